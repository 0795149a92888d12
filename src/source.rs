//! The source stage: discovering episode files in an object store, parsing
//! them into [`Episode`]s with content-hash ids, and turning bad input into
//! [`SourceFailure`]s instead of errors.
//!
//! Files are listed recursively below `source.url` and chosen by extension:
//!
//! | format | files | one episode per |
//! |---|---|---|
//! | `jsonl` | `*.jsonl`, `*.ndjson` | line (blank lines are skipped) |
//! | `json` | `*.json` | item of a top-level array (an object alone is one record) |
//! | `parquet` | `*.parquet` | row, through `source.columns`; with kind `json` and no `content` column, the whole row is the record |
//! | `text` | `*.txt`, `*.md` | chunk of about `source.chunk_tokens` tokens |
//!
//! Files of other extensions are counted in [`Loaded::ignored`]; files and
//! directories whose name starts with `.` or `_` are skipped (`_delta_log`,
//! `.DS_Store`, `_SUCCESS`). A URL that names a single file (no listing
//! below it) loads that file.
//!
//! A record (JSON object or Parquet row) has these fields ([`RECORD_FIELDS`]):
//!
//! * `content` (required): a non-empty string; with kind `json` a JSON object
//!   or array is accepted too and stored serialised; a Parquet file with no
//!   `content` column read with `default_kind = "json"` gives each row's
//!   columns as the content, one JSON object (null columns left out), which
//!   is what `[[mapping]]` rules of CRM or ERP tables read;
//! * `kind`: `message`, `text` or `json` (default `source.default_kind`);
//! * `reference_time`: RFC 3339 (converted to UTC), or for Parquet a
//!   timestamp column of any unit and time zone (no time zone = UTC); when
//!   absent, the file's last-modified time ([`Episode::reference_time_source`]
//!   is then `file_modified`);
//! * `id` (string or number), `document_id`, `group_id` (default: the
//!   pipeline's `output.group_id`), `source_description`: optional strings;
//!   empty strings count as absent.
//!
//! Other fields of a record are ignored: records usually come from other
//! systems and carry more than graphloom needs.
//!
//! Every record either becomes an episode or a [`SourceFailure`] with the
//! file, line (JSON Lines and JSON) and reason; the rest of the file still
//! loads. Only problems with the whole source (a bad URL, an unreachable
//! store, a missing local directory) are [`SourceError`]s.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use url::Url;

use crate::objstore::{self, LocationError};
use crate::rows::{EXCERPT_CHARS, EpisodeRow, FailureRow};
pub use crate::spec::{EpisodeKind, RECORD_FIELDS};
use crate::spec::{SourceFormat, SourceSpec};

/// Files read and parsed at once.
const CONCURRENT_FILES: usize = 8;

/// Characters per token when sizing text chunks.
const CHARS_PER_TOKEN: usize = 4;

/// One unit of input for extraction: a message, a text chunk or a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    /// Stable id: the first 32 hex characters of
    /// `blake3(source_uri + "\n" + content)`. The same record at the same
    /// place gets the same id in every run; note that for JSON Lines the
    /// place includes the line number.
    pub episode_id: String,
    /// The record's own `id` field, if it had one.
    pub source_id: Option<String>,
    /// The record's `group_id`, or the pipeline's `output.group_id`.
    pub group_id: String,
    /// The record's `document_id`; for text files the file's URI.
    pub document_id: Option<String>,
    /// The file's URL without credentials, plus `#L<line>` (JSON Lines),
    /// `#<index>` (JSON array items, Parquet rows) or `#chunk<k>` (text).
    pub source_uri: String,
    /// The record's `source_description`.
    pub source_description: Option<String>,
    /// The record's kind.
    pub kind: EpisodeKind,
    /// The text given to the extractor.
    pub content: String,
    /// When the episode happened, in UTC.
    pub reference_time: DateTime<Utc>,
    /// `field` (from the record) or `file_modified` (the file's
    /// last-modified time, because the record had none).
    pub reference_time_source: String,
    /// (file index in listing order, position in the file): breaks ties
    /// between episodes with the same reference time.
    pub order: (usize, usize),
}

impl Episode {
    /// The `episodes` row of this episode for a run.
    pub fn to_row(&self, run_id: &str, ingested_at: DateTime<Utc>) -> EpisodeRow {
        EpisodeRow {
            episode_id: self.episode_id.clone(),
            group_id: self.group_id.clone(),
            document_id: self.document_id.clone(),
            source_id: self.source_id.clone(),
            source_uri: self.source_uri.clone(),
            source_description: self.source_description.clone(),
            kind: self.kind.as_str().to_string(),
            content: self.content.clone(),
            reference_time: self.reference_time,
            reference_time_source: self.reference_time_source.clone(),
            ingested_at,
            run_id: run_id.to_string(),
        }
    }
}

/// The stable id of an episode: the first 32 hex characters of
/// `blake3(source_uri + "\n" + content)`.
pub fn episode_id(source_uri: &str, content: &str) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(source_uri.as_bytes());
    hasher.update(b"\n");
    hasher.update(content.as_bytes());
    let hex = hasher.finalize().to_hex();
    hex[..32].to_string()
}

