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
use datafusion::prelude::{DataFrame, SessionContext};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;
use url::Url;

use crate::objstore::{self, LocationError};
use crate::store::{GraphStore, Snapshot, StoreError, Table};

mod graphrag;

pub use graphrag::{GraphragOptions, export_graphrag};

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
        table: String,
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
    /// What was written: `delta-tables` (the graph's own tables) or
    /// `graphrag` (GraphRAG's output tables).
    pub format: &'static str,
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
    let mut export = Export::open(store, to, options).await?;
    for table in Table::ALL {
        let frame = export
            .ctx
            .table(table.name())
            .await
            .map_err(|source| export.error(table.name(), source))?;
        export.write(table.name(), frame, table).await?;
    }
    export.finish("delta-tables", store).await
}

/// One export under way: the destination directory (its URL, a client
/// for it and the URL as shown in messages, without credentials), the
/// pinned snapshot registered in a session whose writers reach the
/// destination, and the tables written so far.
pub(crate) struct Export {
    url: Url,
    store: Arc<dyn ObjectStore>,
    shown: String,
    snapshot: Snapshot,
    pub(crate) ctx: SessionContext,
    tables: BTreeMap<String, ExportedTable>,
}

impl Export {
    /// Parses `to` (a path or an object store URL) with its storage options
    /// and opens the graph's last completed run.
    pub(crate) async fn open(
        graph: &GraphStore,
        to: &str,
        options: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let url = objstore::parse_dir_url(to)?;
        let store = objstore::store_for(&url, options)?;
        let shown = objstore::redacted(&url);
        let snapshot = graph.existing_snapshot().await?;
        let ctx = SessionContext::new();
        snapshot.register(&ctx).await?;
        // The writers look stores up by URL: give them the client already
        // configured with the destination's options.
        ctx.register_object_store(&store_root(&url), store.clone());
        Ok(Export {
            url,
            store,
            shown,
            snapshot,
            ctx,
            tables: BTreeMap::new(),
        })
    }

    /// The snapshot being exported.
    pub(crate) fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub(crate) fn error(&self, table: &str, source: DataFusionError) -> ExportError {
        ExportError::Table {
            table: table.to_string(),
            to: format!("{}{table}.parquet", self.shown),
            source,
        }
    }

    /// Writes `frame` as `<name>.parquet` in one piece and records it with
    /// the Delta version of `read`, the graph table it comes from. The plan
    /// streams: memory stays bounded by a few record batches whatever the
    /// table's size.
    pub(crate) async fn write(&mut self, name: &str, frame: DataFrame, read: Table) -> Result<()> {
        let file = format!("{name}.parquet");
        let frame = plain_types(frame).map_err(|source| self.error(name, source))?;
        let target = self.url.join(&file).map_err(|e| LocationError::Invalid {
            location: self.shown.clone(),
            reason: e.to_string(),
        })?;
        let written = frame
            .write_parquet(
                target.as_str(),
                DataFrameWriteOptions::new().with_single_file_output(true),
                None,
            )
            .await
            .map_err(|source| self.error(name, source))?;
        let rows = written
            .first()
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::UInt64Array>()
            })
            .map_or(0, |a| a.value(0));
        let version = self.snapshot.table(read).and_then(|t| t.version());
        self.tables.insert(
            name.to_string(),
            ExportedTable {
                file,
                version,
                rows,
            },
        );
        Ok(())
    }

    /// Writes the manifest beside the files, last (a reader that finds it
    /// finds every file it names), and returns it.
    pub(crate) async fn finish(
        self,
        format: &'static str,
        graph: &GraphStore,
    ) -> Result<ExportReport> {
        let report = ExportReport {
            format,
            graph: graph.display_url(),
            to: self.shown.clone(),
            run_id: self
                .snapshot
                .head
                .last_completed
                .as_ref()
                .map(|r| r.run_id.clone()),
            tables: self.tables,
        };
        let manifest = objstore::path_of(&self.url).join(MANIFEST);
        let body = serde_json::to_vec_pretty(&report).unwrap_or_default();
        self.store
            .put(&manifest, PutPayload::from(body))
            .await
            .map_err(|source| ExportError::Manifest {
                to: format!("{}{MANIFEST}", self.shown),
                source,
            })?;
        Ok(report)
    }
}

/// Casts view types (`Utf8View`, which DataFusion's scans and aggregates
/// produce) back to the plain Arrow types the graph's tables declare: the
/// Parquet files carry their Arrow schema, and readers such as pandas
/// cannot convert a list of string views.
fn plain_types(frame: DataFrame) -> datafusion::error::Result<DataFrame> {
    use arrow::datatypes::{DataType, Field};
    fn plain(t: &DataType) -> DataType {
        match t {
            DataType::Utf8View => DataType::Utf8,
            DataType::BinaryView => DataType::Binary,
            DataType::List(f) | DataType::ListView(f) => DataType::List(Arc::new(Field::new(
                f.name(),
                plain(f.data_type()),
                f.is_nullable(),
            ))),
            other => other.clone(),
        }
    }
    let exprs: Vec<_> = frame
        .schema()
        .fields()
        .iter()
        .map(|f| {
            let column = datafusion::prelude::col(datafusion::common::Column::from_name(f.name()));
            let to = plain(f.data_type());
            if &to == f.data_type() {
                column
            } else {
                datafusion::prelude::cast(column, to).alias(f.name())
            }
        })
        .collect();
    frame.select(exprs)
}

/// `scheme://bucket/` of a URL: the key DataFusion looks object stores up by.
fn store_root(url: &Url) -> Url {
    let mut root = url.clone();
    root.set_path("/");
    root.set_query(None);
    root
}
