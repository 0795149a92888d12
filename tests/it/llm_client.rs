//! The LLM client against the faithful test server: structured output,
//! retry classes, Retry-After, fail-fast errors, repair, truncation,
//! format fallback, the response cache, accounting and secret redaction.

use std::sync::Arc;
use std::time::Duration;

use graphloom::llm::cache::{CacheMode, ResponseCache};
use graphloom::llm::test_server::{Behavior, Fault, Reply, TestServer, embedding_of};
use graphloom::llm::{ApiKey, ChatRequest, LlmClient, LlmError, Message};
use graphloom::spec::{ApiStyle, LlmSpec, StructuredOutput};
use object_store::memory::InMemory;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Entities {
    entities: Vec<Entity>,
}

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Entity {
    name: String,
    #[serde(rename = "type")]
    kind: Option<String>,
}

const GOOD: &str = r#"{"entities":[{"name":"Acme Corp","type":"Company"}]}"#;

fn spec(server: &TestServer) -> LlmSpec {
    LlmSpec {
        base_url: server.base_url(),
        backoff_initial_ms: 10,
        backoff_max_ms: 50,
        max_attempts: 4,
        timeout_secs: 5,
        ..LlmSpec::default()
    }
}

fn request(text: &str) -> ChatRequest {
    ChatRequest {
        stage: graphloom::stage::Stage::ExtractEntities,
        item: Some("episode-1".into()),
        messages: vec![Message::system("Extract entities."), Message::user(text)],
        max_tokens: 256,
        prompt_version: "test-1".into(),
        budget: None,
    }
}

async fn server_with(replies: Vec<Reply>) -> TestServer {
    let server = TestServer::start(Behavior::with_responder(|_| Reply::Content(GOOD.into())))
        .await
        .expect("start test server");
    server.push_replies(replies);
    server
}

fn memory_cache(mode: CacheMode) -> ResponseCache {
    ResponseCache::new(Arc::new(InMemory::new()), "cache".into(), mode)
}

#[tokio::test]
async fn a_structured_call_sends_the_schema_and_records_the_servers_usage() {
    let server = server_with(vec![]).await;
    let client = LlmClient::with_key(&spec(&server), None, None, "run-1").expect("client");
    let reply = client
        .chat_json::<Entities>(request("Acme Corp sent PO 1."))
        .await
        .expect("reply");
    assert_eq!(reply.value.entities[0].name, "Acme Corp");
    assert_eq!((reply.attempts, reply.cache_hit), (1, false));
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    let format = &seen[0].body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["strict"], true);
    assert_eq!(
        format["json_schema"]["schema"]["additionalProperties"],
        false
    );
    assert_eq!(seen[0].max_tokens, Some(256));
    let rows = client.take_calls();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].prompt_tokens as u64, seen[0].prompt_tokens);
    assert_eq!(rows[0].completion_tokens as u64, seen[0].completion_tokens);
    assert_eq!(
        (rows[0].stage.as_str(), rows[0].status.as_str()),
        ("extract_entities", "ok")
    );
    assert_eq!(rows[0].item.as_deref(), Some("episode-1"));
    assert_eq!(rows[0].run_id, "run-1");
}

#[tokio::test]
async fn transient_failures_are_retried_until_a_good_reply() {
    let server = server_with(vec![
        Reply::Fault(Fault::ServerError(500)),
        Reply::Fault(Fault::Truncated),
        Reply::Fault(Fault::BrokenJson),
        Reply::Fault(Fault::ServerError(503)),
    ])
    .await;
    let mut s = spec(&server);
    s.max_attempts = 5;
    let client = LlmClient::with_key(&s, None, None, "run").expect("client");
    let reply = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("reply after retries");
    assert_eq!(reply.attempts, 5);
    assert_eq!(server.requests().len(), 5);
    assert_eq!(client.take_calls()[0].attempts, 5);
}