/// Input that produced no episode: a bad line, record or file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFailure {
    /// The file's URL without credentials (no fragment).
    pub source_uri: String,
    /// The file's path below `source.url`, with `:<line>` when the failure
    /// has a line, or `#<row>` for a Parquet row (e.g. `mail.jsonl:12`).
    pub item: String,
    /// 1-based line of the failure in the file, when it has one.
    pub line: Option<i64>,
    /// What is wrong, in words a user can act on.
    pub reason: String,
    /// The start of the offending input (at most 200 characters).
    pub excerpt: Option<String>,
}

impl SourceFailure {
    /// The `failures` row (stage `source`) of this failure for a run.
    pub fn to_row(&self, run_id: &str, created_at: DateTime<Utc>) -> FailureRow {
        let row = FailureRow::new(
            run_id,
            crate::stage::Stage::Source,
            self.item.clone(),
            self.reason.clone(),
            created_at,
        )
        .at(self.source_uri.clone(), self.line);
        match &self.excerpt {
            Some(text) => row.excerpt(text),
            None => row,
        }
    }
}

/// Everything read from a source.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// Episodes sorted by (reference time, order).
    pub episodes: Vec<Episode>,
    /// Lines, records and files that produced no episode, in file order.
    pub failures: Vec<SourceFailure>,
    /// Files of the source's format that were read.
    pub files: usize,
    /// Files below the URL skipped because of their extension (hidden files
    /// not counted).
    pub ignored: usize,
}

/// Problems with the source as a whole; bad input inside files is a
/// [`SourceFailure`] instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// `source.url` or `source.storage_options` is not usable.
    #[error(transparent)]
    Location(#[from] LocationError),
    /// A local source directory does not exist.
    #[error("source directory {url} does not exist")]
    Missing { url: String },
    /// Listing the files failed (store unreachable, access denied).
    #[error("cannot list {url}: {source}")]
    List {
        url: String,
        #[source]
        source: object_store::Error,
    },
    /// Reading a listed file from a remote store failed for a reason other
    /// than it having vanished or being forbidden (which, like any read
    /// error of a local file, are failures of that file).
    #[error("cannot read {url}: {source}")]
    Read {
        url: String,
        #[source]
        source: object_store::Error,
    },
    /// The store turned the source down for a setup reason (no bucket,
    /// refused credentials, no server): one line saying what to fix.
    #[error("source: {message}")]
    Storage {
        problem: objstore::Problem,
        message: String,
    },
    /// A parsing task stopped unexpectedly.
    #[error("source task failed: {message}")]
    Task { message: String },
}

/// Settings shared by every file of one load.
#[derive(Debug)]
struct Settings {
    format: SourceFormat,
    default_kind: EpisodeKind,
    default_group_id: String,
    max_record_bytes: usize,
    chunk_tokens: usize,
    overlap_tokens: usize,
    columns: BTreeMap<String, String>,
}

/// One file to read.
#[derive(Debug)]
struct FileCtx {
    index: usize,
    /// Redacted URL of the file.
    uri: String,
    /// Path below the source URL, for `item`.
    name: String,
    last_modified: DateTime<Utc>,
    settings: Arc<Settings>,
}

/// Episodes and failures of one file.
#[derive(Debug, Default)]
struct FileOut {
    episodes: Vec<Episode>,
    failures: Vec<SourceFailure>,
}

