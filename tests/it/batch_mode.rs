//! Batch mode (`llm.mode = "batch"`, `--batch`) against the test server's
//! Batch API: the same graph as sync mode from the same replies, at the
//! batch price; failed, expired and cancelled batches, error files and a
//! 429 on create retried in later rounds; attempts that run out ending in
//! `failures`; a run killed while polling resumed without a second create;
//! `--no-wait`, `graphloom status` and `graphloom batches cancel`; Azure's
//! paths.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use graphloom::llm::batch::{BatchRecord, Ledger};
use graphloom::llm::test_server::{
    BatchEnd, Behavior, ChatRequestView, Fault, Recorded, Reply, TestServer,
};
use graphloom::run::{RunOptions, RunReport};
use graphloom::spec::{ApiStyle, PipelineSpec};

use crate::common::{graphloom, ok};
use crate::run_pipeline::{EMPLOYMENT, Fixture, GREY, content, fixture, responder};

/// The run_pipeline corpus with employment facts (contradictions: no
/// functional type settles them) and a grey-band name (adjudication),
/// summaries and embeddings on, priced, and batches polled every few
/// milliseconds.
pub(crate) async fn corpus(tweak: impl FnOnce(&mut PipelineSpec)) -> Fixture {
    let f = fixture(|spec| {
        spec.resolve.functional_edge_types.clear();
        spec.resolve.summaries = true;
        spec.resolve.embeddings = true;
        spec.llm.price_per_1m_prompt_tokens = Some(2.0);
        spec.llm.price_per_1m_completion_tokens = Some(8.0);
        spec.llm.batch.poll_initial_secs = 0.01;
        spec.llm.batch.poll_max_secs = 0.05;
        tweak(spec);
    })
    .await;
    let mut text = std::fs::read_to_string(&f.source_file).expect("read");
    text.push_str(EMPLOYMENT);
    text.push_str(GREY);
    std::fs::write(&f.source_file, text).expect("write");
    f
}

async fn run_with(f: &Fixture, options: RunOptions) -> RunReport {
    let ontology = graphloom::ontology::Ontology::try_from(&f.spec.ontology).expect("ontology");
    graphloom::run::run(&f.spec, &ontology, &f.store, &options)
        .await
        .expect("run completes")
}

fn batch() -> RunOptions {
    RunOptions {
        batch: true,
        ..RunOptions::default()
    }
}

fn ledger(f: &Fixture) -> Ledger {
    Ledger::open(f.store.url().as_str(), &Default::default()).expect("ledger")
}

/// Requests that reached the chat or embeddings routes over HTTP (not as
/// lines of a batch).
fn sync_calls(server: &TestServer) -> Vec<Recorded> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.header("x-batch-id").is_none())
        .filter(|r| r.path.ends_with("/chat/completions") || r.path.ends_with("/embeddings"))
        .collect()
}

/// What a user sees of a graph: nodes, edges, labels and the number of
/// episodes (their ids hash the source path, which differs per fixture).
async fn user_view(f: &Fixture) -> (Vec<Vec<serde_json::Value>>, usize) {
    let mut tables = content(&f.store).await;
    let episodes = tables.pop().map_or(0, |t| t.len());
    (tables, episodes)
}

