//! Real structured calls through graphloom's client to the local model
//! server (llama.cpp's llama-server with Qwen2.5-Coder, started by
//! `scripts/local-llm.sh`; `scripts/test.sh` starts it and sets
//! `GRAPHLOOM_LLM_BASE_URL`). The model is small: the checks are on
//! structure and loose content, never exact strings.

use std::sync::Arc;

use graphloom::llm::cache::{CacheMode, ResponseCache};
use graphloom::llm::{ChatRequest, LlmClient, Message};
use graphloom::spec::{LlmSpec, StructuredOutput};
use object_store::memory::InMemory;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Extracted {
    entities: Vec<Mention>,
}

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Mention {
    name: String,
    #[serde(rename = "type")]
    kind: String,
}

/// The server's base URL, or `None` when the test is skipped on purpose.
fn base_url() -> Option<String> {
    if let Ok(url) = std::env::var("GRAPHLOOM_LLM_BASE_URL") {
        return Some(url);
    }
    if std::env::var("GRAPHLOOM_SKIP_LOCAL_LLM").is_ok_and(|v| v == "1") {
        eprintln!("note: local model tests skipped (GRAPHLOOM_SKIP_LOCAL_LLM=1)");
        return None;
    }
    panic!(
        "GRAPHLOOM_LLM_BASE_URL is not set: start the local model with `scripts/local-llm.sh setup && scripts/local-llm.sh start` \
         and export GRAPHLOOM_LLM_BASE_URL=http://127.0.0.1:8093/v1 (scripts/test.sh does both), \
         or set GRAPHLOOM_SKIP_LOCAL_LLM=1"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_local_model_answers_structured_calls_through_the_client() {
    let Some(base_url) = base_url() else { return };
    let spec = LlmSpec {
        base_url,
        model: "local-llm".into(),
        requests_per_minute: 120,
        tokens_per_minute: 200_000,
        max_concurrency: 1,
        timeout_secs: 180,
        extra_body: serde_json::Map::from_iter([("cache_prompt".to_string(), json!(false))]),
        ..LlmSpec::default()
    };
    let cache = ResponseCache::new(Arc::new(InMemory::new()), "c".into(), CacheMode::ReadWrite);
    let client = LlmClient::with_key(&spec, None, Some(cache), "local").expect("client");
    let text = "Dana Whitcombe of Northwind Outfitters signed purchase order PO-4590 with Acme Corp \
                for 35 docking stations on 12 May 2025.";
    let request = || ChatRequest {
        stage: graphloom::stage::Stage::ExtractEntities,
        item: Some("local-1".into()),
        messages: vec![
            Message::system(
                "You extract named entities from a text. Return every person, company and document \
                 named in the text with its type (Person, Company or Contract). Use names exactly as written.",
            ),
            Message::user(text),
        ],
        max_tokens: 300,
        prompt_version: "local-test-1".into(),
        budget: None,
    };
    let reply = client
        .chat_json::<Extracted>(request())
        .await
        .expect("a structured reply from the local model");
    assert!(!reply.cache_hit && reply.attempts >= 1);
    assert!(
        !reply.value.entities.is_empty(),
        "no entities: {:?}",
        reply.value
    );
    // Loose content check: most names must come from the text.
    let from_text = reply
        .value
        .entities
        .iter()
        .filter(|e| {
            !e.name.trim().is_empty() && text.to_lowercase().contains(&e.name.to_lowercase())
        })
        .count();
    assert!(
        from_text >= 1,
        "no extracted name occurs in the text: {:?}",
        reply.value
    );
    assert!(reply.value.entities.iter().all(|e| !e.kind.is_empty()));
    assert!(
        reply.usage.prompt_tokens > 20 && reply.usage.completion_tokens > 0,
        "{:?}",
        reply.usage
    );
    assert_eq!(
        client.structured_output(),
        StructuredOutput::JsonSchema,
        "llama-server accepts json_schema, so no fallback was needed"
    );

    // The same call again is answered by the cache.
    let again = client
        .chat_json::<Extracted>(request())
        .await
        .expect("cached reply");
    assert!(again.cache_hit);
    let rows = client.take_calls();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].status, "ok");
    assert!(rows[0].latency_ms > 0);
    assert!(rows[1].cache_hit);
    eprintln!(
        "local model: {} entities, {} prompt + {} completion tokens, {} ms: {:?}",
        reply.value.entities.len(),
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
        rows[0].latency_ms,
        reply.value.entities
    );

    // Streamed (`llm.stream`), llama-server's events read back into the
    // same answer, with its own token counts. The prompt cache is off, so
    // the greedy reply is the one above.
    let streaming = LlmSpec {
        stream: true,
        ..spec
    };
    let client = LlmClient::with_key(&streaming, None, None, "local").expect("client");
    let streamed = client
        .chat_json::<Extracted>(request())
        .await
        .expect("a streamed reply from the local model");
    assert_eq!(streamed.value, reply.value, "streaming changes no answer");
    assert_eq!(
        (
            streamed.usage.prompt_tokens,
            streamed.usage.completion_tokens
        ),
        (reply.usage.prompt_tokens, reply.usage.completion_tokens),
        "the usage comes from the stream's last event"
    );
}

