//! Several model endpoints under one budget (`[[llm.endpoints]]`): calls
//! spread by weight and free slots, a failing server is rested and probed
//! again, every call still succeeds through the others, `llm_calls` names
//! the endpoint, bad endpoint lists are refused, and an `llm_calls` table
//! written before the `endpoint` column existed still takes new rows.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use graphloom::llm::test_server::{Behavior, Fault, Reply, TestServer};
use graphloom::llm::{ChatRequest, LlmClient, Message};
use graphloom::spec::{EndpointSpec, LlmSpec, PipelineSpec, SpecError};
use graphloom::store::rows::{self, LlmCallRow};
use graphloom::store::{GraphStore, RunStats, Table, WriteMode};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::common;

#[derive(Debug, Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Answer {
    ok: bool,
}

const GOOD: &str = r#"{"ok":true}"#;

fn request(i: usize) -> ChatRequest {
    ChatRequest {
        stage: graphloom::stage::Stage::ExtractEntities,
        item: Some(format!("episode-{i}")),
        messages: vec![
            Message::system("Answer."),
            Message::user(format!("question {i}")),
        ],
        max_tokens: 32,
        prompt_version: "endpoints-1".into(),
        budget: None,
    }
}

async fn good_server() -> TestServer {
    TestServer::start(Behavior::with_responder(|_| Reply::Content(GOOD.into())))
        .await
        .expect("start test server")
}

/// A spec over these endpoints `(base_url, max_concurrency, weight)`, with
/// a budget that never holds the test up, short backoffs, and rests of
/// `rest_ms` after `failures_to_rest` failures.
fn fleet(endpoints: &[(String, Option<u32>, u32)], failures_to_rest: u32, rest_ms: u64) -> LlmSpec {
    LlmSpec {
        endpoints: endpoints
            .iter()
            .map(|(url, cap, weight)| EndpointSpec {
                base_url: url.clone(),
                max_concurrency: *cap,
                weight: *weight,
            })
            .collect(),
        requests_per_minute: 600_000,
        tokens_per_minute: 100_000_000,
        backoff_initial_ms: 10,
        backoff_max_ms: 50,
        max_attempts: 6,
        timeout_secs: 5,
        endpoint_failures_to_rest: failures_to_rest,
        endpoint_rest_initial_ms: rest_ms,
        endpoint_rest_max_ms: rest_ms * 2,
        ..LlmSpec::default()
    }
}

/// A port nothing listens on: connections are refused.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}/v1")
}

async fn ask(client: &LlmClient, i: usize) {
    let reply = client
        .chat_json::<Answer>(request(i))
        .await
        .unwrap_or_else(|e| panic!("call {i} failed: {e}"));
    assert!(!reply.cache_hit);
}

#[tokio::test]
async fn one_at_a_time_calls_spread_over_two_servers_by_weight_and_rows_name_them() {
    let (a, b) = (good_server().await, good_server().await);
    let spec = fleet(
        &[(a.base_url(), None, 1), (b.base_url() + "/", None, 2)],
        3,
        60_000,
    );
    let client = LlmClient::with_key(&spec, None, None, "run-1").expect("client");
    for i in 0..30 {
        ask(&client, i).await;
    }
    assert_eq!((a.requests().len(), b.requests().len()), (10, 20));
    let rows = client.take_calls();
    let named = |url: &str| {
        rows.iter()
            .filter(|r| r.endpoint.as_deref() == Some(url))
            .count()
    };
    assert_eq!((named(&a.base_url()), named(&b.base_url())), (10, 20));
    assert!(rows.iter().all(|r| r.status == "ok" && r.attempts == 1));
    let stats = client.endpoint_stats();
    assert_eq!(stats[1].endpoint, b.base_url(), "the label drops the slash");
    assert_eq!((stats[0].attempts, stats[1].attempts), (10, 20));
}

