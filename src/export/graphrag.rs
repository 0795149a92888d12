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

use datafusion::prelude::SessionContext;

use super::{Destination, ExportError, ExportReport, ExportedTable, Result, last_run};
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
    let destination = Destination::open(to, storage_options)?;
    let snapshot = store.existing_snapshot().await?;
    let ctx = SessionContext::new();
    snapshot.register(&ctx).await?;
    destination.register(&ctx);

    let plans = [
        ("entities", entities_sql(options)),
        ("relationships", relationships_sql(options)),
        ("text_units", text_units_sql(options)),
        ("documents", documents_sql()),
    ];
    let mut tables = BTreeMap::new();
    for (name, sql) in plans {
        let frame = ctx.sql(&sql).await.map_err(|source| ExportError::Table {
            table: name.to_string(),
            to: format!("{}{name}.parquet", destination.shown()),
            source,
        })?;
        let (file, rows) = destination.write(name, frame).await?;
        let version = match name {
            "entities" => snapshot.table(Table::Nodes),
            "relationships" => snapshot.table(Table::Edges),
            _ => snapshot.table(Table::Episodes),
        }
        .and_then(|t| t.version());
        tables.insert(
            name.to_string(),
            ExportedTable {
                file,
                version,
                rows,
            },
        );
    }
    let report = ExportReport {
        format: "graphrag",
        graph: store.display_url(),
        to: destination.shown().to_string(),
        run_id: last_run(&snapshot),
        tables,
    };
    destination.manifest(&report).await?;
    Ok(report)
}
