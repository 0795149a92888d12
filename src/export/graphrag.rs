//! `graphloom export graphrag`: the graph as GraphRAG's output tables.
//!
//! GraphRAG (the `graphrag` PyPI package, 3.x) reads its index from
//! Parquet files named after its tables, with fixed column names
//! (`graphrag/data_model/schemas.py`); its query side
//! (`graphrag.query.indexer_adapters`) builds entities, relationships, text
//! units, communities and reports from them. The export writes those
//! columns first, in GraphRAG's order and types, then graphloom's own
//! columns that have no GraphRAG place (GraphRAG's readers pick columns by
//! name and pass the rest through):
//!
//! | file | from | notes |
//! |---|---|---|
//! | `entities` | `nodes` | `title` is the name, made unique with ` #<short_id>` where two nodes share one (GraphRAG joins relationships to entities by title); `type` the most specific type; `description` the summary (empty without); `frequency` the episodes naming the node; `degree` its exported relationships. Extra: `labels`, `attributes`, `name_embedding`, `group_id`. |
//! | `relationships` | `edges` | `source`/`target` are entity titles; `description` the fact, with `(ended …)` or `(superseded …)` appended when it no longer holds; `weight` the episodes stating it. Extra: `relation_type`, `valid_at`, `invalid_at`, `expired_at`, `current`, `source_id`, `target_id`. |
//! | `text_units` | `episodes` | one unit per episode; `n_tokens` estimated as UTF-8 bytes / 4; `document_id` the episode's document. |
//! | `documents` | `episodes` | one per `document_id` (or source file when none): episodes in time order joined by blank lines. |
//! | `communities`, `community_reports` | `communities` | when the graph has communities (`graphloom communities`). |
//!
//! Every table is one SQL plan over the pinned snapshot written straight to
//! Parquet, so the export streams like `export parquet` does.

use std::collections::BTreeMap;

use super::{Export, ExportReport, Result};
use crate::store::{GraphStore, Table};

/// Choices of a GraphRAG export.
#[derive(Debug, Clone, Default)]
pub struct GraphragOptions {
    /// Leave out relationships that no longer hold (ended: `invalid_at` in
    /// the past; superseded: `expired_at` set). By default they are
    /// exported with `current = false` and a note in their description.
    pub current_only: bool,
}

/// The relationships exported: every edge, or those that still hold.
fn exported_edges(options: &GraphragOptions) -> String {
    let filter = if options.current_only {
        "WHERE expired_at IS NULL AND (invalid_at IS NULL OR invalid_at > now())"
    } else {
        ""
    };
    format!("SELECT * FROM edges {filter}")
}

/// Shared definitions: the exported edges, node degrees over them and a
/// unique title per node.
fn with_clause(options: &GraphragOptions) -> String {
    format!(
        "WITH x_edges AS ({edges}),
         x_degree AS (
           SELECT node_id, CAST(count(*) AS BIGINT) AS degree FROM (
             SELECT source_node_id AS node_id FROM x_edges
             UNION ALL SELECT target_node_id AS node_id FROM x_edges) d
           GROUP BY node_id),
         x_title AS (
           SELECT node_id, short_id,
             CASE WHEN count(*) OVER (PARTITION BY name) > 1
                  THEN name || ' #' || CAST(short_id AS VARCHAR) ELSE name END AS title
           FROM nodes)",
        edges = exported_edges(options)
    )
}

fn entities_sql(options: &GraphragOptions) -> String {
    format!(
        "{with}
         SELECT n.node_id AS id,
                n.short_id AS human_readable_id,
                t.title AS title,
                n.type AS type,
                coalesce(n.summary, '') AS description,
                n.episode_ids AS text_unit_ids,
                CAST(cardinality(n.episode_ids) AS BIGINT) AS frequency,
                coalesce(d.degree, CAST(0 AS BIGINT)) AS degree,
                n.labels AS labels,
                n.attributes AS attributes,
                n.name_embedding AS name_embedding,
                n.group_id AS group_id
         FROM nodes n
         JOIN x_title t ON t.node_id = n.node_id
         LEFT JOIN x_degree d ON d.node_id = n.node_id
         ORDER BY n.short_id",
        with = with_clause(options)
    )
}

