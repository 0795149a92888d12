//! An OpenAI-compatible HTTP/1.1 test server for graphloom's tests and for
//! the benchmark command.
//!
//! It stands in for a real provider (OpenAI, vLLM, llama.cpp's
//! `llama-server`) that cannot run here at scale. It speaks real HTTP/1.1
//! over TCP on `127.0.0.1` (a random port), written by hand on
//! [`tokio::net::TcpListener`]: request line, headers, a `Content-Length`
//! body (chunked request bodies are refused with 411), keep-alive with
//! several requests per connection (pipelined requests too) and
//! `Connection: close`.
//!
//! # Routes
//!
//! * `POST /v1/chat/completions`: an OpenAI chat completion. The reply is
//!   decided by the scripted replies ([`TestServer::push_replies`]), then by
//!   [`Behavior::responder`]. With `stream: true` a 200 comes as
//!   server-sent events, a chunk per token of its content.
//! * `POST /v1/embeddings`: 8-dimensional, L2-normalised embeddings that
//!   are a deterministic function of each input's text
//!   ([`embedding_of`]).
//! * `GET /v1/models`: a model list with one model, `test-model`.
//! * `GET /health`: `200 {"status":"ok"}`.
//! * The Azure OpenAI paths
//!   `POST /openai/deployments/{name}/chat/completions?api-version=...` and
//!   `POST /openai/deployments/{name}/embeddings?api-version=...`, where a
//!   request without a `model` takes the deployment name as its model.
//! * Anything else: 404 with an OpenAI error JSON.
//!
//! A malformed request (a body that is not JSON, no `model`, no or empty
//! `messages`, an unknown role, a `stream` that is not a boolean, ...) gets a 400 with an
//! OpenAI error JSON (`{"error":{"message","type":"invalid_request_error",
//! "param","code"}}`).
//!
//! # Token counting
//!
//! The server counts tokens with a fixed, documented rule so that tests can
//! check a client's accounting ([`count_tokens`], [`prompt_tokens`]):
//!
//! * a text counts `ceil(chars / 4)` tokens (Unicode scalar values);
//! * `prompt_tokens` of a chat request is the sum over its messages of the
//!   content's tokens plus 4 per message;
//! * `completion_tokens` of a reply is its content's tokens, at least 1,
//!   unless [`Reply::ContentWithUsage`] gives the numbers;
//! * `prompt_tokens` of an embeddings request is the sum of its inputs'
//!   tokens (a pre-tokenised input counts its length).
//!
//! # Order of decisions for a chat or embeddings request
//!
//! 1. The request is recorded ([`TestServer::requests`]) with status 0.
//! 2. One uniform number `u` in `[0, 1)` is drawn from the server's seeded
//!    RNG (only when [`Behavior::faults`] is not empty). The faults are
//!    checked in order against their cumulative rates: the first whose
//!    running sum of rates exceeds `u` is injected. So each fault happens at
//!    its own rate (as long as the rates sum to at most 1), and a given seed
//!    gives the same sequence of faults for the same sequence of requests.
//! 3. An injected fault replaces the reply: the scripted replies are not
//!    consumed and the responder is not asked (a retry then gets them). An
//!    injected [`Fault::Slow`] only adds its delay.
//! 4. A malformed request gets its 400.
//! 5. A chat request takes the next scripted reply, else asks the responder.
//! 6. [`Behavior::latency`] is slept, then the status is recorded and the
//!    response is written.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, sleep, timeout};

mod batch;
pub use batch::BatchEnd;
use batch::{BatchRoute, BatchState, Upload, batch_api, batch_route, parse_upload, upload_file};

/// Largest request head (request line and headers) the server reads.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header lines in one request.
const MAX_HEADERS: usize = 128;
/// Largest request body the server reads.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Most requests served on one connection; the last reply closes it.
const MAX_REQUESTS_PER_CONNECTION: u64 = 100_000;
/// How long an idle keep-alive connection is kept open. Longer than
/// reqwest's pool idle timeout (90 s), so that the client closes first.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the server waits for the rest of a request once it has begun.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long writing one response may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Size of each read from a socket.
const READ_CHUNK: usize = 16 * 1024;
/// Dimensions of the embeddings the server returns.
pub const EMBEDDING_DIMS: usize = 8;
/// The model listed by `GET /v1/models`.
pub const LISTED_MODEL: &str = "test-model";
/// The message content of [`Fault::InvalidContent`]: not JSON at all.
pub const INVALID_CONTENT: &str = "I'm sorry, but I can't help with that request.";

/// The default responder's content: a fixed valid JSON document.
const DEFAULT_CONTENT: &str = "{}";

/// Decides the reply to a chat request; see [`Behavior::responder`].
pub type Responder = Arc<dyn Fn(&ChatRequestView) -> Reply + Send + Sync>;

/// How the server behaves; replace it at any time with
/// [`TestServer::set_behavior`].
#[derive(Clone)]
pub struct Behavior {
    /// Added before every reply (all routes, faults included).
    pub latency: Duration,
    /// Faults injected at these rates (probabilities in `[0, 1]`, checked in
    /// order against their cumulative sum, see the module docs) on chat and
    /// embeddings requests.
    pub faults: Vec<(f64, Fault)>,
    /// Seed of the [`StdRng`] that draws the faults, so that fault
    /// injection is reproducible.
    pub seed: u64,
    /// Decides the reply to a chat request once the scripted replies are
    /// used up.
    pub responder: Responder,
}

impl Behavior {
    /// The default behaviour with this responder.
    pub fn with_responder(
        responder: impl Fn(&ChatRequestView) -> Reply + Send + Sync + 'static,
    ) -> Behavior {
        Behavior {
            responder: Arc::new(responder),
            ..Behavior::default()
        }
    }
}

impl Default for Behavior {
    /// No latency, no faults, seed 0, and a responder that answers every
    /// chat request with the content `{}`.
    fn default() -> Behavior {
        Behavior {
            latency: Duration::ZERO,
            faults: Vec::new(),
            seed: 0,
            responder: Arc::new(|_| Reply::Content(DEFAULT_CONTENT.to_owned())),
        }
    }
}

impl fmt::Debug for Behavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Behavior")
            .field("latency", &self.latency)
            .field("faults", &self.faults)
            .field("seed", &self.seed)
            .field("responder", &"<fn>")
            .finish()
    }
}