async fn slow_server() -> TestServer {
    TestServer::start(Behavior {
        latency: Duration::from_millis(30),
        ..Behavior::with_responder(|_| Reply::Content(GOOD.into()))
    })
    .await
    .expect("start test server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_fill_the_free_slots_of_each_server() {
    let (a, b) = (slow_server().await, slow_server().await);
    // One slot on a, three on b, equal weights: under load b takes about
    // three calls for each of a's.
    let spec = fleet(
        &[(a.base_url(), Some(1), 1), (b.base_url(), Some(3), 1)],
        3,
        60_000,
    );
    let client =
        std::sync::Arc::new(LlmClient::with_key(&spec, None, None, "run-1").expect("client"));
    let calls: Vec<_> = (0..60)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { ask(&client, i).await })
        })
        .collect();
    for call in calls {
        call.await.expect("call task");
    }
    let (on_a, on_b) = (a.requests().len(), b.requests().len());
    assert_eq!(on_a + on_b, 60);
    assert!(on_a >= 1, "a took no call");
    // a can hold one call while b holds three: well under half.
    assert!(on_a * 2 < on_b, "a took {on_a} calls, b {on_b}");
}

#[tokio::test]
async fn a_server_answering_500_is_rested_and_every_call_succeeds_via_the_other() {
    let failing = TestServer::start(Behavior::with_responder(|_| {
        Reply::Fault(Fault::ServerError(500))
    }))
    .await
    .expect("failing server");
    let good = good_server().await;
    // A long rest: within this test the failing server is never probed.
    let spec = fleet(
        &[(failing.base_url(), None, 1), (good.base_url(), None, 1)],
        2,
        600_000,
    );
    let client = LlmClient::with_key(&spec, None, None, "run-1").expect("client");
    for i in 0..20 {
        ask(&client, i).await;
    }
    // Two failures in a row rest it; nothing more is sent there.
    assert_eq!(failing.requests().len(), 2);
    assert_eq!(good.requests().len(), 20);
    let rows = client.take_calls();
    assert!(rows.iter().all(|r| r.status == "ok"));
    assert!(
        rows.iter()
            .all(|r| r.endpoint.as_deref() == Some(good.base_url().as_str())),
        "every call ended on the good server"
    );
    // The two calls that tried the failing server first went on at once.
    let retried: Vec<i64> = rows.iter().map(|r| r.attempts).filter(|n| *n > 1).collect();
    assert_eq!(retried, [2, 2]);
    let stats = client.endpoint_stats();
    assert_eq!(
        (stats[0].attempts, stats[0].failed_attempts, stats[0].rests),
        (2, 2, 1)
    );
    assert_eq!((stats[1].failed_attempts, stats[1].rests), (0, 0));
}

#[tokio::test]
async fn a_rested_server_is_probed_after_its_rest_and_comes_back() {
    let flaky = good_server().await;
    flaky.push_replies([
        Reply::Fault(Fault::ServerError(503)),
        Reply::Fault(Fault::ServerError(503)),
    ]);
    let good = good_server().await;
    let rest = Duration::from_millis(40);
    let spec = fleet(
        &[(flaky.base_url(), None, 1), (good.base_url(), None, 1)],
        2,
        rest.as_millis() as u64,
    );
    let client = LlmClient::with_key(&spec, None, None, "run-1").expect("client");
    for i in 0..2 {
        ask(&client, i).await;
    }
    // Each call tried it first and went on to the other at once.
    assert_eq!(flaky.requests().len(), 2, "rested after two failures");
    assert_eq!(good.requests().len(), 2);
    // Once the rest is over, the next call probes it; it answers and
    // takes its share again.
    tokio::time::sleep(rest * 2).await;
    ask(&client, 2).await;
    assert_eq!(flaky.requests().len(), 3, "the probe");
    let rows = client.take_calls();
    assert_eq!(
        rows.last().and_then(|r| r.endpoint.clone()),
        Some(flaky.base_url())
    );
    for i in 3..13 {
        ask(&client, i).await;
    }
    // Back in the rotation: half of the next ten calls.
    assert_eq!(
        (flaky.requests().len(), good.requests().len()),
        (3 + 5, 2 + 5)
    );
    let stats = client.endpoint_stats();
    assert_eq!((stats[0].failed_attempts, stats[0].rests), (2, 1));
}