fn relationships_sql(options: &GraphragOptions) -> String {
    format!(
        "{with}
         SELECT e.edge_id AS id,
                CAST(row_number() OVER (ORDER BY e.created_at, e.edge_id) - 1 AS BIGINT)
                  AS human_readable_id,
                s.title AS source,
                t.title AS target,
                CASE
                  WHEN e.expired_at IS NOT NULL
                    THEN e.fact || ' (superseded ' || to_char(e.expired_at, '%Y-%m-%d') || ')'
                  WHEN e.invalid_at IS NOT NULL AND e.invalid_at <= now()
                    THEN e.fact || ' (ended ' || to_char(e.invalid_at, '%Y-%m-%d') || ')'
                  ELSE e.fact
                END AS description,
                CAST(greatest(cardinality(e.episode_ids), 1) AS DOUBLE) AS weight,
                coalesce(ds.degree, CAST(0 AS BIGINT)) + coalesce(dt.degree, CAST(0 AS BIGINT))
                  AS combined_degree,
                e.episode_ids AS text_unit_ids,
                e.relation_type AS relation_type,
                e.valid_at AS valid_at,
                e.invalid_at AS invalid_at,
                e.expired_at AS expired_at,
                e.expired_at IS NULL AND (e.invalid_at IS NULL OR e.invalid_at > now()) AS current,
                e.source_node_id AS source_id,
                e.target_node_id AS target_id
         FROM x_edges e
         JOIN x_title s ON s.node_id = e.source_node_id
         JOIN x_title t ON t.node_id = e.target_node_id
         LEFT JOIN x_degree ds ON ds.node_id = e.source_node_id
         LEFT JOIN x_degree dt ON dt.node_id = e.target_node_id
         ORDER BY human_readable_id",
        with = with_clause(options)
    )
}

/// An episode's document: its `document_id`, else the file it came from.
const DOCUMENT_KEY: &str = "coalesce(document_id, source_uri)";

fn text_units_sql(options: &GraphragOptions) -> String {
    format!(
        "WITH x_edges AS ({edges}),
         x_node_eps AS (
           SELECT ep, array_agg(node_id ORDER BY node_id) AS ids
           FROM (SELECT unnest(episode_ids) AS ep, node_id FROM nodes) u GROUP BY ep),
         x_edge_eps AS (
           SELECT ep, array_agg(edge_id ORDER BY edge_id) AS ids
           FROM (SELECT unnest(episode_ids) AS ep, edge_id FROM x_edges) u GROUP BY ep)
         SELECT p.episode_id AS id,
                CAST(row_number() OVER (ORDER BY p.reference_time, p.episode_id) - 1 AS BIGINT)
                  AS human_readable_id,
                p.content AS text,
                CAST((octet_length(p.content) + 3) / 4 AS BIGINT) AS n_tokens,
                {DOCUMENT_KEY} AS document_id,
                coalesce(n.ids, arrow_cast(make_array(), 'List(Utf8)')) AS entity_ids,
                coalesce(r.ids, arrow_cast(make_array(), 'List(Utf8)')) AS relationship_ids,
                arrow_cast(make_array(), 'List(Utf8)') AS covariate_ids,
                p.kind AS kind,
                p.reference_time AS reference_time,
                p.source_uri AS source_uri,
                p.group_id AS group_id
         FROM episodes p
         LEFT JOIN x_node_eps n ON n.ep = p.episode_id
         LEFT JOIN x_edge_eps r ON r.ep = p.episode_id
         ORDER BY human_readable_id",
        edges = exported_edges(options)
    )
}

fn documents_sql() -> String {
    format!(
        "SELECT doc AS id,
                CAST(row_number() OVER (ORDER BY min(reference_time), doc) - 1 AS BIGINT)
                  AS human_readable_id,
                doc AS title,
                string_agg(content, '\n\n' ORDER BY reference_time, episode_id) AS text,
                array_agg(episode_id ORDER BY reference_time, episode_id) AS text_unit_ids,
                to_char(min(reference_time), '%Y-%m-%dT%H:%M:%SZ') AS creation_date,
                CAST(NULL AS VARCHAR) AS raw_data,
                min(source_uri) AS source_uri
         FROM (SELECT {DOCUMENT_KEY} AS doc, * FROM episodes) p
         GROUP BY doc
         ORDER BY human_readable_id"
    )
}