/// A chat request as the responder sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequestView {
    /// The requested model (an Azure deployment's name when the request
    /// names none).
    pub model: String,
    /// `(role, content)` of each message, in order. A content made of parts
    /// is the text parts joined by newlines; a missing content is empty.
    pub messages: Vec<(String, String)>,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u64>,
    /// `response_format` as sent, if any and not null.
    pub response_format: Option<Value>,
    /// The whole request body.
    pub body: Value,
}

impl ChatRequestView {
    /// The content of the last message with this role, if any.
    pub fn last(&self, role: &str) -> Option<&str> {
        self.messages
            .iter()
            .rev()
            .find(|(r, _)| r == role)
            .map(|(_, content)| content.as_str())
    }
}

/// The reply to one chat request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// 200 with a `chat.completion` whose `choices[0].message.content` is
    /// this, `finish_reason` `"stop"` and usage counted by the server's rule.
    Content(String),
    /// Like [`Reply::Content`] but with the usage given here.
    ContentWithUsage {
        /// The message content.
        content: String,
        /// Reported `usage.prompt_tokens`.
        prompt_tokens: u64,
        /// Reported `usage.completion_tokens`.
        completion_tokens: u64,
    },
    /// Like [`Reply::Content`] but with `finish_reason` `"length"` (a reply
    /// cut at `max_tokens`).
    Length(String),
    /// Any raw response, e.g. a 400 with an OpenAI error JSON. The server
    /// frames it: it sets `Content-Length` (a given `Content-Length` or
    /// `Transfer-Encoding` is dropped), adds `Content-Type:
    /// application/json` unless given, and closes the connection afterwards
    /// when given `Connection: close`.
    Status {
        /// HTTP status code.
        status: u16,
        /// Response headers.
        headers: Vec<(String, String)>,
        /// Response body.
        body: String,
    },
    /// A fault instead of a reply.
    Fault(Fault),
    /// `reply`, sent after waiting `delay` (without holding up other
    /// requests): to make replies arrive in another order than sent.
    Delayed {
        /// How long to wait first.
        delay: Duration,
        /// What to send then.
        reply: Box<Reply>,
    },
}

impl Reply {
    /// A [`Reply::Status`] with an OpenAI error JSON
    /// `{"error":{"message","type","param":null,"code"}}`.
    pub fn error(status: u16, message: &str, kind: &str, code: Option<&str>) -> Reply {
        Reply::Status {
            status,
            headers: Vec::new(),
            body: error_json(message, kind, None, code).to_string(),
        }
    }

    /// [`Reply::Content`] holding this JSON value, serialised.
    pub fn json(value: &Value) -> Reply {
        Reply::Content(value.to_string())
    }
}

/// A failure the server can inject.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// 429 with the OpenAI error JSON `{"error":{"message":..,"type":
    /// "requests","param":null,"code":"rate_limit_exceeded"}}`, and
    /// `Retry-After: <value>` when given (seconds such as `"2"`, or an HTTP
    /// date).
    RateLimited {
        /// The `Retry-After` header's value.
        retry_after: Option<String>,
    },
    /// 429 with error code and type `"insufficient_quota"`, which clients
    /// must not retry.
    QuotaExhausted,
    /// This status (500, 502, 503, ...) with an OpenAI `server_error` JSON.
    ServerError(u16),
    /// Sleeps this long, then replies normally (for client timeouts). As a
    /// scripted reply, "normally" is what the responder says; as the
    /// responder's reply (or a second `Slow`), it is the content `{}`.
    Slow(Duration),
    /// Sends a 200's headers with a `Content-Length` larger than the body
    /// it then sends (half of a valid reply), and closes the connection.
    Truncated,
    /// 200 `application/json` with a body that is not valid JSON.
    BrokenJson,
    /// 200 with a valid `chat.completion` whose message content is
    /// [`INVALID_CONTENT`], not JSON at all. On the embeddings route: a
    /// valid list with no embeddings in it.
    InvalidContent,
    /// Closes the connection after reading the request, without any
    /// response.
    Close,
}

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Arrival number, from 0.
    pub seq: u64,
    /// Arrival time (the whole request read) since the server started.
    pub at: Duration,
    /// Number of the connection it came on, from 1 in order of acceptance;
    /// requests on one keep-alive connection share it.
    pub connection: u64,
    /// HTTP method.
    pub method: String,
    /// Request target as sent: the path with its query, if any.
    pub path: String,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body as JSON; `Null` if empty or not JSON.
    pub body: Value,
    /// Prompt tokens by the server's rule (chat and embeddings requests that
    /// are well formed; 0 otherwise).
    pub prompt_tokens: u64,
    /// The chat request's `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u64>,
    /// Status sent; 0 while the reply is pending and when none was sent
    /// ([`Fault::Close`]).
    pub status: u16,
    /// `usage.completion_tokens` of a complete chat completion sent; 0
    /// otherwise.
    pub completion_tokens: u64,
}

