//! The test server's Batch API: files and batches as OpenAI and Azure
//! OpenAI serve them.
//!
//! * `POST /v1/files` (multipart: `purpose` = `batch`, `file`), `GET
//!   /v1/files/{id}` and `GET /v1/files/{id}/content`.
//! * `POST /v1/batches`, `GET /v1/batches` (newest first, `limit`,
//!   `after`), `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.
//! * The same under Azure's `/openai/v1/…` and `/openai/…?api-version=…`.
//!
//! A batch moves one status step per retrieve: `validating` →
//! `in_progress` → `finalizing` → `completed`, or the end pushed with
//! [`TestServer::push_batch_ends`]. Validation fails a batch whose input
//! file holds a line that is not JSON, lacks `custom_id`, repeats one, or
//! names another endpoint than the batch. When a batch finalizes, each
//! line is answered exactly as the synchronous route would answer it (the
//! same fault draw, scripted replies and responder), and recorded like a
//! request with an `x-batch-id` header. Lines answered 200 go to the
//! output file, in reverse input order (a provider does not keep the
//! order); the others to the error file. An expired or cancelled batch
//! answers its first half of lines only.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::{Value, json};

use super::{
    Action, BadRequest, Fault, Head, Response, Shared, TestServer, chat_outcome,
    embeddings_outcome, error_json, invalid_request, parse_chat, parse_embeddings, prompt_tokens,
    rate_limited, record,
};

/// How a batch ends; see [`TestServer::push_batch_ends`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// `validating` → `in_progress` → `finalizing` → `completed`.
    Completed,
    /// `validating` → `failed`, with an error in `errors.data`.
    Failed,
    /// `validating` → `in_progress` → `expired`: the first half of the
    /// lines answered, the rest in the error file with `batch_expired`.
    Expired,
    /// Stays `in_progress` until cancelled.
    StuckInProgress,
}

/// A Batch API route, after the base path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BatchRoute {
    FileMeta(String),
    FileContent(String),
    Create,
    List,
    Retrieve(String),
    Cancel(String),
}

/// The Batch API routes: `Some` for a path under a Batch API base.
pub(super) fn batch_route(method: &str, path: &str) -> Option<super::Route> {
    let (rest, azure) = if let Some(rest) = path.strip_prefix("/openai/v1") {
        (rest, false)
    } else if let Some(rest) = path.strip_prefix("/openai") {
        (rest, true)
    } else {
        (path.strip_prefix("/v1")?, false)
    };
    let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    let api = match (method, segments.as_slice()) {
        ("POST", ["files"]) => return Some(super::Route::Upload { azure }),
        ("GET", ["files", id]) if !id.is_empty() => BatchRoute::FileMeta((*id).to_owned()),
        ("GET", ["files", id, "content"]) if !id.is_empty() => {
            BatchRoute::FileContent((*id).to_owned())
        }
        ("POST", ["batches"]) => BatchRoute::Create,
        ("GET", ["batches"]) => BatchRoute::List,
        ("GET", ["batches", id]) if !id.is_empty() => BatchRoute::Retrieve((*id).to_owned()),
        ("POST", ["batches", id, "cancel"]) if !id.is_empty() => {
            BatchRoute::Cancel((*id).to_owned())
        }
        _ => return None,
    };
    Some(super::Route::Batch { api, azure })
}

/// Files and batches the server holds.
#[derive(Debug, Default)]
pub(super) struct BatchState {
    files: HashMap<String, File>,
    batches: BTreeMap<u64, Batch>,
    next_id: u64,
    ends: VecDeque<BatchEnd>,
    creates: u64,
    rate_limited_creates: u32,
}

#[derive(Debug, Clone)]
struct File {
    id: String,
    filename: String,
    purpose: String,
    bytes: Vec<u8>,
    created_at: i64,
}

impl File {
    fn object(&self) -> Value {
        json!({
            "id": self.id, "object": "file", "bytes": self.bytes.len(),
            "created_at": self.created_at, "filename": self.filename,
            "purpose": self.purpose, "status": "processed", "status_details": null,
        })
    }
}

#[derive(Debug, Clone)]
struct Batch {
    object: Value,
    end: BatchEnd,
    /// Answers are being computed (the status does not move meanwhile).
    answering: bool,
}

