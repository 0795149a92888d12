//! The OpenAI-compatible test server, driven by a real HTTP client (reqwest)
//! and, for framing details, by raw TCP.

use std::time::Duration;

use graphloom::llm::test_server::{
    Behavior, EMBEDDING_DIMS, Fault, INVALID_CONTENT, Reply, TestServer, count_tokens, embedding_of,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn server(behavior: Behavior) -> TestServer {
    TestServer::start(behavior).await.expect("server starts")
}

fn chat_body(content: &str) -> Value {
    json!({
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You extract facts."},
            {"role": "user", "content": content},
        ],
        "max_tokens": 64,
        "temperature": 0,
        "response_format": {"type": "json_object"},
    })
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> reqwest::Response {
    client
        .post(url)
        .json(body)
        .send()
        .await
        .expect("request is answered")
}

async fn chat(client: &reqwest::Client, server: &TestServer, content: &str) -> reqwest::Response {
    let url = format!("{}/chat/completions", server.base_url());
    post(client, &url, &chat_body(content)).await
}

/// Sends raw bytes and reads until the server closes (bounded by a timeout).
async fn raw_exchange(server: &TestServer, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(server.addr()).await.expect("connects");
    stream.write_all(request).await.expect("writes");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("server closes the connection")
        .expect("reads");
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes standard padded base64 (test helper).
fn decode_base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let mut n = 0u32;
        let mut valid = 0;
        for &c in chunk {
            n <<= 6;
            if let Some(i) = ALPHABET.iter().position(|&a| a == c) {
                n |= i as u32;
                valid += 1;
            }
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..valid]);
    }
    out
}

#[tokio::test]
async fn chat_reply_has_the_openai_shape_and_usage() {
    let server = server(Behavior::with_responder(|view| {
        assert_eq!(view.model, "gpt-test");
        assert_eq!(view.max_tokens, Some(64));
        assert_eq!(view.response_format, Some(json!({"type": "json_object"})));
        Reply::json(&json!({"facts": [], "echo": view.last("user")}))
    }))
    .await;
    let client = reqwest::Client::new();
    let resp = chat(&client, &server, "Alice joined Acme in 2020.").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let body: Value = resp.json().await.expect("JSON body");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(body["created"].as_i64().unwrap() > 1_600_000_000);
    assert_eq!(body["model"], "gpt-test");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "stop");
    let content = choice["message"]["content"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(content).expect("content is JSON");
    assert_eq!(parsed["echo"], "Alice joined Acme in 2020.");

    // "You extract facts." is 18 chars (5 tokens), the user message 26 (7).
    let prompt = 5 + 4 + 7 + 4;
    let completion = count_tokens(content);
    assert_eq!(body["usage"]["prompt_tokens"], prompt);
    assert_eq!(body["usage"]["completion_tokens"], completion);
    assert_eq!(body["usage"]["total_tokens"], prompt + completion);

    let recorded = server.requests();
    assert_eq!(recorded.len(), 1);
    let r = &recorded[0];
    assert_eq!((r.seq, r.method.as_str()), (0, "POST"));
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.prompt_tokens, prompt);
    assert_eq!(r.max_tokens, Some(64));
    assert_eq!(r.status, 200);
    assert_eq!(r.completion_tokens, completion);
    assert_eq!(r.body["temperature"], 0);
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    assert!(r.headers.iter().all(|(n, _)| *n == n.to_ascii_lowercase()));
    server.shutdown().await;
}

#[tokio::test]
async fn a_streamed_chat_reply_comes_as_server_sent_events_with_usage_last() {
    let content = r#"{"facts": ["Alice joined Acme in 2020."]}"#;
    let server = server(Behavior::with_responder(move |_| {
        Reply::Content(content.into())
    }))
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.base_url());
    let mut body = chat_body("Alice joined Acme in 2020.");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = post(&client, &url, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let text = resp.text().await.expect("body");
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("a data line"))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("a JSON event"))
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    // The pieces make up the content; the finish reason comes after them,
    // the usage last, in a chunk without choices.
    let written: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(written, content);
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    let recorded = &server.requests()[0];
    assert_eq!(
        chunks[n - 1]["usage"]["completion_tokens"],
        recorded.completion_tokens
    );
    // One chunk per token of the server's counting rule (and the role).
    let pieces = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count();
    assert_eq!(pieces as u64, 1 + recorded.completion_tokens);
}

#[tokio::test]
async fn default_behavior_answers_an_empty_json_object() {
    let server = server(Behavior::default()).await;
    let client = reqwest::Client::new();
    let body: Value = chat(&client, &server, "hi").await.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "{}");
    assert_eq!(body["usage"]["completion_tokens"], 1);
    server.shutdown().await;
}