impl Recorded {
    /// The value of the first header with this name (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Tokens of a text by the server's rule: `ceil(chars / 4)`.
pub fn count_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

/// Prompt tokens of a chat request's `(role, content)` messages by the
/// server's rule: the sum of each content's [`count_tokens`] plus 4 per
/// message.
pub fn prompt_tokens(messages: &[(String, String)]) -> u64 {
    messages.iter().map(|(_, c)| count_tokens(c) + 4).sum()
}

/// Completion tokens of a reply's content by the server's rule:
/// [`count_tokens`], at least 1.
pub fn completion_tokens(content: &str) -> u64 {
    count_tokens(content).max(1)
}

/// The embedding the server returns for this text: [`EMBEDDING_DIMS`]
/// numbers taken from the BLAKE3 hash of the text, L2-normalised, as `f32`
/// like a real provider's (so they survive a JSON round trip exactly when
/// read back as `f32`).
pub fn embedding_of(text: &str) -> Vec<f32> {
    let hash = blake3::hash(text.as_bytes());
    let raw: Vec<f64> = hash
        .as_bytes()
        .chunks_exact(4)
        .take(EMBEDDING_DIMS)
        .map(|b| {
            let x = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            f64::from(x) / f64::from(u32::MAX) * 2.0 - 1.0
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 0.0 {
        raw.iter().map(|x| (x / norm) as f32).collect()
    } else {
        let mut unit = vec![0.0; EMBEDDING_DIMS];
        unit[0] = 1.0;
        unit
    }
}

/// A running test server. Dropping it aborts the server; prefer
/// [`TestServer::shutdown`], which also waits for it to stop.
pub struct TestServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    accept: Option<JoinHandle<()>>,
}

impl fmt::Debug for TestServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl TestServer {
    /// Binds `127.0.0.1` on a random port and starts serving with this
    /// behaviour.
    pub async fn start(behavior: Behavior) -> std::io::Result<TestServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            started: Instant::now(),
            state: Mutex::new(State {
                rng: StdRng::seed_from_u64(behavior.seed),
                behavior,
                replies: VecDeque::new(),
                recorded: Vec::new(),
                next_seq: 0,
                batch: BatchState::default(),
            }),
        });
        let (stop, stop_rx) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared), stop_rx));
        Ok(TestServer {
            addr,
            shared,
            stop,
            accept: Some(accept),
        })
    }

    /// The OpenAI base URL, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.root_url())
    }

    /// The server's root, `http://127.0.0.1:PORT` (for `/health` and the
    /// Azure paths).
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The Azure OpenAI base URL of a deployment,
    /// `http://127.0.0.1:PORT/openai/deployments/NAME`.
    pub fn azure_url(&self, deployment: &str) -> String {
        format!("{}/openai/deployments/{deployment}", self.root_url())
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Time since the server started, on the clock of [`Recorded::at`]
    /// (to compare arrivals with a moment in the test).
    pub fn elapsed(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Every request so far, in arrival order (those taken by
    /// [`TestServer::take_requests`] excepted).
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().recorded.clone()
    }

    /// Every request so far, in arrival order, forgetting them (for long
    /// benchmarks). A reply still pending is then no longer updated.
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.shared.lock().recorded)
    }

    /// Replaces the behaviour for requests that arrive from now on, and
    /// reseeds the fault RNG with its seed.
    pub fn set_behavior(&self, behavior: Behavior) {
        let mut state = self.shared.lock();
        state.rng = StdRng::seed_from_u64(behavior.seed);
        state.behavior = behavior;
    }

    /// Appends scripted replies, consumed one per well-formed chat request
    /// (that gets no injected fault) before the responder is asked.
    pub fn push_replies(&self, replies: impl IntoIterator<Item = Reply>) {
        self.shared.lock().replies.extend(replies);
    }

    /// Scripted replies not consumed yet.
    pub fn pending_replies(&self) -> usize {
        self.shared.lock().replies.len()
    }

    /// Stops accepting connections, aborts the open ones (a request still
    /// in flight gets no reply) and waits until all of it has stopped.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(accept) = self.accept.take() {
            let _ = accept.await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
    }
}

/// State shared by the handle and the connection tasks.
struct Shared {
    started: Instant,
    state: Mutex<State>,
}

struct State {
    behavior: Behavior,
    rng: StdRng,
    replies: VecDeque<Reply>,
    recorded: Vec<Recorded>,
    next_seq: u64,
    /// Files and batches of the Batch API.
    batch: BatchState,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The lock is never held across user code, so a poisoned lock only
        // means a panic elsewhere; the data is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the outcome of request `seq` (if it is still recorded).
    fn finish(&self, seq: u64, status: u16, completion_tokens: u64) {
        let mut state = self.lock();
        if let Some(r) = state.recorded.iter_mut().rev().find(|r| r.seq == seq) {
            r.status = status;
            r.completion_tokens = completion_tokens;
        }
    }
}

impl State {
    /// Draws the fault for one chat or embeddings request (see the module
    /// docs).
    fn draw_fault(&mut self) -> Option<Fault> {
        if self.behavior.faults.is_empty() {
            return None;
        }
        let u: f64 = self.rng.random();
        let mut sum = 0.0;
        for (rate, fault) in &self.behavior.faults {
            sum += rate.max(0.0);
            if u < sum {
                return Some(fault.clone());
            }
        }
        None
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    let mut next_connection: u64 = 0;
    // Runs until `shutdown` (a change) or until the handle is gone (an
    // error); `Drop` aborts it as well.
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    next_connection += 1;
                    connections.spawn(serve_connection(
                        stream,
                        Arc::clone(&shared),
                        next_connection,
                    ));
                }
                // Out of file descriptors and the like: back off a little.
                Err(_) => sleep(Duration::from_millis(10)).await,
            },
        }
    }
    drop(listener);
    connections.shutdown().await;
}

/// A parsed request head.
struct Head {
    method: String,
    target: String,
    http10: bool,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// Whether the connection stays open after this request.
    fn keep_alive(&self) -> bool {
        let tokens: Vec<String> = self
            .headers
            .iter()
            .filter(|(n, _)| n == "connection")
            .flat_map(|(_, v)| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        if self.http10 {
            tokens.iter().any(|t| t == "keep-alive")
        } else {
            !tokens.iter().any(|t| t == "close")
        }
    }
}

/// A response to write.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    close: bool,
}

impl Response {
    fn json(status: u16, body: &Value) -> Response {
        Response {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
            close: false,
        }
    }

    fn with_header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.to_owned(), value.into()));
        self
    }
}

/// What to do with a request.
enum Action {
    Respond(Response),
    Truncate(Response),
    Close,
}

/// A request head that cannot be served: respond with this status and
/// close, or (None) just close.
type Reject = Option<(u16, String)>;