#[tokio::test]
async fn a_dropped_connection_and_a_timeout_are_retried() {
    let server = server_with(vec![
        Reply::Fault(Fault::Close),
        Reply::Fault(Fault::Slow(Duration::from_secs(3))),
    ])
    .await;
    let mut s = spec(&server);
    s.timeout_secs = 1;
    let client = LlmClient::with_key(&s, None, None, "run").expect("client");
    let reply = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("reply");
    assert_eq!(reply.attempts, 3);
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let server = server_with(vec![Reply::Fault(Fault::RateLimited {
        retry_after: Some("1".into()),
    })])
    .await;
    let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
    client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("reply");
    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(950),
        "waited only {gap:?} after Retry-After: 1"
    );
    assert!(client.take_calls()[0].wait_ms >= 950);
}

#[tokio::test]
async fn retry_after_as_an_http_date_is_honoured() {
    let header = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(2));
    // The date as sent (whole seconds, rounded down).
    let date = httpdate::parse_http_date(&header).expect("an HTTP date");
    let server = server_with(vec![Reply::Fault(Fault::RateLimited {
        retry_after: Some(header),
    })])
    .await;
    let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
    client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("reply");
    // The retry waited for the date itself, however long the first request
    // took to arrive (a gap between the two requests would shrink under load).
    let done = std::time::SystemTime::now();
    assert!(
        done + Duration::from_millis(50) >= date,
        "the retry came {:?} before the Retry-After date",
        date.duration_since(done).unwrap_or_default()
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn exhausted_quota_and_client_errors_fail_fast() {
    for fail in [
        Reply::Fault(Fault::QuotaExhausted),
        Reply::error(
            400,
            "messages must not be empty",
            "invalid_request_error",
            None,
        ),
        Reply::error(
            401,
            "bad key",
            "invalid_request_error",
            Some("invalid_api_key"),
        ),
        Reply::error(
            404,
            "model not found",
            "invalid_request_error",
            Some("model_not_found"),
        ),
    ] {
        let server = server_with(vec![fail.clone()]).await;
        let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
        let err = client
            .chat_json::<Entities>(request("x"))
            .await
            .expect_err("must fail");
        assert!(matches!(err, LlmError::Refused { .. }), "{fail:?}: {err}");
        assert_eq!(server.requests().len(), 1, "{fail:?} was retried");
        let rows = client.take_calls();
        assert_eq!(rows[0].status, "error");
        assert!(
            rows[0]
                .error
                .as_deref()
                .unwrap_or_default()
                .starts_with("refused")
        );
    }
}

#[tokio::test]
async fn attempts_are_bounded() {
    let server = TestServer::start(Behavior::with_responder(|_| {
        Reply::Fault(Fault::ServerError(502))
    }))
    .await
    .expect("server");
    let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
    let err = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect_err("must give up");
    assert!(
        matches!(err, LlmError::Exhausted { attempts: 4, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("HTTP 502"), "{err}");
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn an_invalid_reply_is_sent_back_once_with_the_error() {
    let server = server_with(vec![Reply::Content(
        r#"{"entities":[{"nam":"Acme"}]}"#.into(),
    )])
    .await;
    let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
    let reply = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("repaired");
    assert_eq!(reply.attempts, 2);
    let second = &server.requests()[1].body["messages"];
    let n = second.as_array().expect("messages").len();
    assert_eq!(second[n - 2]["role"], "assistant");
    assert!(
        second[n - 1]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("missing field `name`")
    );
}

#[tokio::test]
async fn a_reply_invalid_twice_fails_with_an_excerpt() {
    let server = TestServer::start(Behavior::with_responder(|_| {
        Reply::Fault(Fault::InvalidContent)
    }))
    .await
    .expect("server");
    let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
    let err = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect_err("invalid");
    match &err {
        LlmError::InvalidReply { excerpt, .. } => assert!(excerpt.starts_with("I'm sorry")),
        other => panic!("unexpected {other}"),
    }
    assert_eq!(server.requests().len(), 2, "one repair, no loop");
    assert_eq!(
        client.take_calls()[0]
            .error
            .as_deref()
            .map(|e| e.starts_with("invalid_reply")),
        Some(true)
    );
}

#[tokio::test]
async fn a_reply_cut_at_max_tokens_fails_without_looping() {
    let server = server_with(vec![Reply::Length(r#"{"entities":[{"name":"Ac"#.into())]).await;
    let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
    let err = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect_err("cut");
    assert!(
        matches!(
            err,
            LlmError::Truncated {
                max_tokens: 256,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_server_without_json_schema_gets_json_object_then_prompt_only() {
    let server = TestServer::start(Behavior::with_responder(|req| match &req.response_format {
        Some(f) if f["type"] == "json_schema" || f["type"] == "json_object" => Reply::error(
            400,
            &format!("response_format type {} is not supported", f["type"]),
            "invalid_request_error",
            None,
        ),
        _ => Reply::Content(GOOD.into()),
    }))
    .await
    .expect("server");
    let client = LlmClient::with_key(&spec(&server), None, None, "run").expect("client");
    client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("reply in prompt mode");
    let seen = server.requests();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].body["response_format"]["type"], "json_schema");
    assert_eq!(seen[1].body["response_format"]["type"], "json_object");
    assert!(seen[2].body.get("response_format").is_none());
    let system = seen[2].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(system.contains("JSON Schema"), "{system}");
    // The level sticks for later calls.
    client
        .chat_json::<Entities>(request("y"))
        .await
        .expect("reply");
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn the_cache_answers_repeated_calls_without_http() {
    let server = server_with(vec![]).await;
    let cache = memory_cache(CacheMode::ReadWrite);
    let client =
        LlmClient::with_key(&spec(&server), None, Some(cache.clone()), "run").expect("client");
    let first = client
        .chat_json::<Entities>(request("Acme"))
        .await
        .expect("miss");
    let second = client
        .chat_json::<Entities>(request("Acme"))
        .await
        .expect("hit");
    assert_eq!(first.value, second.value);
    assert!(second.cache_hit && !first.cache_hit);
    assert_eq!(server.requests().len(), 1, "the hit made no HTTP call");
    assert_eq!(
        second.usage, first.usage,
        "a hit reports the original call's tokens"
    );
    // A different prompt version is a different key.
    let mut changed = request("Acme");
    changed.prompt_version = "test-2".into();
    client.chat_json::<Entities>(changed).await.expect("miss");
    assert_eq!(server.requests().len(), 2);
    let rows = client.take_calls();
    assert_eq!(rows.iter().filter(|r| r.cache_hit).count(), 1);
    let totals = client.totals(&rows);
    assert_eq!((totals.calls, totals.cache_hits), (3, 1));
    assert_eq!(
        totals.prompt_tokens,
        rows.iter()
            .filter(|r| !r.cache_hit)
            .map(|r| r.prompt_tokens as u64)
            .sum::<u64>()
    );
}

#[tokio::test]
async fn no_cache_and_refresh_cache_call_the_server() {
    let server = server_with(vec![]).await;
    let store: Arc<InMemory> = Arc::new(InMemory::new());
    let make = |mode| {
        let cache = ResponseCache::new(store.clone(), "c".into(), mode);
        LlmClient::with_key(&spec(&server), None, Some(cache), "run").expect("client")
    };
    make(CacheMode::Off)
        .chat_json::<Entities>(request("a"))
        .await
        .expect("reply");
    make(CacheMode::ReadWrite)
        .chat_json::<Entities>(request("a"))
        .await
        .expect("reply");
    assert_eq!(
        server.requests().len(),
        2,
        "--no-cache wrote nothing to hit"
    );
    make(CacheMode::Refresh)
        .chat_json::<Entities>(request("a"))
        .await
        .expect("reply");
    assert_eq!(
        server.requests().len(),
        3,
        "--refresh-cache ignores the entry"
    );
    make(CacheMode::ReadWrite)
        .chat_json::<Entities>(request("a"))
        .await
        .expect("reply");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_torn_cache_entry_is_a_miss_and_is_rewritten() {
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
    let server = server_with(vec![]).await;
    let store: Arc<InMemory> = Arc::new(InMemory::new());
    let cache = ResponseCache::new(store.clone(), "c".into(), CacheMode::ReadWrite);
    let client =
        LlmClient::with_key(&spec(&server), None, Some(cache.clone()), "run").expect("client");
    client
        .chat_json::<Entities>(request("a"))
        .await
        .expect("reply");
    // Tear every entry.
    let entries: Vec<_> = futures::StreamExt::collect::<Vec<_>>(store.list(None)).await;
    assert_eq!(entries.len(), 1);
    for e in entries {
        let e = e.expect("entry");
        store
            .put(&e.location, PutPayload::from_static(b"{\"content\": \"tor"))
            .await
            .expect("put");
    }
    client
        .chat_json::<Entities>(request("a"))
        .await
        .expect("reply");
    assert_eq!(server.requests().len(), 2, "the torn entry was not used");
    client
        .chat_json::<Entities>(request("a"))
        .await
        .expect("reply");
    assert_eq!(server.requests().len(), 2, "the rewritten entry is used");
}

#[tokio::test]
async fn the_api_key_is_sent_as_a_header_and_never_shown() {
    const KEY: &str = "sk-test-SECRET4242";
    let server = server_with(vec![Reply::error(
        401,
        &format!("Incorrect API key provided: {KEY}. You can find your key at ..."),
        "invalid_request_error",
        Some("invalid_api_key"),
    )])
    .await;
    let client =
        LlmClient::with_key(&spec(&server), Some(ApiKey::new(KEY)), None, "run").expect("client");
    let err = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect_err("401");
    let seen = server.requests();
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let rows = client.take_calls();
    for shown in [
        err.to_string(),
        format!("{err:?}"),
        format!("{client:?}"),
        format!("{:?}", ApiKey::new(KEY)),
        format!("{rows:?}"),
    ] {
        assert!(!shown.contains("SECRET4242"), "key leaked: {shown}");
    }
    assert!(
        err.to_string()
            .contains("Incorrect API key provided: [redacted]"),
        "{err}"
    );
}

#[tokio::test]
async fn azure_style_uses_the_deployment_path_api_version_and_api_key_header() {
    let server = server_with(vec![]).await;
    let s = LlmSpec {
        base_url: server.azure_url("gpt4o-deploy"),
        api_style: ApiStyle::Azure,
        azure_api_version: Some("2024-10-21".into()),
        ..spec(&server)
    };
    let client =
        LlmClient::with_key(&s, Some(ApiKey::new("azure-key-1")), None, "run").expect("client");
    client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("reply");
    let seen = server.requests();
    assert_eq!(
        seen[0].path,
        "/openai/deployments/gpt4o-deploy/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(seen[0].header("api-key"), Some("azure-key-1"));
    assert_eq!(seen[0].header("authorization"), None);
}

#[tokio::test]
async fn a_call_larger_than_the_token_burst_fails_before_any_request() {
    let server = server_with(vec![]).await;
    let s = LlmSpec {
        tokens_per_minute: 2_000,
        token_burst: Some(100),
        ..spec(&server)
    };
    let client = LlmClient::with_key(&s, None, None, "run").expect("client");
    let err = client
        .chat_json::<Entities>(request("x"))
        .await
        .expect_err("too large");
    assert!(err.to_string().contains("llm.token_burst"), "{err}");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn requests_are_paced_at_the_configured_rate() {
    let server = server_with(vec![]).await;
    // 60 per minute with a burst of 2: two at once, then one every 60/58 s.
    let s = LlmSpec {
        requests_per_minute: 60,
        request_burst: Some(2),
        max_concurrency: 8,
        ..spec(&server)
    };
    let client = Arc::new(LlmClient::with_key(&s, None, None, "run").expect("client"));
    // Slots are counted from before the first call, not from the first
    // arrival: a machine under load can only make requests late, so this
    // bound holds however slow the first connection is.
    let before = server.elapsed();
    let calls = (0..5).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .chat_json::<Entities>(request(&format!("text {i}")))
                .await
        })
    });
    for c in futures::future::join_all(calls).await {
        c.expect("task").expect("reply");
    }
    let at: Vec<Duration> = server.requests().iter().map(|r| r.at).collect();
    assert_eq!(at.len(), 5);
    let step = Duration::from_secs(60).div_f64(58.0);
    for (k, arrived) in at.iter().enumerate().skip(2) {
        let earliest = before + step.mul_f64((k - 1) as f64) - Duration::from_millis(20);
        assert!(
            *arrived >= earliest,
            "request {k} at {arrived:?}, before its slot {earliest:?}"
        );
    }
}

#[tokio::test]
async fn structured_output_can_start_in_prompt_mode() {
    let server = server_with(vec![]).await;
    let s = LlmSpec {
        structured_output: StructuredOutput::Prompt,
        extra_body: serde_json::Map::from_iter([("cache_prompt".to_string(), json!(false))]),
        ..spec(&server)
    };
    let client = LlmClient::with_key(&s, None, None, "run").expect("client");
    client
        .chat_json::<Entities>(request("x"))
        .await
        .expect("reply");
    let body = &server.requests()[0].body;
    assert!(body.get("response_format").is_none());
    assert_eq!(
        body["cache_prompt"], false,
        "extra_body is merged into the request"
    );
}

#[tokio::test]
async fn embeddings_use_the_endpoint_and_the_cache() {
    let server = server_with(vec![]).await;
    let client = LlmClient::with_key(
        &spec(&server),
        None,
        Some(memory_cache(CacheMode::ReadWrite)),
        "run",
    )
    .expect("client");
    let texts: Vec<String> = ["Acme Corp", "PO-4471", "Priya Raman"]
        .map(String::from)
        .to_vec();
    let vectors = client
        .embed(graphloom::stage::Stage::EmbedNames, &texts)
        .await
        .expect("vectors");
    for (t, v) in texts.iter().zip(&vectors) {
        assert_eq!(v, &embedding_of(t));
    }
    let again = client
        .embed(graphloom::stage::Stage::EmbedNames, &texts)
        .await
        .expect("vectors");
    assert_eq!(again, vectors);
    let embedding_requests = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .count();
    assert_eq!(
        embedding_requests, 1,
        "the second call was answered by the cache"
    );
}

/// A client of `server` with `llm.stream` on.
fn streaming_client(server: &TestServer) -> LlmClient {
    let streaming = LlmSpec {
        stream: true,
        ..spec(server)
    };
    LlmClient::with_key(&streaming, None, None, "run").expect("client")
}

#[tokio::test]
async fn a_streamed_reply_reads_as_the_whole_one_with_the_servers_usage() {
    let server = server_with(vec![]).await;
    let client = streaming_client(&server);
    let reply = client
        .chat_json::<Entities>(request("Acme Corp sent PO 1."))
        .await
        .expect("reply");
    assert_eq!(reply.value.entities[0].name, "Acme Corp");
    assert!(reply.dropped.is_empty(), "{:?}", reply.dropped);
    let seen = server.requests();
    assert_eq!(seen[0].body["stream"], true);
    assert_eq!(seen[0].body["stream_options"]["include_usage"], true);
    let rows = client.take_calls();
    assert_eq!(rows[0].prompt_tokens as u64, seen[0].prompt_tokens);
    assert_eq!(rows[0].completion_tokens as u64, seen[0].completion_tokens);
}

#[tokio::test]
async fn a_streamed_reply_that_loops_is_stopped_and_keeps_what_it_completed() {
    // A model caught in a loop: two entities, then the same two again and
    // again, until max_tokens.
    let item = |name: &str| format!(r#"{{"name":"{name}","type":"Company"}}"#);
    let mut items = vec![item("Acme Corp"), item("Globex")];
    for _ in 0..40 {
        items.push(item("Acme Corp"));
        items.push(item("Globex"));
    }
    let looping = format!(r#"{{"entities":[{}"#, items.join(","));
    let server = server_with(vec![Reply::Length(looping)]).await;
    let client = streaming_client(&server);
    let reply = client
        .chat_json::<Entities>(request("Acme Corp and Globex."))
        .await
        .expect("the completed items are kept");
    let names: Vec<&str> = reply
        .value
        .entities
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(names, ["Acme Corp", "Globex", "Acme Corp", "Globex"]);
    assert!(
        reply
            .dropped
            .iter()
            .any(|n| n.contains("began to repeat its items")),
        "{:?}",
        reply.dropped
    );
    // Only what was read is counted: the 4 items, not the 82 written.
    let rows = client.take_calls();
    let whole = server.requests()[0].completion_tokens;
    assert!(
        (rows[0].completion_tokens as u64) * 10 < whole,
        "{} of {whole}",
        rows[0].completion_tokens
    );
    assert_eq!(server.requests().len(), 1, "a loop is not asked again");
}

/// Four concurrent calls that open with one system prompt, as an
/// extraction stage sends them.
async fn burst(client: &LlmClient, texts: &[&str]) {
    let calls = texts
        .iter()
        .map(|t| client.chat_json::<Entities>(request(t)))
        .collect::<Vec<_>>();
    for reply in futures::future::join_all(calls).await {
        reply.expect("every call of the burst is answered");
    }
}

fn is_warm_up(r: &graphloom::llm::test_server::Recorded) -> bool {
    r.max_tokens == Some(1)
}

#[tokio::test]
async fn a_shared_system_prompt_is_warmed_once_before_the_calls_that_miss_the_cache() {
    let server = server_with(vec![]).await;
    let mut behavior = Behavior::with_responder(|_| Reply::Content(GOOD.into()));
    behavior.latency = Duration::from_millis(300);
    server.set_behavior(behavior);
    let mut s = spec(&server);
    s.warm_prefix = true;
    s.max_concurrency = 4;
    let cache = memory_cache(CacheMode::ReadWrite);
    let client = LlmClient::with_key(&s, None, Some(cache.clone()), "run").expect("client");
    client.share_prefix(&Message::system("Extract entities."));
    burst(&client, &["a", "b", "c", "d"]).await;

    let seen = server.take_requests();
    assert_eq!(seen.len(), 5, "one warm-up and the four calls");
    let warm = &seen[0];
    assert!(is_warm_up(warm), "the warm-up goes first: {:?}", warm.body);
    assert_eq!(
        warm.body["messages"],
        json!([
            {"role": "system", "content": "Extract entities."},
            {"role": "user", "content": ""}
        ])
    );
    assert!(warm.body.get("response_format").is_none());
    for call in &seen[1..] {
        assert!(!is_warm_up(call));
        assert!(
            call.at >= warm.at + Duration::from_millis(300),
            "a call went out at {:?}, before the warm-up (sent at {:?}) was answered",
            call.at,
            warm.at
        );
    }
    let rows = client.take_calls();
    let warm_rows: Vec<_> = rows
        .iter()
        .filter(|r| r.item.as_deref() == Some("warm-up"))
        .collect();
    assert_eq!(warm_rows.len(), 1);
    assert_eq!(
        (warm_rows[0].stage.as_str(), warm_rows[0].status.as_str()),
        ("extract_entities", "ok")
    );
    assert_eq!(warm_rows[0].prompt_tokens as u64, warm.prompt_tokens);

    // Declared again: no second warm-up for the next burst.
    client.share_prefix(&Message::system("Extract entities."));
    burst(&client, &["e", "f"]).await;
    assert_eq!(
        server
            .take_requests()
            .iter()
            .filter(|r| is_warm_up(r))
            .count(),
        0
    );

    // A rerun whose calls all hit the cache sends nothing at all.
    let rerun = LlmClient::with_key(&s, None, Some(cache), "rerun").expect("client");
    rerun.share_prefix(&Message::system("Extract entities."));
    burst(&rerun, &["a", "b", "c", "d"]).await;
    assert!(server.take_requests().is_empty());

    // Off (the default), declaring a prompt changes nothing.
    s.warm_prefix = false;
    let off = LlmClient::with_key(&s, None, None, "off").expect("client");
    off.share_prefix(&Message::system("Extract entities."));
    burst(&off, &["a", "b"]).await;
    let seen = server.take_requests();
    assert_eq!(seen.len(), 2);
    assert!(!seen.iter().any(is_warm_up));
}

#[tokio::test]
async fn a_failed_warm_up_is_recorded_and_the_calls_it_led_are_answered() {
    // The first request (the warm-up) is refused for good.
    let server = server_with(vec![Reply::error(
        400,
        "messages: empty content",
        "invalid_request_error",
        None,
    )])
    .await;
    let mut s = spec(&server);
    s.warm_prefix = true;
    let client = LlmClient::with_key(&s, None, None, "run").expect("client");
    client.share_prefix(&Message::system("Extract entities."));
    burst(&client, &["a", "b", "c"]).await;
    let seen = server.requests();
    assert_eq!(seen.len(), 4);
    assert!(is_warm_up(&seen[0]) && seen[0].status == 400);
    let rows = client.take_calls();
    let warm = rows
        .iter()
        .find(|r| r.item.as_deref() == Some("warm-up"))
        .expect("the warm-up's row");
    assert_eq!(warm.status, "error");
    assert_eq!(rows.iter().filter(|r| r.status == "ok").count(), 3);
}