#[tokio::test]
async fn scripted_replies_come_first_in_order_then_the_responder() {
    let server = server(Behavior::with_responder(|_| {
        Reply::Content("from responder".into())
    }))
    .await;
    server.push_replies([
        Reply::Content("first".into()),
        Reply::Length("second, cut".into()),
        Reply::ContentWithUsage {
            content: "third".into(),
            prompt_tokens: 1000,
            completion_tokens: 7,
        },
        Reply::error(400, "bad schema", "invalid_request_error", Some("bad")),
    ]);
    assert_eq!(server.pending_replies(), 4);
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for i in 0..6 {
        let resp = chat(&client, &server, &format!("request {i}")).await;
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        answers.push((status, body));
    }
    let content = |i: usize| answers[i].1["choices"][0]["message"]["content"].clone();
    let finish = |i: usize| answers[i].1["choices"][0]["finish_reason"].clone();
    assert_eq!((content(0), finish(0)), (json!("first"), json!("stop")));
    assert_eq!(
        (content(1), finish(1)),
        (json!("second, cut"), json!("length"))
    );
    assert_eq!(content(2), "third");
    assert_eq!(answers[2].1["usage"]["prompt_tokens"], 1000);
    assert_eq!(answers[2].1["usage"]["completion_tokens"], 7);
    assert_eq!(answers[2].1["usage"]["total_tokens"], 1007);
    assert_eq!(answers[3].0, 400);
    assert_eq!(answers[3].1["error"]["code"], "bad");
    assert_eq!(content(4), "from responder");
    assert_eq!(content(5), "from responder");
    assert_eq!(server.pending_replies(), 0);

    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 400, 200, 200]);
    let completion: Vec<u64> = server
        .requests()
        .iter()
        .map(|r| r.completion_tokens)
        .collect();
    assert_eq!(completion, [2, 3, 7, 0, 4, 4]);
    server.shutdown().await;
}

#[tokio::test]
async fn rate_limited_sends_429_with_retry_after() {
    let date = "Wed, 21 Oct 2015 07:28:00 GMT";
    let server = server(Behavior::default()).await;
    server.push_replies([
        Reply::Fault(Fault::RateLimited {
            retry_after: Some("2".into()),
        }),
        Reply::Fault(Fault::RateLimited {
            retry_after: Some(date.into()),
        }),
        Reply::Fault(Fault::RateLimited { retry_after: None }),
    ]);
    let client = reqwest::Client::new();
    for expected in [Some("2"), Some(date), None] {
        let resp = chat(&client, &server, "x").await;
        assert_eq!(resp.status(), 429);
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(retry_after.as_deref(), expected);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(body["error"]["type"], "requests");
        assert!(body["error"]["message"].is_string());
    }
    // The connection stays usable after an error status.
    assert_eq!(chat(&client, &server, "x").await.status(), 200);
    server.shutdown().await;
}

#[tokio::test]
async fn quota_exhausted_and_server_errors_carry_openai_errors() {
    let server = server(Behavior::default()).await;
    server.push_replies([
        Reply::Fault(Fault::QuotaExhausted),
        Reply::Fault(Fault::ServerError(500)),
        Reply::Fault(Fault::ServerError(502)),
        Reply::Fault(Fault::ServerError(503)),
    ]);
    let client = reqwest::Client::new();
    let resp = chat(&client, &server, "x").await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("retry-after").is_none());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_quota");
    assert_eq!(body["error"]["type"], "insufficient_quota");
    for status in [500, 502, 503] {
        let resp = chat(&client, &server, "x").await;
        assert_eq!(resp.status().as_u16(), status);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["type"], "server_error");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn truncated_body_fails_to_read() {
    let server = server(Behavior::default()).await;
    server.push_replies([Reply::Fault(Fault::Truncated)]);
    let client = reqwest::Client::new();
    let resp = chat(&client, &server, "x").await;
    assert_eq!(resp.status(), 200);
    let announced = resp.content_length().expect("Content-Length is sent");
    assert!(announced > 0);
    assert!(resp.bytes().await.is_err(), "a short body is an error");
    assert_eq!(server.requests()[0].status, 200);
    // The client recovers on a new connection.
    assert_eq!(chat(&client, &server, "x").await.status(), 200);
    server.shutdown().await;
}