impl Batch {
    fn id(&self) -> &str {
        self.object["id"].as_str().unwrap_or_default()
    }
    fn status(&self) -> &str {
        self.object["status"].as_str().unwrap_or_default()
    }
    fn set_status(&mut self, status: &str) {
        let now = chrono::Utc::now().timestamp();
        self.object["status"] = json!(status);
        let at = match status {
            "in_progress" => "in_progress_at",
            "finalizing" => "finalizing_at",
            "completed" => "completed_at",
            "failed" => "failed_at",
            "expired" => "expired_at",
            "cancelling" => "cancelling_at",
            "cancelled" => "cancelled_at",
            _ => return,
        };
        self.object[at] = json!(now);
    }
}

/// An uploaded file as parsed from the multipart body.
#[derive(Debug)]
pub(super) struct Upload {
    purpose: Option<String>,
    filename: String,
    bytes: Vec<u8>,
}

impl Upload {
    /// What the request log keeps of an upload (not the file's bytes).
    pub(super) fn summary(&self) -> Value {
        json!({"purpose": self.purpose, "filename": self.filename, "bytes": self.bytes.len()})
    }
}

impl TestServer {
    /// Sets how the next batches end, one per batch created (then
    /// [`BatchEnd::Completed`]).
    pub fn push_batch_ends(&self, ends: impl IntoIterator<Item = BatchEnd>) {
        self.shared.lock().batch.ends.extend(ends);
    }

    /// Answers the next `n` batch creates with a 429.
    pub fn rate_limit_batch_creates(&self, n: u32) {
        self.shared.lock().batch.rate_limited_creates += n;
    }

    /// Lets the batches stuck in progress ([`BatchEnd::StuckInProgress`])
    /// complete from their next retrieve on.
    pub fn release_batches(&self) {
        let mut state = self.shared.lock();
        for b in state.batch.batches.values_mut() {
            if b.end == BatchEnd::StuckInProgress {
                b.end = BatchEnd::Completed;
            }
        }
    }

    /// Batches created so far (a create answered 429 does not count).
    pub fn batch_creates(&self) -> u64 {
        self.shared.lock().batch.creates
    }

    /// Every batch object, oldest first, as a retrieve would show it
    /// (without moving it).
    pub fn batches(&self) -> Vec<Value> {
        let state = self.shared.lock();
        state
            .batch
            .batches
            .values()
            .map(|b| b.object.clone())
            .collect()
    }
}

/// Parses a `multipart/form-data` upload (the fields `purpose` and `file`).
pub(super) fn parse_upload(head: &Head, body: &[u8]) -> Result<Upload, BadRequest> {
    let content_type = head.header("content-type").unwrap_or_default();
    let boundary = content_type
        .split(';')
        .map(str::trim)
        .find_map(|p| p.strip_prefix("boundary="))
        .map(|b| b.trim_matches('"'))
        .filter(|b| !b.is_empty())
        .ok_or_else(|| BadRequest::new("expected a multipart/form-data body", None))?;
    let delimiter = format!("--{boundary}").into_bytes();
    let mut upload = Upload {
        purpose: None,
        filename: String::new(),
        bytes: Vec::new(),
    };
    let mut file = false;
    let mut rest = body;
    // Each part starts after a delimiter line and ends before the next
    // ("\r\n--boundary"); the last delimiter is followed by "--".
    let mut parts = 0;
    while let Some(at) = super::find(rest, &delimiter) {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") || parts > 16 {
            break;
        }
        parts += 1;
        let rest_part = rest.strip_prefix(b"\r\n").unwrap_or(rest);
        let Some(head_end) = super::find(rest_part, b"\r\n\r\n") else {
            break;
        };
        let headers = String::from_utf8_lossy(&rest_part[..head_end]).to_string();
        let content = &rest_part[head_end + 4..];
        let mut end_marker = b"\r\n".to_vec();
        end_marker.extend_from_slice(&delimiter);
        let end = super::find(content, &end_marker).unwrap_or(content.len());
        let data = &content[..end];
        let disposition = headers
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
            .unwrap_or_default();
        let field = |key: &str| {
            disposition.split(';').map(str::trim).find_map(|p| {
                p.strip_prefix(key)
                    .and_then(|v| v.strip_prefix('='))
                    .map(|v| v.trim_matches('"').to_owned())
            })
        };
        match field("name").as_deref() {
            Some("purpose") => upload.purpose = Some(String::from_utf8_lossy(data).into_owned()),
            Some("file") => {
                upload.filename = field("filename").unwrap_or_else(|| "file".into());
                upload.bytes = data.to_vec();
                file = true;
            }
            _ => {}
        }
        rest = &content[end..];
    }
    if !file {
        return Err(BadRequest::new(
            "'file' is a required property",
            Some("file"),
        ));
    }
    Ok(upload)
}

