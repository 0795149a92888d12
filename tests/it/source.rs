//! The source stage: every format, stable ids, sorting, failures with line
//! numbers and reasons, text chunking, reference times from file mtimes,
//! object stores other than local files, and the example corpus.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use chrono::{DateTime, TimeZone, Utc};
use graphloom::source::{self, Episode, EpisodeKind, Loaded, SourceError, SourceFailure};
use graphloom::spec::{PipelineSpec, SourceSpec, SpecError};
use object_store::{ObjectStoreExt, PutPayload};
use url::Url;

use crate::common;

/// A `[source]` spec read through the pipeline spec parser, so its checks run.
fn spec(url: &str, format: &str, extra: &str) -> SourceSpec {
    try_spec(url, format, extra)
        .expect("spec parses")
        .source
        .expect("has a source")
}

fn try_spec(url: &str, format: &str, extra: &str) -> Result<PipelineSpec, SpecError> {
    let toml = format!(
        "[source]\nurl = {url:?}\nformat = {format:?}\n{extra}\n\n[output]\ngraph = \"memory://unused/\"\n"
    );
    PipelineSpec::from_toml(&toml, Path::new("test.toml"))
}

fn dir_url(dir: &Path) -> String {
    format!("file://{}/", dir.display())
}

fn file_uri(path: &Path) -> String {
    Url::from_file_path(path)
        .expect("absolute path")
        .to_string()
}

async fn load(spec: &SourceSpec) -> Loaded {
    source::load(spec, "grp", &BTreeMap::new())
        .await
        .expect("source loads")
}

fn t(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .expect("test time")
        .with_timezone(&Utc)
}

