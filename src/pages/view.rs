//! `graphloom view`: the graph (or the part a query selects) as one HTML
//! page drawn with Cytoscape.js: nodes coloured by top-level type, edges
//! labelled with their type and dashed once they ended, a search box, a
//! label filter where a parent label matches its subtypes, and an as-of
//! slider over the edges' validity.
//!
//! Large graphs are capped: the page shows the `max_nodes` highest-ranked
//! nodes of the selection and the edges among them, and says so with the
//! SQL that chose them.

use std::path::Path;

use serde_json::{Value, json};

use super::{PageError, Result, fill, rows, script_js, script_json, write_page};
use crate::store::GraphStore;

/// The page template (assets/view/template.html).
pub(crate) const TEMPLATE: &str = include_str!("../../assets/view/template.html");
/// Cytoscape.js 3.35.0 from npm (MIT, assets/vendor/cytoscape/LICENSE).
const CYTOSCAPE: &str = include_str!("../../assets/vendor/cytoscape/cytoscape.min.js");
/// Cytoscape.js's license, carried into every page that bundles it.
const CYTOSCAPE_LICENSE: &str = include_str!("../../assets/vendor/cytoscape/LICENSE");

/// The default cap on drawn nodes: the page lays out 500 nodes in a few
/// seconds in a browser on 2 cores (docs/commands.md, `graphloom view`).
pub const DEFAULT_MAX_NODES: usize = 500;

/// What to draw.
#[derive(Debug, Clone)]
pub struct ViewOptions {
    /// SQL whose `node_id` column selects the nodes (default: all nodes).
    pub query: Option<String>,
    /// Initial position of the as-of slider (RFC 3339, a date or a year);
    /// `None`: all times, ended edges dashed.
    pub as_of: Option<String>,
    /// Most nodes drawn; the highest-ranked nodes of the selection win.
    pub max_nodes: usize,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            query: None,
            as_of: None,
            max_nodes: DEFAULT_MAX_NODES,
        }
    }
}

/// What a view page holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewSummary {
    /// Nodes the selection matched.
    pub matched_nodes: u64,
    /// Nodes on the page (at most `max_nodes`).
    pub nodes: usize,
    /// Edges on the page (every edge between two nodes on it).
    pub edges: usize,
}

/// The user's `--query` as one statement without its trailing `;`, or
/// `None` for all nodes.
fn user_query(options: &ViewOptions) -> Result<Option<&str>> {
    let Some(q) = options.query.as_deref() else {
        return Ok(None);
    };
    let q = q.trim().trim_end_matches(';').trim();
    if q.is_empty() {
        return Err(PageError::ViewQuery("is empty".into()));
    }
    if q.contains(';') {
        return Err(PageError::ViewQuery(
            "must be one statement (a SELECT with a node_id column)".into(),
        ));
    }
    Ok(Some(q))
}

/// The nodes selected, as a SQL subquery with one `node_id` column.
fn selection(query: Option<&str>) -> String {
    match query {
        None => "SELECT node_id FROM nodes".to_string(),
        Some(q) => format!("SELECT DISTINCT node_id FROM ({q}) AS selected"),
    }
}

/// The SQL of the nodes drawn: the selection's highest-ranked nodes.
fn capped_sql(selection: &str, max_nodes: usize) -> String {
    format!(
        "SELECT n.node_id FROM nodes n WHERE n.node_id IN ({selection}) \
         ORDER BY n.rank DESC, n.short_id LIMIT {max_nodes}"
    )
}

