//! Exports of the graph for readers outside Delta Lake.
//!
//! `graphloom export parquet` writes the pinned snapshot (every table at
//! the version the last completed run recorded) as one plain Parquet file
//! per table. Readers that list a Delta table's directory instead of
//! reading its log see the files of rolled-back commits too (after a crash
//! and `graphloom recover` a table directory can hold more rows than the
//! graph has); the export holds exactly the graph.
//!
//! The copy is a DataFusion plan per table (`SELECT *` over the pinned
//! Delta provider, written with `write_parquet`), so it streams: memory
//! stays bounded by a few record batches whatever the table's size.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;
use url::Url;

use crate::objstore::{self, LocationError};
use crate::store::{GraphStore, StoreError, Table};

/// Errors of an export.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The destination URL or its options are unusable.
    #[error(transparent)]
    Location(#[from] LocationError),
    /// The graph could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Copying one table failed.
    #[error("exporting table `{table}` to {to}: {source}")]
    Table {
        table: &'static str,
        to: String,
        #[source]
        source: DataFusionError,
    },
    /// Writing the manifest failed.
    #[error("writing the export manifest {to}: {source}")]
    Manifest {
        to: String,
        #[source]
        source: object_store::Error,
    },
}

/// Result alias for exports.
pub type Result<T, E = ExportError> = std::result::Result<T, E>;

/// Name of the manifest written beside the table files.
pub const MANIFEST: &str = "_graphloom_export.json";

/// What an export wrote; also the content of its manifest.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    /// The graph exported (without credentials).
    pub graph: String,
    /// The destination directory (without credentials).
    pub to: String,
    /// The run whose snapshot was exported (`None` for a graph with no
    /// completed run: every table is exported empty).
    pub run_id: Option<String>,
    /// Per table: the Delta version read and the rows written.
    pub tables: BTreeMap<String, ExportedTable>,
}

/// One exported table.
#[derive(Debug, Clone, Serialize)]
pub struct ExportedTable {
    /// File written, relative to the destination.
    pub file: String,
    /// Delta version it was read at (`None`: never written, exported empty).
    pub version: Option<u64>,
    /// Rows written.
    pub rows: u64,
}

/// Writes every table of the graph's last completed run to
/// `<to>/<table>.parquet` and a manifest (`_graphloom_export.json`) naming
/// the run and versions. Existing files of the same names are replaced;
/// each file is written in one piece, so a reader never sees half of one.
/// `options` are storage options for the destination (the environment's
/// settings apply under them).
pub async fn export_parquet(
    store: &GraphStore,
    to: &str,
    options: &BTreeMap<String, String>,
) -> Result<ExportReport> {
    let to_url = objstore::parse_dir_url(to)?;
    let destination: Arc<dyn ObjectStore> = objstore::store_for(&to_url, options)?;
    let snapshot = store.existing_snapshot().await?;
    let ctx = SessionContext::new();
    snapshot.register(&ctx).await?;
    // The writer resolves `to` through the session's registry; give it the
    // client already configured with the destination's options.
    ctx.register_object_store(&store_root(&to_url), destination.clone());

    let shown = objstore::redacted(&to_url);
    let mut tables = BTreeMap::new();
    for table in Table::ALL {
        let file = format!("{}.parquet", table.name());
        let target = to_url.join(&file).map_err(|e| LocationError::Invalid {
            location: shown.clone(),
            reason: e.to_string(),
        })?;
        let step = |source| ExportError::Table {
            table: table.name(),
            to: objstore::redacted(&target),
            source,
        };
        let frame = ctx.table(table.name()).await.map_err(step)?;
        let written = frame
            .write_parquet(
                target.as_str(),
                DataFrameWriteOptions::new().with_single_file_output(true),
                None,
            )
            .await
            .map_err(step)?;
        let rows = written
            .first()
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::UInt64Array>()
            })
            .map_or(0, |a| a.value(0));
        let version = snapshot.table(table).and_then(|t| t.version());
        tables.insert(
            table.name().to_string(),
            ExportedTable {
                file,
                version,
                rows,
            },
        );
    }
    let report = ExportReport {
        graph: store.display_url(),
        to: shown,
        run_id: snapshot
            .head
            .last_completed
            .as_ref()
            .map(|r| r.run_id.clone()),
        tables,
    };
    let manifest = objstore::path_of(&to_url).join(MANIFEST);
    let body = serde_json::to_vec_pretty(&report).unwrap_or_default();
    destination
        .put(&manifest, PutPayload::from(body))
        .await
        .map_err(|source| ExportError::Manifest {
            to: format!("{}{MANIFEST}", report.to),
            source,
        })?;
    Ok(report)
}

/// `scheme://bucket/` of a URL: the key DataFusion looks object stores up by.
fn store_root(url: &Url) -> Url {
    let mut root = url.clone();
    root.set_path("/");
    root.set_query(None);
    root
}
