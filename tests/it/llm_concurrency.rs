//! Calls in flight and call budgets against the faithful test server: the
//! limit follows what the server sustains (up to `llm.max_concurrency`
//! where more calls add throughput, held low where a server shares one
//! throughput among them, as a CPU server does), and a call's budget runs
//! from its first request, not while it waits for a slot of the client.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graphloom::llm::test_server::{Behavior, Reply, TestServer};
use graphloom::llm::{ChatRequest, LlmClient, LlmError, Message};
use graphloom::spec::LlmSpec;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Answer {
    #[allow(dead_code)]
    ok: bool,
}

fn request(i: usize, budget: Option<Duration>) -> ChatRequest {
    ChatRequest {
        stage: graphloom::stage::Stage::ExtractEntities,
        item: Some(format!("episode-{i}")),
        messages: vec![Message::system("Answer."), Message::user(format!("q {i}"))],
        max_tokens: 32,
        prompt_version: "concurrency-1".into(),
        budget,
    }
}

fn spec(server: &TestServer, max: u32, adaptive: bool) -> LlmSpec {
    LlmSpec {
        base_url: server.base_url(),
        max_concurrency: max,
        adaptive_concurrency: adaptive,
        requests_per_minute: 100_000,
        backoff_initial_ms: 10,
        backoff_max_ms: 50,
        max_attempts: 3,
        timeout_secs: 30,
        ..LlmSpec::default()
    }
}

/// Sends `n` calls at once through `client` (which decides how many go);
/// returns their results.
async fn send_all(
    client: &Arc<LlmClient>,
    n: usize,
    budget: Option<Duration>,
) -> Vec<Result<(), LlmError>> {
    let calls = (0..n).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .chat_json_with_schema::<Answer>(
                    request(i, budget),
                    serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                       "required": ["ok"], "additionalProperties": false}),
                )
                .await
                .map(|_| ())
        })
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect()
}

const OK: &str = r#"{"ok": true}"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_call_budget_runs_from_its_first_request_not_while_it_waits_for_a_slot() {
    let server = TestServer::start(Behavior {
        latency: Duration::from_millis(400),
        ..Behavior::with_responder(|_| Reply::Content(OK.into()))
    })
    .await
    .expect("test server");
    // One call at a time: the fourth waits 1.2 s for its slot, longer
    // than its 1 s budget, and still has all of it once sent.
    let client =
        Arc::new(LlmClient::with_key(&spec(&server, 1, false), None, None, "run").expect("client"));
    let results = send_all(&client, 4, Some(Duration::from_secs(1))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(server.take_requests().len(), 4);

    // A reply slower than the budget: the attempt is cut at the budget and
    // not retried past it.
    server.set_behavior(Behavior {
        latency: Duration::from_millis(1500),
        ..Behavior::with_responder(|_| Reply::Content(OK.into()))
    });
    let results = send_all(&client, 1, Some(Duration::from_secs(1))).await;
    let err = results[0].as_ref().expect_err("past its budget");
    assert!(
        err.to_string().contains("ran past its time budget of 1 s"),
        "{err}"
    );
    assert_eq!(
        server.take_requests().len(),
        1,
        "no attempt after the budget"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_in_flight_grow_to_the_maximum_where_the_server_serves_them_all_at_full_speed() {
    let server = TestServer::start(Behavior {
        latency: Duration::from_millis(40),
        ..Behavior::with_responder(|_| Reply::Content(OK.into()))
    })
    .await
    .expect("test server");
    let client =
        Arc::new(LlmClient::with_key(&spec(&server, 8, true), None, None, "run").expect("client"));
    let results = send_all(&client, 80, None).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(client.in_flight(), (2, 8, 8), "from 2 up to the maximum");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_in_flight_stay_low_where_the_server_shares_one_throughput_among_them() {
    // A CPU server: every request in flight slows the others, so a reply
    // takes 40 ms for each request in flight when it arrives (itself
    // included) and throughput is the same at any concurrency.
    let ends: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let responder = {
        let ends = ends.clone();
        move |_: &graphloom::llm::test_server::ChatRequestView| {
            let now = Instant::now();
            let mut ends = ends.lock().expect("lock");
            ends.retain(|e| *e > now);
            let delay = Duration::from_millis(40) * (ends.len() as u32 + 1);
            ends.push(now + delay);
            Reply::Delayed {
                delay,
                reply: Box::new(Reply::Content(OK.into())),
            }
        }
    };
    let server = TestServer::start(Behavior::with_responder(responder))
        .await
        .expect("test server");
    let client =
        Arc::new(LlmClient::with_key(&spec(&server, 16, true), None, None, "run").expect("client"));
    let results = send_all(&client, 60, None).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let (low, high, max) = client.in_flight();
    assert_eq!(max, 16);
    assert!(
        low >= 1 && high <= 4,
        "more calls in flight add no throughput: {low} to {high}"
    );
    // The same client without adaptation keeps sixteen in flight.
    let fixed = Arc::new(
        LlmClient::with_key(&spec(&server, 16, false), None, None, "run").expect("client"),
    );
    send_all(&fixed, 16, None).await;
    assert_eq!(fixed.in_flight(), (16, 16, 16));
    server.shutdown().await;
}