/// Builds the page's data document and counts.
pub async fn view_document(
    store: &GraphStore,
    options: &ViewOptions,
) -> Result<(Value, ViewSummary)> {
    let as_of = match options.as_of.as_deref() {
        None => None,
        Some(text) => crate::values::parse_time(Some(text)).map_err(|reason| PageError::AsOf {
            value: text.to_string(),
            reason,
        })?,
    };
    let session = super::open(store).await?;
    let query = user_query(options)?;
    let selection = selection(query);
    if let Some(q) = query {
        // A query without a node_id column fails here with a clear message
        // instead of inside the larger plans below.
        let probe = format!("SELECT * FROM ({q}) AS q LIMIT 0");
        let cols = session.run(&probe).await.map_err(|e| PageError::Query {
            step: "running --query",
            source: Box::new(e),
        })?;
        if cols
            .first()
            .is_some_and(|r| r.schema.field_with_name("node_id").is_err())
        {
            return Err(PageError::ViewQuery(
                "must return a `node_id` column (e.g. SELECT node_id FROM nodes WHERE has_label(labels, 'Contract'))".into(),
            ));
        }
    }
    let matched = rows(
        &session,
        "counting the selected nodes",
        &format!("SELECT count(*) AS n FROM ({selection}) AS s"),
    )
    .await?;
    let matched_nodes = matched
        .first()
        .and_then(|r| r.get("n"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let capped = capped_sql(&selection, options.max_nodes);
    let nodes = rows(
        &session,
        "reading the nodes to draw",
        &format!(
            "SELECT node_id AS id, name, type, labels, \
               CASE WHEN cardinality(labels) > 1 THEN labels[2] ELSE labels[1] END AS top, \
               summary, attributes \
             FROM nodes WHERE node_id IN ({capped}) ORDER BY rank DESC, short_id"
        ),
    )
    .await?;
    let edges = rows(
        &session,
        "reading the edges among them",
        &format!(
            "WITH shown AS ({capped}) \
             SELECT edge_id AS id, source_node_id AS source, target_node_id AS target, \
               relation_type AS type, fact, \
               to_char(valid_at, '%Y-%m-%dT%H:%M:%SZ') AS valid_at, \
               to_char(invalid_at, '%Y-%m-%dT%H:%M:%SZ') AS invalid_at, \
               to_char(expired_at, '%Y-%m-%dT%H:%M:%SZ') AS expired_at \
             FROM edges \
             WHERE source_node_id IN (SELECT node_id FROM shown) \
               AND target_node_id IN (SELECT node_id FROM shown) \
             ORDER BY created_at, edge_id"
        ),
    )
    .await?;
    let entity_types = rows(
        &session,
        "reading the entity types",
        "SELECT name, parent FROM entity_types ORDER BY depth, name",
    )
    .await?;
    let edge_types = rows(
        &session,
        "reading the edge types",
        "SELECT name, parent FROM edge_types ORDER BY depth, name",
    )
    .await?;

    // Labels start at the root `Entity`, which the entity_types table leaves
    // implicit: the page's type tree gets it back as the top types' parent.
    let mut entity_types: Vec<Value> = entity_types
        .into_iter()
        .map(|mut t| {
            if t.get("parent").is_none_or(Value::is_null) && t.get("name") != Some(&json!("Entity"))
            {
                t.insert("parent".into(), json!("Entity"));
            }
            Value::Object(t)
        })
        .collect();
    if !entity_types.iter().any(|t| t["name"] == "Entity") {
        entity_types.insert(0, json!({"name": "Entity", "parent": null}));
    }
    let nodes: Vec<Value> = nodes
        .into_iter()
        .map(|mut n| {
            // Attributes are a JSON object in a text column.
            let attributes = n
                .get("attributes")
                .and_then(Value::as_str)
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
                .unwrap_or_else(|| json!({}));
            n.insert("attributes".into(), attributes);
            Value::Object(n)
        })
        .collect();
    let summary = ViewSummary {
        matched_nodes,
        nodes: nodes.len(),
        edges: edges.len(),
    };
    // The run the session read, not a newer one committed meanwhile.
    let run = session
        .snapshot()
        .head
        .last_completed
        .as_ref()
        .map(|r| format!(" (run #{})", r.run_seq))
        .unwrap_or_default();
    let document = json!({
        "title": format!("graph {}{run}", store.display_url()),
        "generated_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "query": options.query,
        "as_of": as_of.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        "cap": {
            "max_nodes": options.max_nodes,
            "matched_nodes": matched_nodes,
            "shown_nodes": summary.nodes,
            "capped": (summary.nodes as u64) < matched_nodes,
            "sql": capped,
        },
        "entity_types": entity_types,
        "edge_types": edge_types,
        "nodes": nodes,
        "edges": edges,
    });
    Ok((document, summary))
}

/// The page's HTML for a data document.
pub fn render(document: &Value) -> String {
    // The license travels with the bundled library, as a comment before it.
    let lib = format!(
        "/*! Cytoscape.js 3.35.0 (npm), bundled with its license:\n{}*/\n{CYTOSCAPE}",
        CYTOSCAPE_LICENSE.replace("*/", "* /")
    );
    let html = fill(TEMPLATE, "/*GRAPHLOOM_LIB*/", &script_js(&lib));
    fill(&html, "/*GRAPHLOOM_DATA*/", &script_json(document))
}

/// Writes the view of `store` to `out`.
pub async fn write_view(
    store: &GraphStore,
    options: &ViewOptions,
    out: &Path,
) -> Result<ViewSummary> {
    let (document, summary) = view_document(store, options).await?;
    write_page(out, &render(&document))?;
    Ok(summary)
}