#[tokio::test]
async fn a_server_that_is_down_is_only_probed_and_calls_never_fail() {
    let down = closed_port_url();
    let good = good_server().await;
    let spec = LlmSpec {
        endpoint_rest_max_ms: 1_000,
        ..fleet(
            &[(down.clone(), None, 1), (good.base_url(), None, 1)],
            1,
            20,
        )
    };
    let client = LlmClient::with_key(&spec, None, None, "run-1").expect("client");
    for i in 0..30 {
        ask(&client, i).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = client.endpoint_stats();
    let s = &stats[0];
    // Every attempt there failed and rested it again; after the first rest
    // (20 ms; the calls took at least 150 ms) it was probed at least once,
    // and the doubling rests (20, 40, … 1000 ms) leave few probes.
    assert_eq!(s.failed_attempts, s.attempts);
    assert_eq!(s.rests, s.attempts);
    assert!(s.attempts >= 2, "never probed again: {s:?}");
    assert!(s.attempts <= 10, "probed too often: {s:?}");
    assert_eq!(good.requests().len(), 30);
    let rows = client.take_calls();
    assert!(rows.iter().all(|r| r.status == "ok"));
    // The error text of a failed attempt names the endpoint only by its
    // label; nothing failed here, so check the label itself.
    assert_eq!(stats[0].endpoint, down);
}

#[tokio::test]
async fn with_every_server_resting_a_call_waits_for_the_first_back() {
    let (a, b) = (good_server().await, good_server().await);
    a.push_replies([Reply::Fault(Fault::ServerError(502))]);
    b.push_replies([Reply::Fault(Fault::ServerError(502))]);
    let spec = fleet(&[(a.base_url(), None, 1), (b.base_url(), None, 1)], 1, 30);
    let client = LlmClient::with_key(&spec, None, None, "run-1").expect("client");
    let reply = client
        .chat_json::<Answer>(request(0))
        .await
        .expect("the call succeeds");
    // a failed, b failed, both rested; the call waited for a's probe.
    assert_eq!(reply.attempts, 3);
    assert_eq!((a.requests().len(), b.requests().len()), (2, 1));
}

#[tokio::test]
async fn a_call_fails_when_every_server_stays_down() {
    let spec = LlmSpec {
        max_attempts: 3,
        ..fleet(
            &[(closed_port_url(), None, 1), (closed_port_url(), None, 1)],
            1,
            5,
        )
    };
    let client = LlmClient::with_key(&spec, None, None, "run-1").expect("client");
    let error = client
        .chat_json::<Answer>(request(0))
        .await
        .expect_err("all down");
    let text = error.to_string();
    assert!(text.contains("gave up after 3 attempts"), "{text}");
    let rows = client.take_calls();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "error");
    assert!(rows[0].endpoint.is_some());
}

