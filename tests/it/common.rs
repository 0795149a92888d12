//! Shared fixtures: paths into the repository and a graph loaded with the
//! example facts.

use std::path::{Path, PathBuf};

use graphloom::ontology::Ontology;
use graphloom::spec::PipelineSpec;
use graphloom::store::GraphStore;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The example pipeline spec and its validated ontology, with the library's
/// defaults where the example tunes for the small local model: the
/// scripted replies of these tests write fact starts and answer
/// contradiction calls, as a hosted model does.
pub fn procurement() -> (PipelineSpec, Ontology) {
    let mut spec = PipelineSpec::from_path(&repo().join("pipelines/procurement.toml"))
        .expect("example spec parses");
    spec.extract.fact_start = graphloom::extract::FactStart::Model;
    spec.resolve.judge_contradictions = true;
    let ontology = Ontology::try_from(&spec.ontology).expect("example ontology is valid");
    (spec, ontology)
}

/// The example facts file.
/// A text episode `ep-1` of `content`, for calling an extraction step
/// directly.
pub fn text_episode(content: &str) -> graphloom::source::Episode {
    graphloom::source::Episode {
        episode_id: "ep-1".into(),
        source_id: None,
        group_id: "default".into(),
        document_id: None,
        source_uri: "memory://x/a.jsonl#L1".into(),
        source_description: None,
        kind: graphloom::source::EpisodeKind::Text,
        content: content.into(),
        reference_time: chrono::Utc::now(),
        reference_time_source: "field".into(),
        order: (0, 0),
    }
}

pub fn facts_file() -> PathBuf {
    repo().join("pipelines/facts/procurement.jsonl")
}

/// The graphloom binary built for this test run.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_graphloom")
}

/// A graph under `dir` with the example facts added once.
pub async fn procurement_graph(dir: &Path) -> GraphStore {
    let (spec, ontology) = procurement();
    let store = GraphStore::open(dir.to_str().expect("utf-8 temp path"), &Default::default())
        .expect("open graph");
    let report = graphloom::add::add_file(
        &store,
        &ontology,
        &spec.resolve.name_keys(),
        &spec.output.group_id,
        facts_file().to_str().expect("utf-8 path"),
        &Default::default(),
    )
    .await
    .expect("example facts load");
    assert!(
        report.failures.is_empty(),
        "example facts must load cleanly: {:?}",
        report.failures
    );
    store
}

/// A finished command's status, stdout and stderr, for assertion messages.
pub fn describe(what: &str, out: &std::process::Output) -> String {
    format!(
        "{what}: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The graphloom binary with `args`, no input and no failpoint set.
pub fn graphloom(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .env_remove("GRAPHLOOM_FAILPOINT");
    cmd
}

/// Runs `cmd`; panics with its output unless it succeeds; returns stdout.
pub fn ok(mut cmd: std::process::Command, what: &str) -> String {
    let out = cmd.output().expect("spawn graphloom");
    assert!(out.status.success(), "{}", describe(what, &out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `rows` (rows of `table`) as the table's first version with only
/// its first `columns` columns, as an older graphloom that lacked the
/// later ones wrote it.
pub async fn write_older_table(
    store: &GraphStore,
    table: graphloom::store::Table,
    rows: arrow::array::RecordBatch,
    columns: usize,
) {
    let kept: Vec<usize> = (0..columns).collect();
    let old = rows.project(&kept).expect("the older columns");
    let url = store.table_url(table);
    deltalake::DeltaTableBuilder::from_url(url.clone())
        .expect("builder")
        .with_storage_backend(store.object_store(), url)
        .build()
        .expect("table")
        .write(vec![old])
        .with_save_mode(deltalake::protocol::SaveMode::ErrorIfExists)
        .await
        .expect("the older table");
}

/// Whether a request the test server saw is a warm-up call
/// (`llm.warm_prefix`, which the example pipelines set): a system prompt
/// with an empty user message and one token of reply.
pub fn is_warm_up(request: &graphloom::llm::test_server::Recorded) -> bool {
    request.max_tokens == Some(1) && request.body["messages"][1]["content"] == ""
}

/// The warm-up calls among `requests`: none is answered from the response
/// cache, so a replay has that many hits fewer than the run had calls.
pub fn warm_ups(requests: &[graphloom::llm::test_server::Recorded]) -> usize {
    requests.iter().filter(|r| is_warm_up(r)).count()
}

/// A subtype-walk reply as the walk's schema asks for it, an object keyed
/// by item number, from `{"id", "subtype", "attributes"?}` answers: the
/// bare subtype, or the subtype with its attributes when any are given.
pub fn walk_reply(items: Vec<serde_json::Value>) -> graphloom::llm::test_server::Reply {
    let keyed: serde_json::Map<String, serde_json::Value> = items
        .into_iter()
        .map(|item| {
            let given = item.get("attributes").is_some_and(|a| {
                a.as_array().is_some_and(|l| !l.is_empty())
                    || a.as_object().is_some_and(|o| !o.is_empty())
            });
            let answer = if given {
                serde_json::json!({"subtype": item["subtype"], "attributes": item["attributes"]})
            } else {
                item["subtype"].clone()
            };
            (item["id"].to_string(), answer)
        })
        .collect();
    graphloom::llm::test_server::Reply::json(&serde_json::Value::Object(keyed))
}

/// Points `spec` at the episodes under `source` and at the model server
/// `base_url`, one attempt a call and none of the example's extra request
/// fields, and opens a fresh graph at `dir/graph`: the set-up of a run
/// against a faithful test server.
pub fn against_test_server(
    spec: &mut PipelineSpec,
    source: &Path,
    base_url: String,
    dir: &Path,
) -> GraphStore {
    spec.source = Some(graphloom::spec::SourceSpec {
        url: source.to_str().expect("utf-8").to_string(),
        ..spec.source.clone().expect("a spec with a source")
    });
    spec.llm.base_url = base_url;
    spec.llm.max_attempts = 1;
    spec.llm.extra_body = Default::default();
    GraphStore::open(
        dir.join("graph").to_str().expect("utf-8"),
        &Default::default(),
    )
    .expect("open")
}