#[tokio::test]
async fn broken_json_fails_to_parse_and_invalid_content_is_not_json() {
    let server = server(Behavior::default()).await;
    server.push_replies([
        Reply::Fault(Fault::BrokenJson),
        Reply::Fault(Fault::BrokenJson),
        Reply::Fault(Fault::InvalidContent),
    ]);
    let client = reqwest::Client::new();
    let resp = chat(&client, &server, "x").await;
    assert_eq!(resp.status(), 200);
    assert!(resp.json::<Value>().await.is_err());
    let text = chat(&client, &server, "x").await.text().await.unwrap();
    assert!(!text.is_empty());
    assert!(serde_json::from_str::<Value>(&text).is_err());

    let body: Value = chat(&client, &server, "x").await.json().await.unwrap();
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content, INVALID_CONTENT);
    assert!(serde_json::from_str::<Value>(content).is_err());
    assert_eq!(body["usage"]["completion_tokens"], count_tokens(content));
    server.shutdown().await;
}

#[tokio::test]
async fn close_gives_a_connection_error() {
    let server = server(Behavior::default()).await;
    server.push_replies([Reply::Fault(Fault::Close)]);
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.base_url());
    let err = client
        .post(&url)
        .json(&chat_body("x"))
        .send()
        .await
        .expect_err("no response");
    assert!(!err.is_timeout());
    assert!(err.status().is_none());
    let recorded = server.requests();
    assert_eq!(recorded.len(), 1, "the request was read, and not retried");
    assert_eq!(recorded[0].status, 0);
    assert_eq!(chat(&client, &server, "x").await.status(), 200);
    server.shutdown().await;
}