async fn serve_connection(mut stream: TcpStream, shared: Arc<Shared>, connection: u64) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    for n in 1..=MAX_REQUESTS_PER_CONNECTION {
        let head = match read_head(&mut stream, &mut buf).await {
            Ok(Some(head)) => head,
            Ok(None) => return,
            Err(reject) => {
                if let Some((status, message)) = reject {
                    let resp = Response::json(status, &invalid_request(&message));
                    let _ = write_response(&mut stream, &resp, true, false, false).await;
                }
                return;
            }
        };
        let body = match read_body(&mut stream, &mut buf, &head).await {
            Ok(body) => body,
            Err(reject) => {
                if let Some((status, message)) = reject {
                    let at = shared.started.elapsed();
                    let seq = record(&shared, at, connection, &head, Value::Null, 0, None);
                    shared.finish(seq, status, 0);
                    let resp = Response::json(status, &invalid_request(&message));
                    let _ = write_response(&mut stream, &resp, true, false, false).await;
                }
                return;
            }
        };
        let head_only = head.method == "HEAD";
        match handle(&shared, connection, &head, &body).await {
            Action::Respond(resp) => {
                let close = resp.close || !head.keep_alive() || n == MAX_REQUESTS_PER_CONNECTION;
                let keep_alive_10 = head.http10 && !close;
                let written = write_response(&mut stream, &resp, close, keep_alive_10, head_only);
                if written.await.is_err() || close {
                    let _ = stream.shutdown().await;
                    return;
                }
            }
            Action::Truncate(resp) => {
                let _ = write_truncated(&mut stream, &resp).await;
                let _ = stream.shutdown().await;
                return;
            }
            Action::Close => return,
        }
    }
}

/// Reads more bytes into `buf`: the count read (0 at end of stream), or
/// None on a timeout.
async fn read_more(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    wait: Duration,
) -> Option<std::io::Result<usize>> {
    let mut chunk = [0u8; READ_CHUNK];
    match timeout(wait, stream.read(&mut chunk)).await {
        Err(_) => None,
        Ok(Ok(n)) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(Ok(n))
        }
        Ok(Err(e)) => Some(Err(e)),
    }
}

/// Reads and parses the next request head. `Ok(None)` when the client
/// closed (or left idle) the connection between requests.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<Head>, Reject> {
    let mut end = None;
    // Each pass reads at least one byte or returns, and the head is capped.
    for _ in 0..=MAX_HEAD_BYTES + 1 {
        // Empty lines before a request line are ignored (RFC 9112, 2.2).
        let blank = buf
            .iter()
            .take_while(|b| **b == b'\r' || **b == b'\n')
            .count();
        buf.drain(..blank);
        if let Some(pos) = find(buf, b"\r\n\r\n") {
            end = Some(pos);
            break;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(Some((431, "Request header fields too large".into())));
        }
        let wait = if buf.is_empty() {
            IDLE_TIMEOUT
        } else {
            READ_TIMEOUT
        };
        match read_more(stream, buf, wait).await {
            None if buf.is_empty() => return Ok(None),
            None => return Err(Some((408, "Request timeout".into()))),
            Some(Ok(0)) if buf.is_empty() => return Ok(None),
            Some(Ok(0)) | Some(Err(_)) => return Err(None),
            Some(Ok(_)) => {}
        }
    }
    let Some(end) = end else {
        return Err(Some((431, "Request header fields too large".into())));
    };
    let raw: Vec<u8> = buf.drain(..end + 4).collect();
    let text = String::from_utf8_lossy(&raw[..end]);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let bad = |m: &str| Err(Some((400, m.to_owned())));
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad("Malformed request line");
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return bad("Malformed request method");
    }
    if !target.starts_with('/') {
        return bad("Malformed request target");
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(Some((505, "HTTP version not supported".into()))),
    };
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() >= MAX_HEADERS {
            return Err(Some((431, "Too many header fields".into())));
        }
        let Some((name, value)) = line.split_once(':') else {
            return bad("Malformed header line");
        };
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace() || b < 0x21) {
            return bad("Malformed header name");
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Some(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        http10,
        headers,
    }))
}