/// Loads every episode below `spec.url`.
///
/// `default_group_id` is used for records without a `group_id` (normally
/// `output.group_id`). `options` are storage options from the caller;
/// `spec.storage_options` are applied over them (a key in both takes the
/// spec's value). Finding no file is not an error: the result is empty and
/// a warning is logged.
pub async fn load(
    spec: &SourceSpec,
    default_group_id: &str,
    options: &BTreeMap<String, String>,
) -> Result<Loaded, SourceError> {
    let url = objstore::parse_dir_url(&spec.url)?;
    let shown = objstore::redacted(&url);
    if url.scheme() == "file"
        && let Ok(dir) = url.to_file_path()
    {
        // A missing local directory is almost always a typo; an empty
        // listing would hide it. Object stores cannot tell, so only here.
        let file = dir
            .to_str()
            .map(|d| std::path::PathBuf::from(d.trim_end_matches('/')));
        let exists = dir.exists() || file.as_ref().is_some_and(|f| f.is_file());
        if !exists {
            return Err(SourceError::Missing { url: shown });
        }
    }
    let mut store_options = options.clone();
    store_options.extend(spec.storage_options.clone());
    let store = objstore::store_for(&url, &store_options)?;
    let prefix = objstore::path_of(&url);
    let prefix_opt = (!prefix.as_ref().is_empty()).then_some(&prefix);
    let mut listed: Vec<ObjectMeta> = store.list(prefix_opt).try_collect().await.map_err(
        |source| match objstore::Problem::of(&source) {
            Some(problem) => SourceError::Storage {
                problem,
                message: problem.describe(&url),
            },
            None => SourceError::List {
                url: shown.clone(),
                source,
            },
        },
    )?;
    let mut single_file = false;
    if listed.is_empty() && !prefix.as_ref().is_empty() {
        // The URL may name one file rather than a directory.
        match store.head(&prefix).await {
            Ok(meta) => {
                listed.push(meta);
                single_file = true;
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                return Err(SourceError::List {
                    url: shown.clone(),
                    source,
                });
            }
        }
    }
    listed.sort_by(|a, b| a.location.cmp(&b.location));

    let settings = Arc::new(Settings {
        format: spec.format,
        default_kind: spec.default_kind,
        default_group_id: default_group_id.to_string(),
        max_record_bytes: spec.max_record_bytes,
        chunk_tokens: spec.chunk_tokens,
        overlap_tokens: spec.chunk_overlap_tokens,
        columns: spec.columns.clone(),
    });
    let mut files = Vec::new();
    let mut ignored = 0usize;
    for meta in listed {
        let name = if single_file {
            meta.location.filename().unwrap_or_default().to_string()
        } else {
            relative_name(&prefix, &meta.location)
        };
        if name
            .split('/')
            .any(|part| part.starts_with('.') || part.starts_with('_'))
        {
            tracing::debug!(file = %name, "skipping hidden file");
            continue;
        }
        if !matches_format(spec.format, &name) {
            tracing::debug!(file = %name, format = ?spec.format, "ignoring file of another format");
            ignored += 1;
            continue;
        }
        let uri = objstore::redacted(&file_url(&url, &meta.location));
        files.push((meta, uri, name));
    }
    if files.is_empty() {
        tracing::warn!(
            url = %shown,
            format = ?spec.format,
            ignored,
            "no episode files found below the source URL"
        );
        return Ok(Loaded {
            ignored,
            ..Loaded::default()
        });
    }

    let file_count = files.len();
    let local = url.scheme() == "file";
    let outs: Vec<FileOut> = futures::stream::iter(files.into_iter().enumerate())
        .map(|(index, (meta, uri, name))| {
            let store = store.clone();
            let settings = settings.clone();
            async move {
                let ctx = FileCtx {
                    index,
                    uri,
                    name,
                    last_modified: meta.last_modified,
                    settings,
                };
                read_file(store.as_ref(), &meta.location, local, ctx).await
            }
        })
        .buffered(CONCURRENT_FILES)
        .try_collect()
        .await?;

    let mut loaded = Loaded {
        files: file_count,
        ignored,
        ..Loaded::default()
    };
    for out in outs {
        loaded.episodes.extend(out.episodes);
        loaded.failures.extend(out.failures);
    }
    loaded.episodes.sort_by_key(|e| (e.reference_time, e.order));
    tracing::info!(
        url = %shown,
        files = loaded.files,
        episodes = loaded.episodes.len(),
        failures = loaded.failures.len(),
        ignored = loaded.ignored,
        "source loaded"
    );
    Ok(loaded)
}

/// The path of `location` below `prefix` (`sub/a.jsonl`).
fn relative_name(prefix: &StorePath, location: &StorePath) -> String {
    match location.prefix_match(prefix) {
        Some(parts) => parts
            .map(|p| p.as_ref().to_string())
            .collect::<Vec<_>>()
            .join("/"),
        None => location.as_ref().to_string(),
    }
}

fn matches_format(format: SourceFormat, name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let exts: &[&str] = match format {
        SourceFormat::Jsonl => &[".jsonl", ".ndjson"],
        SourceFormat::Json => &[".json"],
        SourceFormat::Parquet => &[".parquet"],
        SourceFormat::Text => &[".txt", ".md"],
    };
    exts.iter().any(|e| lower.ends_with(e))
}

/// The URL of an object listed from the store of `base`.
fn file_url(base: &Url, location: &StorePath) -> Url {
    let mut u = base.clone();
    u.set_path(&format!("/{}", location.as_ref()));
    u.set_fragment(None);
    u
}

async fn read_file(
    store: &dyn ObjectStore,
    location: &StorePath,
    local: bool,
    ctx: FileCtx,
) -> Result<FileOut, SourceError> {
    let got = match store.get(location).await {
        Ok(got) => got.bytes().await,
        Err(e) => Err(e),
    };
    let bytes = match got {
        Ok(bytes) => bytes,
        // A local read error concerns that file only (unreadable, removed
        // since the listing); remotely only these two do, the rest (network,
        // credentials) concern the whole store.
        Err(e)
            if local
                || matches!(
                    e,
                    object_store::Error::NotFound { .. }
                        | object_store::Error::PermissionDenied { .. }
                ) =>
        {
            let mut out = FileOut::default();
            fail(&ctx, &mut out, None, format!("cannot read file: {e}"), None);
            return Ok(out);
        }
        Err(source) => {
            return Err(SourceError::Read {
                url: ctx.uri.clone(),
                source,
            });
        }
    };
    let uri = ctx.uri.clone();
    // Parsing is CPU work proportional to the file: keep it off the async
    // runtime's threads.
    tokio::task::spawn_blocking(move || {
        let mut out = FileOut::default();
        match ctx.settings.format {
            SourceFormat::Jsonl => parse_jsonl(&ctx, &bytes, &mut out),
            SourceFormat::Json => parse_json(&ctx, &bytes, &mut out),
            SourceFormat::Parquet => parse_parquet_guarded(&ctx, bytes, &mut out),
            SourceFormat::Text => parse_text(&ctx, &bytes, &mut out),
        }
        out
    })
    .await
    .map_err(|e| SourceError::Task {
        message: format!("parsing {uri}: {e}"),
    })
}

fn excerpt(text: &str) -> String {
    text.chars().take(EXCERPT_CHARS).collect()
}

