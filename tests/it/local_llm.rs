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

#[derive(Debug, Deserialize, JsonSchema)]
struct Extracted {
    entities: Vec<Mention>,
}

#[derive(Debug, Deserialize, JsonSchema)]
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
        stage: "extract_entities".into(),
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
}