/// Reads the body the head announces with `Content-Length`.
async fn read_body(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: &Head,
) -> Result<Vec<u8>, Reject> {
    if let Some(te) = head.header("transfer-encoding") {
        return if te.to_ascii_lowercase().contains("chunked") {
            Err(Some((
                411,
                "Chunked request bodies are not supported; send a Content-Length".into(),
            )))
        } else {
            Err(Some((400, format!("Unsupported Transfer-Encoding: {te}"))))
        };
    }
    let lengths: Vec<&str> = head
        .headers
        .iter()
        .filter(|(n, _)| n == "content-length")
        .map(|(_, v)| v.as_str())
        .collect();
    let length = match lengths.as_slice() {
        [] => 0,
        [first, rest @ ..] if rest.iter().all(|v| v == first) => match first.parse::<usize>() {
            Ok(n) => n,
            Err(_) => return Err(Some((400, "Invalid Content-Length".into()))),
        },
        _ => return Err(Some((400, "Conflicting Content-Length headers".into()))),
    };
    if length > MAX_BODY_BYTES {
        return Err(Some((413, "Request body too large".into())));
    }
    let expects_continue = head
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_continue && buf.len() < length {
        let interim = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        if !matches!(timeout(WRITE_TIMEOUT, interim).await, Ok(Ok(()))) {
            return Err(None);
        }
    }
    // Each pass reads at least one byte or returns.
    for _ in 0..=length {
        if buf.len() >= length {
            break;
        }
        match read_more(stream, buf, READ_TIMEOUT).await {
            None => return Err(Some((408, "Request timeout".into()))),
            Some(Ok(0)) | Some(Err(_)) => return Err(None),
            Some(Ok(_)) => {}
        }
    }
    if buf.len() < length {
        return Err(None);
    }
    Ok(buf.drain(..length).collect())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

/// The status line and headers of a response announcing `length` bytes.
fn head_bytes(resp: &Response, length: usize, close: bool, keep_alive_10: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    out.push_str(&format!(
        "date: {}\r\n",
        httpdate::fmt_http_date(SystemTime::now())
    ));
    out.push_str("server: graphloom-test-server\r\n");
    out.push_str(&format!("content-length: {length}\r\n"));
    if close {
        out.push_str("connection: close\r\n");
    } else if keep_alive_10 {
        out.push_str("connection: keep-alive\r\n");
    }
    for (name, value) in &resp.headers {
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            continue;
        }
        // Header values cannot hold line breaks.
        let value: String = value.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

async fn write_response(
    stream: &mut TcpStream,
    resp: &Response,
    close: bool,
    keep_alive_10: bool,
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = head_bytes(resp, resp.body.len(), close, keep_alive_10);
    // 1xx, 204 and 304 carry no body; neither does a reply to HEAD.
    if !head_only && !matches!(resp.status, 100..=199 | 204 | 304) {
        out.extend_from_slice(&resp.body);
    }
    write_all(stream, &out).await
}

/// Announces the whole body but sends half of it.
async fn write_truncated(stream: &mut TcpStream, resp: &Response) -> std::io::Result<()> {
    let mut out = head_bytes(resp, resp.body.len(), false, false);
    out.extend_from_slice(&resp.body[..resp.body.len() / 2]);
    write_all(stream, &out).await
}

async fn write_all(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let write = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    match timeout(WRITE_TIMEOUT, write).await {
        Ok(result) => result,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// The routes the server knows.
enum Route {
    Chat { deployment: Option<String> },
    Embeddings { deployment: Option<String> },
    Health,
    Models,
    Upload { azure: bool },
    Batch { api: BatchRoute, azure: bool },
    NotFound,
}

fn route(method: &str, path: &str) -> Route {
    if let Some(route) = batch_route(method, path) {
        return route;
    }
    match (method, path) {
        ("POST", "/v1/chat/completions") => Route::Chat { deployment: None },
        ("POST", "/v1/embeddings") => Route::Embeddings { deployment: None },
        ("GET" | "HEAD", "/health") => Route::Health,
        ("GET" | "HEAD", "/v1/models") => Route::Models,
        ("POST", _) => {
            let azure = path
                .strip_prefix("/openai/deployments/")
                .and_then(|rest| rest.split_once('/'))
                .filter(|(name, _)| !name.is_empty());
            match azure {
                Some((name, "chat/completions")) => Route::Chat {
                    deployment: Some(name.to_owned()),
                },
                Some((name, "embeddings")) => Route::Embeddings {
                    deployment: Some(name.to_owned()),
                },
                _ => Route::NotFound,
            }
        }
        _ => Route::NotFound,
    }
}

/// An OpenAI error JSON.
fn error_json(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

fn invalid_request(message: &str) -> Value {
    error_json(message, "invalid_request_error", None, None)
}

/// A 400 for a malformed request.
struct BadRequest {
    message: String,
    param: Option<String>,
}

impl BadRequest {
    fn new(message: impl Into<String>, param: Option<&str>) -> BadRequest {
        BadRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    fn response(&self) -> Response {
        let body = error_json(
            &self.message,
            "invalid_request_error",
            self.param.as_deref(),
            None,
        );
        Response::json(400, &body)
    }
}

const BAD_JSON: &str = "We could not parse the JSON body of your request. (HINT: This likely \
means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but \
what was sent was not valid JSON.)";

/// The request body as a JSON object, or the 400 for it.
fn json_object(body: Option<&Value>) -> Result<&serde_json::Map<String, Value>, BadRequest> {
    match body {
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(BadRequest::new(
            "Invalid request body: expected a JSON object",
            None,
        )),
        None => Err(BadRequest::new(BAD_JSON, None)),
    }
}

fn model_of(
    map: &serde_json::Map<String, Value>,
    deployment: Option<&str>,
) -> Result<String, BadRequest> {
    match (map.get("model"), deployment) {
        (Some(Value::String(model)), _) if !model.is_empty() => Ok(model.clone()),
        (None | Some(Value::Null), Some(deployment)) => Ok(deployment.to_owned()),
        _ => Err(BadRequest::new(
            "you must provide a model parameter",
            Some("model"),
        )),
    }
}

const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

fn parse_chat(
    body: Option<&Value>,
    deployment: Option<&str>,
) -> Result<ChatRequestView, BadRequest> {
    let map = json_object(body)?;
    let model = model_of(map, deployment)?;
    let messages = match map.get("messages") {
        None | Some(Value::Null) => {
            return Err(BadRequest::new(
                "'messages' is a required property",
                Some("messages"),
            ));
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(BadRequest::new(
                "[] is too short - 'messages'",
                Some("messages"),
            ));
        }
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(BadRequest::new(
                "Invalid type for 'messages': expected an array",
                Some("messages"),
            ));
        }
    };
    let mut parsed = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Some(role) = message.get("role").and_then(Value::as_str) else {
            return Err(BadRequest::new(
                format!("Missing required parameter: '{param}.role'."),
                Some(&format!("{param}.role")),
            ));
        };
        if !ROLES.contains(&role) {
            return Err(BadRequest::new(
                format!(
                    "Invalid value: '{role}'. Supported values are: 'system', 'assistant', \
                     'user', 'function', 'tool', and 'developer'."
                ),
                Some(&format!("{param}.role")),
            ));
        }
        let content = match message.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None => {
                return Err(BadRequest::new(
                    format!("Missing required parameter: '{param}.content'."),
                    Some(&format!("{param}.content")),
                ));
            }
            Some(_) => {
                return Err(BadRequest::new(
                    format!("Invalid type for '{param}.content'."),
                    Some(&format!("{param}.content")),
                ));
            }
        };
        parsed.push((role.to_owned(), content));
    }
    if map
        .get("stream")
        .is_some_and(|v| !v.is_null() && !v.is_boolean())
    {
        return Err(BadRequest::new(
            "Invalid type for 'stream': expected a boolean.",
            Some("stream"),
        ));
    }
    let mut max_tokens = None;
    for key in ["max_tokens", "max_completion_tokens"] {
        match map.get(key) {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_u64() {
                Some(0) => {
                    return Err(BadRequest::new(
                        format!("Invalid '{key}': integer below minimum value 1."),
                        Some(key),
                    ));
                }
                Some(n) => max_tokens = Some(n),
                None => {
                    return Err(BadRequest::new(
                        format!("Invalid type for '{key}': expected an integer."),
                        Some(key),
                    ));
                }
            },
        }
    }
    let response_format = map.get("response_format").filter(|v| !v.is_null()).cloned();
    Ok(ChatRequestView {
        model,
        messages: parsed,
        max_tokens,
        response_format,
        body: Value::Object(map.clone()),
    })
}

/// A well-formed embeddings request.
struct EmbeddingsRequest {
    model: String,
    /// The text each embedding is computed from (a pre-tokenised input's
    /// JSON).
    inputs: Vec<String>,
    prompt_tokens: u64,
    base64: bool,
}

fn parse_embeddings(
    body: Option<&Value>,
    deployment: Option<&str>,
) -> Result<EmbeddingsRequest, BadRequest> {
    let map = json_object(body)?;
    let model = model_of(map, deployment)?;
    let invalid = || BadRequest::new("Invalid type for 'input'.", Some("input"));
    let (inputs, prompt_tokens) = match map.get("input") {
        None | Some(Value::Null) => {
            return Err(BadRequest::new(
                "'input' is a required property",
                Some("input"),
            ));
        }
        Some(Value::String(text)) => (vec![text.clone()], count_tokens(text)),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(BadRequest::new("[] is too short - 'input'", Some("input")));
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            let texts: Vec<String> = items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            let tokens = texts.iter().map(|t| count_tokens(t)).sum();
            (texts, tokens)
        }
        // One pre-tokenised input.
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => (
            vec![Value::Array(items.clone()).to_string()],
            items.len() as u64,
        ),
        // Several pre-tokenised inputs.
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => {
            let mut tokens = 0;
            for item in items {
                let ok = item.as_array().is_some_and(|t| t.iter().all(Value::is_u64));
                if !ok {
                    return Err(invalid());
                }
                tokens += item.as_array().map_or(0, Vec::len) as u64;
            }
            (items.iter().map(Value::to_string).collect(), tokens)
        }
        Some(_) => return Err(invalid()),
    };
    let base64 = match map.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(_) => {
            return Err(BadRequest::new(
                "Invalid value for 'encoding_format': expected 'float' or 'base64'.",
                Some("encoding_format"),
            ));
        }
    };
    Ok(EmbeddingsRequest {
        model,
        inputs,
        prompt_tokens,
        base64,
    })
}

/// A request's interpretation.
enum Kind {
    Chat(Result<ChatRequestView, BadRequest>),
    Embeddings(Result<EmbeddingsRequest, BadRequest>),
    Health,
    Models,
    /// `POST /v1/files`, its multipart body parsed.
    Upload {
        upload: Result<Upload, BadRequest>,
        azure: bool,
    },
    /// The other Batch API routes.
    Batch {
        api: BatchRoute,
        azure: bool,
    },
    NotFound,
}

/// Records a request with status 0 and returns its sequence number.
fn record(
    shared: &Shared,
    at: Duration,
    connection: u64,
    head: &Head,
    body: Value,
    prompt_tokens: u64,
    max_tokens: Option<u64>,
) -> u64 {
    let mut state = shared.lock();
    let seq = state.next_seq;
    state.next_seq += 1;
    // Arrival times are taken before the lock; keep them in sequence order
    // (two requests read at nearly the same moment may take the lock in
    // the other order) so that `requests()` is sorted by both.
    let at = state.recorded.last().map_or(at, |last| at.max(last.at));
    state.recorded.push(Recorded {
        seq,
        at,
        connection,
        method: head.method.clone(),
        path: head.target.clone(),
        headers: head.headers.clone(),
        body,
        prompt_tokens,
        max_tokens,
        status: 0,
        completion_tokens: 0,
    });
    seq
}

async fn handle(shared: &Shared, connection: u64, head: &Head, body: &[u8]) -> Action {
    let at = shared.started.elapsed();
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let kind = match route(&head.method, head.path()) {
        Route::Chat { deployment } => Kind::Chat(parse_chat(json.as_ref(), deployment.as_deref())),
        Route::Embeddings { deployment } => {
            Kind::Embeddings(parse_embeddings(json.as_ref(), deployment.as_deref()))
        }
        Route::Health => Kind::Health,
        Route::Models => Kind::Models,
        Route::Upload { azure } => Kind::Upload {
            upload: parse_upload(head, body),
            azure,
        },
        Route::Batch { api, azure } => Kind::Batch { api, azure },
        Route::NotFound => Kind::NotFound,
    };
    let (prompt, max_tokens) = match &kind {
        Kind::Chat(Ok(view)) => (prompt_tokens(&view.messages), view.max_tokens),
        Kind::Embeddings(Ok(request)) => (request.prompt_tokens, None),
        _ => (0, None),
    };
    // Only the Batch API routes need the body after it is recorded (and
    // theirs are small); an upload is recorded without its file's bytes.
    let (recorded_body, json) = match &kind {
        Kind::Upload { upload, .. } => (upload.as_ref().map_or(Value::Null, Upload::summary), None),
        Kind::Batch { .. } => (json.clone().unwrap_or(Value::Null), json),
        _ => (json.unwrap_or(Value::Null), None),
    };
    let seq = record(
        shared,
        at,
        connection,
        head,
        recorded_body,
        prompt,
        max_tokens,
    );
    let completion_id = format!("chatcmpl-test{seq}");
    let (latency, mut fault, scripted, responder) = {
        let mut state = shared.lock();
        let fault = match kind {
            Kind::Chat(_) | Kind::Embeddings(_) => state.draw_fault(),
            _ => None,
        };
        let scripted = match kind {
            Kind::Chat(Ok(_)) if fault.is_none() => state.replies.pop_front(),
            _ => None,
        };
        let responder = Arc::clone(&state.behavior.responder);
        (state.behavior.latency, fault, scripted, responder)
    };
    if let Some(Fault::Slow(delay)) = fault {
        sleep(delay).await;
        fault = None;
    }
    let (action, completion) = match kind {
        Kind::Health => (
            Action::Respond(Response::json(200, &json!({"status": "ok"}))),
            0,
        ),
        Kind::Models => {
            let list = json!({"object": "list", "data": [{
                "id": LISTED_MODEL, "object": "model", "created": 0, "owned_by": "graphloom"
            }]});
            (Action::Respond(Response::json(200, &list)), 0)
        }
        Kind::Upload { upload, azure } => {
            (Action::Respond(upload_file(shared, head, upload, azure)), 0)
        }
        Kind::Batch { api, azure } => {
            let resp = batch_api(shared, api, azure, head, json.as_ref()).await;
            (Action::Respond(resp), 0)
        }
        Kind::NotFound => {
            let message = format!("Invalid URL ({} {})", head.method, head.path());
            (
                Action::Respond(Response::json(404, &invalid_request(&message))),
                0,
            )
        }
        Kind::Chat(request) => {
            chat_outcome(fault, request, scripted, &responder, &completion_id, prompt).await
        }
        Kind::Embeddings(request) => embeddings_outcome(fault, request, &completion_id),
    };
    if !latency.is_zero() {
        sleep(latency).await;
    }
    let status = match &action {
        Action::Respond(resp) | Action::Truncate(resp) => resp.status,
        Action::Close => 0,
    };
    shared.finish(seq, status, completion);
    let request_id = format!("req_test_{seq}");
    match action {
        Action::Respond(resp) => Action::Respond(resp.with_header("x-request-id", request_id)),
        Action::Truncate(resp) => Action::Truncate(resp.with_header("x-request-id", request_id)),
        Action::Close => Action::Close,
    }
}

/// The action for a chat request, with the completion tokens it reports:
/// the injected fault, else the 400 of a malformed request, else the
/// reply ([`chat_action`]). `id` is the `chat.completion`'s id.
async fn chat_outcome(
    fault: Option<Fault>,
    request: Result<ChatRequestView, BadRequest>,
    scripted: Option<Reply>,
    responder: &Responder,
    id: &str,
    prompt: u64,
) -> (Action, u64) {
    let model = request
        .as_ref()
        .map_or("unknown", |v| v.model.as_str())
        .to_owned();
    match (fault, request) {
        (Some(fault), _) => {
            let normal = completion_response(id, &model, DEFAULT_CONTENT, "stop", prompt, 1);
            fault_action(fault, id, &model, normal, Some(prompt))
        }
        (None, Err(bad)) => (Action::Respond(bad.response()), 0),
        (None, Ok(view)) => chat_action(scripted, responder, &view, id, prompt).await,
    }
}

/// The action for an embeddings request: the injected fault (an invalid
/// content is a list without embeddings), else the 400 of a malformed
/// request, else the embeddings.
fn embeddings_outcome(
    fault: Option<Fault>,
    request: Result<EmbeddingsRequest, BadRequest>,
    id: &str,
) -> (Action, u64) {
    match (fault, request) {
        (Some(Fault::InvalidContent), Ok(request)) => {
            (Action::Respond(embeddings_response(&request, true)), 0)
        }
        (Some(fault), Ok(request)) => {
            let normal = embeddings_response(&request, false);
            fault_action(fault, id, &request.model, normal, None)
        }
        (None, Ok(request)) => (Action::Respond(embeddings_response(&request, false)), 0),
        (Some(fault), Err(bad)) => fault_action(fault, id, "unknown", bad.response(), None),
        (None, Err(bad)) => (Action::Respond(bad.response()), 0),
    }
}

/// The action for a well-formed chat request without an injected fault,
/// with the completion tokens it reports: the scripted reply if any, else
/// the responder's. One path for the chat route and the batch lines, so
/// that a batch answers exactly as the synchronous route would.
async fn chat_action(
    scripted: Option<Reply>,
    responder: &Responder,
    view: &ChatRequestView,
    id: &str,
    prompt: u64,
) -> (Action, u64) {
    let reply = resolve_reply(scripted, responder, view).await;
    reply_action(reply, id, view, prompt)
}

/// The reply of a well-formed chat request without an injected fault.
async fn resolve_reply(
    scripted: Option<Reply>,
    responder: &Responder,
    view: &ChatRequestView,
) -> Reply {
    let from_script = scripted.is_some();
    let mut reply = scripted.unwrap_or_else(|| responder(view));
    // Bounded: a reply nests only as deep as whoever built it.
    while let Reply::Delayed {
        delay,
        reply: inner,
    } = reply
    {
        sleep(delay).await;
        reply = *inner;
    }
    let Reply::Fault(Fault::Slow(delay)) = reply else {
        return reply;
    };
    sleep(delay).await;
    let next = if from_script {
        responder(view)
    } else {
        Reply::Content(DEFAULT_CONTENT.to_owned())
    };
    match next {
        Reply::Fault(Fault::Slow(_)) => Reply::Content(DEFAULT_CONTENT.to_owned()),
        next => next,
    }
}

/// The action for a reply, with the completion tokens it reports; `id` is
/// the `chat.completion`'s id.
fn reply_action(reply: Reply, id: &str, view: &ChatRequestView, prompt: u64) -> (Action, u64) {
    let (action, tokens) = reply_action_whole(reply, id, view, prompt);
    match action {
        Action::Respond(resp) if resp.status == 200 && view.body["stream"] == true => {
            (Action::Respond(event_stream(&resp, view)), tokens)
        }
        other => (other, tokens),
    }
}

/// A `chat.completion` as the server-sent events of a streamed one: a
/// `chat.completion.chunk` per token of its content (4 characters, the
/// server's counting rule), one with the `finish_reason`, one with the
/// usage when `stream_options.include_usage` asks for it, and `[DONE]`.
fn event_stream(whole: &Response, view: &ChatRequestView) -> Response {
    let completion: Value = serde_json::from_slice(&whole.body).unwrap_or(Value::Null);
    let chunk = |delta: Value, finish: &Value| {
        json!({
            "id": completion["id"],
            "object": "chat.completion.chunk",
            "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        &Value::Null,
    )];
    let content: Vec<char> = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .chars()
        .collect();
    for piece in content.chunks(4) {
        let piece: String = piece.iter().collect();
        events.push(chunk(json!({"content": piece}), &Value::Null));
    }
    events.push(chunk(json!({}), &completion["choices"][0]["finish_reason"]));
    if view.body["stream_options"]["include_usage"] == true {
        let mut last = chunk(json!({}), &Value::Null);
        last["choices"] = json!([]);
        last["usage"] = completion["usage"].clone();
        events.push(last);
    }
    let mut body = String::new();
    for event in events {
        body.push_str(&format!("data: {event}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    Response {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: body.into_bytes(),
        close: whole.close,
    }
}

/// [`reply_action`] before streaming.
fn reply_action_whole(
    reply: Reply,
    id: &str,
    view: &ChatRequestView,
    prompt: u64,
) -> (Action, u64) {
    let completion = |content: String, finish: &str| {
        let tokens = completion_tokens(&content);
        let resp = completion_response(id, &view.model, &content, finish, prompt, tokens);
        (Action::Respond(resp), tokens)
    };
    match reply {
        Reply::Delayed { reply, .. } => reply_action_whole(*reply, id, view, prompt),
        Reply::Content(content) => completion(content, "stop"),
        Reply::Length(content) => completion(content, "length"),
        Reply::ContentWithUsage {
            content,
            prompt_tokens,
            completion_tokens,
        } => {
            let resp = completion_response(
                id,
                &view.model,
                &content,
                "stop",
                prompt_tokens,
                completion_tokens,
            );
            (Action::Respond(resp), completion_tokens)
        }
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let close = headers.iter().any(|(n, v)| {
                n.eq_ignore_ascii_case("connection") && v.to_ascii_lowercase().contains("close")
            });
            let mut headers = headers;
            if !headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            {
                headers.push(("content-type".into(), "application/json".into()));
            }
            let resp = Response {
                status,
                headers,
                body: body.into_bytes(),
                close,
            };
            (Action::Respond(resp), 0)
        }
        Reply::Fault(Fault::InvalidContent) => completion(INVALID_CONTENT.to_owned(), "stop"),
        Reply::Fault(fault) => {
            let normal = completion_response(id, &view.model, DEFAULT_CONTENT, "stop", prompt, 1);
            fault_action(fault, id, &view.model, normal, Some(prompt))
        }
    }
}

/// The action for a fault, with the completion tokens it reports; `id` is
/// the `chat.completion`'s id, `normal` the response the fault stands in
/// for, `chat` the prompt tokens of a chat request (None for embeddings).
fn fault_action(
    fault: Fault,
    id: &str,
    model: &str,
    normal: Response,
    chat: Option<u64>,
) -> (Action, u64) {
    let action = match fault {
        Fault::RateLimited { retry_after } => Action::Respond(rate_limited(retry_after)),
        Fault::QuotaExhausted => {
            let body = error_json(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                None,
                Some("insufficient_quota"),
            );
            Action::Respond(Response::json(429, &body))
        }
        Fault::ServerError(status) => {
            let body = error_json(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                None,
                None,
            );
            Action::Respond(Response::json(status, &body))
        }
        // Only an injected `Slow` reaches here before its sleep; handled by
        // the callers. Replying normally is the right fallback.
        Fault::Slow(_) => Action::Respond(normal),
        Fault::Truncated => Action::Truncate(normal),
        Fault::BrokenJson => {
            let mut resp = Response::json(200, &Value::Null);
            resp.body = format!(
                "{{\"id\":\"{id}\",\"object\":\"chat.completion\",\"model\":\"{}\",\
                 \"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{{",
                model.replace(['"', '\\'], "")
            )
            .into_bytes();
            Action::Respond(resp)
        }
        Fault::InvalidContent => match chat {
            Some(prompt) => {
                let tokens = completion_tokens(INVALID_CONTENT);
                let resp = completion_response(id, model, INVALID_CONTENT, "stop", prompt, tokens);
                return (Action::Respond(resp), tokens);
            }
            None => Action::Respond(normal),
        },
        Fault::Close => Action::Close,
    };
    (action, 0)
}

/// The 429 of a rate limit (OpenAI's body, type `requests`), with
/// `Retry-After` when given.
fn rate_limited(retry_after: Option<String>) -> Response {
    let body = error_json(
        "Rate limit reached for requests. Please try again later.",
        "requests",
        None,
        Some("rate_limit_exceeded"),
    );
    let mut resp = Response::json(429, &body).with_header("x-ratelimit-remaining-requests", "0");
    if let Some(value) = retry_after {
        resp = resp.with_header("retry-after", value);
    }
    resp
}

/// A 200 `chat.completion` with this id.
fn completion_response(
    id: &str,
    model: &str,
    content: &str,
    finish_reason: &str,
    prompt_tokens: u64,
    completion_tokens: u64,
) -> Response {
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    });
    Response::json(200, &body)
}

/// A 200 embeddings list; `empty` leaves the embeddings out
/// ([`Fault::InvalidContent`]).
fn embeddings_response(request: &EmbeddingsRequest, empty: bool) -> Response {
    let data: Vec<Value> = if empty {
        Vec::new()
    } else {
        request
            .inputs
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let vector = embedding_of(text);
                let embedding = if request.base64 {
                    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Value::String(base64(&bytes))
                } else {
                    json!(vector)
                };
                json!({"object": "embedding", "index": index, "embedding": embedding})
            })
            .collect()
    };
    let body = json!({
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": request.prompt_tokens, "total_tokens": request.prompt_tokens},
    });
    Response::json(200, &body)
}