/// Records a failure; `line` is 1-based.
fn fail(ctx: &FileCtx, out: &mut FileOut, line: Option<usize>, reason: String, text: Option<&str>) {
    let item = match line {
        Some(l) => format!("{}:{l}", ctx.name),
        None => ctx.name.clone(),
    };
    out.failures.push(SourceFailure {
        source_uri: ctx.uri.clone(),
        item,
        line: line.map(|l| l as i64),
        reason,
        excerpt: text.map(excerpt),
    });
}

/// 1-based line of a byte offset.
fn line_of(bytes: &[u8], offset: usize) -> usize {
    bytes[..offset.min(bytes.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The file as text, or a failure naming the first invalid byte.
fn whole_text<'a>(ctx: &FileCtx, bytes: &'a [u8], out: &mut FileOut) -> Option<&'a str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            let text = text.strip_prefix('\u{feff}').unwrap_or(text);
            if text.trim().is_empty() {
                fail(ctx, out, None, "file is empty".into(), None);
                return None;
            }
            Some(text)
        }
        Err(e) => {
            let offset = e.valid_up_to();
            let line = line_of(bytes, offset);
            let start = bytes[..offset]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |p| p + 1);
            let lossy =
                String::from_utf8_lossy(&bytes[start..(offset + 64).min(bytes.len())]).into_owned();
            fail(
                ctx,
                out,
                Some(line),
                format!("file is not valid UTF-8 (invalid byte at offset {offset})"),
                Some(&lossy),
            );
            None
        }
    }
}

/// A record's fields, checked.
struct Record {
    content: String,
    kind: EpisodeKind,
    reference_time: Option<DateTime<Utc>>,
    id: Option<String>,
    document_id: Option<String>,
    group_id: Option<String>,
    source_description: Option<String>,
}

fn too_large(size: usize, max: usize) -> String {
    format!("record is {size} bytes, larger than source.max_record_bytes ({max})")
}

/// Parses an RFC 3339 reference time into UTC.
fn parse_reference_time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!(
                "reference_time {text:?} is not an RFC 3339 time such as 2024-03-28T09:41:00Z ({e})"
            )
        })
}

fn parse_kind(text: &str) -> Result<EpisodeKind, String> {
    EpisodeKind::parse(text)
        .ok_or_else(|| format!("kind {text:?} is not one of message, text, json"))
}

fn check_content(content: Option<String>) -> Result<String, String> {
    match content {
        None => Err("content is missing".into()),
        Some(c) if c.trim().is_empty() => Err("content is empty".into()),
        Some(c) => Ok(c),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An optional string field; null and empty strings are absent.
fn optional_str(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "{field} must be a string, found {}",
            json_type(other)
        )),
    }
}

/// Checks a JSON record's fields.
fn record_from_json(value: &Value, settings: &Settings) -> Result<Record, String> {
    let Value::Object(obj) = value else {
        return Err(format!(
            "record is not a JSON object (found {})",
            json_type(value)
        ));
    };
    let kind = match obj.get("kind") {
        None | Some(Value::Null) => settings.default_kind,
        Some(Value::String(s)) => parse_kind(s)?,
        Some(other) => return Err(format!("kind must be a string, found {}", json_type(other))),
    };
    let content = match obj.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v @ (Value::Object(_) | Value::Array(_))) if kind == EpisodeKind::Json => {
            Some(v.to_string())
        }
        Some(other) => {
            return Err(format!(
                "content must be a string{}, found {}",
                if kind == EpisodeKind::Json {
                    " (or, for kind json, an object or array)"
                } else {
                    ""
                },
                json_type(other)
            ));
        }
    };
    let content = check_content(content)?;
    let reference_time = match obj.get("reference_time") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_reference_time(s)?),
        Some(other) => {
            return Err(format!(
                "reference_time must be an RFC 3339 string, found {}",
                json_type(other)
            ));
        }
    };
    let id = match obj.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            return Err(format!(
                "id must be a string or a number, found {}",
                json_type(other)
            ));
        }
    };
    Ok(Record {
        content,
        kind,
        reference_time,
        id,
        document_id: optional_str(obj, "document_id")?,
        group_id: optional_str(obj, "group_id")?,
        source_description: optional_str(obj, "source_description")?,
    })
}

fn episode(ctx: &FileCtx, record: Record, fragment: String, position: usize) -> Episode {
    let source_uri = format!("{}#{fragment}", ctx.uri);
    let (reference_time, reference_time_source) = match record.reference_time {
        Some(t) => (t, "field"),
        None => (ctx.last_modified, "file_modified"),
    };
    Episode {
        episode_id: episode_id(&source_uri, &record.content),
        source_id: record.id,
        group_id: record
            .group_id
            .unwrap_or_else(|| ctx.settings.default_group_id.clone()),
        document_id: record.document_id,
        source_uri,
        source_description: record.source_description,
        kind: record.kind,
        content: record.content,
        reference_time,
        reference_time_source: reference_time_source.to_string(),
        order: (ctx.index, position),
    }
}

/// serde_json's message without its position, which is relative to the
/// text it was given.
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