/// Runs the example pipeline with the local model over `source` (a file
/// or directory) into a fresh graph.
async fn run_slice(
    base_url: &str,
    source: &std::path::Path,
    limit: usize,
) -> (
    tempfile::TempDir,
    graphloom::store::GraphStore,
    graphloom::run::RunReport,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut spec, ontology) = crate::common::procurement();
    let template = spec.source.clone().expect("source");
    spec.source = Some(graphloom::spec::SourceSpec {
        url: source.to_str().expect("utf-8").to_string(),
        ..template
    });
    spec.llm.base_url = base_url.to_string();
    let store = graphloom::store::GraphStore::open(
        dir.path().join("g").to_str().expect("utf-8"),
        &Default::default(),
    )
    .expect("open");
    let options = graphloom::run::RunOptions {
        limit: Some(limit),
        ..Default::default()
    };
    let report = graphloom::run::run(&spec, &ontology, &store, &options)
        .await
        .expect("the run completes");
    eprintln!(
        "local run over {}: {} episodes added, {} nodes, {} edges, {:.2} calls per episode, failures {:?}",
        source.display(),
        report.episodes_added,
        report.nodes_added,
        report.edges_added,
        report.calls_per_episode(),
        report.failures_by_stage
    );
    if report.episodes_seen <= limit {
        // Committed episodes are skipped; only failed ones are tried again
        // (the small model sometimes breaks an episode's reply).
        let again = graphloom::run::run(&spec, &ontology, &store, &options)
            .await
            .expect("re-run");
        assert_eq!(
            again.episodes_skipped,
            report.episodes_skipped + report.episodes_added,
            "a re-run skips every committed episode"
        );
        if report.episodes_added == report.episodes_seen {
            assert_eq!(
                again.calls_by_stage.values().sum::<usize>(),
                0,
                "a re-run over a fully committed slice makes no calls"
            );
        }
    }
    (dir, store, report)
}

async fn count(store: &graphloom::store::GraphStore, sql: &str) -> i64 {
    let session = graphloom::query::GraphSession::open(store)
        .await
        .expect("session");
    let r = session.run(sql).await.expect("query");
    arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(r[0].batches[0].column(0))
        .value(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_with_the_local_model_types_purchase_orders_as_contracts() {
    let Some(base_url) = base_url() else { return };
    let input = tempfile::tempdir().expect("temp dir");
    let file = input.path().join("orders.jsonl");
    std::fs::write(
        &file,
        r#"{"id": "o1", "content": "Northwind Outfitters issued purchase order PO-4471 to Acme Corp for 40 laptops.", "kind": "message", "reference_time": "2024-04-08T09:00:00Z"}
{"id": "o2", "content": "Purchase order PO-4590 from Northwind Outfitters to Acme Corp covers 35 docking stations.", "kind": "message", "reference_time": "2025-05-12T09:00:00Z"}
{"id": "o3", "content": "Priya Raman works full time for Acme Corp as an account manager.", "kind": "message", "reference_time": "2025-01-10T09:00:00Z"}
"#,
    )
    .expect("write slice");
    let (_dir, store, report) = run_slice(&base_url, &file, 3).await;
    assert!(
        report.episodes_added >= 2,
        "most episodes must make it: {report:?}"
    );
    assert!(report.nodes_added >= 2);
    // Entity, fact and walk calls, and one warm-up for the run.
    let warm_up = 1.0 / report.episodes_planned.max(1) as f64;
    assert!(
        report.calls_per_episode() <= 3.0 + warm_up + 1e-9,
        "{}",
        report.calls_per_episode()
    );
    let contracts = count(
        &store,
        "SELECT count(*) FROM nodes WHERE has_label(labels, 'Contract')",
    )
    .await;
    let orders = count(
        &store,
        "SELECT count(*) FROM nodes WHERE has_label(labels, 'PurchaseOrder')",
    )
    .await;
    assert!(
        contracts >= 1,
        "purchase orders give at least one Contract node"
    );
    assert!(
        contracts >= orders,
        "a Contract filter also returns every PurchaseOrder node"
    );
    let orphans = "SELECT count(*) FROM nodes WHERE has_label(labels, 'PurchaseOrder') AND NOT has_label(labels, 'Contract')";
    assert_eq!(count(&store, orphans).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_over_a_corpus_slice_clears_loose_quality_floors() {
    let Some(base_url) = base_url() else { return };
    let mail = crate::common::repo().join("pipelines/data/procurement/mail.jsonl");
    let (_dir, store, report) = run_slice(&base_url, &mail, 3).await;
    assert!(report.episodes_added >= 1, "{report:?}");
    let gold = graphloom::eval::Gold::from_path(
        &crate::common::repo().join("pipelines/gold/procurement.json"),
    )
    .expect("gold");
    let q = graphloom::eval::evaluate(&store, &gold)
        .await
        .expect("eval");
    eprintln!("local run quality on the slice:\n{q}");
    // The 0.5B model is small: floors only; docs/quality.md gives the figures.
    assert!(q.entity_recall() >= 0.2, "{q}");
    assert!(q.entity_precision() >= 0.2, "{q}");
}