/// `POST /files`.
pub(super) fn upload_file(
    shared: &Shared,
    head: &Head,
    upload: Result<Upload, BadRequest>,
    azure: bool,
) -> Response {
    if let Some(missing) = missing_api_version(head, azure) {
        return missing;
    }
    let upload = match upload {
        Ok(upload) => upload,
        Err(bad) => return bad.response(),
    };
    if upload.purpose.as_deref() != Some("batch") {
        return BadRequest::new(
            "this server only takes files with purpose 'batch'",
            Some("purpose"),
        )
        .response();
    }
    let mut state = shared.lock();
    state.batch.next_id += 1;
    let file = File {
        id: format!("file-test{}", state.batch.next_id),
        filename: upload.filename,
        purpose: "batch".into(),
        bytes: upload.bytes,
        created_at: chrono::Utc::now().timestamp(),
    };
    let object = file.object();
    state.batch.files.insert(file.id.clone(), file);
    Response::json(200, &object)
}

/// Azure's classic paths (`/openai/…`, not `/openai/v1/…`) need an
/// `api-version`.
fn missing_api_version(head: &Head, azure: bool) -> Option<Response> {
    (azure && !head.target.contains("api-version=")).then(|| {
        Response::json(
            400,
            &invalid_request("Missing required query parameter 'api-version'."),
        )
    })
}

fn not_found(what: &str, id: &str) -> Response {
    let body = error_json(
        &format!("No {what} found with id '{id}'."),
        "invalid_request_error",
        None,
        None,
    );
    Response::json(404, &body)
}

/// The other Batch API routes.
pub(super) async fn batch_api(
    shared: &Shared,
    api: BatchRoute,
    azure: bool,
    head: &Head,
    body: Option<&Value>,
) -> Response {
    if let Some(missing) = missing_api_version(head, azure) {
        return missing;
    }
    match api {
        BatchRoute::FileMeta(id) => match shared.lock().batch.files.get(&id) {
            Some(file) => Response::json(200, &file.object()),
            None => not_found("file", &id),
        },
        BatchRoute::FileContent(id) => match shared.lock().batch.files.get(&id) {
            Some(file) => Response {
                status: 200,
                headers: vec![("content-type".into(), "application/octet-stream".into())],
                body: file.bytes.clone(),
                close: false,
            },
            None => not_found("file", &id),
        },
        BatchRoute::Create => create(shared, body),
        BatchRoute::List => list(shared, head),
        BatchRoute::Retrieve(id) => retrieve(shared, &id).await,
        BatchRoute::Cancel(id) => cancel(shared, &id),
    }
}

const ENDPOINTS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/embeddings",
    "/chat/completions",
    "/embeddings",
];

fn create(shared: &Shared, body: Option<&Value>) -> Response {
    let map = match super::json_object(body) {
        Ok(map) => map,
        Err(bad) => return bad.response(),
    };
    let mut state = shared.lock();
    if state.batch.rate_limited_creates > 0 {
        state.batch.rate_limited_creates -= 1;
        return rate_limited(Some("0".into()));
    }
    let Some(file_id) = map.get("input_file_id").and_then(Value::as_str) else {
        return BadRequest::new(
            "'input_file_id' is a required property",
            Some("input_file_id"),
        )
        .response();
    };
    if !state.batch.files.contains_key(file_id) {
        return not_found("file", file_id);
    }
    let endpoint = map
        .get("endpoint")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !ENDPOINTS.contains(&endpoint) {
        return BadRequest::new(format!("Invalid endpoint '{endpoint}'."), Some("endpoint"))
            .response();
    }
    let window = map.get("completion_window").and_then(Value::as_str);
    if window != Some("24h") {
        return BadRequest::new(
            "Invalid value for 'completion_window': expected '24h'.",
            Some("completion_window"),
        )
        .response();
    }
    state.batch.next_id += 1;
    let n = state.batch.next_id;
    let now = chrono::Utc::now().timestamp();
    let object = json!({
        "id": format!("batch_test{n}"), "object": "batch", "endpoint": endpoint,
        "errors": null, "input_file_id": file_id, "completion_window": "24h",
        "status": "validating", "output_file_id": null, "error_file_id": null,
        "created_at": now, "in_progress_at": null, "expires_at": now + 86_400,
        "finalizing_at": null, "completed_at": null, "failed_at": null,
        "expired_at": null, "cancelling_at": null, "cancelled_at": null,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": map.get("metadata").cloned().unwrap_or(Value::Null),
    });
    let end = state.batch.ends.pop_front().unwrap_or(BatchEnd::Completed);
    state.batch.creates += 1;
    state.batch.batches.insert(
        n,
        Batch {
            object: object.clone(),
            end,
            answering: false,
        },
    );
    Response::json(200, &object)
}