fn parse_jsonl(ctx: &FileCtx, bytes: &[u8], out: &mut FileOut) {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        fail(ctx, out, None, "file is empty".into(), None);
        return;
    }
    let max = ctx.settings.max_record_bytes;
    let mut file_offset = 0usize;
    for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
        let line_no = i + 1;
        let line_start = file_offset;
        file_offset += raw.len() + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.len() > max {
            let lossy = String::from_utf8_lossy(&raw[..raw.len().min(EXCERPT_CHARS * 4)]);
            fail(
                ctx,
                out,
                Some(line_no),
                too_large(raw.len(), max),
                Some(&lossy),
            );
            continue;
        }
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t,
            Err(e) => {
                let lossy = String::from_utf8_lossy(raw).into_owned();
                fail(
                    ctx,
                    out,
                    Some(line_no),
                    format!(
                        "line is not valid UTF-8 (invalid byte at offset {} of the line, {} of the file)",
                        e.valid_up_to(),
                        line_start + e.valid_up_to()
                    ),
                    Some(&lossy),
                );
                continue;
            }
        };
        let text = text.trim_start_matches('\u{feff}');
        if text.trim().is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                fail(
                    ctx,
                    out,
                    Some(line_no),
                    format!(
                        "malformed JSON: {} at column {}",
                        json_message(&e),
                        char_column(text, e.column())
                    ),
                    Some(text),
                );
                continue;
            }
        };
        match record_from_json(&value, &ctx.settings) {
            Ok(record) => {
                let ep = episode(ctx, record, format!("L{line_no}"), line_no);
                out.episodes.push(ep);
            }
            Err(reason) => fail(ctx, out, Some(line_no), reason, Some(text)),
        }
    }
}

/// Items of a JSON file: (start byte, end byte, value).
type JsonItems = Vec<(usize, usize, Value)>;

/// Reads a top-level array item by item so that each item keeps its
/// position; an object alone is one item. Errors carry the byte offset.
fn json_items(text: &str) -> Result<JsonItems, (usize, String)> {
    let bytes = text.as_bytes();
    let skip_ws = |mut pos: usize| {
        while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
            pos += 1;
        }
        pos
    };
    let start = skip_ws(0);
    if bytes.get(start) != Some(&b'[') {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            (
                offset_of(text, 0, &e),
                format!("malformed JSON: {}", json_message(&e)),
            )
        })?;
        return match value {
            Value::Object(_) => Ok(vec![(start, text.trim_end().len(), value)]),
            other => Err((
                start,
                format!(
                    "file is not a JSON array of records or a single object (found {})",
                    json_type(&other)
                ),
            )),
        };
    }
    let mut items = Vec::new();
    let mut pos = skip_ws(start + 1);
    if bytes.get(pos) == Some(&b']') {
        pos += 1;
    } else {
        loop {
            let item_start = skip_ws(pos);
            let mut stream =
                serde_json::Deserializer::from_str(&text[item_start..]).into_iter::<Value>();
            match stream.next() {
                Some(Ok(value)) => {
                    let item_end = item_start + stream.byte_offset();
                    items.push((item_start, item_end, value));
                    pos = skip_ws(item_end);
                }
                Some(Err(e)) => {
                    return Err((
                        offset_of(text, item_start, &e),
                        format!("malformed JSON: {}", json_message(&e)),
                    ));
                }
                None => return Err((text.len(), "malformed JSON: unclosed array".into())),
            }
            match bytes.get(pos) {
                Some(b',') => pos += 1,
                Some(b']') => {
                    pos += 1;
                    break;
                }
                Some(_) => {
                    return Err((
                        pos,
                        "malformed JSON: expected `,` or `]` after an array item".into(),
                    ));
                }
                None => return Err((pos, "malformed JSON: unclosed array".into())),
            }
        }
    }
    let end = skip_ws(pos);
    if end < bytes.len() {
        return Err((
            end,
            "malformed JSON: trailing characters after the array".into(),
        ));
    }
    Ok(items)
}