/// Asserts one failure with this item, line and reason words.
fn assert_failure(failures: &[SourceFailure], item: &str, line: Option<i64>, words: &str) {
    let found = failures.iter().find(|f| f.item == item).unwrap_or_else(|| {
        panic!("no failure for {item}; failures: {failures:#?}");
    });
    assert_eq!(found.line, line, "line of {item}: {found:?}");
    assert!(
        found.reason.contains(words),
        "reason of {item} should contain {words:?}: {:?}",
        found.reason
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn jsonl_records_become_episodes_with_their_fields() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lines = [
        r#"{"id": "m-1", "content": "Hello Dana", "kind": "message", "reference_time": "2024-03-28T11:41:00+02:00", "document_id": "thread-1", "source_description": "mail", "group_id": "team-a", "cc": ["ignored"]}"#,
        "",
        r#"{"id": 42, "content": {"po": "PO-1", "amount": 10}, "kind": "json", "reference_time": "2024-03-28T09:42:00Z"}"#,
        r#"{"content": "plain text, default kind", "reference_time": "2024-03-28T09:43:00Z", "document_id": ""}"#,
    ];
    let path = dir.path().join("a.jsonl");
    std::fs::write(&path, lines.join("\r\n")).expect("write");
    std::fs::write(
        dir.path().join("b.ndjson"),
        r#"{"content": "from ndjson", "reference_time": "2024-03-28T09:44:00Z", "kind": "MESSAGE"}"#,
    )
    .expect("write");

    let loaded = load(&spec(&dir_url(dir.path()), "jsonl", "")).await;
    assert!(loaded.failures.is_empty(), "{:?}", loaded.failures);
    assert_eq!(loaded.files, 2);
    assert_eq!(loaded.episodes.len(), 4);
    let uri = file_uri(&path);

    let first = &loaded.episodes[0];
    assert_eq!(first.source_id.as_deref(), Some("m-1"));
    assert_eq!(first.content, "Hello Dana");
    assert_eq!(first.kind, EpisodeKind::Message);
    assert_eq!(first.group_id, "team-a");
    assert_eq!(first.document_id.as_deref(), Some("thread-1"));
    assert_eq!(first.source_description.as_deref(), Some("mail"));
    assert_eq!(
        first.reference_time,
        t("2024-03-28T09:41:00Z"),
        "converted to UTC"
    );
    assert_eq!(first.reference_time_source, "field");
    assert_eq!(first.source_uri, format!("{uri}#L1"));
    assert_eq!(first.order, (0, 1));
    assert_eq!(
        first.episode_id,
        source::episode_id(&first.source_uri, "Hello Dana")
    );
    assert_eq!(first.episode_id.len(), 32);

    let json = &loaded.episodes[1];
    assert_eq!(json.kind, EpisodeKind::Json);
    assert_eq!(json.source_id.as_deref(), Some("42"));
    assert_eq!(
        json.content, r#"{"po":"PO-1","amount":10}"#,
        "object content serialised"
    );
    assert_eq!(json.source_uri, format!("{uri}#L3"));
    assert_eq!(json.group_id, "grp", "default group id");

    let text = &loaded.episodes[2];
    assert_eq!(text.kind, EpisodeKind::Text, "default kind");
    assert_eq!(text.document_id, None, "empty strings count as absent");
    assert_eq!(text.source_id, None);

    let nd = &loaded.episodes[3];
    assert_eq!(nd.content, "from ndjson");
    assert_eq!(nd.kind, EpisodeKind::Message, "kind ignores case");
    assert_eq!(nd.order.0, 1);

    // source.default_kind applies to records without a kind.
    let loaded = load(&spec(
        &dir_url(dir.path()),
        "jsonl",
        r#"default_kind = "message""#,
    ))
    .await;
    assert_eq!(loaded.episodes[2].kind, EpisodeKind::Message);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_jsonl_lines_become_failures_and_good_lines_still_load() {
    let dir = tempfile::tempdir().expect("temp dir");
    let big = format!(r#"{{"content": "{}"}}"#, "x".repeat(300));
    let mut bytes: Vec<u8> = Vec::new();
    let lines: Vec<Vec<u8>> = vec![
        br#"{"content": "good one", "reference_time": "2024-01-01T00:00:00Z"}"#.to_vec(),
        br#"{"content": "broken"#.to_vec(),
        br#"["an", "array"]"#.to_vec(),
        br#"{"id": "no-content"}"#.to_vec(),
        br#"{"content": "   "}"#.to_vec(),
        br#"{"content": "x", "reference_time": "last tuesday"}"#.to_vec(),
        b"{\"content\": \"caf\xff\"}".to_vec(),
        big.into_bytes(),
        br#"{"content": "x", "kind": "email"}"#.to_vec(),
        br#"{"content": 7}"#.to_vec(),
        br#"{"content": "x", "reference_time": 1700000000}"#.to_vec(),
        br#"{"content": "x", "document_id": 5}"#.to_vec(),
        br#"{"content": {"a": 1}, "kind": "text"}"#.to_vec(),
        br#"{"content": "good two", "reference_time": "2024-01-02T00:00:00Z"}"#.to_vec(),
    ];
    for line in &lines {
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
    }
    std::fs::write(dir.path().join("bad.jsonl"), &bytes).expect("write");

    let loaded = load(&spec(
        &dir_url(dir.path()),
        "jsonl",
        "max_record_bytes = 200",
    ))
    .await;
    let contents: Vec<&str> = loaded.episodes.iter().map(|e| e.content.as_str()).collect();
    assert_eq!(contents, ["good one", "good two"]);
    assert_eq!(
        loaded.episodes[1].source_uri.rsplit('#').next(),
        Some("L14")
    );
    let f = &loaded.failures;
    assert_eq!(f.len(), 12, "{f:#?}");
    assert_failure(f, "bad.jsonl:2", Some(2), "malformed JSON");
    assert_failure(
        f,
        "bad.jsonl:3",
        Some(3),
        "not a JSON object (found an array)",
    );
    assert_failure(f, "bad.jsonl:4", Some(4), "content is missing");
    assert_failure(f, "bad.jsonl:5", Some(5), "content is empty");
    assert_failure(
        f,
        "bad.jsonl:6",
        Some(6),
        "\"last tuesday\" is not an RFC 3339 time",
    );
    assert_failure(f, "bad.jsonl:7", Some(7), "not valid UTF-8");
    assert_failure(f, "bad.jsonl:7", Some(7), "offset 16 of the line");
    assert_failure(
        f,
        "bad.jsonl:8",
        Some(8),
        "larger than source.max_record_bytes (200)",
    );
    assert_failure(
        f,
        "bad.jsonl:9",
        Some(9),
        "kind \"email\" is not one of message, text, json",
    );
    assert_failure(
        f,
        "bad.jsonl:10",
        Some(10),
        "content must be a string, found a number",
    );
    assert_failure(
        f,
        "bad.jsonl:11",
        Some(11),
        "reference_time must be an RFC 3339 string",
    );
    assert_failure(f, "bad.jsonl:12", Some(12), "document_id must be a string");
    assert_failure(f, "bad.jsonl:13", Some(13), "content must be a string");
    for failure in f {
        assert!(failure.source_uri.ends_with("/bad.jsonl"), "{failure:?}");
        assert!(failure.excerpt.is_some(), "{failure:?}");
        assert!(failure.excerpt.as_ref().unwrap().chars().count() <= 200);
    }
    let row = f[0].to_row("run-1", Utc::now());
    assert_eq!(row.stage, "source");
    assert_eq!(row.item, "bad.jsonl:2");
    assert_eq!(row.line, Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_files_are_one_failure_each() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, format) in [
        ("e.jsonl", "jsonl"),
        ("e.json", "json"),
        ("e.txt", "text"),
        ("e.parquet", "parquet"),
    ] {
        let sub = dir.path().join(format);
        std::fs::create_dir(&sub).expect("mkdir");
        std::fs::write(
            sub.join(name),
            if format == "parquet" { "" } else { " \n\n" },
        )
        .expect("write");
        let loaded = load(&spec(&dir_url(&sub), format, "")).await;
        assert_eq!(loaded.files, 1);
        assert!(loaded.episodes.is_empty());
        assert_eq!(loaded.failures.len(), 1, "{:?}", loaded.failures);
        assert_failure(&loaded.failures, name, None, "file is empty");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_files_hold_an_array_or_one_object() {
    let dir = tempfile::tempdir().expect("temp dir");
    let array = r#"[
  {"id": "a", "content": "first", "reference_time": "2024-05-01T00:00:00Z"},
  {"id": "b"},
  "not an object",
  {"id": "c", "content": "second", "reference_time": "2024-05-02T00:00:00Z",
   "extra": {"nested": [1, 2, 3]}},
  {"id": "d", "content": [1, 2], "kind": "json", "reference_time": "2024-05-03T00:00:00Z"}
]
"#;
    std::fs::write(dir.path().join("array.json"), array).expect("write");
    std::fs::write(
        dir.path().join("one.json"),
        "\u{feff}{\"content\": \"only\", \"reference_time\": \"2024-06-01T00:00:00Z\"}",
    )
    .expect("write");
    std::fs::write(dir.path().join("empty_array.json"), "[ ]").expect("write");
    std::fs::write(dir.path().join("number.json"), "\n42\n").expect("write");
    std::fs::write(
        dir.path().join("broken.json"),
        "[\n  {\"content\": \"ok\"},\n  {\"content\": \"missing quote}\n]",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("latin1.json"),
        b"[\n{\"content\": \"ok\"},\n{\"content\": \"caf\xe9\"}\n]".as_slice(),
    )
    .expect("write");

    let loaded = load(&spec(&dir_url(dir.path()), "json", "")).await;
    assert_eq!(loaded.files, 6);
    let got: Vec<(&str, &str)> = loaded
        .episodes
        .iter()
        .map(|e| (e.content.as_str(), e.source_uri.rsplit('/').next().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("first", "array.json#0"),
            ("second", "array.json#3"),
            ("[1,2]", "array.json#4"),
            ("only", "one.json#0"),
        ]
    );
    let f = &loaded.failures;
    assert_eq!(f.len(), 5, "{f:#?}");
    assert_failure(f, "array.json:3", Some(3), "content is missing");
    assert_failure(
        f,
        "array.json:4",
        Some(4),
        "not a JSON object (found a string)",
    );
    assert_failure(f, "number.json:2", Some(2), "not a JSON array of records");
    assert_failure(f, "broken.json:4", Some(4), "malformed JSON");
    assert_failure(
        f,
        "latin1.json:3",
        Some(3),
        "not valid UTF-8 (invalid byte at offset 37)",
    );
}

/// Writes one batch to a Parquet file.
fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).expect("batch");
    let file = std::fs::File::create(path).expect("create");
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
    writer.write(&batch).expect("write batch");
    writer.close().expect("close");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parquet_table_without_content_gives_each_row_as_a_json_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_parquet(
        &dir.path().join("crm.parquet"),
        vec![
            (
                "name",
                Arc::new(StringArray::from(vec![Some("Acme Corp"), Some("Globex")])) as ArrayRef,
            ),
            (
                "domain",
                Arc::new(StringArray::from(vec![Some("acme.test"), None])) as ArrayRef,
            ),
            (
                "employees",
                Arc::new(Int64Array::from(vec![120, 9])) as ArrayRef,
            ),
            ("id", Arc::new(Int64Array::from(vec![7, 8])) as ArrayRef),
        ],
    );
    let loaded = load(&spec(
        &dir_url(dir.path()),
        "parquet",
        "default_kind = \"json\"",
    ))
    .await;
    assert!(loaded.failures.is_empty(), "{:?}", loaded.failures);
    let e = &loaded.episodes;
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].kind, EpisodeKind::Json);
    let first: serde_json::Value = serde_json::from_str(&e[0].content).expect("JSON content");
    assert_eq!(
        first,
        serde_json::json!({"name": "Acme Corp", "domain": "acme.test", "employees": 120, "id": 7})
    );
    let second: serde_json::Value = serde_json::from_str(&e[1].content).expect("JSON content");
    assert_eq!(
        second,
        serde_json::json!({"name": "Globex", "employees": 9, "id": 8}),
        "a null column is left out"
    );
    assert_eq!(e[1].source_id.as_deref(), Some("8"));

    // Without kind json a missing content column is still an error of the file.
    let loaded = load(&spec(&dir_url(dir.path()), "parquet", "")).await;
    assert!(loaded.episodes.is_empty());
    assert!(
        loaded.failures[0]
            .reason
            .contains("content is read from column `content`"),
        "{:?}",
        loaded.failures
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn parquet_rows_are_read_through_the_column_mapping() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sent_at = TimestampMillisecondArray::from(vec![
        Some(1_711_618_860_000),
        Some(1_711_618_920_000),
        None,
        Some(1_711_618_980_000),
    ])
    .with_timezone("+02:00");
    write_parquet(
        &dir.path().join("mapped.parquet"),
        vec![
            (
                "body",
                Arc::new(StringArray::from(vec![
                    Some("first"),
                    Some("second"),
                    Some("no time"),
                    None,
                ])) as ArrayRef,
            ),
            ("sent_at", Arc::new(sent_at) as ArrayRef),
            (
                "id",
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
            ),
            (
                "kind",
                Arc::new(StringArray::from(vec!["message", "json", "text", "text"])) as ArrayRef,
            ),
            (
                "unrelated",
                Arc::new(StringArray::from(vec!["a", "b", "c", "d"])) as ArrayRef,
            ),
        ],
    );
    let mapping = r#"columns = { content = "body", reference_time = "sent_at" }"#;
    let loaded = load(&spec(&dir_url(dir.path()), "parquet", mapping)).await;
    assert_eq!(loaded.files, 1);
    assert_eq!(loaded.failures.len(), 1, "{:?}", loaded.failures);
    assert_eq!(loaded.failures[0].item, "mapped.parquet#3");
    assert!(loaded.failures[0].reason.contains("content is missing"));
    let e = &loaded.episodes;
    assert_eq!(e.len(), 3);
    assert_eq!(e[0].content, "first");
    assert_eq!(
        e[0].reference_time,
        t("2024-03-28T09:41:00Z"),
        "UTC instant kept"
    );
    assert_eq!(e[0].reference_time_source, "field");
    assert_eq!(e[0].source_id.as_deref(), Some("1"));
    assert_eq!(e[0].kind, EpisodeKind::Message);
    assert!(e[0].source_uri.ends_with("/mapped.parquet#0"));
    assert_eq!(e[1].kind, EpisodeKind::Json);
    assert_eq!(e[2].content, "no time");
    assert_eq!(e[2].reference_time_source, "file_modified");

    // Default names, a string reference_time column, naive timestamps.
    let other = tempfile::tempdir().expect("temp dir");
    let naive = arrow::array::TimestampSecondArray::from(vec![1_700_000_000, 1_700_000_001]);
    write_parquet(
        &other.path().join("plain.parquet"),
        vec![
            (
                "content",
                Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef,
            ),
            (
                "reference_time",
                Arc::new(StringArray::from(vec!["2024-01-01T00:00:00Z", "yesterday"])) as ArrayRef,
            ),
            (
                "group_id",
                Arc::new(StringArray::from(vec![Some("g2"), None])) as ArrayRef,
            ),
        ],
    );
    write_parquet(
        &other.path().join("naive.parquet"),
        vec![
            (
                "content",
                Arc::new(StringArray::from(vec!["n1", "n2"])) as ArrayRef,
            ),
            ("reference_time", Arc::new(naive) as ArrayRef),
        ],
    );
    let loaded = load(&spec(&dir_url(other.path()), "parquet", "")).await;
    assert_failure(
        &loaded.failures,
        "plain.parquet#1",
        None,
        "\"yesterday\" is not an RFC 3339",
    );
    let got: Vec<(&str, DateTime<Utc>, &str)> = loaded
        .episodes
        .iter()
        .map(|e| (e.content.as_str(), e.reference_time, e.group_id.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("n1", Utc.timestamp_opt(1_700_000_000, 0).unwrap(), "grp"),
            ("n2", Utc.timestamp_opt(1_700_000_001, 0).unwrap(), "grp"),
            ("a", t("2024-01-01T00:00:00Z"), "g2"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unreadable_parquet_files_fail_whole_and_name_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("garbage.parquet"), b"PAR1 not really").expect("write");
    write_parquet(
        &dir.path().join("nocontent.parquet"),
        vec![("text", Arc::new(StringArray::from(vec!["a"])) as ArrayRef)],
    );
    write_parquet(
        &dir.path().join("wrongtype.parquet"),
        vec![("content", Arc::new(Int64Array::from(vec![1])) as ArrayRef)],
    );
    write_parquet(
        &dir.path().join("ok.parquet"),
        vec![(
            "content",
            Arc::new(StringArray::from(vec!["fine"])) as ArrayRef,
        )],
    );
    let loaded = load(&spec(&dir_url(dir.path()), "parquet", "")).await;
    assert_eq!(loaded.files, 4);
    assert_eq!(loaded.episodes.len(), 1);
    assert_eq!(loaded.episodes[0].content, "fine");
    let f = &loaded.failures;
    assert_eq!(f.len(), 3, "{f:#?}");
    assert_failure(f, "garbage.parquet", None, "not a readable parquet file");
    assert_failure(f, "nocontent.parquet", None, "column `content`");
    assert_failure(f, "nocontent.parquet", None, "columns: text");
    assert_failure(f, "wrongtype.parquet", None, "needs a string column");

    // A mapped column the file lacks is named with its key.
    let loaded = load(&spec(
        &dir_url(dir.path()),
        "parquet",
        r#"columns = { reference_time = "sent_at" }"#,
    ))
    .await;
    assert_failure(
        &loaded.failures,
        "ok.parquet",
        None,
        "source.columns.reference_time names column `sent_at`",
    );
}

fn words(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("word{i}")).collect()
}

/// A document of paragraphs of sentences of unique words.
fn document() -> String {
    let w = words(900);
    let mut text = String::from("# Title\n\n");
    for (p, para) in w.chunks(60).enumerate() {
        for sentence in para.chunks(12) {
            text.push_str(&sentence.join(" "));
            text.push_str(". ");
        }
        text.push_str(if p % 2 == 0 { "\n\n" } else { "\n\n\n" });
    }
    text
}

#[test]
fn chunks_stay_within_bounds_overlap_and_never_split_words() {
    let text = document();
    let all: BTreeSet<&str> = text.split_whitespace().collect();
    for (tokens, overlap) in [(50, 10), (100, 0), (400, 50), (13, 12), (1, 0)] {
        let chunks = source::chunk_text(&text, tokens, overlap);
        assert!(chunks.len() > 1, "{tokens}: several chunks");
        let limit = tokens * 4;
        for (k, c) in chunks.iter().enumerate() {
            let longest_word = c.split_whitespace().map(str::len).max().unwrap_or(0);
            assert!(
                c.chars().count() <= limit.max(longest_word),
                "chunk {k} of {tokens} tokens is {} chars",
                c.chars().count()
            );
            assert!(!c.is_empty() && c.trim() == *c, "chunk {k} is trimmed");
            for w in c.split_whitespace() {
                assert!(all.contains(w), "chunk {k} split a word: {w:?}");
            }
        }
        // Every word is in some chunk, in order.
        let covered: BTreeSet<&str> = chunks.iter().flat_map(|c| c.split_whitespace()).collect();
        assert_eq!(covered, all, "{tokens}: every word kept");
        // Consecutive chunks overlap by about `overlap` tokens.
        for pair in chunks.windows(2) {
            let first: Vec<&str> = pair[0].split_whitespace().collect();
            let next: Vec<&str> = pair[1].split_whitespace().collect();
            let shared = (0..=first.len().min(next.len()))
                .rev()
                .find(|n| first[first.len() - n..] == next[..*n])
                .unwrap_or(0);
            let shared_chars = next[..shared].join(" ").chars().count();
            assert!(
                shared_chars <= overlap * 4,
                "{tokens}: overlap {shared_chars}"
            );
            if overlap >= 10 {
                assert!(shared > 0, "{tokens}/{overlap}: chunks overlap: {pair:?}");
            }
            assert!(shared < next.len(), "every chunk brings new words");
        }
    }
    // With room for a paragraph, chunks end at paragraph breaks.
    let chunks = source::chunk_text(&text, 200, 0);
    for c in &chunks[..chunks.len() - 1] {
        let end = c.as_ptr() as usize - text.as_ptr() as usize + c.len();
        assert!(
            text[end..].trim_start_matches(' ').starts_with("\n\n"),
            "ends at a paragraph: {c:?}"
        );
    }
    // A word longer than a chunk stays whole.
    let long = format!("short {} tail", "x".repeat(50));
    assert_eq!(
        source::chunk_text(&long, 2, 0),
        ["short", &"x".repeat(50), "tail"]
    );
    assert!(source::chunk_text("  \n ", 10, 1).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn text_files_are_chunked_documents_dated_by_their_mtime() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.md");
    std::fs::write(&path, document()).expect("write");
    std::fs::write(dir.path().join("short.txt"), "One short note.\n").expect("write");
    std::fs::write(dir.path().join("data.csv"), "a,b\n").expect("write");
    let mtime = t("2023-07-01T12:00:00Z");
    let file = std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open");
    file.set_modified(mtime.into()).expect("set mtime");
    drop(file);

    let loaded = load(&spec(
        &dir_url(dir.path()),
        "text",
        "chunk_tokens = 100\nchunk_overlap_tokens = 20",
    ))
    .await;
    assert!(loaded.failures.is_empty(), "{:?}", loaded.failures);
    assert_eq!(loaded.files, 2);
    assert_eq!(loaded.ignored, 1, "the csv file");
    let uri = file_uri(&path);
    let chunks: Vec<&Episode> = loaded
        .episodes
        .iter()
        .filter(|e| e.document_id.as_deref() == Some(uri.as_str()))
        .collect();
    assert!(chunks.len() > 5, "{} chunks", chunks.len());
    for (k, c) in chunks.iter().enumerate() {
        assert_eq!(c.source_uri, format!("{uri}#chunk{k}"));
        assert_eq!(c.kind, EpisodeKind::Text);
        assert_eq!(c.reference_time, mtime);
        assert_eq!(c.reference_time_source, "file_modified");
        assert_eq!(c.order, (0, k));
        assert!(c.content.chars().count() <= 400);
        assert_eq!(c.group_id, "grp");
    }
    assert!(chunks[0].content.starts_with("# Title"));
    let ids: BTreeSet<&str> = chunks.iter().map(|c| c.episode_id.as_str()).collect();
    assert_eq!(ids.len(), chunks.len(), "chunk ids differ");
    let short = loaded
        .episodes
        .iter()
        .find(|e| e.content == "One short note.")
        .expect("short note");
    assert!(short.source_uri.ends_with("/short.txt#chunk0"));
    assert!(short.reference_time > mtime, "written just now");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_reference_time_falls_back_to_the_file_mtime() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("a.jsonl");
    std::fs::write(
        &path,
        "{\"content\": \"undated\"}\n{\"content\": \"null time\", \"reference_time\": null}\n",
    )
    .expect("write");
    let mtime = t("2022-02-02T02:02:02Z");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open")
        .set_modified(mtime.into())
        .expect("set mtime");
    let loaded = load(&spec(&dir_url(dir.path()), "jsonl", "")).await;
    assert_eq!(loaded.episodes.len(), 2);
    for e in &loaded.episodes {
        assert_eq!(e.reference_time, mtime);
        assert_eq!(e.reference_time_source, "file_modified");
    }
    let row = loaded.episodes[0].to_row("run-1", Utc::now());
    assert_eq!(row.reference_time_source, "file_modified");
    assert_eq!(row.kind, "text");
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_are_stable_hashes_of_uri_and_content() {
    let dir = tempfile::tempdir().expect("temp dir");
    let line = r#"{"content": "same words", "reference_time": "2024-01-01T00:00:00Z"}"#;
    std::fs::write(dir.path().join("a.jsonl"), format!("{line}\n{line}\n")).expect("write");
    std::fs::write(dir.path().join("b.jsonl"), format!("{line}\n")).expect("write");
    let s = spec(&dir_url(dir.path()), "jsonl", "");
    let first = load(&s).await;
    let second = load(&s).await;
    let ids =
        |l: &Loaded| -> Vec<String> { l.episodes.iter().map(|e| e.episode_id.clone()).collect() };
    assert_eq!(ids(&first), ids(&second), "same input, same ids");
    let unique: BTreeSet<String> = ids(&first).into_iter().collect();
    assert_eq!(
        unique.len(),
        3,
        "same content at another line or file: another id"
    );
    for e in &first.episodes {
        assert_eq!(e.episode_id, source::episode_id(&e.source_uri, &e.content));
    }
    assert_eq!(
        source::episode_id("file:///x.jsonl#L1", "c"),
        blake3::hash(b"file:///x.jsonl#L1\nc").to_hex()[..32]
    );
    assert_ne!(
        source::episode_id("file:///x.jsonl#L1", "c"),
        source::episode_id("file:///y.jsonl#L1", "c")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn episodes_are_sorted_by_time_then_file_and_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("a.jsonl"),
        [
            r#"{"content": "a1 late", "reference_time": "2024-03-01T00:00:00Z"}"#,
            r#"{"content": "a2 tie", "reference_time": "2024-02-01T00:00:00Z"}"#,
            r#"{"content": "a3 early", "reference_time": "2024-01-01T00:00:00+01:00"}"#,
            r#"{"content": "a4 tie", "reference_time": "2024-02-01T01:00:00+01:00"}"#,
        ]
        .join("\n"),
    )
    .expect("write");
    std::fs::write(
        dir.path().join("b.jsonl"),
        [
            r#"{"content": "b1 tie", "reference_time": "2024-02-01T00:00:00Z"}"#,
            r#"{"content": "b2 first", "reference_time": "2023-12-31T22:00:00Z"}"#,
        ]
        .join("\n"),
    )
    .expect("write");
    let loaded = load(&spec(&dir_url(dir.path()), "jsonl", "")).await;
    let order: Vec<&str> = loaded.episodes.iter().map(|e| e.content.as_str()).collect();
    assert_eq!(
        order,
        [
            "b2 first", "a3 early", "a2 tie", "a4 tie", "b1 tie", "a1 late"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_recurses_skips_hidden_files_and_counts_other_formats() {
    let dir = tempfile::tempdir().expect("temp dir");
    let line = r#"{"content": "x", "reference_time": "2024-01-01T00:00:00Z"}"#;
    std::fs::create_dir_all(dir.path().join("sub/deeper")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("_delta_log")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join(".git")).expect("mkdir");
    for name in [
        "top.jsonl",
        "sub/deeper/nested.jsonl",
        ".hidden.jsonl",
        "_tmp.jsonl",
        "_delta_log/0.jsonl",
        ".git/x.jsonl",
    ] {
        std::fs::write(dir.path().join(name), line).expect("write");
    }
    std::fs::write(dir.path().join("sub/readme.md"), "notes").expect("write");
    std::fs::write(dir.path().join("sub/bad.jsonl"), "nope\n").expect("write");
    let loaded = load(&spec(&dir_url(dir.path()), "jsonl", "")).await;
    assert_eq!(loaded.files, 3);
    assert_eq!(loaded.ignored, 1);
    assert_eq!(loaded.episodes.len(), 2);
    assert_failure(
        &loaded.failures,
        "sub/bad.jsonl:1",
        Some(1),
        "malformed JSON",
    );
    // Listing order is by path: sub/... sorts before top.jsonl.
    let nested = loaded
        .episodes
        .iter()
        .find(|e| e.source_uri.contains("/sub/deeper/nested.jsonl#L1"))
        .expect("nested file");
    assert_eq!(nested.order, (1, 1));

    // A URL naming one file loads that file.
    let one = spec(&file_uri(&dir.path().join("top.jsonl")), "jsonl", "");
    let loaded = load(&one).await;
    assert_eq!(loaded.files, 1);
    assert_eq!(loaded.episodes.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_files_is_empty_but_a_missing_directory_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let loaded = load(&spec(&dir_url(dir.path()), "jsonl", "")).await;
    assert!(loaded.episodes.is_empty() && loaded.failures.is_empty());
    assert_eq!(loaded.files, 0);

    let missing = spec(&dir_url(&dir.path().join("nope")), "jsonl", "");
    let err = source::load(&missing, "grp", &BTreeMap::new())
        .await
        .expect_err("missing directory");
    assert!(matches!(err, SourceError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    let as_cli = graphloom::Error::from(graphloom::run::RunError::Source(err));
    assert_eq!(
        as_cli.exit_code(),
        2,
        "a missing source directory is the user's to fix"
    );

    let bad_option = spec(
        "s3://bucket/prefix/",
        "jsonl",
        "storage_options = { not_an_option = \"1\" }",
    );
    let err = source::load(&bad_option, "grp", &BTreeMap::new())
        .await
        .expect_err("unknown storage option");
    assert!(matches!(err, SourceError::Location(_)), "{err}");
    assert!(err.to_string().contains("not_an_option"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_store_sources_load_like_local_ones() {
    let url_text = format!("memory://source-test-{}/", uuid::Uuid::new_v4());
    let url = Url::parse(&url_text).expect("url");
    let store = graphloom::objstore::store_for(&url, &Default::default()).expect("memory store");
    let put = |path: &str, body: &str| {
        let store = store.clone();
        let path = object_store::path::Path::from(path);
        let body = body.to_string();
        async move {
            store.put(&path, PutPayload::from(body)).await.expect("put");
        }
    };
    let before = Utc::now();
    put(
        "archive/2024/chat.jsonl",
        "{\"content\": \"dated\", \"reference_time\": \"2024-01-01T00:00:00Z\"}\n{\"content\": \"undated\"}\n",
    )
    .await;
    put("archive/other.txt", "ignored for jsonl").await;
    put(
        "elsewhere/x.jsonl",
        "{\"content\": \"not below the prefix\"}",
    )
    .await;

    let s = spec(&format!("{url_text}archive"), "jsonl", "");
    let loaded = load(&s).await;
    assert_eq!(loaded.files, 1);
    assert_eq!(loaded.ignored, 1);
    assert!(loaded.failures.is_empty(), "{:?}", loaded.failures);
    let e = &loaded.episodes;
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].content, "dated");
    assert_eq!(
        e[0].source_uri,
        format!("{url_text}archive/2024/chat.jsonl#L1")
    );
    assert_eq!(e[1].content, "undated");
    assert_eq!(e[1].reference_time_source, "file_modified");
    assert!(e[1].reference_time >= before - chrono::Duration::seconds(1));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_corpus_loads_cleanly() {
    let spec = PipelineSpec::from_path(&common::repo().join("pipelines/procurement.toml"))
        .expect("example spec");
    let source_spec = spec.source.as_ref().expect("example has a [source]");
    let loaded = source::load(source_spec, &spec.output.group_id, &BTreeMap::new())
        .await
        .expect("example corpus loads");
    assert_eq!(loaded.files, 4);
    assert!(loaded.failures.is_empty(), "{:?}", loaded.failures);
    assert_eq!(loaded.episodes.len(), 67);
    let kinds: BTreeSet<EpisodeKind> = loaded.episodes.iter().map(|e| e.kind).collect();
    assert_eq!(kinds.len(), 3, "message, text and json episodes");
    assert!(loaded.episodes.iter().all(|e| e.group_id == "procurement"
        && e.reference_time_source == "field"
        && e.source_id.is_some()));
    assert!(
        loaded
            .episodes
            .windows(2)
            .all(|w| (w[0].reference_time, w[0].order) <= (w[1].reference_time, w[1].order))
    );
    let ids: BTreeSet<&str> = loaded
        .episodes
        .iter()
        .map(|e| e.episode_id.as_str())
        .collect();
    assert_eq!(ids.len(), 67);
}

#[test]
fn source_keys_have_defaults_and_checked_ranges() {
    let s = spec("file://./x/", "text", "");
    assert_eq!(s.default_kind, EpisodeKind::Text);
    assert_eq!(s.chunk_tokens, 400);
    assert_eq!(s.chunk_overlap_tokens, 50);
    assert_eq!(s.max_record_bytes, 1_048_576);
    assert!(s.columns.is_empty() && s.storage_options.is_empty());

    for (format, extra, key, words) in [
        (
            "jsonl",
            r#"columns = { content = "body" }"#,
            "source.columns",
            "only used with",
        ),
        (
            "parquet",
            r#"columns = { body = "text" }"#,
            "source.columns.body",
            "not a record field",
        ),
        (
            "parquet",
            r#"columns = { content = "" }"#,
            "source.columns.content",
            "must name a column",
        ),
        (
            "text",
            "chunk_tokens = 0",
            "source.chunk_tokens",
            "between 1 and",
        ),
        (
            "text",
            "chunk_tokens = 40",
            "source.chunk_overlap_tokens",
            "less than source.chunk_tokens (40)",
        ),
        (
            "text",
            "chunk_overlap_tokens = 400",
            "source.chunk_overlap_tokens",
            "less than",
        ),
        (
            "jsonl",
            "max_record_bytes = 0",
            "source.max_record_bytes",
            "between 1 and",
        ),
    ] {
        let err = try_spec("file://./x/", format, extra).expect_err(extra);
        match &err {
            SpecError::Value {
                key: k, message, ..
            } => {
                assert_eq!(k, key, "{extra}");
                assert!(message.contains(words), "{extra}: {message}");
            }
            other => panic!("{extra}: {other}"),
        }
    }
    for extra in [r#"default_kind = "email""#, "chunk_size = 3"] {
        let err = try_spec("file://./x/", "text", extra).expect_err(extra);
        assert!(matches!(err, SpecError::Parse { .. }), "{extra}: {err}");
    }
    let ok = spec(
        "file://./x/",
        "parquet",
        r#"columns = { content = "body", reference_time = "sent_at" }
default_kind = "message""#,
    );
    assert_eq!(ok.columns["content"], "body");
    assert_eq!(ok.default_kind, EpisodeKind::Message);
}

#[test]
fn kinds_have_lowercase_names() {
    for (kind, name) in [
        (EpisodeKind::Message, "message"),
        (EpisodeKind::Text, "text"),
        (EpisodeKind::Json, "json"),
    ] {
        assert_eq!(kind.as_str(), name);
        assert_eq!(kind.to_string(), name);
        assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{name}\""));
        assert_eq!(EpisodeKind::parse(&name.to_uppercase()), Some(kind));
    }
    assert_eq!(EpisodeKind::parse("email"), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn records_larger_than_max_record_bytes_fail_in_every_format() {
    let dir = tempfile::tempdir().expect("temp dir");
    let big = "y".repeat(500);
    let json = dir.path().join("json");
    std::fs::create_dir(&json).expect("mkdir");
    std::fs::write(
        json.join("a.json"),
        format!("[\n{{\"content\": \"small\"}},\n{{\"content\": \"{big}\"}}\n]"),
    )
    .expect("write");
    let text = dir.path().join("text");
    std::fs::create_dir(&text).expect("mkdir");
    std::fs::write(text.join("a.txt"), format!("small words\n\n{big}\n")).expect("write");
    let parquet = dir.path().join("parquet");
    std::fs::create_dir(&parquet).expect("mkdir");
    write_parquet(
        &parquet.join("a.parquet"),
        vec![(
            "content",
            Arc::new(StringArray::from(vec!["small", big.as_str()])) as ArrayRef,
        )],
    );
    for (sub, format, item, line) in [
        (&json, "json", "a.json:3", Some(3)),
        (&text, "text", "a.txt:3", Some(3)),
        (&parquet, "parquet", "a.parquet#1", None),
    ] {
        let loaded = load(&spec(
            &dir_url(sub),
            format,
            "max_record_bytes = 100\nchunk_tokens = 5\nchunk_overlap_tokens = 0",
        ))
        .await;
        assert_eq!(loaded.episodes.len(), 1, "{format}: {:?}", loaded.episodes);
        assert!(loaded.episodes[0].content.starts_with("small"));
        assert_eq!(loaded.failures.len(), 1, "{format}: {:?}", loaded.failures);
        assert_failure(
            &loaded.failures,
            item,
            line,
            "larger than source.max_record_bytes (100)",
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_local_file_is_a_failure_of_that_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let locked = dir.path().join("locked.jsonl");
    std::fs::write(&locked, "{\"content\": \"secret\"}\n").expect("write");
    std::fs::write(dir.path().join("open.jsonl"), "{\"content\": \"open\"}\n").expect("write");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    if std::fs::read(&locked).is_ok() {
        // Running as root: permissions do not stop reads.
        return;
    }
    let loaded = load(&spec(&dir_url(dir.path()), "jsonl", "")).await;
    assert_eq!(loaded.episodes.len(), 1);
    assert_failure(&loaded.failures, "locked.jsonl", None, "cannot read file");
}
