//! Property tests ("fuzzing" on stable Rust, with proptest) for every parser
//! of outside input: source records (JSON Lines, JSON, Parquet, text), the
//! pipeline TOML and its ontology, `graphloom add` lines, LLM replies and
//! `Retry-After` headers.
//!
//! Each property asserts three things: nothing panics (proptest reports a
//! panic as a failing case and shrinks it), every rejection is a clear error
//! or a `failures` row that names the file, line or field, and valid input
//! still parses into what was written.
//!
//! Case counts are bounded so that the module stays well under a minute of
//! CI time (debug build, 2 cores), seeds are fixed so that CI sees the same
//! inputs every run, and failing cases are not persisted (no files are
//! written into the repository; a failure prints the shrunk input). For a
//! longer run: `PROPTEST_CASES=100000 cargo test --test it fuzz`;
//! `PROPTEST_RNG_SEED=<n>` explores other inputs.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arrow::array::{
    ArrayRef, Date32Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
    TimestampNanosecondArray,
};
use chrono::{DateTime, FixedOffset, Utc};
use graphloom::llm::retry::{MAX_RETRY_AFTER, parse_retry_after};
use graphloom::llm::test_server::{Behavior, Reply, TestServer};
use graphloom::llm::{ChatRequest, LlmClient, LlmError, Message};
use graphloom::ontology::{
    EdgeTypeSpec, EntityTypeSpec, Hierarchy, Ontology, OntologyError, OntologySpec, PropertySpec,
    PropertyType, SourceTarget,
};
use graphloom::source::{self, EpisodeKind, Loaded, SourceFailure};
use graphloom::spec::{LlmSpec, PipelineSpec, SourceSpec, SpecError};
use object_store::{ObjectStoreExt, PutPayload};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use url::Url;

// ---------------------------------------------------------------------------
// Running properties
// ---------------------------------------------------------------------------

/// proptest's settings with a bounded number of cases and a fixed seed
/// unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say otherwise, and no
/// failure files.
fn config(default_cases: u32, seed: u64) -> Config {
    // Config::default() reads the PROPTEST_* environment variables.
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default_cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(seed);
    }
    config.failure_persistence = None;
    if std::env::var_os("PROPTEST_MAX_SHRINK_ITERS").is_none() {
        config.max_shrink_iters = 512;
    }
    // Shrinking re-runs the property; a case that hits a time limit must not
    // make that take hours.
    if std::env::var_os("PROPTEST_MAX_SHRINK_TIME").is_none() {
        config.max_shrink_time = 120_000;
    }
    config
}

/// Runs `test` on `cases` inputs drawn from `strategy` and fails with the
/// shrunk input if any case fails or panics.
fn check<S>(
    cases: u32,
    seed: u64,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let mut runner = TestRunner::new(config(cases, seed));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Replaces the one file of a memory store's `case/` directory (memory
/// stores live as long as the process, so each property reuses one).
fn put_case(rt: &tokio::runtime::Runtime, root: &str, name: &str, bytes: Vec<u8>) {
    let url = Url::parse(root).expect("memory url");
    let store = graphloom::objstore::store_for(&url, &Default::default()).expect("memory store");
    rt.block_on(async {
        let listed: Vec<_> = futures::TryStreamExt::try_collect(
            store.list(Some(&object_store::path::Path::from("case"))),
        )
        .await
        .expect("list");
        for meta in listed {
            store.delete(&meta.location).await.expect("delete");
        }
        store
            .put(
                &object_store::path::Path::from(format!("case/{name}")),
                PutPayload::from(bytes),
            )
            .await
            .expect("put");
    });
}

/// A `[source]` spec read through the pipeline spec parser.
fn source_spec(url: &str, format: &str, extra: &str) -> SourceSpec {
    let toml = format!(
        "[source]\nurl = {url:?}\nformat = {format:?}\n{extra}\n\n[output]\ngraph = \"memory://unused/\"\n"
    );
    PipelineSpec::from_toml(&toml, Path::new("test.toml"))
        .expect("source spec parses")
        .source
        .expect("has a source")
}

fn load(rt: &tokio::runtime::Runtime, spec: &SourceSpec) -> Result<Loaded, TestCaseError> {
    let loaded = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(60),
            source::load(spec, "grp", &BTreeMap::new()),
        )
        .await
    });
    loaded
        .map_err(|_| TestCaseError::fail("loading the source took more than 60 s"))?
        .map_err(|e| TestCaseError::fail(format!("the source failed as a whole: {e}")))
}

/// Every failure names the file (and its line when it has one), gives a
/// reason and keeps at most 200 characters of the input.
fn check_failures_are_clear(failures: &[SourceFailure], name: &str) -> Result<(), TestCaseError> {
    for f in failures {
        prop_assert!(!f.reason.trim().is_empty(), "empty reason: {f:?}");
        let want = match f.line {
            Some(l) => format!("{name}:{l}"),
            None => name.to_string(),
        };
        prop_assert!(
            f.item == want || f.item.starts_with(&format!("{name}#")),
            "item {:?} should name the file {name} and line {:?}",
            f.item,
            f.line
        );
        prop_assert!(f.source_uri.ends_with(name), "{f:?}");
        if let Some(x) = &f.excerpt {
            prop_assert!(x.chars().count() <= 200, "excerpt too long");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Generators shared by the source, add and reply properties
// ---------------------------------------------------------------------------

/// Any string of up to `n` characters, control and non-ASCII characters
/// included.
fn any_text(n: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..=n).prop_map(String::from_iter)
}

/// A string holding at least one non-whitespace character.
fn content_text() -> impl Strategy<Value = String> {
    any_text(40).prop_map(|mut s| {
        if s.trim().is_empty() {
            s.push('c');
        }
        s
    })
}

/// Byte sequences that are never valid UTF-8 where they are inserted (at a
/// character boundary).
fn invalid_utf8() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec![
        vec![0x80],
        vec![0xBF],
        vec![0xC0, 0x80],
        vec![0xC3],
        vec![0xE2, 0x82],
        vec![0xED, 0xA0, 0x80],
        vec![0xF4, 0x90, 0x80, 0x80],
        vec![0xFE],
        vec![0xFF],
    ])
}

/// `bytes` with `insert` placed at the character boundary nearest to `at`.
fn insert_at_boundary(text: &str, at: usize, insert: &[u8]) -> (Vec<u8>, usize) {
    let mut at = at % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let mut out = text.as_bytes()[..at].to_vec();
    out.extend_from_slice(insert);
    out.extend_from_slice(&text.as_bytes()[at..]);
    (out, at)
}

/// Nested JSON `depth` levels deep: arrays or objects.
fn nested(depth: usize, object: bool) -> String {
    if object {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    } else {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }
}

// ---------------------------------------------------------------------------
// Source records: JSON Lines and JSON
// ---------------------------------------------------------------------------

/// Largest record in the JSON Lines and JSON properties; large enough for
/// 10,000 levels of nesting, small enough that huge lines are cheap.
const RECORD_MAX: usize = 128 * 1024;

#[derive(Debug, Clone)]
enum Id {
    Str(String),
    Num(i64),
    Blank,
}

#[derive(Debug, Clone)]
struct ValidRecord {
    content: String,
    kind: Option<&'static str>,
    /// Seconds since the epoch and an offset in minutes.
    time: Option<(i64, i32)>,
    id: Option<Id>,
    document_id: Option<String>,
    group_id: Option<String>,
    /// A field graphloom does not read.
    extra: Option<String>,
}

impl ValidRecord {
    fn value(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("content".into(), Value::String(self.content.clone()));
        if let Some(k) = self.kind {
            m.insert("kind".into(), Value::String(k.into()));
        }
        if let Some(t) = self.time() {
            m.insert("reference_time".into(), Value::String(t.to_rfc3339()));
        }
        match &self.id {
            Some(Id::Str(s)) => m.insert("id".into(), Value::String(s.clone())),
            Some(Id::Num(n)) => m.insert("id".into(), json!(n)),
            Some(Id::Blank) => m.insert("id".into(), Value::String("  ".into())),
            None => None,
        };
        if let Some(d) = &self.document_id {
            m.insert("document_id".into(), Value::String(d.clone()));
        }
        if let Some(g) = &self.group_id {
            m.insert("group_id".into(), Value::String(g.clone()));
        }
        if let Some(x) = &self.extra {
            m.insert("cc".into(), json!([x, {"nested": [1, 2.5, null, true]}]));
        }
        m
    }

    fn time(&self) -> Option<DateTime<FixedOffset>> {
        let (secs, offset) = self.time?;
        let tz = FixedOffset::east_opt(offset * 60)?;
        Some(DateTime::from_timestamp(secs, 0)?.with_timezone(&tz))
    }

    fn expected(&self) -> Expected {
        let blank_none = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
        Expected::Episode(Box::new(ExpectedEpisode {
            content: self.content.clone(),
            kind: self.kind.map_or(EpisodeKind::Text, |k| {
                EpisodeKind::parse(k).expect("a kind")
            }),
            time: self.time().map(|t| t.with_timezone(&Utc)),
            source_id: match &self.id {
                Some(Id::Str(s)) => Some(s.clone()),
                Some(Id::Num(n)) => Some(n.to_string()),
                _ => None,
            },
            document_id: blank_none(&self.document_id),
            group_id: blank_none(&self.group_id).unwrap_or_else(|| "grp".into()),
        }))
    }
}

fn valid_record() -> impl Strategy<Value = ValidRecord> {
    let id = prop_oneof![
        content_text().prop_map(Id::Str),
        any::<i64>().prop_map(Id::Num),
        Just(Id::Blank),
    ];
    let opt_str = || prop::option::of(prop_oneof![any_text(12), Just("  ".to_string())]);
    (
        content_text(),
        prop::option::of(prop::sample::select(vec![
            "message", "text", "json", " TEXT ", "Message",
        ])),
        // Years 1970 to 9999, offsets of up to a day.
        prop::option::of((0i64..253_402_214_400, -1439i32..=1439)),
        prop::option::of(id),
        opt_str(),
        opt_str(),
        prop::option::of(any_text(8)),
    )
        .prop_map(
            |(content, kind, time, id, document_id, group_id, extra)| ValidRecord {
                content,
                kind,
                time,
                id,
                document_id,
                group_id,
                extra,
            },
        )
}

#[derive(Debug, Clone, PartialEq)]
struct ExpectedEpisode {
    content: String,
    kind: EpisodeKind,
    time: Option<DateTime<Utc>>,
    source_id: Option<String>,
    document_id: Option<String>,
    group_id: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Episode(Box<ExpectedEpisode>),
    /// A failure whose reason holds these words.
    Failure(String),
    /// Blank: neither.
    Skip,
    /// Either an episode or a failure, but exactly one.
    Any,
}

/// A JSON value of a type that no record field accepts (kind `text`).
#[derive(Debug, Clone, Copy)]
enum WrongValue {
    Bool,
    Num,
    Array,
    Object,
}

impl WrongValue {
    fn value(self) -> Value {
        match self {
            WrongValue::Bool => json!(true),
            WrongValue::Num => json!(7.5),
            WrongValue::Array => json!(["a", 1]),
            WrongValue::Object => json!({"text": "x"}),
        }
    }
}