#[tokio::test]
async fn slow_reply_runs_into_the_client_timeout() {
    let server = server(Behavior::default()).await;
    server.push_replies([Reply::Fault(Fault::Slow(Duration::from_secs(5)))]);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let url = format!("{}/chat/completions", server.base_url());
    let err = client
        .post(&url)
        .json(&chat_body("x"))
        .send()
        .await
        .expect_err("times out");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(server.requests().len(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn injected_slow_replies_normally_after_its_delay() {
    let server = server(Behavior {
        faults: vec![(1.0, Fault::Slow(Duration::from_millis(1)))],
        ..Behavior::with_responder(|_| Reply::Content("late".into()))
    })
    .await;
    let client = reqwest::Client::new();
    let body: Value = chat(&client, &server, "x").await.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "late");
    server.shutdown().await;
}

#[tokio::test]
async fn fault_rates_with_a_seed_are_reproducible() {
    let behavior = Behavior {
        faults: vec![
            (
                0.2,
                Fault::RateLimited {
                    retry_after: Some("1".into()),
                },
            ),
            (0.1, Fault::ServerError(503)),
            (0.1, Fault::QuotaExhausted),
        ],
        seed: 42,
        ..Behavior::default()
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        let server = server(behavior.clone()).await;
        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        for i in 0..50 {
            statuses.push(
                chat(&client, &server, &format!("{i}"))
                    .await
                    .status()
                    .as_u16(),
            );
        }
        let recorded: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
        assert_eq!(recorded, statuses);
        runs.push(statuses);
        server.shutdown().await;
    }
    assert_eq!(runs[0], runs[1]);
    assert!(runs[0].contains(&200));
    assert!(runs[0].contains(&429));
    assert!(runs[0].iter().all(|s| [200, 429, 503].contains(s)));

    // Another seed gives another sequence; set_behavior reseeds.
    let server = server(behavior.clone()).await;
    let client = reqwest::Client::new();
    server.set_behavior(Behavior {
        seed: 7,
        ..behavior.clone()
    });
    let mut other = Vec::new();
    for i in 0..50 {
        other.push(
            chat(&client, &server, &format!("{i}"))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_ne!(other, runs[0]);
    server.set_behavior(behavior);
    let mut again = Vec::new();
    for i in 0..50 {
        again.push(
            chat(&client, &server, &format!("{i}"))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(again, runs[0]);
    server.shutdown().await;
}

#[tokio::test]
async fn keep_alive_serves_many_requests_on_one_connection() {
    let server = server(Behavior::default()).await;
    let client = reqwest::Client::new();
    for i in 0..20 {
        let resp = chat(&client, &server, &format!("request {i}")).await;
        assert_eq!(resp.status(), 200);
        let _: Value = resp.json().await.unwrap();
    }
    let recorded = server.requests();
    assert_eq!(recorded.len(), 20);
    for (i, r) in recorded.iter().enumerate() {
        assert_eq!(r.seq, i as u64);
        assert_eq!(r.status, 200);
        assert_eq!(r.connection, recorded[0].connection, "one connection");
        assert_eq!(
            r.body["messages"][1]["content"],
            format!("request {i}").as_str()
        );
    }
    assert!(recorded.windows(2).all(|w| w[0].at <= w[1].at));
    assert!(recorded[0].at < recorded[19].at);
    server.shutdown().await;
}

#[tokio::test]
async fn pipelined_requests_and_connection_close_over_raw_tcp() {
    let server = server(Behavior::default()).await;
    let body = chat_body("x").to_string();
    let one = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let last = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let out = raw_exchange(&server, format!("{one}{one}{last}").as_bytes()).await;
    assert_eq!(out.matches("HTTP/1.1 200 OK\r\n").count(), 3, "{out}");
    assert!(out.ends_with("{\"status\":\"ok\"}"), "{out}");
    assert_eq!(out.matches("connection: close").count(), 1);
    let recorded = server.requests();
    assert_eq!(recorded.len(), 3);
    assert!(
        recorded
            .iter()
            .all(|r| r.connection == recorded[0].connection)
    );

    // HTTP/1.0 closes by default.
    let out = raw_exchange(&server, b"GET /health HTTP/1.0\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    server.shutdown().await;
}

#[tokio::test]
async fn chunked_and_malformed_http_is_refused() {
    let server = server(Behavior::default()).await;
    let chunked = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                   Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    let out = raw_exchange(&server, chunked.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 411 "), "{out}");
    assert!(out.contains("invalid_request_error"));
    assert_eq!(server.requests()[0].status, 411);

    let out = raw_exchange(&server, b"NOT AN HTTP REQUEST\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
    let out = raw_exchange(
        &server,
        b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
    server.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_openai_400s() {
    let server = server(Behavior::default()).await;
    server.push_replies([Reply::Content("kept for a valid request".into())]);
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.base_url());
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("JSON"));

    let bad_bodies = [
        json!({"model": "m"}),
        json!({"model": "m", "messages": []}),
        json!({"model": "m", "messages": "hi"}),
        json!({"messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}),
        json!({"model": "m", "messages": [{"role": "user"}]}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "9"}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}),
    ];
    for body in &bad_bodies {
        let resp = post(&client, &url, body).await;
        assert_eq!(resp.status(), 400, "{body}");
        let error: Value = resp.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
    }
    assert_eq!(
        server.pending_replies(),
        1,
        "400s consume no scripted reply"
    );
    let recorded = server.requests();
    assert_eq!(recorded[0].body, Value::Null);
    assert!(
        recorded
            .iter()
            .all(|r| r.status == 400 && r.prompt_tokens == 0)
    );

    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"}]}],
        "max_completion_tokens": 5,
    });
    let reply: Value = post(&client, &url, &body).await.json().await.unwrap();
    assert_eq!(
        reply["choices"][0]["message"]["content"],
        "kept for a valid request"
    );
    assert_eq!(reply["usage"]["prompt_tokens"], 1 + 4);
    assert_eq!(server.requests().last().unwrap().max_tokens, Some(5));
    server.shutdown().await;
}

#[tokio::test]
async fn embeddings_are_deterministic_and_normalised() {
    let server = server(Behavior::default()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/embeddings", server.base_url());
    let body = json!({"model": "embed-test", "input": ["Alice", "Acme Corp", "Alice"]});
    let first: Value = post(&client, &url, &body).await.json().await.unwrap();
    let second: Value = post(&client, &url, &body).await.json().await.unwrap();
    assert_eq!(first["object"], "list");
    assert_eq!(first["model"], "embed-test");
    let data = first["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let vectors: Vec<Vec<f32>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    for v in &vectors {
        assert_eq!(v.len(), EMBEDDING_DIMS);
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-6, "norm {norm}");
    }
    assert_eq!(vectors[0], vectors[2]);
    assert_ne!(vectors[0], vectors[1]);
    assert_eq!(vectors[0], embedding_of("Alice"));
    assert_eq!(first["data"], second["data"]);
    let tokens = count_tokens("Alice") * 2 + count_tokens("Acme Corp");
    assert_eq!(first["usage"]["prompt_tokens"], tokens);
    assert_eq!(first["usage"]["total_tokens"], tokens);
    assert_eq!(server.requests()[0].prompt_tokens, tokens);

    let single: Value = post(&client, &url, &json!({"model": "e", "input": "Alice"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        single["data"][0]["embedding"],
        first["data"][0]["embedding"]
    );
    let b64: Value = post(
        &client,
        &url,
        &json!({"model": "e", "input": "Alice", "encoding_format": "base64"}),
    )
    .await
    .json()
    .await
    .unwrap();
    let encoded = b64["data"][0]["embedding"].as_str().unwrap();
    assert_eq!(encoded.len(), (EMBEDDING_DIMS * 4).div_ceil(3) * 4);
    let bytes = decode_base64(encoded);
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(decoded, vectors[0]);

    let resp = post(&client, &url, &json!({"model": "e"})).await;
    assert_eq!(resp.status(), 400);
    server.shutdown().await;
}

#[tokio::test]
async fn faults_apply_to_embeddings_too() {
    let server = server(Behavior {
        faults: vec![(1.0, Fault::ServerError(502))],
        ..Behavior::default()
    })
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/embeddings", server.base_url());
    let resp = post(&client, &url, &json!({"model": "e", "input": "x"})).await;
    assert_eq!(resp.status(), 502);
    // Health checks are never faulted.
    let health = client
        .get(format!("{}/health", server.root_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    server.shutdown().await;
}

#[tokio::test]
async fn azure_paths_work() {
    let server = server(Behavior::with_responder(|view| {
        Reply::Content(view.model.clone())
    }))
    .await;
    let client = reqwest::Client::new();
    let deployment = server.azure_url("gpt4o-prod");
    let chat_url = format!("{deployment}/chat/completions?api-version=2024-10-21");
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let resp = client
        .post(&chat_url)
        .header("api-key", "test-key")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let reply: Value = resp.json().await.unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "gpt4o-prod");

    let embed_url = format!("{deployment}/embeddings?api-version=2024-10-21");
    let reply: Value = post(&client, &embed_url, &json!({"input": "x"}))
        .await
        .json()
        .await
        .unwrap();
    let vector: Vec<f32> = reply["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(vector, embedding_of("x"));

    let recorded = server.requests();
    assert_eq!(
        recorded[0].path,
        "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(recorded[0].header("api-key"), Some("test-key"));
    assert_eq!(
        recorded[1].path,
        "/openai/deployments/gpt4o-prod/embeddings?api-version=2024-10-21"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn health_models_and_unknown_routes() {
    let server = server(Behavior::default()).await;
    let client = reqwest::Client::new();
    let health = client
        .get(format!("{}/health", server.root_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(
        health.json::<Value>().await.unwrap(),
        json!({"status": "ok"})
    );
    let models: Value = client
        .get(format!("{}/models", server.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "test-model");

    for (method, path) in [
        (reqwest::Method::POST, "/v1/completions"),
        (reqwest::Method::GET, "/v1/chat/completions"),
        (reqwest::Method::POST, "/openai/deployments/x/images"),
        (reqwest::Method::GET, "/"),
    ] {
        let resp = client
            .request(method.clone(), format!("{}{path}", server.root_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{method} {path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"].as_str().unwrap().contains(path));
    }
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_accepting() {
    let server = server(Behavior::default()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.base_url());
    assert_eq!(chat(&client, &server, "x").await.status(), 200);
    server.shutdown().await;
    // The pooled connection is gone and nobody listens any more.
    assert!(
        client
            .post(&url)
            .json(&chat_body("x"))
            .send()
            .await
            .is_err()
    );
    let fresh = reqwest::Client::new();
    assert!(fresh.post(&url).json(&chat_body("x")).send().await.is_err());
}

#[tokio::test]
async fn dropping_the_server_stops_it() {
    let server = server(Behavior::default()).await;
    let url = format!("{}/health", server.root_url());
    drop(server);
    // Give the runtime a moment to run the aborted tasks' drops.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(reqwest::Client::new().get(&url).send().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_are_all_served_and_recorded() {
    let server = server(Behavior {
        latency: Duration::from_millis(20),
        ..Behavior::with_responder(|view| Reply::Content(view.last("user").unwrap_or("").into()))
    })
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.base_url());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..32 {
        let client = client.clone();
        let url = url.clone();
        tasks.spawn(async move {
            let body: Value = post(&client, &url, &chat_body(&format!("{i}")))
                .await
                .json()
                .await
                .unwrap();
            (i, body["choices"][0]["message"]["content"].clone())
        });
    }
    let mut answered = 0;
    while let Some(result) = tasks.join_next().await {
        let (i, content) = result.expect("task completes");
        assert_eq!(content, format!("{i}").as_str());
        answered += 1;
    }
    assert_eq!(answered, 32);
    let recorded = server.requests();
    let seqs: Vec<u64> = recorded.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (0..32).collect::<Vec<u64>>());
    assert!(recorded.iter().all(|r| r.status == 200));
    assert!(recorded.windows(2).all(|w| w[0].at <= w[1].at));
    server.shutdown().await;
}