/// Byte offset of serde_json's 1-based `column` in `line`, on a character
/// boundary. serde_json counts columns in bytes, not characters: counting
/// characters put errors after non-ASCII text past the end of their line,
/// and so on the next line.
fn column_offset(line: &str, column: usize) -> usize {
    let mut at = column.saturating_sub(1).min(line.len());
    while !line.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The 1-based character column of serde_json's byte `column` in `line`.
fn char_column(line: &str, column: usize) -> usize {
    line[..column_offset(line, column)].chars().count() + 1
}

/// Byte offset in `text` of an error in `text[base..]`.
fn offset_of(text: &str, base: usize, e: &serde_json::Error) -> usize {
    let sub = &text[base..];
    let mut offset = 0;
    for (i, line) in sub.split_inclusive('\n').enumerate() {
        if i + 1 == e.line() {
            return base + offset + column_offset(line, e.column());
        }
        offset += line.len();
    }
    base + sub.len()
}

fn parse_json(ctx: &FileCtx, bytes: &[u8], out: &mut FileOut) {
    let Some(text) = whole_text(ctx, bytes, out) else {
        return;
    };
    // Offsets below are in `text`, which may start after a BOM.
    let bom = bytes.len() - text.len();
    let line_at = |offset: usize| line_of(bytes, bom + offset);
    let items = match json_items(text) {
        Ok(items) => items,
        Err((offset, reason)) => {
            let line = line_at(offset);
            let line_text = text[..offset.min(text.len())]
                .rsplit('\n')
                .next()
                .unwrap_or_default()
                .to_string()
                + text[offset.min(text.len())..]
                    .split('\n')
                    .next()
                    .unwrap_or_default();
            fail(ctx, out, Some(line), reason, Some(&line_text));
            return;
        }
    };
    let max = ctx.settings.max_record_bytes;
    for (index, (start, end, value)) in items.into_iter().enumerate() {
        let line = line_at(start);
        let raw = &text[start..end];
        if end - start > max {
            fail(ctx, out, Some(line), too_large(end - start, max), Some(raw));
            continue;
        }
        match record_from_json(&value, &ctx.settings) {
            Ok(record) => {
                let ep = episode(ctx, record, index.to_string(), index);
                out.episodes.push(ep);
            }
            Err(reason) => fail(ctx, out, Some(line), reason, Some(raw)),
        }
    }
}

fn parse_text(ctx: &FileCtx, bytes: &[u8], out: &mut FileOut) {
    let Some(text) = whole_text(ctx, bytes, out) else {
        return;
    };
    let max = ctx.settings.max_record_bytes;
    let chunks = chunk_text(text, ctx.settings.chunk_tokens, ctx.settings.overlap_tokens);
    for (k, chunk) in chunks.into_iter().enumerate() {
        if chunk.len() > max {
            let start = chunk.as_ptr() as usize - text.as_ptr() as usize;
            let line = line_of(bytes, bytes.len() - text.len() + start);
            fail(
                ctx,
                out,
                Some(line),
                format!(
                    "chunk {k} is {} bytes, larger than source.max_record_bytes ({max}) (a single word longer than a chunk is never split)",
                    chunk.len()
                ),
                Some(chunk),
            );
            continue;
        }
        let record = Record {
            content: chunk.to_string(),
            kind: EpisodeKind::Text,
            reference_time: None,
            id: None,
            document_id: Some(ctx.uri.clone()),
            group_id: None,
            source_description: None,
        };
        let ep = episode(ctx, record, format!("chunk{k}"), k);
        out.episodes.push(ep);
    }
}

/// A word of a text: its byte and character span and how strong the break
/// before it is (0 space, 1 sentence or line, 2 paragraph).
#[derive(Debug, Clone, Copy)]
struct Word {
    byte_start: usize,
    byte_end: usize,
    char_start: usize,
    char_end: usize,
    break_before: u8,
}

fn words_of(text: &str) -> Vec<Word> {
    let mut words: Vec<Word> = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    let mut newlines = 0usize;
    let mut chars = 0usize;
    let finish = |words: &mut Vec<Word>, start: (usize, usize), end: (usize, usize), nl: usize| {
        let break_before = if words.is_empty() || nl >= 2 {
            2
        } else if nl == 1
            || ends_sentence(
                &text[words[words.len() - 1].byte_start..words[words.len() - 1].byte_end],
            )
        {
            1
        } else {
            0
        };
        words.push(Word {
            byte_start: start.0,
            byte_end: end.0,
            char_start: start.1,
            char_end: end.1,
            break_before,
        });
    };
    for (b, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(start) = current.take() {
                finish(&mut words, start, (b, chars), newlines);
                newlines = 0;
            }
            if c == '\n' {
                newlines += 1;
            }
        } else if current.is_none() {
            current = Some((b, chars));
        }
        chars += 1;
    }
    if let Some(start) = current {
        finish(&mut words, start, (text.len(), chars), newlines);
    }
    words
}

fn ends_sentence(word: &str) -> bool {
    let trimmed = word.trim_end_matches(['"', '\'', ')', ']', '\u{201d}', '\u{2019}', '*', '_']);
    trimmed.ends_with(['.', '!', '?', '\u{2026}', ':', ';'])
}

/// Splits `text` into chunks of at most about `chunk_tokens` tokens (4
/// characters each), with about `overlap_tokens` tokens of the end of each
/// chunk repeated at the start of the next.
///
/// A chunk ends at a paragraph break if one leaves it at least half full,
/// else at a sentence (or line) break, else between words; words are never
/// split, so a single word longer than a chunk is a chunk of its own. Chunks
/// are slices of `text` (inner whitespace kept, outer whitespace dropped).
pub fn chunk_text(text: &str, chunk_tokens: usize, overlap_tokens: usize) -> Vec<&str> {
    let limit = chunk_tokens.max(1) * CHARS_PER_TOKEN;
    let overlap = (overlap_tokens * CHARS_PER_TOKEN).min(limit.saturating_sub(1));
    let words = words_of(text);
    let n = words.len();
    let span = |from: usize, to: usize| words[to].char_end - words[from].char_start;
    let mut chunks = Vec::new();
    let mut i = 0usize;
    // Index of the first word not in any chunk yet.
    let mut fresh = 0usize;
    while i < n {
        let mut j = i + 1;
        while j < n && span(i, j) <= limit {
            j += 1;
        }
        // words[i..j] fit; choose the end k (exclusive) among them.
        let k = if j == n {
            n
        } else {
            let lowest = (i + 1).max(fresh + 1);
            let min_len = limit / 2;
            let best = |level: u8| {
                (lowest..=j)
                    .rev()
                    .find(|&k| words[k].break_before >= level && span(i, k - 1) >= min_len)
            };
            best(2).or_else(|| best(1)).unwrap_or(j.max(lowest))
        };
        chunks.push(&text[words[i].byte_start..words[k - 1].byte_end]);
        if k == n {
            break;
        }
        fresh = k;
        // Start the next chunk with the last words that fit in the overlap,
        // fewer if the next word would not fit after them.
        let mut s = k;
        while s > i + 1 && span(s - 1, k - 1) <= overlap {
            s -= 1;
        }
        while s < k && span(s, k) > limit {
            s += 1;
        }
        i = s;
    }
    chunks
}