/// One record (a JSON Lines line or a JSON array item).
#[derive(Debug, Clone)]
enum Rec {
    Valid(ValidRecord),
    /// Kind `json` with structured content nested this deep (within
    /// serde_json's limit).
    JsonContent(usize),
    WrongType(&'static str, WrongValue, ValidRecord),
    NotObject(WrongValue),
    BadKind(String, ValidRecord),
    BadTime(String, ValidRecord),
    NoContent {
        blank: bool,
    },
    /// An ignored field nested beyond serde_json's recursion limit.
    Deep {
        depth: usize,
        object: bool,
    },
    /// Content that makes the record larger than `RECORD_MAX`.
    Huge(usize),
}

fn rec() -> impl Strategy<Value = Rec> {
    let field = prop::sample::select(graphloom::source::RECORD_FIELDS.to_vec());
    let wrong = prop::sample::select(vec![
        WrongValue::Bool,
        WrongValue::Num,
        WrongValue::Array,
        WrongValue::Object,
    ]);
    prop_oneof![
        6 => valid_record().prop_map(Rec::Valid),
        1 => (1usize..=100).prop_map(Rec::JsonContent),
        2 => (field, wrong.clone(), valid_record()).prop_map(|(f, w, r)| {
            // A number is a valid id.
            let w = if f == "id" && matches!(w, WrongValue::Num) { WrongValue::Bool } else { w };
            Rec::WrongType(f, w, r)
        }),
        1 => prop::sample::select(vec![WrongValue::Bool, WrongValue::Num, WrongValue::Array])
            .prop_map(Rec::NotObject),
        1 => (any_text(10), valid_record()).prop_map(|(k, r)| {
            let k = if EpisodeKind::parse(&k).is_some() { format!("{k}x") } else { k };
            Rec::BadKind(k, r)
        }),
        1 => (any_text(30), valid_record()).prop_map(|(t, r)| {
            let t = if DateTime::parse_from_rfc3339(t.trim()).is_ok() { format!("{t}x") } else { t };
            Rec::BadTime(t, r)
        }),
        1 => any::<bool>().prop_map(|blank| Rec::NoContent { blank }),
        1 => (200usize..=10_000, any::<bool>()).prop_map(|(depth, object)| Rec::Deep { depth, object }),
        1 => (1usize..=RECORD_MAX).prop_map(Rec::Huge),
    ]
}

impl Rec {
    /// The record's JSON text, and what loading it must give.
    fn render(&self) -> (String, Expected) {
        match self {
            Rec::Valid(r) => (Value::Object(r.value()).to_string(), r.expected()),
            Rec::JsonContent(depth) => {
                let content = nested(*depth, false);
                let text = format!(r#"{{"kind":"json","content":{content}}}"#);
                let e = ExpectedEpisode {
                    content,
                    kind: EpisodeKind::Json,
                    time: None,
                    source_id: None,
                    document_id: None,
                    group_id: "grp".into(),
                };
                (text, Expected::Episode(Box::new(e)))
            }
            Rec::WrongType(field, wrong, r) => {
                let mut m = r.value();
                // A kind json would accept structured content.
                m.remove("kind");
                m.insert((*field).into(), wrong.value());
                (
                    Value::Object(m).to_string(),
                    Expected::Failure(format!("{field} must be")),
                )
            }
            Rec::NotObject(w) => (
                w.value().to_string(),
                Expected::Failure("not a JSON object".into()),
            ),
            Rec::BadKind(k, r) => {
                let mut m = r.value();
                m.insert("kind".into(), Value::String(k.clone()));
                (
                    Value::Object(m).to_string(),
                    Expected::Failure("kind".into()),
                )
            }
            Rec::BadTime(t, r) => {
                let mut m = r.value();
                m.insert("reference_time".into(), Value::String(t.clone()));
                (
                    Value::Object(m).to_string(),
                    Expected::Failure("reference_time".into()),
                )
            }
            Rec::NoContent { blank } => {
                if *blank {
                    (
                        r#"{"content":" \t ","id":"x"}"#.into(),
                        Expected::Failure("content is empty".into()),
                    )
                } else {
                    (
                        r#"{"id":"x","kind":"text"}"#.into(),
                        Expected::Failure("content is missing".into()),
                    )
                }
            }
            Rec::Deep { depth, object } => (
                format!(
                    r#"{{"content":"deep","extra":{}}}"#,
                    nested(*depth, *object)
                ),
                Expected::Failure("recursion limit".into()),
            ),
            Rec::Huge(extra) => (
                format!(r#"{{"content":"{}"}}"#, "x".repeat(RECORD_MAX + extra)),
                Expected::Failure("larger than source.max_record_bytes".into()),
            ),
        }
    }
}

/// One line of a JSON Lines file.
#[derive(Debug, Clone)]
enum Line {
    Rec(Rec),
    Blank(String),
    /// A valid record cut short.
    Truncated(ValidRecord, usize),
    /// A valid record with bytes that are not UTF-8 in it.
    InvalidUtf8(ValidRecord, usize, Vec<u8>),
    /// Anything (no newline).
    Garbage(String),
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        8 => rec().prop_map(Line::Rec),
        1 => "[ \t]{0,4}".prop_map(Line::Blank),
        1 => (valid_record(), any::<usize>()).prop_map(|(r, at)| Line::Truncated(r, at)),
        1 => (valid_record(), any::<usize>(), invalid_utf8())
            .prop_map(|(r, at, b)| Line::InvalidUtf8(r, at, b)),
        1 => any_text(60).prop_map(|s| Line::Garbage(s.replace('\n', " "))),
    ]
}

impl Line {
    fn render(&self) -> (Vec<u8>, Expected) {
        match self {
            Line::Rec(r) => {
                let (text, e) = r.render();
                (text.into_bytes(), e)
            }
            Line::Blank(ws) => (ws.clone().into_bytes(), Expected::Skip),
            Line::Truncated(r, at) => {
                let text = Value::Object(r.value()).to_string();
                // A strict, non-empty prefix of an object is never JSON.
                let mut cut = 1 + at % (text.len() - 1);
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                (
                    text.as_bytes()[..cut].to_vec(),
                    Expected::Failure("malformed JSON".into()),
                )
            }
            Line::InvalidUtf8(r, at, bytes) => {
                let text = Value::Object(r.value()).to_string();
                let (out, _) = insert_at_boundary(&text, *at, bytes);
                (out, Expected::Failure("not valid UTF-8".into()))
            }
            Line::Garbage(s) => {
                let e = if s.trim_start_matches('\u{feff}').trim().is_empty() {
                    Expected::Skip
                } else {
                    Expected::Any
                };
                (s.clone().into_bytes(), e)
            }
        }
    }
}

fn check_episode(
    loaded: &Loaded,
    fragment: &str,
    want: &ExpectedEpisode,
) -> Result<(), TestCaseError> {
    let found: Vec<_> = loaded
        .episodes
        .iter()
        .filter(|e| e.source_uri.ends_with(fragment))
        .collect();
    prop_assert_eq!(found.len(), 1, "one episode for {}", fragment);
    let e = found[0];
    prop_assert_eq!(&e.content, &want.content);
    prop_assert_eq!(e.kind, want.kind);
    prop_assert_eq!(&e.source_id, &want.source_id);
    prop_assert_eq!(&e.document_id, &want.document_id);
    prop_assert_eq!(&e.group_id, &want.group_id);
    match want.time {
        Some(t) => {
            prop_assert_eq!(e.reference_time, t);
            prop_assert_eq!(e.reference_time_source.as_str(), "field");
        }
        None => prop_assert_eq!(e.reference_time_source.as_str(), "file_modified"),
    }
    prop_assert_eq!(
        &e.episode_id,
        &source::episode_id(&e.source_uri, &e.content)
    );
    Ok(())
}

#[test]
fn fuzz_jsonl_records_become_episodes_or_failures_with_their_line() {
    let rt = runtime();
    let root = "memory://fuzz-source-jsonl/";
    let spec = source_spec(
        &format!("{root}case/"),
        "jsonl",
        &format!("max_record_bytes = {RECORD_MAX}"),
    );
    let strategy = (
        prop::collection::vec(line(), 0..24),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    );
    check(48, 1, strategy, |(lines, crlf, bom, trailing)| {
        let mut bytes = Vec::new();
        if bom {
            bytes.extend_from_slice("\u{feff}".as_bytes());
        }
        let mut expected = Vec::new();
        // Characters of each line that is JSON cut short.
        let mut cut_lines = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let (b, e) = l.render();
            if i > 0 {
                bytes.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
            }
            if matches!(l, Line::Truncated(..)) {
                let chars = String::from_utf8_lossy(&b).chars().count();
                cut_lines.push((i + 1, chars));
            }
            bytes.extend_from_slice(&b);
            expected.push(e);
        }
        if trailing {
            bytes.push(b'\n');
        }
        let all_blank = bytes.iter().all(u8::is_ascii_whitespace);
        put_case(&rt, root, "records.jsonl", bytes);
        let loaded = load(&rt, &spec)?;
        prop_assert_eq!(loaded.files, 1);
        check_failures_are_clear(&loaded.failures, "records.jsonl")?;
        if all_blank {
            prop_assert_eq!(loaded.episodes.len(), 0);
            prop_assert_eq!(loaded.failures.len(), 1);
            prop_assert!(loaded.failures[0].reason.contains("file is empty"));
            return Ok(());
        }
        let mut episodes = 0;
        for (i, want) in expected.iter().enumerate() {
            let n = i + 1;
            let fragment = format!("#L{n}");
            let failures: Vec<_> = loaded
                .failures
                .iter()
                .filter(|f| f.line == Some(n as i64))
                .collect();
            let here = loaded
                .episodes
                .iter()
                .filter(|e| e.source_uri.ends_with(&fragment))
                .count();
            match want {
                Expected::Episode(e) => {
                    prop_assert!(failures.is_empty(), "line {n} failed: {failures:?}");
                    check_episode(&loaded, &fragment, e)?;
                    episodes += 1;
                }
                Expected::Failure(words) => {
                    prop_assert_eq!(here, 0, "line {} should fail", n);
                    prop_assert_eq!(failures.len(), 1, "line {} should fail once", n);
                    prop_assert!(
                        failures[0].reason.contains(words.as_str()),
                        "line {n}: reason {:?} should mention {words:?}",
                        failures[0].reason
                    );
                }
                Expected::Skip => prop_assert_eq!(here + failures.len(), 0),
                Expected::Any => {
                    prop_assert_eq!(here + failures.len(), 1, "line {}", n);
                    episodes += here;
                }
            }
        }
        prop_assert_eq!(loaded.episodes.len(), episodes);
        // Error columns count characters: at most one past the line's end.
        for (n, chars) in cut_lines {
            let reason = loaded
                .failures
                .iter()
                .find(|f| f.line == Some(n as i64))
                .map(|f| f.reason.clone())
                .unwrap_or_default();
            let column: Option<usize> = reason
                .rsplit_once(" at column ")
                .and_then(|(_, c)| c.parse().ok());
            prop_assert!(
                column.is_some_and(|c| (1..=chars + 1).contains(&c)),
                "line {n} of {chars} characters: {reason:?}"
            );
        }
        prop_assert!(
            loaded.failures.iter().all(|f| f
                .line
                .is_some_and(|l| l >= 1 && l as usize <= expected.len())),
            "every failure has a line of the file: {:?}",
            loaded.failures
        );
        Ok(())
    });
}

/// What happens to a whole JSON file.
#[derive(Debug, Clone)]
enum JsonFile {
    /// The items as an array, one item per line.
    Array(Vec<Rec>),
    /// One record alone (not in an array).
    Single(ValidRecord),
    /// The array cut before its closing bracket.
    Truncated(Vec<Rec>, usize),
    /// `@` before the closing brace of item `k`, after a value.
    Garbage(Vec<Rec>, usize),
    /// Bytes that are not UTF-8 in item `k`.
    InvalidUtf8(Vec<Rec>, usize, usize, Vec<u8>),
    /// A top-level value that is not an array or an object.
    Scalar(WrongValue),
}

fn json_file() -> impl Strategy<Value = JsonFile> {
    // Huge items are costly in a whole-file parse; keep them rare.
    let items = || prop::collection::vec(rec(), 0..16);
    prop_oneof![
        4 => items().prop_map(JsonFile::Array),
        1 => valid_record().prop_map(JsonFile::Single),
        1 => (items(), any::<usize>()).prop_map(|(i, at)| JsonFile::Truncated(i, at)),
        2 => (prop::collection::vec(rec(), 1..16), any::<usize>())
            .prop_map(|(i, k)| JsonFile::Garbage(i, k)),
        1 => (prop::collection::vec(rec(), 1..16), any::<usize>(), any::<usize>(), invalid_utf8())
            .prop_map(|(i, k, at, b)| JsonFile::InvalidUtf8(i, k, at, b)),
        1 => prop::sample::select(vec![WrongValue::Bool, WrongValue::Num]).prop_map(JsonFile::Scalar),
    ]
}

/// The array text with item `k` on line `k + 2`.
fn json_array(items: &[String]) -> String {
    format!("[\n{}\n]\n", items.join(",\n"))
}

/// A whole-file failure: (line, words of the reason).
type FileFailure = (Option<usize>, String);

fn first_deep(items: &[Rec], before: usize) -> Option<usize> {
    items[..before]
        .iter()
        .position(|r| matches!(r, Rec::Deep { .. }))
}

#[test]
fn fuzz_json_files_fail_whole_at_the_right_line_or_per_item() {
    let rt = runtime();
    let root = "memory://fuzz-source-json/";
    let spec = source_spec(
        &format!("{root}case/"),
        "json",
        &format!("max_record_bytes = {RECORD_MAX}"),
    );
    check(48, 2, (json_file(), any::<bool>()), |(file, bom)| {
        let render = |items: &[Rec]| -> (Vec<String>, Vec<Expected>) {
            items.iter().map(Rec::render).unzip()
        };
        // (bytes, per-item expectations, or one failure for the file)
        let (text_bytes, per_item, whole): (Vec<u8>, Vec<Expected>, Option<FileFailure>) =
            match &file {
                JsonFile::Array(items) => {
                    let (texts, expected) = render(items);
                    let whole = first_deep(items, items.len())
                        .map(|k| (Some(k + 2), "recursion limit".to_string()));
                    (json_array(&texts).into_bytes(), expected, whole)
                }
                JsonFile::Single(r) => {
                    let text = Value::Object(r.value()).to_string();
                    (text.into_bytes(), vec![r.expected()], None)
                }
                JsonFile::Truncated(items, at) => {
                    let (texts, _) = render(items);
                    let text = json_array(&texts);
                    let close = text.rfind(']').expect("closing bracket");
                    let mut cut = at % close.max(1);
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    let words = if text[..cut].trim().is_empty() {
                        "file is empty"
                    } else {
                        "malformed JSON"
                    };
                    (
                        text.as_bytes()[..cut].to_vec(),
                        vec![],
                        Some((None, words.into())),
                    )
                }
                JsonFile::Garbage(items, k) => {
                    let k = k % items.len();
                    let (mut texts, _) = render(items);
                    let whole = match first_deep(items, k + 1) {
                        Some(d) => (Some(d + 2), "recursion limit".to_string()),
                        None => {
                            // After the last value of an object or array, `@`
                            // is never valid; scalars are replaced by an
                            // object first.
                            let t = &mut texts[k];
                            if !t.ends_with('}') && !t.ends_with(']') {
                                *t = r#"{"content":"x"}"#.into();
                            }
                            let last = t.len() - 1;
                            t.insert(last, '@');
                            (Some(k + 2), "malformed JSON".to_string())
                        }
                    };
                    (json_array(&texts).into_bytes(), vec![], Some(whole))
                }
                JsonFile::InvalidUtf8(items, k, at, bytes) => {
                    let k = k % items.len();
                    let (texts, _) = render(items);
                    // `[\n`, then each item followed by `,\n`.
                    let item_start = 2 + texts[..k].iter().map(|t| t.len() + 2).sum::<usize>();
                    let text = json_array(&texts);
                    let within = at % (texts[k].len() + 1);
                    let (out, _) = insert_at_boundary(&text, item_start + within, bytes);
                    (
                        out,
                        vec![],
                        Some((Some(k + 2), "not valid UTF-8".to_string())),
                    )
                }
                JsonFile::Scalar(w) => (
                    w.value().to_string().into_bytes(),
                    vec![],
                    Some((Some(1), "not a JSON array of records".to_string())),
                ),
            };
        let mut bytes = Vec::new();
        if bom {
            bytes.extend_from_slice("\u{feff}".as_bytes());
        }
        bytes.extend_from_slice(&text_bytes);
        put_case(&rt, root, "records.json", bytes);
        let loaded = load(&rt, &spec)?;
        check_failures_are_clear(&loaded.failures, "records.json")?;
        if let Some((line, words)) = whole {
            prop_assert_eq!(loaded.episodes.len(), 0);
            prop_assert_eq!(loaded.failures.len(), 1, "{:?}", loaded.failures);
            let f = &loaded.failures[0];
            prop_assert!(
                f.reason.contains(words.as_str()),
                "reason {:?} should mention {words:?}",
                f.reason
            );
            if let Some(line) = line {
                prop_assert_eq!(f.line, Some(line as i64), "line of {:?}", f.reason);
            }
            return Ok(());
        }
        let single = matches!(file, JsonFile::Single(_));
        let mut episodes = 0;
        for (k, want) in per_item.iter().enumerate() {
            let line = if single { 1 } else { k + 2 };
            let fragment = format!("#{k}");
            let failures: Vec<_> = loaded
                .failures
                .iter()
                .filter(|f| f.line == Some(line as i64))
                .collect();
            match want {
                Expected::Episode(e) => {
                    prop_assert!(failures.is_empty(), "item {k} failed: {failures:?}");
                    check_episode(&loaded, &fragment, e)?;
                    episodes += 1;
                }
                Expected::Failure(words) => {
                    prop_assert_eq!(failures.len(), 1, "item {} should fail once", k);
                    prop_assert!(
                        failures[0].reason.contains(words.as_str()),
                        "item {k}: reason {:?} should mention {words:?}",
                        failures[0].reason
                    );
                }
                Expected::Skip | Expected::Any => unreachable!("records are never blank"),
            }
        }
        prop_assert_eq!(loaded.episodes.len(), episodes);
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// Source records: text
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Word {
    Short(String),
    /// A word longer than any chunk: `n` copies of one character.
    Long(usize, char),
}

#[derive(Debug, Clone)]
struct TextCase {
    words: Vec<(Word, &'static str)>,
    chunk_tokens: usize,
    overlap: usize,
    max: usize,
    /// Bytes that are not UTF-8 before word `k`.
    invalid: Option<(usize, Vec<u8>)>,
    bom: bool,
}

fn text_case() -> impl Strategy<Value = TextCase> {
    let word = prop_oneof![
        8 => "[a-zA-Z0-9.,!?;:'\"()_*\u{e9}\u{fc}\u{6f22}\u{5b57}\u{1f642}\u{301}-]{1,10}"
            .prop_map(Word::Short),
        1 => (50usize..1500, prop::sample::select(vec!['w', '\u{e9}', '\u{1f642}']))
            .prop_map(|(n, c)| Word::Long(n, c)),
    ];
    let sep = prop::sample::select(vec![
        " ", " ", " ", "\n", "\n\n", "\t", "  \n  ", "\r\n", "\r\n\r\n", "\u{2003}", ". ",
    ]);
    (
        prop::collection::vec((word, sep), 0..300),
        1usize..=64,
        any::<usize>(),
        16usize..=4096,
        prop::option::of((any::<usize>(), invalid_utf8())),
        any::<bool>(),
    )
        .prop_map(
            |(words, chunk_tokens, overlap, max, invalid, bom)| TextCase {
                words,
                chunk_tokens,
                overlap: overlap % chunk_tokens,
                max,
                invalid,
                bom,
            },
        )
}

/// Byte ranges of the whitespace-separated words of `text`.
fn word_ranges(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// The chunker's promises: chunks are slices of the text that start and end
/// at word boundaries, in order, cover every word, and hold at most the
/// chunk size unless they are a single longer word.
fn check_chunks(text: &str, chunks: &[&str], chunk_tokens: usize) -> Result<(), TestCaseError> {
    let words = word_ranges(text);
    let limit = chunk_tokens * 4;
    let base = text.as_ptr() as usize;
    let mut last_start = None;
    let mut covered = vec![false; words.len()];
    for c in chunks {
        let start = c.as_ptr() as usize - base;
        let end = start + c.len();
        prop_assert!(end <= text.len(), "a chunk is not a slice of the text");
        prop_assert!(
            !c.is_empty() && c.trim() == *c,
            "chunk {c:?} has outer whitespace"
        );
        let first = words.iter().position(|w| w.0 == start);
        let last = words.iter().position(|w| w.1 == end);
        let (Some(first), Some(last)) = (first, last) else {
            return Err(TestCaseError::fail(format!(
                "chunk {c:?} does not start and end at word boundaries"
            )));
        };
        prop_assert!(last_start.is_none_or(|s| start > s), "chunks out of order");
        last_start = Some(start);
        covered[first..=last].iter_mut().for_each(|c| *c = true);
        if last > first {
            prop_assert!(
                c.chars().count() <= limit,
                "a chunk of {} words has {} characters, more than {limit}",
                last - first + 1,
                c.chars().count()
            );
        }
    }
    prop_assert!(covered.iter().all(|c| *c), "a word is in no chunk");
    Ok(())
}

#[test]
fn fuzz_text_files_are_chunked_within_bounds_or_fail_with_a_line() {
    let rt = runtime();
    let root = "memory://fuzz-source-text/";
    check(48, 3, text_case(), |case| {
        let mut text = String::new();
        let mut word_starts = Vec::new();
        for (w, sep) in &case.words {
            word_starts.push(text.len());
            match w {
                Word::Short(s) => text.push_str(s),
                Word::Long(n, c) => text.extend(std::iter::repeat_n(*c, *n)),
            }
            text.push_str(sep);
        }
        let chunks = source::chunk_text(&text, case.chunk_tokens, case.overlap);
        check_chunks(&text, &chunks, case.chunk_tokens)?;

        let bom = if case.bom { "\u{feff}" } else { "" };
        let spec = source_spec(
            &format!("{root}case/"),
            "text",
            &format!(
                "chunk_tokens = {}\nchunk_overlap_tokens = {}\nmax_record_bytes = {}",
                case.chunk_tokens, case.overlap, case.max
            ),
        );
        let mut bytes = bom.as_bytes().to_vec();
        let mut invalid_line = None;
        match &case.invalid {
            Some((k, seq)) if !word_starts.is_empty() => {
                let at = word_starts[k % word_starts.len()];
                let (b, at) = insert_at_boundary(&text, at, seq);
                invalid_line = Some(1 + text[..at].matches('\n').count());
                bytes.extend(b);
            }
            _ => bytes.extend_from_slice(text.as_bytes()),
        }
        put_case(&rt, root, "doc.md", bytes);
        let loaded = load(&rt, &spec)?;
        check_failures_are_clear(&loaded.failures, "doc.md")?;
        if let Some(line) = invalid_line {
            prop_assert_eq!(loaded.episodes.len(), 0);
            prop_assert_eq!(loaded.failures.len(), 1);
            let f = &loaded.failures[0];
            prop_assert!(f.reason.contains("not valid UTF-8"), "{}", f.reason);
            prop_assert_eq!(f.line, Some(line as i64));
            return Ok(());
        }
        if text.trim().is_empty() {
            prop_assert_eq!(loaded.failures.len(), 1);
            prop_assert!(loaded.failures[0].reason.contains("file is empty"));
            return Ok(());
        }
        prop_assert_eq!(loaded.episodes.len() + loaded.failures.len(), chunks.len());
        for (k, chunk) in chunks.iter().enumerate() {
            if chunk.len() > case.max {
                let start = chunk.as_ptr() as usize - text.as_ptr() as usize;
                let line = 1 + text[..start].matches('\n').count();
                let found = loaded.failures.iter().find(|f| {
                    f.reason.starts_with(&format!("chunk {k} is "))
                        && f.reason.contains("larger than source.max_record_bytes")
                });
                prop_assert!(found.is_some(), "no failure for chunk {k}");
                prop_assert_eq!(found.and_then(|f| f.line), Some(line as i64));
            } else {
                let e = loaded
                    .episodes
                    .iter()
                    .find(|e| e.source_uri.ends_with(&format!("#chunk{k}")));
                prop_assert_eq!(e.map(|e| e.content.as_str()), Some(*chunk));
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// Source records: Parquet
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum TimeCol {
    None,
    Strings(Vec<Option<String>>),
    Millis(Vec<Option<i64>>),
    Nanos(Vec<Option<i64>>),
    Days(Vec<Option<i32>>),
}

#[derive(Debug, Clone)]
enum Damage {
    None,
    Truncate(usize),
    Flip(usize, u8),
    Random(Vec<u8>),
    Empty,
}

#[derive(Debug, Clone)]
struct ParquetCase {
    content: Vec<Option<String>>,
    /// `content` as an integer column (a type the field cannot take).
    content_ints: bool,
    kind: Option<Vec<Option<String>>>,
    id: Option<Vec<Option<i64>>>,
    time: TimeCol,
    damage: Damage,
}

const PARQUET_MAX: usize = 256;

fn parquet_case() -> impl Strategy<Value = ParquetCase> {
    (1usize..40).prop_flat_map(|n| {
        let content = prop::collection::vec(
            prop::option::of(prop_oneof![
                4 => content_text(),
                1 => Just("  ".to_string()),
                1 => (PARQUET_MAX..PARQUET_MAX * 2).prop_map(|n| "p".repeat(n)),
            ]),
            n,
        );
        let kind = prop::option::of(prop::collection::vec(
            prop::option::of(prop::sample::select(vec![
                "message".to_string(),
                " JSON ".into(),
                "text".into(),
                "".into(),
                "bogus".into(),
            ])),
            n,
        ));
        let id = prop::option::of(prop::collection::vec(prop::option::of(any::<i64>()), n));
        let extreme_i64 = || {
            prop::option::of(prop_oneof![
                any::<i64>(),
                Just(i64::MIN),
                Just(i64::MAX),
                0i64..4_000_000_000_000
            ])
        };
        let time = prop_oneof![
            Just(TimeCol::None),
            prop::collection::vec(
                prop::option::of(prop_oneof![
                    (0i64..4_000_000_000)
                        .prop_map(|s| DateTime::from_timestamp(s, 0).unwrap().to_rfc3339()),
                    any_text(20),
                ]),
                n
            )
            .prop_map(TimeCol::Strings),
            prop::collection::vec(extreme_i64(), n).prop_map(TimeCol::Millis),
            prop::collection::vec(extreme_i64(), n).prop_map(TimeCol::Nanos),
            prop::collection::vec(prop::option::of(any::<i32>()), n).prop_map(TimeCol::Days),
        ];
        let damage = prop_oneof![
            4 => Just(Damage::None),
            2 => any::<usize>().prop_map(Damage::Truncate),
            3 => (any::<usize>(), 1u8..=255).prop_map(|(at, x)| Damage::Flip(at, x)),
            1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(Damage::Random),
            1 => Just(Damage::Empty),
        ];
        (content, prop::bool::weighted(0.05), kind, id, time, damage).prop_map(
            |(content, content_ints, kind, id, time, damage)| ParquetCase {
                content,
                content_ints,
                kind,
                id,
                time,
                damage,
            },
        )
    })
}

impl ParquetCase {
    fn file(&self) -> Vec<u8> {
        let strings = |v: &[Option<String>]| -> ArrayRef {
            Arc::new(StringArray::from(
                v.iter().map(|s| s.as_deref()).collect::<Vec<_>>(),
            ))
        };
        let mut columns: Vec<(&str, ArrayRef)> = Vec::new();
        if self.content_ints {
            columns.push((
                "content",
                Arc::new(Int64Array::from_iter(
                    self.content
                        .iter()
                        .map(|c| c.as_ref().map(|s| s.len() as i64)),
                )),
            ));
        } else {
            columns.push(("content", strings(&self.content)));
        }
        if let Some(k) = &self.kind {
            columns.push(("kind", strings(k)));
        }
        if let Some(id) = &self.id {
            columns.push(("id", Arc::new(Int64Array::from(id.clone()))));
        }
        match &self.time {
            TimeCol::None => {}
            TimeCol::Strings(v) => columns.push(("reference_time", strings(v))),
            TimeCol::Millis(v) => columns.push((
                "reference_time",
                Arc::new(TimestampMillisecondArray::from(v.clone()).with_timezone("+02:00")),
            )),
            TimeCol::Nanos(v) => columns.push((
                "reference_time",
                Arc::new(TimestampNanosecondArray::from(v.clone())),
            )),
            TimeCol::Days(v) => {
                columns.push(("reference_time", Arc::new(Date32Array::from(v.clone()))))
            }
        }
        let batch = RecordBatch::try_from_iter(columns).expect("batch");
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(Vec::new(), batch.schema(), None).expect("writer");
        writer.write(&batch).expect("write");
        let mut bytes = writer.into_inner().expect("close");
        match &self.damage {
            Damage::None => {}
            Damage::Truncate(at) => bytes.truncate(at % bytes.len()),
            Damage::Flip(at, x) => {
                let n = bytes.len();
                bytes[at % n] ^= x;
            }
            Damage::Random(b) => bytes = b.clone(),
            Damage::Empty => bytes.clear(),
        }
        bytes
    }

    /// What row `r` of an undamaged file must give.
    fn expected(&self, r: usize) -> Result<Option<DateTime<Utc>>, &'static str> {
        let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
        let kind = self.kind.as_ref().and_then(|k| k[r].clone());
        let time_text = match &self.time {
            TimeCol::Strings(v) => v[r].clone(),
            _ => None,
        };
        let size = self.content[r].as_ref().map_or(0, String::len)
            + kind.as_ref().map_or(0, String::len)
            + self
                .id
                .as_ref()
                .and_then(|id| id[r])
                .map_or(0, |i| i.to_string().len())
            + time_text.as_ref().map_or(0, String::len);
        if size > PARQUET_MAX {
            return Err("larger than source.max_record_bytes");
        }
        if !blank(&kind) && EpisodeKind::parse(kind.as_deref().unwrap_or_default()).is_none() {
            return Err("kind");
        }
        match &self.content[r] {
            None => return Err("content is missing"),
            Some(c) if c.trim().is_empty() => return Err("content is empty"),
            _ => {}
        }
        Ok(match &self.time {
            TimeCol::None => None,
            TimeCol::Strings(v) => match &v[r] {
                Some(t) if !t.trim().is_empty() => Some(
                    DateTime::parse_from_rfc3339(t.trim())
                        .map_err(|_| "reference_time")?
                        .with_timezone(&Utc),
                ),
                _ => None,
            },
            TimeCol::Millis(v) => v[r].and_then(DateTime::from_timestamp_millis),
            TimeCol::Nanos(v) => v[r].map(DateTime::from_timestamp_nanos),
            TimeCol::Days(v) => {
                v[r].and_then(|d| DateTime::from_timestamp(i64::from(d) * 86_400, 0))
            }
        })
    }
}

#[test]
fn fuzz_parquet_rows_and_damaged_files_never_panic_and_fail_clearly() {
    let rt = runtime();
    let root = "memory://fuzz-source-parquet/";
    let spec = source_spec(
        &format!("{root}case/"),
        "parquet",
        &format!("max_record_bytes = {PARQUET_MAX}"),
    );
    check(48, 4, parquet_case(), |case| {
        put_case(&rt, root, "data.parquet", case.file());
        let loaded = load(&rt, &spec)?;
        check_failures_are_clear(&loaded.failures, "data.parquet")?;
        let rows = case.content.len();
        prop_assert!(loaded.episodes.len() <= rows);
        if !matches!(case.damage, Damage::None) {
            // Damaged files load what they can; the rest is failures.
            prop_assert!(
                loaded.episodes.len() == rows || !loaded.failures.is_empty(),
                "rows went missing without a failure"
            );
            return Ok(());
        }
        if case.content_ints {
            prop_assert_eq!(loaded.failures.len(), 1);
            prop_assert!(
                loaded.failures[0].reason.contains("column `content`"),
                "{}",
                loaded.failures[0].reason
            );
            return Ok(());
        }
        prop_assert_eq!(loaded.episodes.len() + loaded.failures.len(), rows);
        for r in 0..rows {
            let item = format!("data.parquet#{r}");
            let failure = loaded.failures.iter().find(|f| f.item == item);
            let episode = loaded
                .episodes
                .iter()
                .find(|e| e.source_uri.ends_with(&format!("#{r}")));
            match case.expected(r) {
                Ok(time) => {
                    prop_assert!(failure.is_none(), "row {r} failed: {failure:?}");
                    prop_assert!(episode.is_some(), "row {r} gave no episode");
                    let e = episode.expect("checked");
                    prop_assert_eq!(Some(&e.content), case.content[r].as_ref());
                    match time {
                        Some(t) => prop_assert_eq!(e.reference_time, t),
                        None => prop_assert_eq!(e.reference_time_source.as_str(), "file_modified"),
                    }
                }
                Err(words) => {
                    let reason = failure.map(|f| f.reason.as_str()).unwrap_or_default();
                    prop_assert!(
                        reason.contains(words),
                        "row {r}: {reason:?} should mention {words:?}"
                    );
                }
            }
        }
        Ok(())
    });
}

/// Every one-bit flip in a Parquet file's footer that makes the parquet
/// crate panic is a failure of that file, not a failed source: the
/// regression test for "not implemented: Type NONE not supported" and
/// `Option::unwrap()` panics in the reader's metadata decoding (18 of the
/// 2760 flips of this file with parquet 59.3).
#[test]
fn fuzz_parquet_footer_flips_that_panic_the_reader_are_file_failures() {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let rt = runtime();
    let root = "memory://fuzz-source-parquet-footer/";
    let spec = source_spec(&format!("{root}case/"), "parquet", "");
    let case = ParquetCase {
        content: vec![Some("a".into())],
        content_ints: false,
        kind: None,
        id: None,
        time: TimeCol::None,
        damage: Damage::None,
    };
    let file = case.file();
    let n = file.len();
    let footer = u32::from_le_bytes(file[n - 8..n - 4].try_into().expect("4 bytes")) as usize;
    let mut panicking = Vec::new();
    for at in n - 8 - footer..n - 8 {
        for bit in 0..8 {
            let mut damaged = file.clone();
            damaged[at] ^= 1 << bit;
            let read = std::panic::catch_unwind(|| {
                let _ =
                    ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(damaged.clone()));
            });
            if read.is_err() {
                panicking.push(damaged);
            }
        }
    }
    eprintln!(
        "{} of {} footer flips panic the parquet reader (the panic messages printed around this line are expected)",
        panicking.len(),
        footer * 8
    );
    for damaged in panicking {
        put_case(&rt, root, "data.parquet", damaged);
        let loaded = rt
            .block_on(source::load(&spec, "grp", &BTreeMap::new()))
            .expect("a damaged file is a failure of that file");
        assert_eq!(loaded.episodes.len(), 0);
        assert_eq!(loaded.failures.len(), 1, "{:?}", loaded.failures);
        let reason = &loaded.failures[0].reason;
        assert!(
            reason.starts_with("not a readable parquet file: "),
            "{reason}"
        );
    }
}

// ---------------------------------------------------------------------------
// The pipeline spec (TOML)
// ---------------------------------------------------------------------------

fn example_spec() -> String {
    std::fs::read_to_string(crate::common::repo().join("pipelines/procurement.toml"))
        .expect("example spec")
}

/// A TOML value of any type, as text.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|i| i.to_string()),
        Just("18446744073709551616".to_string()),
        Just("-0".to_string()),
        Just("0x7fff_ffff".to_string()),
        any::<f64>().prop_map(|f| if f.is_finite() {
            format!("{f:?}")
        } else {
            "nan".into()
        }),
        Just("inf".to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        "[a-zA-Z0-9 ._/:-]{0,20}".prop_map(|s| format!("{s:?}")),
        any_text(12).prop_map(|s| serde_json::to_string(&s).expect("json string")),
        Just("[1, \"two\", 3.0]".to_string()),
        Just("{ a = 1, b = { c = [] } }".to_string()),
        Just("1979-05-27T07:32:00Z".to_string()),
        Just("\"\"\"multi\nline\"\"\"".to_string()),
    ]
}

#[derive(Debug, Clone)]
enum SpecEdit {
    None,
    Truncate(usize),
    Insert(usize, String),
    DeleteLine(usize),
    DuplicateLine(usize),
    /// A new value for the `key = value` line `k`.
    ReplaceValue(usize, String),
    /// `llm.extra_body` nested this deep as inline tables or arrays.
    DeepInline(usize, bool),
    /// Tables nested this deep: a hierarchy or `llm.extra_body`.
    DeepTable(usize, bool),
    /// A key of `[llm]` set to a value shaped like an API key.
    Secret(usize, String),
    InvalidUtf8(usize, Vec<u8>),
    Arbitrary(String),
}

const LLM_KEYS: &[&str] = &[
    "api_key",
    "key",
    "model",
    "base_url",
    "api_key_env",
    "requests_per_minute",
    "tokens_per_minute",
    "temperature",
    "max_attempts",
    "cache",
    "extra_body",
    "azure_api_version",
    "timeout_secs",
    "price_per_1m_prompt_tokens",
    "api_style",
    "structured_output",
];

fn spec_edit() -> impl Strategy<Value = SpecEdit> {
    prop_oneof![
        1 => Just(SpecEdit::None),
        2 => any::<usize>().prop_map(SpecEdit::Truncate),
        2 => (any::<usize>(), any_text(20)).prop_map(|(at, s)| SpecEdit::Insert(at, s)),
        1 => any::<usize>().prop_map(SpecEdit::DeleteLine),
        1 => any::<usize>().prop_map(SpecEdit::DuplicateLine),
        4 => (any::<usize>(), toml_value()).prop_map(|(k, v)| SpecEdit::ReplaceValue(k, v)),
        1 => (1usize..=10_000, any::<bool>()).prop_map(|(d, a)| SpecEdit::DeepInline(d, a)),
        2 => (1usize..=10_000, any::<bool>()).prop_map(|(d, h)| SpecEdit::DeepTable(d, h)),
        2 => (any::<usize>(), "[A-Za-z0-9]{8,24}").prop_map(|(k, s)| SpecEdit::Secret(k, s)),
        1 => (any::<usize>(), invalid_utf8()).prop_map(|(at, b)| SpecEdit::InvalidUtf8(at, b)),
        1 => any_text(200).prop_map(SpecEdit::Arbitrary),
    ]
}

/// The example spec with `edit` applied, and the secret it holds, if any.
fn edited_spec(base: &str, edit: &SpecEdit) -> (Vec<u8>, Option<String>) {
    let lines: Vec<&str> = base.lines().collect();
    let pick = |k: usize| k % lines.len();
    let joined = |lines: Vec<String>| lines.join("\n").into_bytes();
    let owned = || lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    match edit {
        SpecEdit::None => (base.as_bytes().to_vec(), None),
        SpecEdit::Truncate(at) => {
            let (mut b, at) = insert_at_boundary(base, *at, b"");
            b.truncate(at);
            (b, None)
        }
        SpecEdit::Insert(at, s) => (insert_at_boundary(base, *at, s.as_bytes()).0, None),
        SpecEdit::DeleteLine(k) => {
            let mut l = owned();
            l.remove(pick(*k));
            (joined(l), None)
        }
        SpecEdit::DuplicateLine(k) => {
            let mut l = owned();
            let k = pick(*k);
            l.insert(k, l[k].clone());
            (joined(l), None)
        }
        SpecEdit::ReplaceValue(k, v) => {
            let keyed: Vec<usize> = (0..lines.len())
                .filter(|i| {
                    let l = lines[*i];
                    !l.starts_with('#') && !l.starts_with('[') && l.contains(" = ")
                })
                .collect();
            let i = keyed[k % keyed.len()];
            let mut l = owned();
            let key = lines[i].split(" = ").next().unwrap_or_default();
            l[i] = format!("{key} = {v}");
            (joined(l), None)
        }
        SpecEdit::DeepInline(d, arrays) => {
            let value = if *arrays {
                format!("{{ a = {}1{} }}", "[".repeat(*d), "]".repeat(*d))
            } else {
                format!("{}1{}", "{ a = ".repeat(*d), " }".repeat(*d))
            };
            let l: Vec<String> = lines
                .iter()
                .map(|l| {
                    if l.starts_with("extra_body") {
                        format!("extra_body = {value}")
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            (joined(l), None)
        }
        SpecEdit::DeepTable(d, hierarchy) => {
            let mut l: Vec<String> = owned();
            if *hierarchy {
                l.push(format!(
                    "[ontology.entity_type_hierarchy{}]",
                    ".Contract".repeat(*d)
                ));
            } else {
                l.retain(|l| !l.starts_with("extra_body"));
                l.push(format!("[llm.extra_body{}]", ".a".repeat(*d)));
                l.push("x = 1".into());
            }
            (joined(l), None)
        }
        SpecEdit::Secret(k, s) => {
            let key = LLM_KEYS[k % LLM_KEYS.len()];
            let secret = format!("sk-proj-{s}");
            let mut l: Vec<String> = Vec::new();
            let mut in_llm = false;
            for line in &lines {
                if line.starts_with('[') {
                    in_llm = *line == "[llm]";
                }
                if in_llm && line.starts_with(&format!("{key} =")) {
                    continue;
                }
                l.push(line.to_string());
                if *line == "[llm]" {
                    let value = match (k / LLM_KEYS.len()) % 6 {
                        0 => format!("\"{secret}\""),
                        1 => format!("'{secret}'"),
                        2 => secret.clone(),
                        3 => format!("[\"{secret}\"]"),
                        4 => format!("{{ k = \"{secret}\" }}"),
                        _ => format!("\"\"\"{secret}\"\"\""),
                    };
                    l.push(format!("{key} = {value}"));
                }
            }
            (joined(l), Some(secret))
        }
        SpecEdit::InvalidUtf8(at, b) => (insert_at_boundary(base, *at, b).0, None),
        SpecEdit::Arbitrary(s) => (s.clone().into_bytes(), None),
    }
}

/// Ontology errors list every issue with its path into the spec.
fn check_ontology_error(e: &OntologyError) -> Result<(), TestCaseError> {
    let OntologyError::Invalid(issues) = e else {
        return Err(TestCaseError::fail(format!(
            "an ontology error other than Invalid: {e}"
        )));
    };
    prop_assert!(!issues.is_empty(), "an invalid ontology with no issue");
    for i in issues {
        prop_assert!(i.path.starts_with("ontology."), "issue path {:?}", i.path);
        prop_assert!(!i.message.trim().is_empty(), "issue without a message");
    }
    prop_assert!(e.to_string().starts_with("invalid ontology ("));
    Ok(())
}

/// A spec error names the file and either a key or a line and column
/// within the text.
fn check_spec_error(e: &SpecError, text: &str) -> Result<(), TestCaseError> {
    let shown = e.to_string();
    match e {
        SpecError::Read { .. } => {
            prop_assert!(shown.starts_with("cannot read pipeline spec "), "{shown}");
        }
        SpecError::Parse { message, .. } => {
            prop_assert!(shown.starts_with("invalid pipeline spec "), "{shown}");
            prop_assert!(!message.trim().is_empty(), "empty parse error");
            if let Some(rest) = message.strip_prefix("line ") {
                let (line, rest) = rest.split_once(", column ").expect("line, column");
                let column: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let line: usize = line.parse().expect("a line number");
                let column: usize = column.parse().expect("a column number");
                let lines = text.split('\n').count();
                prop_assert!(
                    (1..=lines).contains(&line) && column >= 1,
                    "position line {line}, column {column} is outside the text of {lines} lines"
                );
            }
        }
        SpecError::Value { key, message, .. } => {
            prop_assert!(!key.is_empty() && !message.trim().is_empty(), "{shown}");
            prop_assert!(shown.contains(&format!("`{key}`")), "{shown}");
        }
        other => prop_assert!(false, "a spec error of no known kind: {other}"),
    }
    Ok(())
}

#[test]
fn fuzz_pipeline_spec_edits_parse_or_fail_with_a_position_and_no_secret() {
    let base = example_spec();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("test.toml");
    check(96, 5, spec_edit(), |edit| {
        let (bytes, secret) = edited_spec(&base, &edit);
        // Through the file, as the command line reads it (bytes that are
        // not UTF-8 included).
        std::fs::write(&path, &bytes).expect("write spec");
        let parsed = PipelineSpec::from_path(&path);
        let text = String::from_utf8_lossy(&bytes);
        match &parsed {
            Ok(spec) => match Ontology::try_from(&spec.ontology) {
                Ok(_) => {}
                Err(e) => check_ontology_error(&e)?,
            },
            Err(e) => {
                check_spec_error(e, &text)?;
                prop_assert!(
                    !matches!(edit, SpecEdit::None),
                    "the example spec must parse: {e}"
                );
                if let Some(secret) = &secret {
                    prop_assert!(
                        !e.to_string()
                            .contains(secret.trim_start_matches("sk-proj-")),
                        "the error shows the secret: {e}"
                    );
                }
            }
        }
        if matches!(edit, SpecEdit::InvalidUtf8(..)) {
            let e = parsed
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            prop_assert!(e.contains("UTF-8") && e.contains("test.toml"), "{e}");
        }
        if let (SpecEdit::None, Ok(spec)) = (&edit, &parsed) {
            let ontology = Ontology::try_from(&spec.ontology).expect("example ontology");
            prop_assert_eq!(ontology.entity_types.len(), 7);
        }
        Ok(())
    });
}

/// Keys with an integer range: (section, key, smallest, largest).
const INT_KEYS: &[(&str, &str, i128, i128)] = &[
    ("llm", "requests_per_minute", 1, u32::MAX as i128),
    ("llm", "max_attempts", 1, u32::MAX as i128),
    ("llm", "max_concurrency", 1, u32::MAX as i128),
    ("llm", "timeout_secs", 1, i64::MAX as i128),
    ("output", "lock_stale_after_secs", 1, i64::MAX as i128),
    ("source", "chunk_tokens", 1, 1_000_000),
    ("source", "max_record_bytes", 1, 1 << 30),
    ("extract", "entity_max_tokens", 64, u32::MAX as i128),
    ("extract", "context_chars", 0, i64::MAX as i128),
];

fn int_of(spec: &PipelineSpec, key: &str) -> i128 {
    let source = spec.source.as_ref().expect("source");
    match key {
        "requests_per_minute" => spec.llm.requests_per_minute.into(),
        "max_attempts" => spec.llm.max_attempts.into(),
        "max_concurrency" => spec.llm.max_concurrency.into(),
        "timeout_secs" => spec.llm.timeout_secs.into(),
        "lock_stale_after_secs" => spec.output.lock_stale_after_secs.into(),
        "chunk_tokens" => source.chunk_tokens as i128,
        "max_record_bytes" => source.max_record_bytes as i128,
        "entity_max_tokens" => spec.extract.entity_max_tokens.into(),
        "context_chars" => spec.extract.context_chars as i128,
        other => panic!("no accessor for {other}"),
    }
}

/// How an integer is written.
#[derive(Debug, Clone, Copy)]
enum IntForm {
    Plain,
    Plus,
    Underscores,
    Hex,
}

fn render_int(v: i64, form: IntForm) -> String {
    match form {
        IntForm::Plus if v >= 0 => format!("+{v}"),
        IntForm::Hex if v >= 0 => format!("0x{v:x}"),
        IntForm::Underscores => {
            let digits = v.unsigned_abs().to_string();
            let mut out = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i).is_multiple_of(3) {
                    out.push('_');
                }
                out.push(c);
            }
            if v < 0 { format!("-{out}") } else { out }
        }
        _ => v.to_string(),
    }
}

#[test]
fn fuzz_spec_numbers_round_trip_or_fail_naming_the_key_or_line() {
    let int_value = prop_oneof![
        any::<i64>(),
        -5i64..70,
        Just(u32::MAX as i64),
        Just(u32::MAX as i64 + 1),
        Just(1 << 30),
        Just((1 << 30) + 1),
        Just(1_000_000),
        Just(1_000_001),
    ];
    let form = prop::sample::select(vec![
        IntForm::Plain,
        IntForm::Plus,
        IntForm::Underscores,
        IntForm::Hex,
    ]);
    let temperature = prop_oneof![
        0.0f64..=2.0,
        -10.0f64..10.0,
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-0.0),
    ];
    let strategy = (
        0..INT_KEYS.len(),
        int_value,
        form,
        temperature,
        any::<bool>(),
    );
    check(256, 6, strategy, |(k, v, form, t, wrong_type)| {
        let (section, key, min, max) = INT_KEYS[k];
        let value = if wrong_type {
            format!("\"{v}\"")
        } else {
            render_int(v, form)
        };
        let t_text = if t.is_nan() {
            "nan".to_string()
        } else if t.is_infinite() {
            "inf".to_string()
        } else {
            format!("{t:?}")
        };
        let mut sections: Vec<(&str, Vec<String>)> = vec![
            (
                "source",
                vec![
                    "url = \"memory://fuzz-spec/\"".into(),
                    "chunk_overlap_tokens = 0".into(),
                ],
            ),
            ("output", vec!["graph = \"memory://fuzz-graph/\"".into()]),
            ("llm", vec![format!("temperature = {t_text}")]),
            ("extract", vec![]),
        ];
        let mut key_line = 0;
        let mut text = String::new();
        for (name, entries) in sections.iter_mut() {
            text.push_str(&format!("[{name}]\n"));
            if *name == section {
                key_line = text.matches('\n').count() + 1;
                entries.insert(0, format!("{key} = {value}"));
            }
            for e in entries.iter() {
                text.push_str(e);
                text.push('\n');
            }
        }
        let temperature_line = text
            .lines()
            .position(|l| l.starts_with("temperature"))
            .expect("temperature line")
            + 1;
        let parsed = PipelineSpec::from_toml(&text, Path::new("test.toml"));
        let int_ok = !wrong_type && (min..=max).contains(&(v as i128));
        let t_ok = (0.0..=2.0).contains(&t);
        match (&parsed, int_ok && t_ok) {
            (Ok(spec), true) => {
                prop_assert_eq!(int_of(spec, key), v as i128);
                prop_assert_eq!(spec.llm.temperature, t);
            }
            (Ok(_), false) => {
                return Err(TestCaseError::fail(format!(
                    "{key} = {value} with temperature {t_text} should be rejected"
                )));
            }
            (Err(e), true) => {
                return Err(TestCaseError::fail(format!("valid spec rejected: {e}")));
            }
            (Err(e), false) => {
                check_spec_error(e, &text)?;
                let shown = e.to_string();
                let names_int = shown.contains(&format!("line {key_line},"))
                    || shown.contains(&format!("`{section}.{key}`"));
                let names_t = shown.contains(&format!("line {temperature_line},"))
                    || shown.contains("`llm.temperature`");
                prop_assert!(
                    (!int_ok && names_int) || (!t_ok && names_t),
                    "the error names neither the key nor its line: {shown}"
                );
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// The ontology
// ---------------------------------------------------------------------------

const ENTITY_NAMES: &[&str] = &[
    "Person",
    "Company",
    "Contract",
    "MSA",
    "OrderForm",
    "Entity",
    "entity",
    "Bad Name",
    "",
    "9lives",
    "\u{dc}nicode",
    "A_1",
    "T",
];
const EDGE_NAMES: &[&str] = &[
    "EMPLOYED_BY",
    "WORKS_FOR",
    "employed_by",
    "Bad",
    "",
    "X1",
    "_X",
    "PARTY_TO",
];
const PROPERTY_NAMES: &[&str] = &[
    "role", "email", "name", "Name", "uuid", "fact", "bad name", "", "x", "x", "_ok", "1st",
];

fn hierarchy(names: &'static [&'static str]) -> impl Strategy<Value = Hierarchy> {
    Just(Hierarchy::default()).prop_recursive(7, 64, 12, move |inner| {
        prop::collection::vec((prop::sample::select(names), inner), 0..13).prop_map(|v| {
            // One entry per name at a level, as a TOML table has.
            let mut seen = std::collections::HashSet::new();
            Hierarchy(
                v.into_iter()
                    .filter(|(k, _)| seen.insert(*k))
                    .map(|(k, h)| (k.to_string(), h))
                    .collect(),
            )
        })
    })
}

fn properties() -> impl Strategy<Value = Vec<PropertySpec>> {
    let kind = prop::sample::select(vec![
        PropertyType::Text,
        PropertyType::Int,
        PropertyType::Float,
        PropertyType::Bool,
        PropertyType::Date,
    ]);
    prop::collection::vec(
        (prop::sample::select(PROPERTY_NAMES), kind, any_text(6)).prop_map(|(n, kind, d)| {
            PropertySpec {
                name: n.to_string(),
                kind,
                description: d,
                may_change: false,
                pattern: None,
            }
        }),
        0..4,
    )
}

fn description() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["", "  ", "A type.", "Ein Typ \u{2014} mit Text."])
        .prop_map(str::to_string)
}

fn ontology_spec() -> impl Strategy<Value = OntologySpec> {
    let entity = (
        prop::sample::select(ENTITY_NAMES),
        description(),
        properties(),
        prop::collection::vec(prop::sample::select(PROPERTY_NAMES), 0..3),
    )
        .prop_map(|(n, d, p, ids)| EntityTypeSpec {
            name: n.to_string(),
            description: d,
            properties: p,
            identity_properties: ids.into_iter().map(str::to_string).collect(),
        });
    let many = (95usize..=110).prop_map(|n| {
        (0..n)
            .map(|i| EntityTypeSpec {
                name: format!("T{i}"),
                description: "A type.".into(),
                properties: vec![],
                identity_properties: vec![],
            })
            .collect::<Vec<_>>()
    });
    let entities = prop_oneof![
        6 => prop::collection::vec(entity, 0..14),
        1 => many,
    ];
    let edge = (
        prop::sample::select(EDGE_NAMES),
        description(),
        properties(),
        prop::collection::vec(
            (
                prop::sample::select(ENTITY_NAMES),
                prop::sample::select(ENTITY_NAMES),
            ),
            0..3,
        ),
    )
        .prop_map(|(n, d, p, st)| EdgeTypeSpec {
            name: n.to_string(),
            description: d,
            properties: p,
            source_targets: st
                .into_iter()
                .map(|(s, t)| SourceTarget {
                    source: s.to_string(),
                    target: t.to_string(),
                })
                .collect(),
        });
    (
        any::<bool>(),
        entities,
        prop::collection::vec(edge, 0..6),
        hierarchy(ENTITY_NAMES),
        hierarchy(EDGE_NAMES),
    )
        .prop_map(|(strict, entity_types, edge_types, eh, xh)| OntologySpec {
            strict,
            entity_types,
            edge_types,
            entity_type_hierarchy: eh,
            edge_type_hierarchy: xh,
        })
}

#[derive(Serialize)]
struct SpecDoc<'a> {
    output: BTreeMap<&'static str, &'static str>,
    ontology: &'a OntologySpec,
}

fn ontology_toml(spec: &OntologySpec) -> String {
    toml::to_string(&SpecDoc {
        output: BTreeMap::from([("graph", "memory://fuzz-ontology/")]),
        ontology: spec,
    })
    .expect("an ontology serialises to TOML")
}

/// What a valid ontology promises: every declared type is in its tree once,
/// with a chain of declared types from its top-level type, within the
/// limits, and labels that include every parent.
fn check_valid_ontology(o: &Ontology, spec: &OntologySpec) -> Result<(), TestCaseError> {
    for t in &spec.entity_types {
        let node = o.entity_tree.get(&t.name);
        prop_assert!(
            node.is_some(),
            "declared type {} is not in the tree",
            t.name
        );
        let node = node.expect("checked");
        prop_assert!(node.depth <= 5 && node.children.len() <= 10);
        let labels = o.labels_for(&t.name).expect("labels of a declared type");
        prop_assert_eq!(labels.first().map(String::as_str), Some("Entity"));
        prop_assert_eq!(labels.last(), Some(&t.name));
        prop_assert_eq!(labels.len(), node.depth + 1);
        for pair in labels[1..].windows(2) {
            let child = o
                .entity_tree
                .get(&pair[1])
                .expect("a chain of declared types");
            prop_assert_eq!(child.parent.as_ref(), Some(&pair[0]));
        }
        prop_assert!(!t.name.eq_ignore_ascii_case("Entity"));
    }
    prop_assert_eq!(o.entity_tree.len(), o.entity_types.len());
    prop_assert!(o.entity_types.len() <= 100);
    for t in &spec.edge_types {
        let chain = o.edge_tree.chain(&t.name);
        prop_assert!(chain.is_some_and(|c| c.last() == Some(&t.name)));
    }
    let closure = o.entity_tree.closure();
    for t in &spec.entity_types {
        prop_assert!(closure.contains(&(t.name.clone(), t.name.clone(), 0)));
    }
    Ok(())
}

#[test]
fn fuzz_ontologies_round_trip_through_toml_and_validate_with_paths() {
    check(128, 7, ontology_spec(), |spec| {
        let text = ontology_toml(&spec);
        let parsed = PipelineSpec::from_toml(&text, Path::new("test.toml")).map_err(|e| {
            TestCaseError::fail(format!("serialised ontology rejected: {e}\n{text}"))
        })?;
        prop_assert_eq!(
            serde_json::to_value(&parsed.ontology).expect("json"),
            serde_json::to_value(&spec).expect("json"),
            "the ontology changed on its way through TOML"
        );
        match Ontology::try_from(&parsed.ontology) {
            Ok(o) => check_valid_ontology(&o, &spec)?,
            Err(e) => check_ontology_error(&e)?,
        }
        Ok(())
    });
}

/// A tree shape: the subtypes of one type.
#[derive(Debug, Clone)]
struct Shape(Vec<Shape>);

fn shape_size(s: &Shape) -> usize {
    1 + s.0.iter().map(shape_size).sum::<usize>()
}

#[test]
fn fuzz_valid_ontologies_are_accepted_with_the_tree_as_written() {
    let shape = Just(Shape(vec![])).prop_recursive(4, 40, 10, |inner| {
        prop::collection::vec(inner, 0..=10).prop_map(Shape)
    });
    let forest = prop::collection::vec(shape, 1..6).prop_filter("at most 100 types", |f| {
        f.iter().map(shape_size).sum::<usize>() <= 100
    });
    check(64, 8, (forest, any::<bool>()), |(forest, list_leaves)| {
        let mut types = Vec::new();
        // (type, parent)
        let mut parents: Vec<(String, Option<String>)> = Vec::new();
        fn place(
            s: &Shape,
            parent: Option<&str>,
            parents: &mut Vec<(String, Option<String>)>,
        ) -> (String, Hierarchy) {
            let name = format!("T{}", parents.len());
            parents.push((name.clone(), parent.map(str::to_string)));
            let children = s.0.iter().map(|c| place(c, Some(&name), parents)).collect();
            (name, Hierarchy(children))
        }
        let mut top = Vec::new();
        for s in &forest {
            let (name, sub) = place(s, None, &mut parents);
            if list_leaves || !sub.0.is_empty() {
                top.push((name, sub));
            }
        }
        for (name, _) in &parents {
            types.push(EntityTypeSpec {
                name: name.clone(),
                description: format!("The type {name}."),
                properties: vec![PropertySpec {
                    name: "code".into(),
                    kind: PropertyType::Text,
                    description: String::new(),
                    may_change: false,
                    pattern: None,
                }],
                identity_properties: vec!["code".into()],
            });
        }
        let spec = OntologySpec {
            strict: false,
            entity_types: types,
            edge_types: vec![EdgeTypeSpec {
                name: "RELATES_TO".into(),
                description: "Any relation.".into(),
                properties: vec![],
                source_targets: vec![SourceTarget {
                    source: parents[0].0.clone(),
                    target: "Entity".into(),
                }],
            }],
            entity_type_hierarchy: Hierarchy(top),
            edge_type_hierarchy: Hierarchy::default(),
        };
        let parsed = PipelineSpec::from_toml(&ontology_toml(&spec), Path::new("test.toml"))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let o = Ontology::try_from(&parsed.ontology)
            .map_err(|e| TestCaseError::fail(format!("a valid ontology was rejected: {e}")))?;
        check_valid_ontology(&o, &spec)?;
        for (name, parent) in &parents {
            prop_assert_eq!(&o.entity_tree.get(name).expect("placed").parent, parent);
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// `graphloom add` lines
// ---------------------------------------------------------------------------

const ADD_ONTOLOGY: &str = r#"
[output]
graph = "memory://fuzz-add-graph/"

[[ontology.entity_types]]
name = "Person"
description = "A person."
properties = [{ name = "age", type = "int" }, { name = "born", type = "date" }]

[[ontology.entity_types]]
name = "Company"
description = "A company."
properties = [{ name = "domain", type = "text" }]

[[ontology.edge_types]]
name = "EMPLOYED_BY"
description = "A person works for a company."
source_targets = [{ source = "Person", target = "Company" }]
"#;

#[derive(Debug, Clone, Copy, PartialEq)]
enum NodeType {
    Person,
    Company,
    Untyped,
}

#[derive(Debug, Clone)]
enum BadNode {
    UnknownType,
    NotAProperty,
    WrongKind,
    BadDate,
    EmptyName,
}

#[derive(Debug, Clone)]
enum BadFact {
    Lowercase,
    InvalidBeforeValid,
    BadTime,
    Disallowed,
    SameNode,
    EmptyText,
    UnknownEndpointType,
}

#[derive(Debug, Clone)]
enum AddLine {
    Node(NodeType, Option<i64>),
    /// A node with a summary this long (graphloom add has no line limit).
    Huge(usize),
    /// A fact from an earlier Person (or a new one) to an earlier Company
    /// (or a new one), or an undeclared relation between any two.
    Fact {
        employed: bool,
        source: usize,
        target: usize,
        valid_at: Option<u16>,
    },
    BadNode(BadNode),
    BadFact(BadFact),
    Both,
    Neither,
    UnknownField,
    NotJson(String),
    Truncated(usize),
    InvalidUtf8(usize, Vec<u8>),
    Deep(usize),
    WrongType,
    Blank,
}

fn add_line() -> impl Strategy<Value = AddLine> {
    let node_type =
        prop::sample::select(vec![NodeType::Person, NodeType::Company, NodeType::Untyped]);
    let bad_node = prop::sample::select(vec![
        BadNode::UnknownType,
        BadNode::NotAProperty,
        BadNode::WrongKind,
        BadNode::BadDate,
        BadNode::EmptyName,
    ]);
    let bad_fact = prop::sample::select(vec![
        BadFact::Lowercase,
        BadFact::InvalidBeforeValid,
        BadFact::BadTime,
        BadFact::Disallowed,
        BadFact::SameNode,
        BadFact::EmptyText,
        BadFact::UnknownEndpointType,
    ]);
    prop_oneof![
        6 => (node_type, prop::option::of(any::<i64>())).prop_map(|(t, a)| AddLine::Node(t, a)),
        1 => (100_000usize..300_000).prop_map(AddLine::Huge),
        5 => (any::<bool>(), any::<usize>(), any::<usize>(), prop::option::of(1900u16..2100))
            .prop_map(|(employed, source, target, valid_at)| AddLine::Fact { employed, source, target, valid_at }),
        3 => bad_node.prop_map(AddLine::BadNode),
        3 => bad_fact.prop_map(AddLine::BadFact),
        1 => Just(AddLine::Both),
        1 => Just(AddLine::Neither),
        1 => Just(AddLine::UnknownField),
        1 => any_text(40).prop_map(|s| AddLine::NotJson(s.replace(['\n', '{', '['], " "))),
        1 => any::<usize>().prop_map(AddLine::Truncated),
        1 => (any::<usize>(), invalid_utf8()).prop_map(|(at, b)| AddLine::InvalidUtf8(at, b)),
        1 => (200usize..=10_000).prop_map(AddLine::Deep),
        1 => Just(AddLine::WrongType),
        1 => Just(AddLine::Blank),
    ]
}

/// The oracle's view of the nodes a file creates.
#[derive(Default)]
struct AddState {
    /// (name, type) of every node so far, in order.
    nodes: Vec<(String, &'static str)>,
    implicit: usize,
    edges: usize,
}

impl AddState {
    fn has(&self, name: &str, t: &str) -> bool {
        self.nodes.iter().any(|(n, nt)| n == name && *nt == t)
    }

    /// An earlier node of type `t`, or a new name.
    fn endpoint(&self, t: &'static str, pick: usize, fresh: String) -> String {
        let of_type: Vec<&String> = self
            .nodes
            .iter()
            .filter(|(_, nt)| *nt == t)
            .map(|(n, _)| n)
            .collect();
        if of_type.is_empty() || pick.is_multiple_of(3) {
            fresh
        } else {
            of_type[pick % of_type.len()].clone()
        }
    }
}

fn node_json(name: &str, t: NodeType, age: Option<i64>) -> Value {
    let mut node = json!({"name": name});
    match t {
        NodeType::Person => {
            node["type"] = json!("Person");
            node["attributes"] = json!({"age": age, "born": "1990-02-03"});
        }
        NodeType::Company => {
            node["type"] = json!("Company");
            node["attributes"] = json!({"domain": "example.com"});
        }
        NodeType::Untyped => {
            node["attributes"] = json!({"anything": [1, {"goes": true}]});
        }
    }
    json!({ "node": node })
}

impl AddLine {
    /// The line, and the words of its failure (None: it loads).
    fn render(&self, n: usize, state: &mut AddState) -> (Vec<u8>, Option<&'static str>) {
        let text = |v: Value| v.to_string().into_bytes();
        let fact = |s: &str, st: &str, t: &str, tt: &str, rel: &str, extra: Value| {
            let mut f = json!({"source": s, "source_type": st, "target": t, "target_type": tt,
                               "relation_type": rel, "fact": format!("{s} and {t}.")});
            if let Value::Object(m) = extra {
                for (k, v) in m {
                    f[k] = v;
                }
            }
            json!({ "fact": f })
        };
        match self {
            AddLine::Node(t, age) => {
                let name = format!("node {n}");
                let tn = match t {
                    NodeType::Person => "Person",
                    NodeType::Company => "Company",
                    NodeType::Untyped => "Entity",
                };
                state.nodes.push((name.clone(), tn));
                (text(node_json(&name, *t, *age)), None)
            }
            AddLine::Huge(len) => {
                let name = format!("node {n}");
                state.nodes.push((name.clone(), "Company"));
                let line =
                    json!({"node": {"name": name, "type": "Company", "summary": "s".repeat(*len)}});
                (text(line), None)
            }
            AddLine::Fact {
                employed,
                source,
                target,
                valid_at,
            } => {
                let (st, tt, rel) = if *employed {
                    ("Person", "Company", "EMPLOYED_BY")
                } else {
                    ("Company", "Person", "KNOWS")
                };
                let s = state.endpoint(st, *source, format!("ghost {n} s"));
                let t = state.endpoint(tt, *target, format!("ghost {n} t"));
                for (name, ty) in [(&s, st), (&t, tt)] {
                    if !state.has(name, ty) {
                        state.nodes.push((name.clone(), ty));
                        state.implicit += 1;
                    }
                }
                state.edges += 1;
                let times =
                    json!({"valid_at": valid_at.map(|y| y.to_string()), "invalid_at": null});
                (text(fact(&s, st, &t, tt, rel, times)), None)
            }
            AddLine::BadNode(kind) => {
                let name = format!("node {n}");
                let (node, words) = match kind {
                    BadNode::UnknownType => (
                        json!({"name": name, "type": "Robot"}),
                        "unknown entity type `Robot`",
                    ),
                    BadNode::NotAProperty => (
                        json!({"name": name, "type": "Person", "attributes": {"height": 2}}),
                        "attribute `height` is not a property of `Person`",
                    ),
                    BadNode::WrongKind => (
                        json!({"name": name, "type": "Person", "attributes": {"age": "old"}}),
                        "attribute `age` must be an int",
                    ),
                    BadNode::BadDate => (
                        json!({"name": name, "type": "Person", "attributes": {"born": "2024-13-45"}}),
                        "attribute `born` must be a date",
                    ),
                    BadNode::EmptyName => (
                        json!({"name": " \t", "type": "Person"}),
                        "node name is empty",
                    ),
                };
                (text(json!({ "node": node })), Some(words))
            }
            AddLine::BadFact(kind) => {
                let (s, t) = (format!("ghost {n} s"), format!("ghost {n} t"));
                let (line, words) = match kind {
                    BadFact::Lowercase => (
                        fact(&s, "Person", &t, "Company", "employed_by", json!({})),
                        "must be SCREAMING_SNAKE_CASE",
                    ),
                    BadFact::InvalidBeforeValid => (
                        fact(
                            &s,
                            "Person",
                            &t,
                            "Company",
                            "EMPLOYED_BY",
                            json!({"valid_at": "2024-05-01", "invalid_at": "2024-04-30T23:59:59Z"}),
                        ),
                        "is before valid_at",
                    ),
                    BadFact::BadTime => (
                        fact(
                            &s,
                            "Person",
                            &t,
                            "Company",
                            "EMPLOYED_BY",
                            json!({"valid_at": "last week"}),
                        ),
                        "valid_at: \"last week\" is not a time",
                    ),
                    BadFact::Disallowed => (
                        fact(&s, "Company", &t, "Person", "EMPLOYED_BY", json!({})),
                        "`EMPLOYED_BY` does not allow Company -> Person",
                    ),
                    BadFact::SameNode => (
                        fact(&s, "Person", &s, "Person", "KNOWS", json!({})),
                        "two distinct entities",
                    ),
                    BadFact::EmptyText => (
                        fact(
                            &s,
                            "Person",
                            &t,
                            "Company",
                            "EMPLOYED_BY",
                            json!({"fact": "  "}),
                        ),
                        "fact text is empty",
                    ),
                    BadFact::UnknownEndpointType => (
                        fact(&s, "Robot", &t, "Company", "EMPLOYED_BY", json!({})),
                        "fact source: unknown entity type `Robot`",
                    ),
                };
                (text(line), Some(words))
            }
            AddLine::Both => {
                let mut v = node_json("x", NodeType::Untyped, None);
                v["fact"] = json!({"source": "a", "target": "b", "relation_type": "KNOWS", "fact": "a knows b"});
                (text(v), Some("either \"node\" or \"fact\", not both"))
            }
            AddLine::Neither => (
                b"{\"node\": null}".to_vec(),
                Some("must hold a \"node\" or a \"fact\""),
            ),
            AddLine::UnknownField => (
                text(json!({"nodes": {"name": "x"}})),
                Some("unknown field `nodes`"),
            ),
            AddLine::NotJson(s) => {
                if s.trim_start_matches('\u{feff}').trim().is_empty() {
                    (s.clone().into_bytes(), None)
                } else {
                    (s.clone().into_bytes(), Some("not a valid line"))
                }
            }
            AddLine::Truncated(at) => {
                let full = node_json(&format!("node {n}"), NodeType::Person, Some(3)).to_string();
                let mut cut = 1 + at % (full.len() - 1);
                while !full.is_char_boundary(cut) {
                    cut -= 1;
                }
                (full.as_bytes()[..cut].to_vec(), Some("not a valid line"))
            }
            AddLine::InvalidUtf8(at, b) => {
                let full = node_json(&format!("node {n}"), NodeType::Company, None).to_string();
                (
                    insert_at_boundary(&full, *at, b).0,
                    Some("line is not valid UTF-8"),
                )
            }
            AddLine::Deep(d) => (
                format!(
                    r#"{{"node":{{"name":"deep","attributes":{{"a":{}}}}}}}"#,
                    nested(*d, false)
                )
                .into_bytes(),
                Some("recursion limit exceeded"),
            ),
            AddLine::WrongType => (
                text(json!({"node": {"name": 5, "type": "Person"}})),
                Some("invalid type"),
            ),
            AddLine::Blank => (b"  \t".to_vec(), None),
        }
    }
}

#[test]
fn fuzz_add_lines_load_or_fail_with_their_line_and_reason() {
    let rt = runtime();
    let spec = PipelineSpec::from_toml(ADD_ONTOLOGY, Path::new("add.toml")).expect("spec");
    let ontology = Ontology::try_from(&spec.ontology).expect("ontology");
    let store = graphloom::store::GraphStore::open("memory://fuzz-add-graph/", &Default::default())
        .expect("graph");
    let input_root = "memory://fuzz-add-input/";
    let input = format!("{input_root}case/input.jsonl");
    check(12, 9, prop::collection::vec(add_line(), 0..24), |lines| {
        let mut state = AddState::default();
        let mut bytes = Vec::new();
        let mut expected = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let (b, words) = l.render(i + 1, &mut state);
            if i > 0 {
                bytes.push(b'\n');
            }
            bytes.extend(b);
            expected.push(words);
        }
        put_case(&rt, input_root, "input.jsonl", bytes);
        let report = rt
            .block_on(graphloom::add::add_file(
                &store,
                &ontology,
                &graphloom::resolve::ResolveSpec::default().name_keys(),
                "default",
                &input,
                &BTreeMap::new(),
            ))
            .map_err(|e| TestCaseError::fail(format!("add failed as a whole: {e}")))?;
        for f in &report.failures {
            prop_assert_eq!(f.stage.as_str(), "add");
            let line = f.line.expect("every add failure has a line");
            prop_assert_eq!(&f.item, &format!("input.jsonl:{line}"));
            prop_assert!(f.excerpt.as_ref().is_some_and(|x| x.chars().count() <= 200));
        }
        for (i, words) in expected.iter().enumerate() {
            let n = (i + 1) as i64;
            let here: Vec<_> = report
                .failures
                .iter()
                .filter(|f| f.line == Some(n))
                .collect();
            match words {
                Some(words) => {
                    prop_assert_eq!(here.len(), 1, "line {} should fail once: {:?}", n, here);
                    prop_assert!(
                        here[0].reason.contains(words),
                        "line {n}: {:?} should mention {words:?}",
                        here[0].reason
                    );
                }
                None => prop_assert!(here.is_empty(), "line {n} failed: {here:?}"),
            }
        }
        prop_assert_eq!(
            report.failures.len(),
            expected.iter().filter(|w| w.is_some()).count()
        );
        prop_assert_eq!(report.run.nodes_added as usize, state.nodes.len());
        prop_assert_eq!(report.implicit_nodes, state.implicit);
        prop_assert_eq!(report.run.edges_added as usize, state.edges);
        prop_assert_eq!(report.run.failures as usize, report.failures.len());
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// LLM replies
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Entities {
    entities: Vec<Entity>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Entity {
    name: String,
    #[serde(rename = "type")]
    kind: Option<String>,
}

fn entities() -> impl Strategy<Value = Entities> {
    prop::collection::vec(
        (any_text(16), prop::option::of(any_text(8)))
            .prop_map(|(name, kind)| Entity { name, kind }),
        0..6,
    )
    .prop_map(|entities| Entities { entities })
}

/// Text without JSON brackets, which the reply clean-up would take for JSON.
fn prose() -> impl Strategy<Value = String> {
    any_text(30).prop_map(|s| s.replace(['{', '}', '[', ']', '`', '<'], ""))
}

#[derive(Debug, Clone)]
enum Wrap {
    Bare,
    Fence,
    Think(String),
    Prose(String, String),
}

/// A usage number a server may report.
fn usage_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..10_000).prop_map(|n| json!(n)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MAX)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!("12")),
        Just(Value::Null),
    ]
}

#[derive(Debug, Clone)]
enum ReplyCase {
    Good(Entities, Wrap),
    /// A valid reply with this many entities.
    Enormous(usize),
    Truncated(Entities, usize),
    WrongType(usize),
    Deep(usize),
    Garbage(String),
    /// `<think>` without its end: all thoughts.
    Unfinished(String),
    /// `finish_reason: length`.
    Cut(String),
    /// A 200 written by hand: `content` (None: no message), usage numbers.
    Body(Box<(Option<Value>, Value, Value, Value)>),
}

fn reply_case() -> impl Strategy<Value = ReplyCase> {
    let wrap = prop_oneof![
        Just(Wrap::Bare),
        Just(Wrap::Fence),
        prose().prop_map(Wrap::Think),
        (prose(), prose()).prop_map(|(a, b)| Wrap::Prose(a, b)),
    ];
    let content = prop_oneof![
        entities().prop_map(|e| Some(json!(serde_json::to_string(&e).expect("json")))),
        Just(Some(json!(42))),
        Just(Some(Value::Null)),
        Just(None),
    ];
    prop_oneof![
        4 => (entities(), wrap).prop_map(|(e, w)| ReplyCase::Good(e, w)),
        1 => (1_000usize..=20_000).prop_map(ReplyCase::Enormous),
        2 => (entities(), any::<usize>()).prop_map(|(e, at)| ReplyCase::Truncated(e, at)),
        2 => (0usize..8).prop_map(ReplyCase::WrongType),
        1 => (200usize..=10_000).prop_map(ReplyCase::Deep),
        1 => prose().prop_map(ReplyCase::Garbage),
        1 => prose().prop_map(ReplyCase::Unfinished),
        1 => any_text(40).prop_map(ReplyCase::Cut),
        2 => (content, usage_number(), usage_number(), usage_number())
            .prop_map(|body| ReplyCase::Body(Box::new(body))),
    ]
}

/// What a reply gives: a value, a cut reply, or nothing usable.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Parses(Entities),
    Cut,
    Unusable,
}

fn enormous(n: usize) -> Entities {
    Entities {
        entities: (0..n)
            .map(|i| Entity {
                name: format!("Vendor {i}"),
                kind: (i % 2 == 0).then(|| "Company".to_string()),
            })
            .collect(),
    }
}

impl ReplyCase {
    fn reply(&self) -> (Reply, Outcome) {
        let text = |e: &Entities| serde_json::to_string(e).expect("json");
        match self {
            ReplyCase::Good(e, w) => {
                let body = text(e);
                let content = match w {
                    Wrap::Bare => body,
                    Wrap::Fence => format!("```json\n{body}\n```"),
                    Wrap::Think(t) => format!("<think>{t}</think>\n{body}"),
                    Wrap::Prose(a, b) => format!("{a}\n{body}\n{b}"),
                };
                (Reply::Content(content), Outcome::Parses(e.clone()))
            }
            ReplyCase::Enormous(n) => {
                let e = enormous(*n);
                (Reply::Content(text(&e)), Outcome::Parses(e))
            }
            ReplyCase::Truncated(e, at) => {
                let full = text(e);
                let mut cut = at % full.len();
                while !full.is_char_boundary(cut) {
                    cut -= 1;
                }
                (Reply::Content(full[..cut].to_string()), Outcome::Unusable)
            }
            ReplyCase::WrongType(k) => {
                let wrong = [
                    r#"{"entities": 5}"#,
                    r#"{"entities": [{"name": 7, "type": null}]}"#,
                    r#"{"entities": [{"name": "a", "type": ["x"]}]}"#,
                    r#"{"entities": {"name": "a"}}"#,
                    r#"{"entity": []}"#,
                    r#"[]"#,
                    r#"{"entities": [{"type": "Company"}]}"#,
                    r#"{"entities": [null]}"#,
                ];
                (
                    Reply::Content(wrong[k % wrong.len()].into()),
                    Outcome::Unusable,
                )
            }
            ReplyCase::Deep(d) => (
                Reply::Content(format!(r#"{{"entities": {}}}"#, nested(*d, false))),
                Outcome::Unusable,
            ),
            ReplyCase::Garbage(s) => (Reply::Content(s.clone()), Outcome::Unusable),
            ReplyCase::Unfinished(s) => (
                Reply::Content(format!(r#"<think>{s} {{"entities": []}}"#)),
                Outcome::Unusable,
            ),
            ReplyCase::Cut(s) => (Reply::Length(s.clone()), Outcome::Cut),
            ReplyCase::Body(body) => {
                let (content, p, c, t) = &**body;
                let parsed = content
                    .as_ref()
                    .and_then(Value::as_str)
                    .map(|s| serde_json::from_str::<Entities>(s).expect("written as entities"));
                let mut body = json!({
                    "id": "chatcmpl-fuzz",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "test-model",
                    "choices": [{"index": 0, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": t},
                });
                if let Some(content) = content {
                    body["choices"][0]["message"] =
                        json!({"role": "assistant", "content": content});
                }
                let reply = Reply::Status {
                    status: 200,
                    headers: vec![],
                    body: body.to_string(),
                };
                (reply, parsed.map_or(Outcome::Unusable, Outcome::Parses))
            }
        }
    }
}

fn fuzz_llm_spec(server: &TestServer) -> LlmSpec {
    LlmSpec {
        base_url: server.base_url(),
        max_attempts: 1,
        timeout_secs: 30,
        // Enormous replies are charged in full; keep the budget out of the way.
        tokens_per_minute: u32::MAX,
        requests_per_minute: 1_000_000,
        ..LlmSpec::default()
    }
}

fn entity_request() -> ChatRequest {
    ChatRequest {
        stage: graphloom::stage::Stage::ExtractEntities,
        item: Some("episode-1".into()),
        messages: vec![
            Message::system("Extract entities."),
            Message::user("Acme Corp sent PO 1."),
        ],
        max_tokens: 256,
        prompt_version: "fuzz-1".into(),
        budget: None,
    }
}

#[test]
fn fuzz_llm_replies_parse_or_fail_clearly_after_one_repair() {
    let rt = runtime();
    let server = rt
        .block_on(TestServer::start(Behavior::default()))
        .expect("test server");
    check(48, 10, (reply_case(), reply_case()), |(first, second)| {
        // A client per case keeps cases independent; the call after the
        // case checks what the replies left in the shared budget.
        let client =
            LlmClient::with_key(&fuzz_llm_spec(&server), None, None, "fuzz").expect("client");
        let (r1, o1) = first.reply();
        let (r2, o2) = second.reply();
        server.set_behavior(Behavior::with_responder(move |_| r2.clone()));
        server.push_replies([r1]);
        let got = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(60),
                client.chat_json::<Entities>(entity_request()),
            )
            .await
        });
        let got = got.map_err(|_| TestCaseError::fail("the call did not finish within 60 s"))?;
        let want = match o1 {
            Outcome::Unusable => o2,
            other => other,
        };
        let requests = server.take_requests().len();
        match (&got, &want) {
            (Ok(reply), Outcome::Parses(v)) => {
                prop_assert_eq!(&reply.value, v);
            }
            (Err(LlmError::Truncated { max_tokens, .. }), Outcome::Cut) => {
                prop_assert_eq!(*max_tokens, 256);
            }
            (
                Err(LlmError::InvalidReply {
                    reason, excerpt, ..
                }),
                Outcome::Unusable,
            ) => {
                prop_assert!(!reason.trim().is_empty(), "no reason");
                prop_assert!(excerpt.chars().count() <= 201, "excerpt too long");
                prop_assert_eq!(requests, 2, "an unusable reply is sent back once");
            }
            (got, want) => {
                return Err(TestCaseError::fail(format!(
                    "expected {want:?}, got {:?}",
                    got.as_ref().map(|r| r.value.entities.len())
                )));
            }
        }
        if let Err(e) = &got {
            let shown = e.to_string();
            prop_assert!(shown.starts_with("extract_entities: "), "{shown}");
        }
        let rows = client.take_calls();
        prop_assert_eq!(rows.len(), 1);
        let row = &rows[0];
        prop_assert!(
            row.prompt_tokens >= 0 && row.completion_tokens >= 0,
            "token counts must not wrap: {} / {}",
            row.prompt_tokens,
            row.completion_tokens
        );
        prop_assert_eq!(
            row.status.as_str(),
            if got.is_ok() { "ok" } else { "error" }
        );
        prop_assert_eq!(row.error.is_some(), got.is_err());
        let totals = client.totals(&rows);
        prop_assert_eq!(totals.calls, 1);
        // Whatever usage the replies reported, the budget admits the next
        // call at once.
        server.set_behavior(Behavior::default());
        let next = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(10),
                client.chat_json::<BTreeMap<String, Value>>(entity_request()),
            )
            .await
        });
        prop_assert!(
            matches!(next, Ok(Ok(_))),
            "the next call was held up or failed: {:?}",
            next.map(|r| r.map(|_| ()))
        );
        server.take_requests();
        Ok(())
    });
    rt.block_on(server.shutdown());
}

#[test]
fn fuzz_enormous_entity_replies_keep_the_cap_and_reject_the_rest() {
    use graphloom::extract::{ExtractSpec, Prompts, extract_entities};
    let rt = runtime();
    let server = rt
        .block_on(TestServer::start(Behavior::default()))
        .expect("test server");
    let client = LlmClient::with_key(&fuzz_llm_spec(&server), None, None, "fuzz").expect("client");
    let (_, ontology) = crate::common::procurement();
    // The episode writes the names the cap (at most 100) lets through, or
    // they would be rejected as made up.
    let written: Vec<String> = (0..100).map(|i| format!("Vendor {i}")).collect();
    let episode = crate::common::text_episode(&format!(
        "Each Vendor wrote in: {}; the vendors replied.",
        written.join(", ")
    ));
    let strategy = (1usize..=20_000, 1usize..=100, 0usize..=20);
    check(12, 11, strategy, |(n, cap, bad)| {
        let spec = ExtractSpec {
            max_entities_per_episode: cap,
            ..ExtractSpec::default()
        };
        // n distinct names of declared or unknown types, and `bad` names
        // that are dates, numbers or empty.
        let mut items: Vec<Value> = (0..n)
            .map(|i| {
                let kind = ["Company", "Person", "Spaceship"][i % 3];
                // The role is a word of the episode, so it is grounded.
                json!({"name": format!("Vendor {i}"), "type": kind, "attributes": [{"name": "role", "value": "vendors"}]})
            })
            .collect();
        for i in 0..bad {
            let name = ["2024-03-01", "1234", "  ", "\"\""][i % 4];
            items.push(json!({"name": name, "type": "Company", "attributes": []}));
        }
        server.push_replies([Reply::json(&json!({"entities": items}))]);
        let (mentions, rejected) = rt
            .block_on(extract_entities(
                &client,
                &ontology,
                &spec,
                &Prompts::new(&ontology, &spec),
                &episode,
                &[],
            ))
            .map_err(|e| TestCaseError::fail(format!("a valid reply failed: {e}")))?;
        prop_assert_eq!(mentions.len(), n.min(cap));
        // Items past the schema's maxItems (the cap) are cut, one row each.
        let cut = rejected
            .iter()
            .filter(|r| {
                r.reason
                    .contains(&format!("dropped: past maxItems ({cap})"))
            })
            .count();
        prop_assert_eq!(cut, (n + bad).saturating_sub(cap));
        let unknown = rejected
            .iter()
            .filter(|r| r.reason.starts_with("unknown top-level type `Spaceship`"))
            .count();
        // Unknown types are kept as Entity, with a failure row each.
        prop_assert_eq!(unknown, (0..n.min(cap)).filter(|i| i % 3 == 2).count());
        // Nothing is lost: every item is a mention or a row of its own.
        prop_assert_eq!(mentions.len() + rejected.len() - unknown, n + bad);
        for r in &rejected {
            prop_assert_eq!(r.stage, graphloom::stage::Stage::ExtractEntities);
            prop_assert!(!r.reason.trim().is_empty());
        }
        client.take_calls();
        Ok(())
    });
    rt.block_on(server.shutdown());
}

/// One member of a subtype-classification reply: an item number (or a
/// key that is none) and an answer, bare or with attributes.
fn classify_item() -> impl Strategy<Value = (String, Value)> {
    let key = prop_oneof![
        (0u64..6).prop_map(|k| k.to_string()),
        Just(u64::MAX.to_string()),
        Just((u64::from(u32::MAX) + 1).to_string()),
        Just("-1".to_string()),
        Just(" 2".to_string()),
        Just("two".to_string()),
    ];
    let subtype = prop::sample::select(vec![
        "MSA",
        "OrderForm",
        "PurchaseOrder",
        "none",
        "Person",
        "Contract",
        "msa",
        "",
    ]);
    (key, subtype, prop::option::of(any_text(8))).prop_map(|(key, subtype, value)| {
        let answer = match value {
            Some(v) => json!({"subtype": subtype, "attributes": {"po_number": v, "x": "1"}}),
            None => json!(subtype),
        };
        (key, answer)
    })
}

#[test]
fn fuzz_classification_replies_with_any_ids_keep_chains_valid() {
    use graphloom::classify::walk_entities;
    use graphloom::extract::{ExtractSpec, Mention};
    let rt = runtime();
    let server = rt
        .block_on(TestServer::start(Behavior::default()))
        .expect("test server");
    let (_, ontology) = crate::common::procurement();
    let reply = prop_oneof![
        4 => prop::collection::vec(classify_item(), 0..12)
            .prop_map(|items| Reply::json(&Value::Object(items.into_iter().collect()))),
        1 => Just(Reply::Content(r#"{"1": 7, "2": ["MSA"], "3": {"subtype": 1}}"#.into())),
        1 => Just(Reply::Content(r#"{"items": [{"id": 1, "subtype": "MSA"}]}"#.into())),
        1 => prose().prop_map(Reply::Content),
        1 => (1_000usize..=20_000).prop_map(|n| {
            let items: serde_json::Map<String, Value> =
                (0..n).map(|i| (i.to_string(), json!("MSA"))).collect();
            Reply::json(&Value::Object(items))
        }),
    ];
    let strategy = (1usize..8, 1usize..5, reply);
    check(24, 14, strategy, |(n, batch, reply)| {
        let client = std::sync::Arc::new(
            LlmClient::with_key(&fuzz_llm_spec(&server), None, None, "fuzz").expect("client"),
        );
        server.set_behavior(Behavior::with_responder(move |_| reply.clone()));
        let spec = ExtractSpec {
            classify_batch_size: batch,
            ..ExtractSpec::default()
        };
        let mut mentions: Vec<Mention> = (0..n)
            .map(|i| Mention {
                episode_id: format!("ep-{i}"),
                name: format!("PO-{i}"),
                chain: if i % 3 == 2 {
                    vec![]
                } else {
                    vec!["Contract".into()]
                },
                attributes: Default::default(),
                context: format!("PO-{i} was signed."),
                mapped: false,
            })
            .collect();
        let walked = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(60),
                walk_entities(&client, &ontology, &spec, 2, &mut mentions),
            )
            .await
        });
        let (stats, rejected) =
            walked.map_err(|_| TestCaseError::fail("the walk did not finish within 60 s"))?;
        // One level below Contract at most: its subtypes are leaves. A
        // failed batch of b items is asked again in halves, at most 2b - 1
        // calls in all.
        prop_assert!(stats.calls <= 2 * n - n.div_ceil(batch));
        for m in &mentions {
            let chain = ontology
                .entity_tree
                .chain(m.type_name())
                .unwrap_or_default();
            prop_assert_eq!(
                &m.chain,
                &chain,
                "{} has a chain the ontology does not",
                &m.name
            );
            let labels = ontology.labels_for(m.type_name());
            prop_assert!(labels.is_some());
            // Attributes are properties of the last type only.
            let props: Vec<String> = ontology
                .entity_types
                .get(m.type_name())
                .map(|t| t.properties.iter().map(|p| p.name.clone()).collect())
                .unwrap_or_default();
            prop_assert!(
                m.attributes.keys().all(|k| props.contains(k)),
                "{:?}",
                m.attributes
            );
        }
        for r in &rejected {
            prop_assert_eq!(r.stage, graphloom::stage::Stage::ClassifyEntities);
            prop_assert!(
                r.reason.contains("failed") || r.reason.contains("asked alone"),
                "{}",
                r.reason
            );
            prop_assert!(
                r.reason.len() < 2_000,
                "a reason of {} bytes",
                r.reason.len()
            );
        }
        server.take_requests();
        Ok(())
    });
    rt.block_on(server.shutdown());
}

// ---------------------------------------------------------------------------
// Retry-After
// ---------------------------------------------------------------------------

/// A `Retry-After` or `retry-after-ms` value.
fn retry_value() -> impl Strategy<Value = String> {
    let date = |secs: i64| {
        let t = if secs >= 0 {
            SystemTime::now() + Duration::from_secs(secs as u64)
        } else {
            SystemTime::now() - Duration::from_secs(secs.unsigned_abs())
        };
        httpdate::fmt_http_date(t)
    };
    prop_oneof![
        (0u32..100_000).prop_map(|n| n.to_string()),
        (0u32..1_000, 0u32..1_000).prop_map(|(a, b)| format!("{a}.{b:03}")),
        (1u32..100_000).prop_map(|n| format!("-{n}")),
        (-1_000_000_000i64..1_000_000_000).prop_map(date),
        prop::sample::select(vec![
            "1e300",
            "1e19",
            "18446744073709551616",
            "99999999999999999999999",
            "-0",
            "+5",
            " 7 ",
            "inf",
            "-inf",
            "NaN",
            "infinity",
            "",
            "   ",
            "5s",
            "0x10",
            "1e-400",
            "Fri, 31 Dec 9999 23:59:59 GMT",
            "Thu, 01 Jan 1970 00:00:00 GMT",
            "Mon, 32 Foo 2024 25:61:61 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ])
        .prop_map(str::to_string),
        any_text(20),
    ]
}

/// What a value means by itself: seconds (maybe huge), or nothing.
fn expected_wait(value: &str) -> Option<f64> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then_some(secs);
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(
        when.duration_since(SystemTime::now())
            .map_or(0.0, |d| d.as_secs_f64()),
    )
}

fn assert_wait(got: Option<Duration>, want: Option<f64>, what: &str) -> Result<(), TestCaseError> {
    match (got, want) {
        (None, None) => {}
        (Some(d), Some(w)) if w >= MAX_RETRY_AFTER.as_secs_f64() * 2.0 => {
            prop_assert!(d > MAX_RETRY_AFTER, "{what}: a wait of {w} s became {d:?}");
        }
        (Some(d), Some(w)) => {
            // HTTP dates have whole seconds and the clock moves on.
            prop_assert!(
                (d.as_secs_f64() - w).abs() <= 2.0,
                "{what}: waited {d:?} for {w} s"
            );
        }
        (got, want) => {
            return Err(TestCaseError::fail(format!(
                "{what}: got {got:?}, expected {want:?}"
            )));
        }
    }
    Ok(())
}

#[test]
fn fuzz_retry_after_values_never_panic_and_mean_what_they_say() {
    let strategy = (
        prop::option::of(retry_value()),
        prop::option::of(retry_value()),
    );
    check(2048, 12, strategy, |(retry_after, retry_after_ms)| {
        let got = parse_retry_after(retry_after.as_deref(), retry_after_ms.as_deref());
        // retry-after-ms wins when it is a usable number.
        let ms = retry_after_ms
            .as_deref()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms >= 0.0);
        match ms {
            Some(ms) => assert_wait(got, Some(ms / 1000.0), "retry-after-ms")?,
            None => assert_wait(
                got,
                retry_after.as_deref().and_then(expected_wait),
                "Retry-After",
            )?,
        }
        Ok(())
    });
}

#[test]
fn fuzz_retry_after_from_a_server_waits_or_gives_up_without_hanging() {
    let rt = runtime();
    let server = rt
        .block_on(TestServer::start(Behavior::with_responder(|_| {
            Reply::Content(r#"{"entities": []}"#.into())
        })))
        .expect("test server");
    let spec = LlmSpec {
        max_attempts: 2,
        backoff_initial_ms: 1,
        backoff_max_ms: 5,
        ..fuzz_llm_spec(&server)
    };
    // Header values a server can send: visible ASCII, short waits only.
    let header = prop_oneof![
        (0u32..200).prop_map(|ms| format!("0.{ms:03}")),
        (1u32..100_000).prop_map(|n| format!("-{n}")),
        (601u64..u64::MAX).prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "1e300",
            "18446744073709551616",
            "99999999999999999999999",
            "inf",
            "NaN",
            "soon",
            "",
            "Fri, 31 Dec 9999 23:59:59 GMT",
            "Thu, 01 Jan 1970 00:00:00 GMT",
            "Mon, 32 Foo 2024 25:61:61 GMT",
            "-0",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,20}".prop_filter("short waits only", |v| {
            expected_wait(v).is_none_or(|w| w <= 0.2 || w > 600.0)
        }),
    ];
    let strategy = (prop::option::of(header.clone()), prop::option::of(header));
    check(24, 13, strategy, |(retry_after, retry_after_ms)| {
        let ms_wait = retry_after_ms.as_deref().and_then(|v| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
        });
        if ms_wait.is_some_and(|ms| ms > 200.0 && ms <= 600_000.0) {
            // A real wait; not what this property is about.
            return Ok(());
        }
        let mut headers = Vec::new();
        if let Some(v) = &retry_after {
            headers.push(("Retry-After".to_string(), v.clone()));
        }
        if let Some(v) = &retry_after_ms {
            headers.push(("retry-after-ms".to_string(), v.clone()));
        }
        let client = LlmClient::with_key(&spec, None, None, "fuzz").expect("client");
        server.push_replies([Reply::Status {
            status: 429,
            headers,
            body: r#"{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#.into(),
        }]);
        let wait = parse_retry_after(
            retry_after.as_deref().map(str::trim),
            retry_after_ms.as_deref().map(str::trim),
        );
        let got = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                client.chat_json::<Entities>(entity_request()),
            )
            .await
        });
        let got = got.map_err(|_| TestCaseError::fail("the call did not finish within 30 s"))?;
        match wait {
            Some(w) if w > MAX_RETRY_AFTER => match &got {
                Err(LlmError::Exhausted { last, .. }) => {
                    prop_assert!(last.contains("longer than graphloom waits"), "{last}");
                    prop_assert!(last.contains("HTTP 429"), "{last}");
                }
                other => {
                    return Err(TestCaseError::fail(format!(
                        "a wait of {w:?} should give up, got {:?}",
                        other.as_ref().map(|r| r.attempts)
                    )));
                }
            },
            _ => {
                let reply = got.map_err(|e| TestCaseError::fail(format!("no retry: {e}")))?;
                prop_assert_eq!(reply.attempts, 2);
            }
        }
        prop_assert_eq!(server.pending_replies(), 0);
        server.take_requests();
        Ok(())
    });
    rt.block_on(server.shutdown());
}