/// Shared definitions of the community tables: members, their current
/// facts, episodes and degree.
fn community_with() -> String {
    format!(
        "WITH x_cur AS (SELECT * FROM edges WHERE {current}),
         x_m AS (SELECT community_id, node_id FROM community_members),
         x_deg AS (
           SELECT node_id, count(*) AS degree FROM (
             SELECT source_node_id AS node_id FROM x_cur
             UNION ALL SELECT target_node_id AS node_id FROM x_cur) d GROUP BY node_id),
         x_c_edges AS (
           SELECT m1.community_id, e.edge_id, e.fact, e.relation_type, e.created_at,
                  cardinality(e.episode_ids) AS mentions
           FROM x_cur e
           JOIN x_m m1 ON m1.node_id = e.source_node_id
           JOIN x_m m2 ON m2.node_id = e.target_node_id AND m2.community_id = m1.community_id),
         x_c_rel AS (
           SELECT community_id, array_agg(edge_id ORDER BY edge_id) AS ids FROM x_c_edges
           GROUP BY community_id),
         x_c_nodes AS (
           SELECT m.community_id, array_agg(m.node_id ORDER BY m.node_id) AS ids,
                  array_to_string(array_slice(
                    array_agg(n.name ORDER BY coalesce(d.degree, 0) DESC, n.name), 1, 3), ', ') AS central
           FROM x_m m JOIN nodes n ON n.node_id = m.node_id
           LEFT JOIN x_deg d ON d.node_id = m.node_id
           GROUP BY m.community_id),
         x_c_units AS (
           SELECT community_id, array_sort(array_agg(DISTINCT ep)) AS ids FROM (
             SELECT m.community_id, unnest(n.episode_ids) AS ep
             FROM x_m m JOIN nodes n ON n.node_id = m.node_id) u
           GROUP BY community_id),
         x_c_types AS (
           SELECT community_id, string_agg(type || ' ' || CAST(k AS VARCHAR), ', ' ORDER BY k DESC, type) AS types
           FROM (SELECT m.community_id, n.type, count(*) AS k
                 FROM x_m m JOIN nodes n ON n.node_id = m.node_id GROUP BY m.community_id, n.type) t
           GROUP BY community_id),
         x_c_facts AS (
           SELECT community_id,
                  array_slice(array_agg(named_struct('summary', fact, 'explanation',
                    relation_type || ', stated in ' || CAST(mentions AS VARCHAR) || ' episode(s)')
                    ORDER BY mentions DESC, created_at, edge_id), 1, {findings}) AS findings,
                  array_to_string(array_slice(array_agg('- ' || fact
                    ORDER BY mentions DESC, created_at, edge_id), 1, {listed}), chr(10)) AS fact_lines
           FROM x_c_edges GROUP BY community_id),
         x_c AS (
           SELECT c.*, to_char(r.finished_at, '%Y-%m-%d') AS period
           FROM communities c LEFT JOIN runs r ON r.run_id = c.run_id)",
        current = crate::communities::CURRENT_EDGES,
        findings = REPORT_FINDINGS,
        listed = REPORT_FACTS,
    )
}

/// Facts listed as findings of a community report.
const REPORT_FINDINGS: usize = 8;
/// Facts listed in a report's full content (a level-0 community of a big
/// graph holds millions).
const REPORT_FACTS: usize = 25;

const EMPTY_IDS: &str = "arrow_cast(make_array(), 'List(Utf8)')";

/// The columns GraphRAG's communities and community_reports share, after
/// `id`, and the two they end with.
const COMMUNITY_KEYS: &str = "c.community_id AS human_readable_id, c.community_id AS community, \
     c.level AS level, coalesce(c.parent, CAST(-1 AS BIGINT)) AS parent, c.children AS children";
const COMMUNITY_TAIL: &str = "coalesce(c.period, '') AS period, c.size AS size";