/// The graph of a sync run over the same corpus and replies.
async fn sync_graph(
    tweak: impl FnOnce(&mut PipelineSpec),
) -> ((Vec<Vec<serde_json::Value>>, usize), RunReport) {
    let f = corpus(tweak).await;
    let report = run_with(&f, RunOptions::default()).await;
    (user_view(&f).await, report)
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_mode_builds_the_graph_of_sync_mode_round_by_round_at_the_batch_price() {
    let (expected, sync) = sync_graph(|_| {}).await;
    let f = corpus(|_| {}).await;
    let report = run_with(&f, batch()).await;

    assert_eq!(user_view(&f).await, expected, "batch graph = sync graph");
    assert!(
        sync_calls(&f.server).is_empty(),
        "no call went the sync way"
    );
    let progress = report.batch.as_ref().expect("batch progress");
    assert_eq!(progress.waiting_on, None);
    let records = ledger(&f).list().await.expect("ledger");
    assert_eq!(
        f.server.batch_creates(),
        records.len() as u64,
        "every ledger record is one create"
    );
    assert!(
        records
            .iter()
            .all(|r| r.status == "completed" && r.failed.is_empty())
    );
    let run_id = &report.run.as_ref().expect("committed").run_id;
    assert!(
        records
            .iter()
            .all(|r| r.accounted_by.as_ref() == Some(run_id))
    );
    let stages: BTreeSet<String> = records
        .iter()
        .flat_map(|r| r.stages().into_keys())
        .collect();
    for stage in [
        "extract_entities",
        "classify_entities",
        "extract_facts",
        "classify_facts",
        "adjudicate",
        "contradictions",
        "summaries",
    ] {
        assert!(
            stages.contains(stage),
            "{stage} went through a batch: {stages:?}"
        );
    }
    // One round per stage level (the embeddings of names and facts share
    // one), each submitting one batch, and the round that commits.
    assert!(progress.rounds >= 9, "{progress:?}");
    assert_eq!(
        progress.submitted.len() + 1,
        progress.rounds as usize,
        "{progress:?}"
    );
    // The Batch API's answers are accounted once, at the batch price.
    assert_eq!(
        (report.prompt_tokens, report.completion_tokens),
        (sync.prompt_tokens, sync.completion_tokens)
    );
    let (batch_cost, sync_cost) = (
        report.cost_usd.expect("priced"),
        sync.cost_usd.expect("priced"),
    );
    assert!(sync_cost > 0.0);
    assert!(
        (batch_cost - sync_cost * 0.5).abs() < 1e-9,
        "{batch_cost} vs {sync_cost}"
    );
    let rows = crate::run_pipeline::query(
        &f.store,
        "SELECT count(*) AS n FROM llm_calls WHERE call_id LIKE 'batch:%' AND status = 'ok'",
    )
    .await;
    let answered: usize = records.iter().map(|r| r.answered.len()).sum();
    assert_eq!(rows[0]["n"], answered as u64);

    // A rerun has nothing to do and submits nothing.
    let again = run_with(&f, batch()).await;
    assert_eq!(again.episodes_added, 0);
    assert_eq!(f.server.batch_creates(), records.len() as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_expired_and_refused_batches_and_error_lines_are_retried_in_later_rounds() {
    let (expected, _) = sync_graph(|_| {}).await;
    // Up to four batches per request: the failed one, the expired one,
    // and the 500 below, wherever the expired batch cut.
    let f = corpus(|spec| spec.llm.batch.max_attempts = 4).await;
    // The first answer to Dana's episode is a 500 in the error file.
    let inner = responder(f.fail_entities.clone(), f.po_is_plain.clone());
    let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
    f.server
        .set_behavior(Behavior::with_responder(move |req: &ChatRequestView| {
            let user = req.last("user").unwrap_or_default().to_string();
            if user.contains("TASK: list the named entities")
                && user.contains("Dana Whitcombe signed")
                && seen.lock().expect("lock").insert(user)
            {
                return Reply::Fault(Fault::ServerError(500));
            }
            inner(req)
        }));
    f.server.rate_limit_batch_creates(1);
    f.server
        .push_batch_ends([BatchEnd::Failed, BatchEnd::Expired, BatchEnd::Completed]);
    let report = run_with(&f, batch()).await;

    assert_eq!(user_view(&f).await, expected, "nothing lost on the way");
    let records = ledger(&f).list().await.expect("ledger");
    let statuses: Vec<&str> = records.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(
        &statuses[..3],
        ["failed", "expired", "completed"],
        "{statuses:?}"
    );
    let why: Vec<&String> = records.iter().flat_map(|r| r.failed.values()).collect();
    assert!(why.iter().any(|w| w.contains("batch failed")), "{why:?}");
    assert!(why.iter().any(|w| w.contains("batch_expired")), "{why:?}");
    assert!(why.iter().any(|w| w.contains("HTTP 500")), "{why:?}");
    // An expired batch's answered half is used, not asked again.
    let expired = &records[1];
    assert!(!expired.answered.is_empty() && !expired.failed.is_empty());
    for id in expired.answered.keys() {
        let asked_again = records[2..]
            .iter()
            .any(|r| r.requests.iter().any(|q| &q.custom_id == id));
        assert!(!asked_again, "{id} was answered by the expired batch");
    }
    assert_eq!(
        f.server.batch_creates(),
        records.len() as u64,
        "the 429 created nothing"
    );
    assert!(report.run.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_whose_attempts_run_out_is_a_failures_row_and_the_next_run_tries_it_afresh() {
    let f = corpus(|spec| spec.llm.batch.max_attempts = 1).await;
    f.server.push_batch_ends([BatchEnd::Failed]);
    let first = run_with(&f, batch()).await;
    assert_eq!(first.episodes_added, 0, "{first:?}");
    let failed = first.failures_by_stage.get("extract_entities").copied();
    assert_eq!(failed, Some(first.episodes_planned), "{first:?}");
    assert!(
        first
            .failure_samples
            .iter()
            .any(|f| f.reason.contains("Batch API")),
        "{:?}",
        first.failure_samples
    );
    // The next run (its batches complete) adds every episode.
    let second = run_with(&f, batch()).await;
    assert_eq!(second.episodes_added, first.episodes_planned, "{second:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_mode_refuses_to_run_without_the_response_cache() {
    let f = corpus(|spec| spec.llm.cache = false).await;
    let ontology = graphloom::ontology::Ontology::try_from(&f.spec.ontology).expect("ontology");
    let err = graphloom::run::run(&f.spec, &ontology, &f.store, &batch())
        .await
        .expect_err("no cache");
    assert!(
        err.to_string().contains("needs the response cache"),
        "{err}"
    );
    assert_eq!(f.server.requests().len(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn azure_batches_go_to_the_resources_openai_paths_with_the_api_version() {
    let f = corpus(|_| {}).await;
    let mut spec = f.spec.clone();
    spec.llm.api_style = ApiStyle::Azure;
    spec.llm.base_url = f.server.azure_url("gpt-batch");
    spec.llm.azure_api_version = Some("2025-04-01-preview".into());
    let ontology = graphloom::ontology::Ontology::try_from(&spec.ontology).expect("ontology");
    let report = graphloom::run::run(&spec, &ontology, &f.store, &batch())
        .await
        .expect("azure batch run");
    assert!(report.episodes_added > 0, "{report:?}");
    let paths: Vec<String> = f
        .server
        .requests()
        .into_iter()
        .filter(|r| r.header("x-batch-id").is_none())
        .map(|r| r.path)
        .collect();
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("/openai/files?api-version=2025-04-01-preview")),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("/openai/batches?api-version=")),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .all(|p| p.starts_with("/openai/") && p.contains("api-version=")),
        "{paths:?}"
    );
    let lines: Vec<Recorded> = f
        .server
        .requests()
        .into_iter()
        .filter(|r| r.header("x-batch-id").is_some())
        .collect();
    assert!(
        lines
            .iter()
            .all(|r| r.path == "/chat/completions" || r.path == "/embeddings")
    );
}

/// The fixture's spec as a pipeline file, for the CLI tests.
fn pipeline_file(f: &Fixture, dir: &Path) -> PathBuf {
    let toml = toml::to_string(&f.spec).expect("the spec serialises");
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, toml).expect("write pipeline");
    path
}

/// `graphloom <args> PIPELINE --graph GRAPH`.
fn on_graph(args: &[&str], pipeline: &Path, graph: &str) -> std::process::Command {
    let mut cmd = graphloom(args);
    cmd.arg(pipeline).args(["--graph", graph]);
    cmd
}

/// What the CLI tests start from: the graph a sync run builds, the corpus
/// as a pipeline file on its own graph, and a first batch that stays in
/// progress until released or cancelled.
struct CliCase {
    expected: (Vec<Vec<serde_json::Value>>, usize),
    f: Fixture,
    _dir: tempfile::TempDir,
    pipeline: PathBuf,
    graph: String,
}

async fn cli_case() -> CliCase {
    let (expected, _) = sync_graph(|_| {}).await;
    let f = corpus(|_| {}).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let pipeline = pipeline_file(&f, dir.path());
    let graph = f.store.url().as_str().to_string();
    f.server.push_batch_ends([BatchEnd::StuckInProgress]);
    CliCase {
        expected,
        f,
        _dir: dir,
        pipeline,
        graph,
    }
}

/// The batch each line of a stage was answered in.
fn batches_of(server: &TestServer, needle: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in server.requests() {
        let Some(id) = r.header("x-batch-id") else {
            continue;
        };
        if r.body.to_string().contains(needle) {
            *out.entry(id.to_string()).or_default() += 1;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_killed_while_polling_resumes_its_batches_without_creating_them_again() {
    let CliCase {
        expected,
        f,
        _dir,
        pipeline,
        graph,
    } = cli_case().await;
    let mut child = on_graph(&["run", "--batch"], &pipeline, &graph)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Bounded: 600 × 50 ms.
    for _ in 0..600 {
        if f.server.batch_creates() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        f.server.batch_creates(),
        1,
        "the first round submitted its batch"
    );
    // Let it poll a few times, then kill it mid-wait.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(child.try_wait().expect("poll").is_none(), "still waiting");
    child.kill().expect("kill");
    child.wait().expect("reap");

    let status = ok(graphloom(&["status", "--graph", &graph]), "status");
    assert!(status.contains("pending batches"), "{status}");
    assert!(status.contains("extract_entities"), "{status}");

    f.server.release_batches();
    ok(
        on_graph(&["run", "--batch"], &pipeline, &graph),
        "resumed run",
    );
    assert_eq!(user_view(&f).await, expected);
    let entity_batches = batches_of(&f.server, "TASK: list the named entities");
    assert_eq!(
        entity_batches.len(),
        1,
        "one entity batch, polled across the kill: {entity_batches:?}"
    );
    let records: Vec<BatchRecord> = ledger(&f).list().await.expect("ledger");
    assert_eq!(f.server.batch_creates(), records.len() as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_wait_submits_and_exits_and_a_cancelled_batch_gives_its_partial_output() {
    let CliCase {
        expected,
        f,
        _dir,
        pipeline,
        graph,
    } = cli_case().await;
    let run_no_wait = || on_graph(&["run", "--batch", "--no-wait"], &pipeline, &graph);
    let out = ok(run_no_wait(), "run --no-wait");
    assert!(out.contains("submitted 1 batch(es)"), "{out}");
    assert!(out.contains("nothing committed yet"), "{out}");
    // Still running: a second --no-wait run submits nothing new.
    let out = ok(run_no_wait(), "second run --no-wait");
    assert!(out.contains("submitted 0 batch(es)"), "{out}");
    assert_eq!(f.server.batch_creates(), 1);

    let out = ok(
        on_graph(&["batches", "cancel"], &pipeline, &graph),
        "batches cancel",
    );
    assert!(out.contains("asked to cancel batch_test"), "{out}");
    let listed = ok(
        graphloom(&["batches", "list", "--graph", &graph]),
        "batches list",
    );
    assert!(listed.contains("cancelling"), "{listed}");

    ok(
        on_graph(&["run", "--batch"], &pipeline, &graph),
        "run to the end",
    );
    assert_eq!(user_view(&f).await, expected);
    let records = ledger(&f).list().await.expect("ledger");
    assert_eq!(records[0].status, "cancelled");
    let (answered, failed) = (records[0].answered.len(), records[0].failed.len());
    assert!(
        answered > 0 && failed > 0,
        "partial output: {answered} answered, {failed} not"
    );
    // What the cancelled batch answered was not asked again.
    let entity_lines: usize = batches_of(&f.server, "TASK: list the named entities")
        .values()
        .sum();
    assert_eq!(
        entity_lines,
        answered + failed,
        "each entity question answered once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_in_the_providers_error_text_never_reaches_the_ledger() {
    use graphloom::llm::batch::{BatchApi, Endpoint, QueuedRequest, submit, wait_all};
    use graphloom::llm::{ApiKey, CacheMode, ResponseCache};
    const KEY: &str = "sk-test-0123456789abcdef";
    let server = TestServer::start(Behavior::with_responder(|_: &ChatRequestView| {
        Reply::error(
            401,
            &format!("Incorrect API key provided: {KEY}."),
            "invalid_request_error",
            Some("invalid_api_key"),
        )
    }))
    .await
    .expect("server");
    let dir = tempfile::tempdir().expect("temp dir");
    let url = dir.path().to_str().expect("utf-8");
    let mut spec = PipelineSpec::from_toml(
        "[output]\ngraph = \"file:///graph/\"\n",
        Path::new("key.toml"),
    )
    .expect("a minimal spec");
    spec.llm.base_url = server.base_url();
    spec.llm.batch.poll_initial_secs = 0.01;
    spec.llm.batch.poll_max_secs = 0.05;
    let api = BatchApi::with_key(&spec.llm, Some(ApiKey::new(KEY))).expect("api");
    let ledger = Ledger::open(url, &Default::default()).expect("ledger");
    let cache = ResponseCache::open(
        &format!("{url}/cache/"),
        &Default::default(),
        CacheMode::ReadWrite,
    )
    .expect("cache");
    let request = QueuedRequest {
        custom_id: "c1".into(),
        stage: graphloom::stage::Stage::ExtractEntities,
        item: None,
        endpoint: Endpoint::Chat,
        model: "test-model".into(),
        body: serde_json::json!({"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}),
        keys: Vec::new(),
    };
    submit(&api, &ledger, vec![request]).await.expect("submit");
    wait_all(&api, &ledger, &cache).await.expect("wait");
    let records = ledger.list().await.expect("list");
    let why = &records[0].failed["c1"];
    assert!(
        why.contains("HTTP 401") && why.contains("[redacted]"),
        "{why}"
    );
    let stored = std::fs::read_to_string(
        std::fs::read_dir(dir.path().join("_graphloom/batches"))
            .expect("ledger dir")
            .next()
            .expect("a record")
            .expect("entry")
            .path(),
    )
    .expect("read record");
    assert!(!stored.contains(KEY), "{stored}");
    // The key went as the header, as a sync call sends it.
    let upload = server
        .requests()
        .into_iter()
        .find(|r| r.path == "/v1/files")
        .expect("an upload");
    assert_eq!(
        upload.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
}