fn is_string_type(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, v) => is_string_type(v),
        _ => false,
    }
}

fn is_integer_type(dt: &DataType) -> bool {
    dt.is_integer() || matches!(dt, DataType::Dictionary(_, v) if v.is_integer())
}

fn is_time_type(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Timestamp(_, _) | DataType::Date32 | DataType::Date64
    ) || is_string_type(dt)
}

/// A column of a batch read as what a field needs.
enum Column {
    Absent,
    Strings(StringArray),
    Times(Vec<Option<DateTime<Utc>>>),
}

impl Column {
    fn string(&self, row: usize) -> Option<&str> {
        match self {
            Column::Strings(a) if a.is_valid(row) => Some(a.value(row)),
            _ => None,
        }
    }
}

fn as_strings(array: &ArrayRef) -> Result<StringArray, String> {
    let cast = arrow::compute::cast(array, &DataType::Utf8).map_err(|e| e.to_string())?;
    Ok(cast.as_string::<i32>().clone())
}

fn as_times(array: &ArrayRef) -> Result<Column, String> {
    fn collect<T: arrow::datatypes::ArrowPrimitiveType<Native = i64>>(
        array: &ArrayRef,
        to: impl Fn(i64) -> Option<DateTime<Utc>>,
    ) -> Vec<Option<DateTime<Utc>>> {
        array
            .as_primitive::<T>()
            .iter()
            .map(|v| v.and_then(&to))
            .collect()
    }
    let times = match array.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => {
            collect::<TimestampSecondType>(array, |v| DateTime::from_timestamp(v, 0))
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            collect::<TimestampMillisecondType>(array, DateTime::from_timestamp_millis)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            collect::<TimestampMicrosecondType>(array, DateTime::from_timestamp_micros)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            collect::<TimestampNanosecondType>(array, |v| Some(DateTime::from_timestamp_nanos(v)))
        }
        DataType::Date32 => array
            .as_primitive::<Date32Type>()
            .iter()
            .map(|v| v.and_then(|d| DateTime::from_timestamp(i64::from(d) * 86_400, 0)))
            .collect(),
        DataType::Date64 => collect::<Date64Type>(array, DateTime::from_timestamp_millis),
        _ => return as_strings(array).map(Column::Strings),
    };
    Ok(Column::Times(times))
}

fn parse_parquet<R: parquet::file::reader::ChunkReader + 'static>(
    ctx: &FileCtx,
    bytes: R,
    out: &mut FileOut,
) {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    if bytes.len() == 0 {
        fail(ctx, out, None, "file is empty".into(), None);
        return;
    }
    let builder = match ParquetRecordBatchReaderBuilder::try_new(bytes) {
        Ok(b) => b,
        Err(e) => {
            fail(
                ctx,
                out,
                None,
                format!("not a readable parquet file: {e}"),
                None,
            );
            return;
        }
    };
    let schema = builder.schema().clone();
    let columns = &ctx.settings.columns;
    // A table of records (a CRM or ERP export) has no content column: with
    // kind `json` each row is then the record, its columns written as one
    // JSON object (what `[[mapping]]` rules read).
    let whole_row = ctx.settings.default_kind == EpisodeKind::Json
        && !columns.contains_key("content")
        && schema.index_of("content").is_err();
    let mut mapped: Vec<(&str, String)> = Vec::new();
    let mut roots = Vec::new();
    for field in RECORD_FIELDS {
        let explicit = columns.get(*field);
        let name = explicit.map_or(*field, String::as_str);
        let Ok(idx) = schema.index_of(name) else {
            if explicit.is_some() || (*field == "content" && !whole_row) {
                let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                let how = if explicit.is_some() {
                    format!("source.columns.{field} names column `{name}`")
                } else {
                    format!("{field} is read from column `{name}`")
                };
                fail(
                    ctx,
                    out,
                    None,
                    format!(
                        "{how}, which the file does not have (columns: {}); map it in source.columns",
                        known.join(", ")
                    ),
                    None,
                );
                return;
            }
            continue;
        };
        let dt = schema.field(idx).data_type();
        let ok = match *field {
            "reference_time" => is_time_type(dt),
            "id" => is_string_type(dt) || is_integer_type(dt),
            _ => is_string_type(dt),
        };
        if !ok {
            let wanted = match *field {
                "reference_time" => "a timestamp, date or RFC 3339 string column",
                "id" => "a string or integer column",
                _ => "a string column",
            };
            fail(
                ctx,
                out,
                None,
                format!("column `{name}` ({field}) has type {dt}; {field} needs {wanted}"),
                None,
            );
            return;
        }
        mapped.push((field, name.to_string()));
        roots.push(idx);
    }
    let mask = if whole_row {
        ProjectionMask::all()
    } else {
        ProjectionMask::roots(builder.parquet_schema(), roots)
    };
    let reader = match builder.with_projection(mask).with_batch_size(1024).build() {
        Ok(r) => r,
        Err(e) => {
            fail(
                ctx,
                out,
                None,
                format!("not a readable parquet file: {e}"),
                None,
            );
            return;
        }
    };
    let mut row_base = 0usize;
    for batch in reader {
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                fail(
                    ctx,
                    out,
                    None,
                    format!("parquet file is corrupt after row {row_base}: {e}"),
                    None,
                );
                return;
            }
        };
        if let Err(reason) = parquet_batch(ctx, &batch, &mapped, whole_row, row_base, out) {
            fail(ctx, out, None, reason, None);
            return;
        }
        row_base += batch.num_rows();
    }
}