fn communities_sql() -> String {
    format!(
        "{with}
         SELECT 'community-' || CAST(c.community_id AS VARCHAR) AS id,
                {COMMUNITY_KEYS},
                c.title AS title,
                coalesce(n.ids, {EMPTY_IDS}) AS entity_ids,
                coalesce(r.ids, {EMPTY_IDS}) AS relationship_ids,
                coalesce(u.ids, {EMPTY_IDS}) AS text_unit_ids,
                {COMMUNITY_TAIL}
         FROM x_c c
         LEFT JOIN x_c_nodes n ON n.community_id = c.community_id
         LEFT JOIN x_c_rel r ON r.community_id = c.community_id
         LEFT JOIN x_c_units u ON u.community_id = c.community_id
         ORDER BY c.community_id",
        with = community_with()
    )
}

/// A JSON string literal of a SQL text expression (backslashes, quotes,
/// newlines and tabs escaped; SQL string literals take `\` as is).
fn json_text(expr: &str) -> String {
    format!(
        r#"'"' || replace(replace(replace(replace({expr}, '\', '\\'), '"', '\"'), chr(10), '\n'), chr(9), ' ') || '"'"#
    )
}

fn community_reports_sql() -> String {
    let title = "coalesce(n.central, c.title)";
    let summary = "CAST(c.size AS VARCHAR) || ' entities (' || coalesce(t.types, '') || ') with ' \
                   || CAST(c.edges AS VARCHAR) || ' current facts among them; most connected: ' \
                   || coalesce(n.central, '') || '.'";
    format!(
        "{with}
         SELECT 'report-' || CAST(c.community_id AS VARCHAR) AS id,
                {COMMUNITY_KEYS},
                {title} AS title,
                {summary} AS summary,
                '# ' || {title} || chr(10) || chr(10) || {summary}
                  || coalesce(chr(10) || chr(10) || f.fact_lines, '') AS full_content,
                CAST(c.edges AS DOUBLE) AS rank,
                'extractive report written by graphloom without an LLM; rank = current facts inside the community'
                  AS rating_explanation,
                f.findings AS findings,
                '{{\"title\": ' || {title_json} || ', \"summary\": ' || {summary_json}
                  || ', \"rating\": ' || CAST(c.edges AS VARCHAR) || '}}' AS full_content_json,
                {COMMUNITY_TAIL}
         FROM x_c c
         LEFT JOIN x_c_nodes n ON n.community_id = c.community_id
         LEFT JOIN x_c_types t ON t.community_id = c.community_id
         LEFT JOIN x_c_facts f ON f.community_id = c.community_id
         ORDER BY c.community_id",
        with = community_with(),
        title_json = json_text(title),
        summary_json = json_text(&format!("({summary})")),
    )
}

/// Writes the graph's last completed run as GraphRAG output tables
/// (`entities.parquet`, `relationships.parquet`, `text_units.parquet`,
/// `documents.parquet`) under `to`, and the manifest. `options` are the
/// destination's storage options.
pub async fn export_graphrag(
    store: &GraphStore,
    to: &str,
    storage_options: &BTreeMap<String, String>,
    options: &GraphragOptions,
) -> Result<ExportReport> {
    let mut export = Export::open(store, to, storage_options).await?;
    // Each file with the graph table whose version the manifest records.
    let mut plans = vec![
        ("entities", Table::Nodes, entities_sql(options)),
        ("relationships", Table::Edges, relationships_sql(options)),
        ("text_units", Table::Episodes, text_units_sql(options)),
        ("documents", Table::Episodes, documents_sql()),
    ];
    let has_communities = export
        .snapshot()
        .table(Table::Communities)
        .and_then(|t| t.snapshot().ok())
        .is_some_and(|s| s.log_data().num_files() > 0);
    if has_communities {
        plans.push(("communities", Table::Communities, communities_sql()));
        plans.push((
            "community_reports",
            Table::Communities,
            community_reports_sql(),
        ));
    }
    for (name, read, sql) in plans {
        let frame = export
            .ctx
            .sql(&sql)
            .await
            .map_err(|source| export.error(name, source))?;
        export.write(name, frame, read).await?;
    }
    export.finish("graphrag", store).await
}