fn list(shared: &Shared, head: &Head) -> Response {
    let query = head.target.split_once('?').map_or("", |(_, q)| q);
    let param = |key: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    };
    let limit = param("limit")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, 100);
    let after = param("after");
    let state = shared.lock();
    let newest_first = state.batch.batches.values().rev();
    let mut skipping = after.is_some();
    let mut data = Vec::new();
    let mut has_more = false;
    for b in newest_first {
        if skipping {
            skipping = Some(b.id()) != after;
            continue;
        }
        if data.len() == limit {
            has_more = true;
            break;
        }
        data.push(b.object.clone());
    }
    let first = data.first().map(|b| b["id"].clone());
    let last = data.last().map(|b| b["id"].clone());
    Response::json(
        200,
        &json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}),
    )
}

fn find_batch<'a>(state: &'a mut super::State, id: &str) -> Option<&'a mut Batch> {
    state.batch.batches.values_mut().find(|b| b.id() == id)
}

fn cancel(shared: &Shared, id: &str) -> Response {
    let mut state = shared.lock();
    let Some(batch) = find_batch(&mut state, id) else {
        return not_found("batch", id);
    };
    match batch.status() {
        "validating" | "in_progress" | "finalizing" => {
            batch.set_status("cancelling");
            Response::json(200, &batch.object)
        }
        status => BadRequest::new(
            format!("Cannot cancel a batch with status '{status}'."),
            None,
        )
        .response(),
    }
}

/// One line of an input file, checked.
struct Line {
    custom_id: String,
    url: String,
    body: Value,
}

/// The input file's lines, or the validation errors of the batch.
fn validate(file: &[u8], endpoint: &str) -> Result<Vec<Line>, Vec<Value>> {
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (n, raw) in file.split(|b| *b == b'\n').enumerate() {
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let error = |code: &str, message: String| json!({"code": code, "message": message, "param": null, "line": n + 1});
        let Ok(v) = serde_json::from_slice::<Value>(raw) else {
            errors.push(error(
                "invalid_json_line",
                "This line is not valid JSON.".into(),
            ));
            continue;
        };
        let Some(custom_id) = v["custom_id"].as_str() else {
            errors.push(error(
                "missing_required_parameter",
                "Missing 'custom_id'.".into(),
            ));
            continue;
        };
        if !seen.insert(custom_id.to_owned()) {
            errors.push(error(
                "duplicate_custom_id",
                format!("The custom_id '{custom_id}' appears more than once."),
            ));
            continue;
        }
        let url = v["url"].as_str().unwrap_or_default();
        if url != endpoint {
            errors.push(error(
                "mismatched_endpoint",
                format!("The line's url '{url}' is not the batch's endpoint '{endpoint}'."),
            ));
            continue;
        }
        lines.push(Line {
            custom_id: custom_id.to_owned(),
            url: url.to_owned(),
            body: v["body"].clone(),
        });
    }
    if lines.is_empty() && errors.is_empty() {
        errors.push(json!({"code": "empty_file", "message": "The input file is empty.", "param": null, "line": null}));
    }
    if errors.is_empty() {
        Ok(lines)
    } else {
        Err(errors)
    }
}