/// Each row of `batch` as one JSON object (null columns left out).
fn rows_as_json(batch: &RecordBatch) -> Result<Vec<String>, String> {
    let mut buf = Vec::new();
    let mut writer = arrow::json::LineDelimitedWriter::new(&mut buf);
    writer
        .write(batch)
        .and_then(|()| writer.finish())
        .map_err(|e| format!("rows cannot be read as JSON records: {e}"))?;
    let text =
        String::from_utf8(buf).map_err(|e| format!("rows cannot be read as JSON records: {e}"))?;
    let rows: Vec<String> = text.lines().map(str::to_string).collect();
    if rows.len() != batch.num_rows() {
        return Err(format!(
            "rows cannot be read as JSON records: {} rows gave {} objects",
            batch.num_rows(),
            rows.len()
        ));
    }
    Ok(rows)
}

/// [`parse_parquet`], with a panic of the Parquet reader turned into a
/// failure of the file. The parquet crate panics on some damaged files: one
/// flipped bit in a footer gives "not implemented: Type NONE not supported"
/// (the embedded Arrow schema) or an `Option::unwrap()` on `None` (18 of
/// the 2760 one-bit flips of a one-row file's footer). That is bad input in
/// one file, like any other unreadable Parquet file, and must not fail the
/// whole source. Rows read before the panic are kept.
fn parse_parquet_guarded(ctx: &FileCtx, bytes: bytes::Bytes, out: &mut FileOut) {
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        parse_parquet(ctx, bytes, out)
    }));
    if let Err(panic) = read {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        fail(
            ctx,
            out,
            None,
            format!("not a readable parquet file: the Parquet reader failed on it ({message})"),
            None,
        );
    }
}

fn parquet_batch(
    ctx: &FileCtx,
    batch: &RecordBatch,
    mapped: &[(&str, String)],
    whole_row: bool,
    row_base: usize,
    out: &mut FileOut,
) -> Result<(), String> {
    let mut rows_json = if whole_row {
        Some(rows_as_json(batch)?)
    } else {
        None
    };
    let mut cols: BTreeMap<&str, Column> = BTreeMap::new();
    for (field, name) in mapped {
        let Some(array) = batch.column_by_name(name) else {
            continue;
        };
        let col = if *field == "reference_time" {
            as_times(array)?
        } else {
            Column::Strings(as_strings(array)?)
        };
        cols.insert(field, col);
    }
    let get = |field: &str| cols.get(field).unwrap_or(&Column::Absent);
    let max = ctx.settings.max_record_bytes;
    for r in 0..batch.num_rows() {
        let row = row_base + r;
        let text = |field: &str| {
            get(field)
                .string(r)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
        };
        let row_json = rows_json.as_mut().map(|rows| std::mem::take(&mut rows[r]));
        let size: usize = RECORD_FIELDS
            .iter()
            .filter_map(|f| get(f).string(r))
            .map(str::len)
            .sum::<usize>()
            + row_json.as_ref().map_or(0, String::len);
        let checked = (|| {
            if size > max {
                return Err(too_large(size, max));
            }
            let kind = match get("kind").string(r).filter(|s| !s.trim().is_empty()) {
                Some(k) => parse_kind(k)?,
                None => ctx.settings.default_kind,
            };
            let content = check_content(
                row_json
                    .clone()
                    .or_else(|| get("content").string(r).map(str::to_string)),
            )?;
            let reference_time = match get("reference_time") {
                Column::Times(t) => t[r],
                Column::Strings(_) => match text("reference_time") {
                    Some(s) => Some(parse_reference_time(&s)?),
                    None => None,
                },
                Column::Absent => None,
            };
            Ok(Record {
                content,
                kind,
                reference_time,
                id: text("id"),
                document_id: text("document_id"),
                group_id: text("group_id"),
                source_description: text("source_description"),
            })
        })();
        match checked {
            Ok(record) => {
                let ep = episode(ctx, record, row.to_string(), row);
                out.episodes.push(ep);
            }
            Err(reason) => {
                let excerpt = row_json
                    .clone()
                    .or_else(|| get("content").string(r).map(str::to_string));
                out.failures.push(SourceFailure {
                    source_uri: ctx.uri.clone(),
                    item: format!("{}#{row}", ctx.name),
                    line: None,
                    reason,
                    excerpt: excerpt.as_deref().map(self::excerpt),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_error_positions_count_characters_not_bytes() {
        // `@` is the 13th character and the 18th byte: serde_json says
        // column 18, which counted as characters is past the line's end.
        let line = "{\"a\":\"\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\"@}";
        let e = serde_json::from_str::<Value>(line).unwrap_err();
        assert_eq!(e.column(), 18);
        assert_eq!(char_column(line, e.column()), 13);
        // The error stays on its own line of a file.
        let text = format!("[\n{line}\n]");
        let e = json_items(&text).unwrap_err();
        assert_eq!(line_of(text.as_bytes(), e.0), 2, "{e:?}");
        // Columns past the end or inside a character stay in the line.
        assert_eq!(column_offset("\u{e9}", 2), 0);
        assert_eq!(column_offset("ab", 99), 2);
    }
}