/// Standard base64 with padding (for `encoding_format: "base64"`).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn token_rule() {
        assert_eq!(count_tokens(""), 0);
        assert_eq!(count_tokens("abcd"), 1);
        assert_eq!(count_tokens("abcde"), 2);
        assert_eq!(count_tokens("ééééé"), 2);
        assert_eq!(completion_tokens(""), 1);
        let messages = vec![
            ("system".to_owned(), "abcde".to_owned()),
            ("user".to_owned(), String::new()),
        ];
        assert_eq!(prompt_tokens(&messages), 2 + 4 + 4);
    }

    #[test]
    fn routes() {
        assert!(matches!(
            route("POST", "/v1/chat/completions"),
            Route::Chat { deployment: None }
        ));
        assert!(matches!(
            route("POST", "/openai/deployments/gpt/chat/completions"),
            Route::Chat { deployment: Some(d) } if d == "gpt"
        ));
        assert!(matches!(
            route("POST", "/openai/deployments/e/embeddings"),
            Route::Embeddings {
                deployment: Some(_)
            }
        ));
        assert!(matches!(
            route("POST", "/openai/deployments//embeddings"),
            Route::NotFound
        ));
        assert!(matches!(
            route("GET", "/v1/chat/completions"),
            Route::NotFound
        ));
    }

    #[test]
    fn fault_draws_follow_cumulative_rates() {
        let behavior = Behavior {
            faults: vec![(0.5, Fault::Close), (0.5, Fault::QuotaExhausted)],
            ..Behavior::default()
        };
        let mut state = State {
            rng: StdRng::seed_from_u64(7),
            behavior,
            replies: VecDeque::new(),
            recorded: Vec::new(),
            next_seq: 0,
            batch: BatchState::default(),
        };
        for _ in 0..100 {
            assert!(state.draw_fault().is_some());
        }
    }
}