/// `GET /batches/{id}`: moves the batch one status step and returns it.
async fn retrieve(shared: &Shared, id: &str) -> Response {
    // Decided under the lock; answering lines runs without it.
    let (lines, half, next, batch_id) = {
        let mut state = shared.lock();
        let BatchState { files, batches, .. } = &mut state.batch;
        let Some(batch) = batches.values_mut().find(|b| b.id() == id) else {
            return not_found("batch", id);
        };
        if batch.answering {
            return Response::json(200, &batch.object);
        }
        let file = batch.object["input_file_id"]
            .as_str()
            .and_then(|f| files.get(f))
            .map(|f| f.bytes.as_slice())
            .unwrap_or_default();
        let endpoint = batch.object["endpoint"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let (next, answer) = match (batch.status(), batch.end) {
            ("validating", BatchEnd::Failed) => {
                batch.object["errors"] = json!({"object": "list", "data": [{
                    "code": "token_limit_exceeded", "line": null, "param": null,
                    "message": "Enqueued token limit reached for this model."}]});
                ("failed", None)
            }
            ("validating", _) => match validate(file, &endpoint) {
                Ok(lines) => {
                    batch.object["request_counts"]["total"] = json!(lines.len());
                    ("in_progress", None)
                }
                Err(errors) => {
                    batch.object["errors"] = json!({"object": "list", "data": errors});
                    ("failed", None)
                }
            },
            ("in_progress", BatchEnd::StuckInProgress) => ("in_progress", None),
            ("in_progress", BatchEnd::Expired) => ("expired", Some(true)),
            ("in_progress", _) => ("finalizing", Some(false)),
            ("finalizing", _) => ("completed", None),
            ("cancelling", _) => ("cancelled", Some(true)),
            (status, _) => (status, None),
        };
        let next = next.to_owned();
        let Some(half) = answer else {
            batch.set_status(&next);
            return Response::json(200, &batch.object);
        };
        batch.answering = true;
        let lines = validate(file, &endpoint).unwrap_or_default();
        (lines, half, next, batch.id().to_owned())
    };
    let total = lines.len();
    let answered = if half { total.div_ceil(2) } else { total };
    let mut output = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if i >= answered {
            if next == "expired" {
                errors.push(json!({
                    "id": format!("batch_req_{batch_id}_{i}"), "custom_id": line.custom_id,
                    "response": null,
                    "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."},
                }));
            }
            continue;
        }
        let (status, body) = answer_line(shared, &batch_id, line).await;
        let out = json!({
            "id": format!("batch_req_{batch_id}_{i}"), "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": format!("req_{batch_id}_{i}"), "body": body},
            "error": null,
        });
        if status == 200 {
            output.push(out);
        } else {
            errors.push(out);
        }
    }
    // A provider writes its output in the order requests finish.
    output.reverse();
    let mut state = shared.lock();
    let mut file_of = |lines: &[Value], kind: &str| -> Option<String> {
        if lines.is_empty() {
            return None;
        }
        state.batch.next_id += 1;
        let mut bytes = Vec::new();
        for l in lines {
            bytes.extend_from_slice(l.to_string().as_bytes());
            bytes.push(b'\n');
        }
        let file = File {
            id: format!("file-test{}", state.batch.next_id),
            filename: format!("{batch_id}_{kind}.jsonl"),
            purpose: "batch_output".into(),
            bytes,
            created_at: chrono::Utc::now().timestamp(),
        };
        let id = file.id.clone();
        state.batch.files.insert(id.clone(), file);
        Some(id)
    };
    let output_id = file_of(&output, "output");
    let error_id = file_of(&errors, "error");
    let batch = find_batch(&mut state, &batch_id).expect("batches are never removed");
    batch.object["output_file_id"] = json!(output_id);
    batch.object["error_file_id"] = json!(error_id);
    batch.object["request_counts"] =
        json!({"total": total, "completed": output.len(), "failed": errors.len()});
    batch.answering = false;
    batch.set_status(&next);
    Response::json(200, &batch.object)
}