fn spec_error(llm: &str) -> String {
    let text = format!(
        "[source]\nurl = \"file:///archive/\"\n[output]\ngraph = \"file:///graph/\"\n{llm}"
    );
    match PipelineSpec::from_toml(&text, Path::new("fleet.toml")) {
        Ok(_) => panic!("accepted:\n{llm}"),
        Err(e @ (SpecError::Value { .. } | SpecError::Parse { .. })) => e.to_string(),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn a_spec_with_a_bad_endpoints_list_is_refused_with_a_clear_error() {
    let one = "[[llm.endpoints]]\nbase_url = \"http://10.0.0.1:8000/v1\"\n";
    let cases = [
        (
            "[[llm.endpoints]]\nbase_url = \"\"\n".to_string(),
            "`llm.endpoints[0].base_url` must not be empty",
        ),
        (
            format!("{one}[[llm.endpoints]]\nbase_url = \"ftp://10.0.0.2/v1\"\n"),
            "`llm.endpoints[1].base_url` must be an http:// or https:// URL",
        ),
        (
            format!("{one}weight = 0\n"),
            "`llm.endpoints[0].weight` must be at least 1",
        ),
        (
            format!("{one}max_concurrency = 0\n"),
            "`llm.endpoints[0].max_concurrency` must be at least 1",
        ),
        (
            format!("{one}[[llm.endpoints]]\nbase_url = \"http://10.0.0.1:8000/v1/\"\n"),
            "`llm.endpoints[1].base_url` is the same server as llm.endpoints[0]",
        ),
        (
            // Written with a key in its query: the message names the
            // entries, never the URL.
            format!(
                "{one}[[llm.endpoints]]\nbase_url = \"https://x.example/v1?key=sk-secret\"\n[[llm.endpoints]]\nbase_url = \"https://x.example/v1?key=sk-secret\"\n"
            ),
            "`llm.endpoints[2].base_url` is the same server as llm.endpoints[1]",
        ),
        (
            format!("[llm]\nbase_url = \"http://10.0.0.9:8000/v1\"\n{one}"),
            "`llm.base_url` cannot be set together with llm.endpoints",
        ),
        (
            format!("[llm]\nmode = \"batch\"\n{one}"),
            "`llm.endpoints` is for sync mode",
        ),
        (
            format!("[llm]\nendpoint_failures_to_rest = 0\n{one}"),
            "`llm.endpoint_failures_to_rest` must be at least 1",
        ),
        (
            format!("[llm]\nendpoint_rest_initial_ms = 600000\n{one}"),
            "`llm.endpoint_rest_initial_ms` must be at least 1 and not exceed",
        ),
        (format!("{one}wieght = 2\n"), "unknown field `wieght`"),
        (
            "[[llm.endpoints]]\nweight = 2\n".to_string(),
            "missing field `base_url`",
        ),
    ];
    for (llm, expected) in cases {
        let error = spec_error(&llm);
        assert!(
            error.contains(expected),
            "{llm}\ngave: {error}\nexpected: {expected}"
        );
        assert!(!error.contains("sk-secret"), "{error}");
    }
}

#[test]
fn embeddings_default_to_the_first_endpoint() {
    let text = "[source]\nurl = \"file:///a/\"\n[output]\ngraph = \"file:///g/\"\n[[llm.endpoints]]\nbase_url = \"http://10.0.0.1:8000/v1\"\nweight = 3\n[[llm.endpoints]]\nbase_url = \"http://10.0.0.2:8000/v1\"\nmax_concurrency = 2\n";
    let spec = PipelineSpec::from_toml(text, Path::new("fleet.toml")).expect("a good fleet");
    assert_eq!(spec.llm.endpoints.len(), 2);
    assert_eq!(
        (
            spec.llm.endpoints[0].weight,
            spec.llm.endpoints[0].max_concurrency
        ),
        (3, None)
    );
    assert_eq!(
        (
            spec.llm.endpoints[1].weight,
            spec.llm.endpoints[1].max_concurrency
        ),
        (1, Some(2))
    );
    assert_eq!(spec.llm.primary_base_url(), "http://10.0.0.1:8000/v1");
}

fn call_row(call_id: &str, endpoint: Option<&str>) -> LlmCallRow {
    LlmCallRow {
        call_id: call_id.into(),
        run_id: "run".into(),
        stage: "extract_entities".into(),
        model: "m".into(),
        item: None,
        prompt_tokens: 10,
        completion_tokens: 5,
        latency_ms: 1,
        wait_ms: 0,
        attempts: 1,
        cache_hit: false,
        status: "ok".into(),
        error: None,
        created_at: chrono::Utc::now(),
        endpoint: endpoint.map(str::to_string),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_calls_table_written_without_the_endpoint_column_takes_new_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = GraphStore::open(dir.path().to_str().expect("utf-8"), &BTreeMap::new())
        .expect("open graph");
    // The table as an older graphloom wrote it: every column but the last.
    let batch = rows::to_batch(Table::LlmCalls, &[call_row("a-old", None)]).expect("batch");
    let columns = batch.schema().index_of("endpoint").expect("endpoint");
    assert_eq!(columns, batch.num_columns() - 1);
    common::write_older_table(&store, Table::LlmCalls, batch, columns).await;

    let mut tx = store.begin("test", "default").await.expect("begin");
    let new = rows::to_batch(
        Table::LlmCalls,
        &[call_row("b-new", Some("http://10.0.0.1:8000/v1"))],
    )
    .expect("batch");
    tx.stage(Table::LlmCalls, WriteMode::Append, vec![new]);
    tx.commit(RunStats::default()).await.expect("commit");

    let ctx = datafusion::prelude::SessionContext::new();
    store
        .snapshot()
        .await
        .expect("snapshot")
        .register(&ctx)
        .await
        .expect("register");
    let batches = ctx
        .sql("SELECT * FROM llm_calls ORDER BY call_id")
        .await
        .expect("query")
        .collect()
        .await
        .expect("rows");
    let read: Vec<LlmCallRow> = rows::from_batches(Table::LlmCalls, &batches).expect("decode");
    let got: Vec<(&str, Option<&str>)> = read
        .iter()
        .map(|r| (r.call_id.as_str(), r.endpoint.as_deref()))
        .collect();
    assert_eq!(
        got,
        [("a-old", None), ("b-new", Some("http://10.0.0.1:8000/v1"))]
    );
}
