//! Pages people look at: `graphloom view` (the graph drawn in a browser)
//! and `graphloom report` (what runs did, cost and lost).
//!
//! Each page is one self-contained HTML file: a template from `assets/`
//! compiled into the binary, with the data as a JSON document inside a
//! `<script type="application/json">` element (and, for the view, the
//! vendored Cytoscape.js). Opening it needs no server and no network.
//! The data comes from SQL over the graph's last completed run, so a page
//! shows exactly what `graphloom sql` sees.

use std::path::Path;

use datafusion::error::DataFusionError;
use serde_json::Value;

use crate::query::{GraphSession, OutputFormat, QueryError};
use crate::store::StoreError;

pub mod report;
pub mod view;

/// Errors of the page writers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// The graph could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A query of one step failed; `step` says which.
    #[error("{step}: {source}")]
    Query {
        step: &'static str,
        #[source]
        source: Box<QueryError>,
    },
    /// The user's `--query` is not usable for the view.
    #[error("the view's --query {0}")]
    ViewQuery(String),
    /// `--as-of` is not a time.
    #[error(
        "--as-of `{value}` is not a time: {reason} (use RFC 3339, e.g. 2025-03-01T00:00:00Z, or a date)"
    )]
    AsOf { value: String, reason: String },
    /// Scoring against the gold file failed.
    #[error(transparent)]
    Eval(#[from] Box<crate::eval::EvalError>),
    /// The page could not be written.
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for the page writers.
pub type Result<T, E = PageError> = std::result::Result<T, E>;

/// Opens a query session on the graph's last completed run.
pub(crate) async fn open(store: &crate::store::GraphStore) -> Result<GraphSession> {
    GraphSession::open(store)
        .await
        .map_err(|source| PageError::Query {
            step: "opening the graph",
            source: Box::new(source),
        })
}

/// Runs one read-only query and returns its rows as JSON objects, with every
/// column present (`null` where the value is), for the page's data.
pub(crate) async fn rows(
    session: &GraphSession,
    step: &'static str,
    sql: &str,
) -> Result<Vec<serde_json::Map<String, Value>>> {
    let wrap = |source: QueryError| PageError::Query {
        step,
        source: Box::new(source),
    };
    let results = session.run(sql).await.map_err(wrap)?;
    let Some(result) = results.first() else {
        return Ok(Vec::new());
    };
    let text = crate::query::render(result, OutputFormat::Json).map_err(wrap)?;
    let parsed: Vec<serde_json::Map<String, Value>> = serde_json::from_str(&text).map_err(|e| {
        wrap(QueryError::DataFusion(DataFusionError::External(Box::new(
            e,
        ))))
    })?;
    // Arrow's JSON writer leaves out null columns; the pages read `null`.
    let names: Vec<String> = result
        .schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    Ok(parsed
        .into_iter()
        .map(|mut row| {
            for name in &names {
                row.entry(name.clone()).or_insert(Value::Null);
            }
            row
        })
        .collect())
}

/// The document as the text of a `<script type="application/json">`
/// element: `<` is written as `\u003c`, so no `</script>` (or `<!--`) in
/// the data can end the element early.
pub(crate) fn script_json(document: &Value) -> String {
    document.to_string().replace('<', "\\u003c")
}

/// A JavaScript library as the text of a `<script>` element: the only
/// sequence that could end the element early is `</script`, escaped the
/// way JavaScript reads it unchanged.
pub(crate) fn script_js(code: &str) -> String {
    code.replace("</script", "<\\/script")
        .replace("</SCRIPT", "<\\/SCRIPT")
}

/// Replaces the one `placeholder` of `template` with `content`.
pub(crate) fn fill(template: &str, placeholder: &str, content: &str) -> String {
    debug_assert_eq!(template.matches(placeholder).count(), 1);
    template.replacen(placeholder, content, 1)
}

/// Writes a page in one piece (a temporary file renamed over the target),
/// so a reader never opens half of one.
pub(crate) fn write_page(path: &Path, html: &str) -> Result<()> {
    let err = |source| PageError::Write {
        path: path.display().to_string(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(err)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "page.html".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, html).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_cannot_end_its_element() {
        let doc = serde_json::json!({"fact": "a </script><script>alert(1)</script> <!-- b"});
        let text = script_json(&doc);
        assert!(!text.contains('<'), "{text}");
        let back: Value = serde_json::from_str(&text).expect("still JSON");
        assert_eq!(back, doc);
    }

    #[test]
    fn script_js_escapes_closing_tags_only() {
        assert_eq!(script_js("a</script>b<b>"), "a<\\/script>b<b>");
    }

    #[test]
    fn templates_hold_each_placeholder_once() {
        for (template, placeholders) in [
            (
                view::TEMPLATE,
                &["/*GRAPHLOOM_LIB*/", "/*GRAPHLOOM_DATA*/"][..],
            ),
            (report::TEMPLATE, &["/*GRAPHLOOM_DATA*/"][..]),
        ] {
            for p in placeholders {
                assert_eq!(template.matches(p).count(), 1, "{p}");
            }
        }
    }
}