/// Answers one line as the synchronous route would: its status and body.
async fn answer_line(shared: &Shared, batch_id: &str, line: &Line) -> (u16, Value) {
    let embeddings = line.url.ends_with("/embeddings");
    let head = Head {
        method: "POST".into(),
        target: line.url.clone(),
        http10: false,
        headers: vec![("x-batch-id".into(), batch_id.to_owned())],
    };
    let at = shared.started.elapsed();
    let chat = (!embeddings).then(|| parse_chat(Some(&line.body), None));
    let embed = embeddings.then(|| parse_embeddings(Some(&line.body), None));
    let (prompt, max_tokens) = match (&chat, &embed) {
        (Some(Ok(view)), _) => (prompt_tokens(&view.messages), view.max_tokens),
        (_, Some(Ok(request))) => (request.prompt_tokens, None),
        _ => (0, None),
    };
    let seq = record(shared, at, 0, &head, line.body.clone(), prompt, max_tokens);
    let (fault, scripted, responder) = {
        let mut state = shared.lock();
        let fault = state.draw_fault();
        let scripted = match &chat {
            Some(Ok(_)) if fault.is_none() => state.replies.pop_front(),
            _ => None,
        };
        let responder = std::sync::Arc::clone(&state.behavior.responder);
        (fault, scripted, responder)
    };
    // A slow request in a batch only finishes later.
    let fault = fault.filter(|f| !matches!(f, Fault::Slow(_)));
    let id = format!("chatcmpl-test{seq}");
    let (action, completion) = match (chat, embed) {
        (Some(request), _) => chat_outcome(fault, request, scripted, &responder, &id, prompt).await,
        (None, Some(request)) => embeddings_outcome(fault, request, &id),
        (None, None) => (Action::Close, 0),
    };
    // A body that is not JSON (a broken or cut reply) cannot be a line:
    // the line says the server failed.
    let parsed = match &action {
        Action::Respond(resp) => serde_json::from_slice::<Value>(&resp.body)
            .ok()
            .map(|body| (resp.status, body)),
        Action::Truncate(_) | Action::Close => None,
    };
    let (status, body) = parsed.unwrap_or_else(|| {
        let message = "The server had an error processing your request.";
        (500, error_json(message, "server_error", None, None))
    });
    shared.finish(seq, status, completion);
    (status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(target: &str, content_type: &str) -> Head {
        Head {
            method: "POST".into(),
            target: target.into(),
            http10: false,
            headers: vec![("content-type".into(), content_type.into())],
        }
    }

    #[test]
    fn batch_routes_cover_openai_and_both_azure_bases() {
        let batch = |m: &str, p: &str| match batch_route(m, p) {
            Some(super::super::Route::Batch { api, azure }) => Some((api, azure)),
            _ => None,
        };
        assert_eq!(
            batch("POST", "/v1/batches"),
            Some((BatchRoute::Create, false))
        );
        assert_eq!(
            batch("GET", "/openai/batches/b1"),
            Some((BatchRoute::Retrieve("b1".into()), true))
        );
        assert_eq!(
            batch("POST", "/openai/v1/batches/b1/cancel"),
            Some((BatchRoute::Cancel("b1".into()), false))
        );
        assert_eq!(
            batch("GET", "/v1/files/f1/content"),
            Some((BatchRoute::FileContent("f1".into()), false))
        );
        assert!(matches!(
            batch_route("POST", "/openai/files"),
            Some(super::super::Route::Upload { azure: true })
        ));
        // The chat and embeddings routes are not the Batch API's.
        assert!(batch_route("POST", "/v1/chat/completions").is_none());
        assert!(batch_route("POST", "/openai/deployments/d/chat/completions").is_none());
        assert!(batch_route("GET", "/v1/batches/").is_none());
    }

    #[test]
    fn a_multipart_upload_gives_its_purpose_file_name_and_bytes() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
Content-Type: application/jsonl\r\n\r\n{\"a\":1}\r\n{\"b\":2}\n\r\n--XyZ--\r\n";
        let upload = parse_upload(
            &head("/v1/files", "multipart/form-data; boundary=XyZ"),
            body,
        )
        .map_err(|b| b.message)
        .expect("parses");
        assert_eq!(upload.purpose.as_deref(), Some("batch"));
        assert_eq!(upload.filename, "in.jsonl");
        assert_eq!(upload.bytes, b"{\"a\":1}\r\n{\"b\":2}\n");
        let missing = parse_upload(&head("/v1/files", "application/json"), b"{}");
        assert!(missing.is_err());
    }

    #[test]
    fn validation_names_each_bad_line() {
        let file = b"{\"custom_id\":\"a\",\"url\":\"/v1/embeddings\",\"body\":{}}\n\
not json\n{\"url\":\"/v1/embeddings\"}\n\
{\"custom_id\":\"a\",\"url\":\"/v1/embeddings\",\"body\":{}}\n\
{\"custom_id\":\"b\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n";
        let errors = validate(file, "/v1/embeddings").err().expect("invalid");
        let codes: Vec<(&str, u64)> = errors
            .iter()
            .map(|e| {
                (
                    e["code"].as_str().unwrap_or(""),
                    e["line"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(
            codes,
            [
                ("invalid_json_line", 2),
                ("missing_required_parameter", 3),
                ("duplicate_custom_id", 4),
                ("mismatched_endpoint", 5)
            ]
        );
        let ok = validate(
            b"{\"custom_id\":\"a\",\"url\":\"/v1/embeddings\",\"body\":{}}\n",
            "/v1/embeddings",
        );
        assert_eq!(ok.map(|l| l.len()).ok(), Some(1));
    }
}
