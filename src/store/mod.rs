//! The graph store: one Delta Lake table per graph table under the graph's
//! root URL, and the commit protocol that makes a run's writes visible
//! together.
//!
//! # Commit protocol
//!
//! A run is visible once its row in `runs` (status `completed`) is
//! committed; that row records, in `table_versions`, the Delta version it
//! left every other table at. Readers ([`GraphStore::snapshot`]) open each
//! table at exactly that version, so a run's data commits, made one table at
//! a time, appear at once, and the commits of a run that died half way are
//! never read.
//!
//! A writer ([`GraphStore::begin`]):
//! 1. takes the advisory lock (`_graphloom/writer.lock`, create-if-absent);
//! 2. rolls back every table whose latest version is past the version the
//!    last completed run recorded (commits of a crashed run) with a Delta
//!    RESTORE, so external engines reading the latest version see the last
//!    completed run too;
//! 3. commits each data table, then the `runs` row. Every commit is made
//!    with no retry on the version it read: if anything else committed to
//!    that table in between, the commit fails and the run stops with
//!    [`StoreError::Concurrent`], leaving the graph at the last completed run.

mod changes;
mod lock;
pub mod rows;
mod tables;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Once};
use std::time::Duration;

use arrow::array::RecordBatch;
use chrono::Utc;
use datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use url::Url;

pub use changes::{Changes, identity_key_columns, max_short_id, name_key_columns, unseen_episodes};
pub use lock::{LockInfo, host_name};
pub use rows::RunRow;
pub use tables::Table;

use crate::objstore::{self, LocationError};

/// Errors of the store layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The graph URL is unusable.
    #[error(transparent)]
    Location(#[from] LocationError),
    /// A Delta operation on one table failed.
    #[error("table `{table}`: {source}")]
    Delta {
        table: &'static str,
        #[source]
        source: DeltaTableError,
    },
    /// Another writer holds the graph.
    #[error(
        "the graph is being written by {holder}; wait for it to finish, or if that process is gone, retry after its lock goes stale (output.lock_stale_after_secs)"
    )]
    Locked { holder: String },
    /// Another writer committed to a table while this run was writing.
    #[error(
        "table `{table}` moved from version {expected} to {found} while this run was writing: another writer committed concurrently; this run's commits are not visible and the next run rolls them back"
    )]
    Concurrent {
        table: &'static str,
        expected: u64,
        found: u64,
    },
    /// The tables disagree with the `runs` table in a way no crash explains.
    #[error("graph at {url} is inconsistent: {message}")]
    Corrupt { url: String, message: String },
    /// Rows could not be converted to Arrow.
    #[error("cannot encode rows of `{table}`: {source}")]
    Encode {
        table: &'static str,
        #[source]
        source: arrow::error::ArrowError,
    },
    /// Committed rows could not be read back into row types.
    #[error(transparent)]
    Decode(#[from] crate::rows::DecodeError),
    /// Object store error outside a Delta operation (the lock).
    #[error(transparent)]
    ObjectStore(#[from] object_store::Error),
    /// A DataFusion step of the store failed.
    #[error("{step}: {source}")]
    DataFusion {
        /// What the store was doing.
        step: &'static str,
        #[source]
        source: datafusion::error::DataFusionError,
    },
    /// The object store turned the graph's location down for a reason the
    /// user fixes in the setup: no such bucket, refused credentials, no
    /// server at the endpoint.
    #[error("{message}")]
    Storage {
        problem: objstore::Problem,
        message: String,
    },
    /// A reader was pointed at a location that holds no graph.
    #[error(
        "no graph at {url}: it has no `runs` table (a mistyped path? a graph is created by its first `graphloom run` or `graphloom add`)"
    )]
    NoGraph { url: String },
    /// A fault injected through `GRAPHLOOM_FAILPOINT` (builds with the
    /// `testkit` feature only).
    #[cfg(feature = "testkit")]
    #[error("failpoint `{0}` triggered")]
    Failpoint(String),
}

/// Turns a DataFusion error into the store's, naming the step that failed.
fn step(step: &'static str) -> impl FnOnce(datafusion::error::DataFusionError) -> StoreError {
    move |source| StoreError::DataFusion { step, source }
}

/// Result alias for the store layer.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A graph's root and the object store that holds it.
#[derive(Clone)]
pub struct GraphStore {
    url: Url,
    object_store: Arc<dyn ObjectStore>,
    stale_after: Duration,
}

impl std::fmt::Debug for GraphStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphStore")
            .field("url", &objstore::redacted(&self.url))
            .finish()
    }
}

/// What the `runs` table says about the graph.
#[derive(Debug, Clone, Default)]
pub struct Head {
    /// The last run with status `completed`.
    pub last_completed: Option<RunRow>,
    /// Versions the last completed run recorded.
    pub versions: BTreeMap<Table, u64>,
    /// Sequence number the next run gets.
    pub next_run_seq: i64,
    /// Every row of `runs`, oldest first.
    pub runs: Vec<RunRow>,
}

/// The graph as of its last completed run: every table opened at the
/// version that run recorded (`None` for a table with no rows yet).
pub struct Snapshot {
    /// The runs table's view of the graph.
    pub head: Head,
    tables: BTreeMap<Table, Option<DeltaTable>>,
}

impl Snapshot {
    /// The pinned Delta table, if the table has been written.
    pub fn table(&self, table: Table) -> Option<&DeltaTable> {
        self.tables.get(&table).and_then(|t| t.as_ref())
    }

    /// Registers every table under its name in `ctx`: pinned Delta tables,
    /// or an empty table with the right schema for tables never written.
    pub async fn register(&self, ctx: &SessionContext) -> Result<()> {
        for table in Table::ALL {
            let provider: Arc<dyn datafusion::catalog::TableProvider> = match self.table(table) {
                Some(delta) => {
                    delta
                        .update_datafusion_session(&ctx.state())
                        .map_err(|source| StoreError::Delta {
                            table: table.name(),
                            source,
                        })?;
                    delta
                        .table_provider()
                        .await
                        .map_err(step("registering a snapshot table"))?
                }
                None => Arc::new(
                    datafusion::datasource::MemTable::try_new(table.schema(), vec![vec![]])
                        .map_err(step("registering an empty snapshot table"))?,
                ),
            };
            let register = step("registering a snapshot table");
            ctx.deregister_table(table.name())
                .and_then(|_| ctx.register_table(table.name(), provider))
                .map_err(register)?;
        }
        Ok(())
    }

    /// Registers every table under its name in `ctx` as a plain Parquet
    /// listing of the snapshot's data files, with the schema the Delta
    /// provider gives (an empty table for tables never written).
    ///
    /// Unlike [`Snapshot::register`], the tables are ones DataFusion can
    /// serialize into a plan (`ListingTable`, `EmptyTable`), so a plan over
    /// them can run on other processes, e.g. Ballista executors, that
    /// reach the same object store. That is exact because graphloom's
    /// tables have no partition columns, deletion vectors or column
    /// mapping: the snapshot's `add` files hold every live row.
    pub async fn register_files(&self, ctx: &SessionContext) -> Result<()> {
        use datafusion::datasource::file_format::parquet::ParquetFormat;
        use datafusion::datasource::listing::{
            ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
        };
        for table in Table::ALL {
            let provider: Arc<dyn datafusion::catalog::TableProvider> = match self.table(table) {
                Some(delta) => {
                    let schema = delta
                        .table_provider()
                        .await
                        .map_err(step("reading a snapshot table's schema"))?
                        .schema();
                    let urls = self
                        .file_uris(table)?
                        .iter()
                        .map(ListingTableUrl::parse)
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(step("listing a snapshot table's files"))?;
                    if urls.is_empty() {
                        Arc::new(datafusion::datasource::empty::EmptyTable::new(schema))
                    } else {
                        let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
                            .with_file_extension(".parquet");
                        let config = ListingTableConfig::new_with_multi_paths(urls)
                            .with_listing_options(options)
                            .with_schema(schema);
                        Arc::new(
                            ListingTable::try_new(config)
                                .map_err(step("registering a snapshot table's files"))?,
                        )
                    }
                }
                None => Arc::new(datafusion::datasource::empty::EmptyTable::new(
                    table.schema(),
                )),
            };
            ctx.deregister_table(table.name())
                .and_then(|_| ctx.register_table(table.name(), provider))
                .map_err(step("registering a snapshot table's files"))?;
        }
        Ok(())
    }

    /// URIs of the Parquet files that hold one table's live rows at this
    /// snapshot (empty for a table no run has written). Exact for the same
    /// reasons as [`Snapshot::register_files`], so other engines can read
    /// them directly.
    pub fn file_uris(&self, table: Table) -> Result<Vec<String>> {
        match self.table(table) {
            Some(delta) => Ok(delta
                .get_file_uris()
                .map_err(|source| StoreError::Delta {
                    table: table.name(),
                    source,
                })?
                .collect()),
            None => Ok(Vec::new()),
        }
    }

    /// All rows of one table as batches.
    pub async fn read(&self, table: Table) -> Result<Vec<RecordBatch>> {
        match self.table(table) {
            Some(delta) => read_all(table, delta).await,
            None => Ok(Vec::new()),
        }
    }
}

/// How a staged write changes its table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteMode {
    /// Add rows.
    Append,
    /// Replace every row.
    Overwrite,
    /// Delta MERGE on the key columns: rows whose key exists are replaced,
    /// the others inserted.
    Upsert(&'static [&'static str]),
    /// Delete the rows matching a predicate (the batches are ignored).
    Delete(datafusion::prelude::Expr),
}

/// A table rolled back by recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    /// The table.
    pub table: Table,
    /// Its latest version before recovery (a crashed run's commit).
    pub from: u64,
    /// The version the last completed run recorded, restored.
    pub to: u64,
}

/// Registers deltalake's log stores for `s3://`, `az://`/`abfss://` and
/// `gs://` (from its `s3`, `azure` and `gcs` features). The crate does this
/// in a static constructor too; doing it here as well keeps it independent
/// of the linker keeping that constructor.
fn register_cloud_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        deltalake::aws::register_handlers(None);
        deltalake::azure::register_handlers(None);
        deltalake::gcp::register_handlers(None);
    });
}

impl GraphStore {
    /// Opens the graph at `location` (nothing is read or written yet).
    /// `options` are object store settings over the environment's (see
    /// [`objstore::store_for`]).
    pub fn open(location: &str, options: &BTreeMap<String, String>) -> Result<Self> {
        register_cloud_handlers();
        let url = objstore::parse_dir_url(location)?;
        let object_store = objstore::store_for(&url, options)?;
        Ok(GraphStore {
            url,
            object_store,
            stale_after: Duration::from_secs(120),
        })
    }

    /// Sets how long a writer lock may go without a heartbeat before another
    /// writer may take it over.
    pub fn with_lock_stale_after(mut self, stale_after: Duration) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// The graph's root URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The object store the graph lives in (for what else is kept under
    /// the graph, such as the batch ledger).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.object_store)
    }

    /// The root URL without credentials, for messages.
    pub fn display_url(&self) -> String {
        objstore::redacted(&self.url)
    }

    /// URL of one table's directory.
    pub fn table_url(&self, table: Table) -> Url {
        // The root always ends with `/`, so joining a relative name cannot fail.
        self.url
            .join(&format!("{}/", table.name()))
            .unwrap_or_else(|_| self.url.clone())
    }

    /// Where runs that resolve on a cluster keep their scratch tables:
    /// `_graphloom/scratch/` under the graph, which every cluster process
    /// reaches as it reaches the graph.
    pub fn scratch_url(&self) -> Url {
        self.url
            .join("_graphloom/scratch/")
            .unwrap_or_else(|_| self.url.clone())
    }

    /// Deletes everything under [`Self::scratch_url`]. Only a writer calls
    /// it, under the lock: no other run can be using the files.
    pub async fn clear_scratch(&self) -> Result<()> {
        let prefix = objstore::path_of(&self.scratch_url());
        let listed = self.object_store.list(Some(&prefix)).map_ok(|m| m.location);
        self.object_store
            .delete_stream(listed.boxed())
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| self.storage_error(e))?;
        Ok(())
    }

    /// An object store error as the user should see it: one line for the
    /// setup mistakes [`objstore::Problem`] knows, the error itself otherwise.
    fn storage_error(&self, error: object_store::Error) -> StoreError {
        self.setup_problem(&error).unwrap_or_else(|| error.into())
    }

    /// A Delta error on `table`, told apart like [`Self::storage_error`].
    fn delta_error(&self, table: Table, source: DeltaTableError) -> StoreError {
        self.setup_problem(&source)
            .unwrap_or_else(|| StoreError::Delta {
                table: table.name(),
                source,
            })
    }

    fn setup_problem(&self, error: &(dyn std::error::Error + 'static)) -> Option<StoreError> {
        objstore::Problem::of(error).map(|problem| StoreError::Storage {
            problem,
            message: problem.describe(&self.url),
        })
    }

    /// Whether `table` was ever created: its Delta log has an entry.
    /// Asking the store keeps "not created yet" apart from load errors.
    async fn has_log(&self, table: Table) -> Result<bool> {
        let log = objstore::path_of(&self.table_url(table)).join("_delta_log");
        match self.object_store.list(Some(&log)).next().await {
            None => Ok(false),
            Some(Err(e)) => Err(self.storage_error(e)),
            Some(Ok(_)) => Ok(true),
        }
    }

    /// Fails with [`StoreError::NoGraph`] unless a graph was ever written
    /// at this location (its `runs` table exists). Readers call this so a
    /// mistyped URL is an error rather than an empty graph.
    pub async fn require_graph(&self) -> Result<()> {
        if self.has_log(Table::Runs).await? {
            Ok(())
        } else {
            Err(StoreError::NoGraph {
                url: self.display_url(),
            })
        }
    }

    /// [`Self::snapshot`] of a graph that must exist ([`Self::require_graph`]).
    pub async fn existing_snapshot(&self) -> Result<Snapshot> {
        self.require_graph().await?;
        self.snapshot().await
    }

    fn lock_path(&self) -> object_store::path::Path {
        objstore::path_of(&self.url)
            .join("_graphloom")
            .join("writer.lock")
    }

    fn builder(&self, table: Table) -> Result<DeltaTableBuilder> {
        let url = self.table_url(table);
        Ok(DeltaTableBuilder::from_url(url.clone())
            .map_err(|source| StoreError::Delta {
                table: table.name(),
                source,
            })?
            .with_storage_backend(self.object_store.clone(), url))
    }

    /// Opens a table at its latest version; `None` if it was never created.
    pub async fn load_latest(&self, table: Table) -> Result<Option<DeltaTable>> {
        if !self.has_log(table).await? {
            return Ok(None);
        }
        let mut delta = self
            .builder(table)?
            .build()
            .map_err(|source| self.delta_error(table, source))?;
        match delta.load().await {
            Ok(()) => Ok(Some(delta)),
            Err(DeltaTableError::NotATable(_)) => Ok(None),
            Err(source) => Err(self.delta_error(table, source)),
        }
    }

    /// Opens a table at one version.
    pub async fn load_version(&self, table: Table, version: u64) -> Result<DeltaTable> {
        self.builder(table)?
            .with_version(version)
            .load()
            .await
            .map_err(|source| self.delta_error(table, source))
    }

    /// Reads the `runs` table.
    pub async fn head(&self) -> Result<Head> {
        let Some(runs) = self.load_latest(Table::Runs).await? else {
            return Ok(Head {
                next_run_seq: 1,
                ..Head::default()
            });
        };
        let batches = read_all(Table::Runs, &runs).await?;
        let mut rows: Vec<RunRow> = rows::from_batches(Table::Runs, &batches)?;
        rows.sort_by_key(|r| r.run_seq);
        let next_run_seq = rows.last().map_or(1, |r| r.run_seq + 1);
        let last_completed = rows.iter().rev().find(|r| r.status == "completed").cloned();
        let mut versions = BTreeMap::new();
        if let Some(run) = &last_completed {
            let recorded: BTreeMap<String, u64> = serde_json::from_str(&run.table_versions)
                .map_err(|e| StoreError::Corrupt {
                    url: self.display_url(),
                    message: format!("run {} has unreadable table_versions: {e}", run.run_id),
                })?;
            for (name, v) in recorded {
                if let Some(t) = Table::from_name(&name) {
                    versions.insert(t, v);
                }
            }
        }
        Ok(Head {
            last_completed,
            versions,
            next_run_seq,
            runs: rows,
        })
    }

    /// The graph as of its last completed run.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let head = self.head().await?;
        let mut tables = BTreeMap::new();
        for table in Table::ALL {
            let delta = match head.versions.get(&table) {
                Some(v) => Some(self.load_version(table, *v).await?),
                // `runs` itself is append-only and every row in it is final.
                None if table == Table::Runs => self.load_latest(table).await?,
                None => None,
            };
            tables.insert(table, delta);
        }
        Ok(Snapshot { head, tables })
    }

    /// The current writer lock, if any.
    pub async fn lock_holder(&self) -> Result<Option<LockInfo>> {
        lock::holder(&*self.object_store, &self.lock_path()).await
    }

    /// Starts a write: takes the lock, creates missing tables and rolls
    /// back the commits of an interrupted run.
    pub async fn begin(&self, command: &str, group_id: &str) -> Result<Transaction> {
        let run_id = uuid::Uuid::now_v7().to_string();
        let lock = lock::acquire(
            self.object_store.clone(),
            self.lock_path(),
            &run_id,
            command,
            self.stale_after,
        )
        .await
        .map_err(|e| match e {
            StoreError::ObjectStore(e) => self.storage_error(e),
            other => other,
        })?;
        let prepared = self.prepare(&run_id).await;
        let (head, tables, rollbacks) = match prepared {
            Ok(p) => p,
            Err(e) => {
                lock.release().await.ok();
                return Err(e);
            }
        };
        for r in &rollbacks {
            tracing::warn!(
                "rolled back table `{}` from version {} to {} (commits of an interrupted run)",
                r.table,
                r.from,
                r.to
            );
        }
        Ok(Transaction {
            store: self.clone(),
            lock: Some(lock),
            run_id,
            run_seq: head.next_run_seq,
            command: command.to_string(),
            group_id: group_id.to_string(),
            started_at: Utc::now(),
            head,
            tables,
            staged: Vec::new(),
            rollbacks,
        })
    }

    async fn prepare(
        &self,
        run_id: &str,
    ) -> Result<(Head, BTreeMap<Table, DeltaTable>, Vec<Rollback>)> {
        let head = self.head().await?;
        let mut tables = BTreeMap::new();
        let mut rollbacks = Vec::new();
        for table in Table::ALL {
            let pinned = head.versions.get(&table).copied();
            let delta = match self.load_latest(table).await? {
                None => {
                    if let Some(v) = pinned {
                        return Err(StoreError::Corrupt {
                            url: self.display_url(),
                            message: format!(
                                "table `{table}` is missing but the last completed run recorded version {v}"
                            ),
                        });
                    }
                    self.create_table(table, run_id).await?
                }
                Some(delta) => {
                    let latest = version_of(&delta);
                    // Tables are created empty at version 0, so a table the last
                    // completed run did not record is pinned at its empty start.
                    let pin = if table == Table::Runs {
                        latest
                    } else {
                        pinned.unwrap_or(0)
                    };
                    if latest < pin {
                        return Err(StoreError::Corrupt {
                            url: self.display_url(),
                            message: format!(
                                "table `{table}` is at version {latest}, older than version {pin} recorded by the last completed run"
                            ),
                        });
                    }
                    if latest > pin {
                        let (restored, _) = delta
                            .restore()
                            .with_version_to_restore(pin)
                            .with_commit_properties(commit_props(run_id, "recover"))
                            .await
                            .map_err(|source| StoreError::Delta {
                                table: table.name(),
                                source,
                            })?;
                        rollbacks.push(Rollback {
                            table,
                            from: latest,
                            to: pin,
                        });
                        restored
                    } else {
                        delta
                    }
                }
            };
            tables.insert(table, delta);
        }
        Ok((head, tables, rollbacks))
    }

    async fn create_table(&self, table: Table, run_id: &str) -> Result<DeltaTable> {
        let delta = self
            .builder(table)?
            .build()
            .map_err(|source| StoreError::Delta {
                table: table.name(),
                source,
            })?;
        delta
            .write(vec![RecordBatch::new_empty(table.schema())])
            .with_save_mode(SaveMode::ErrorIfExists)
            .with_table_name(table.name())
            .with_commit_properties(commit_props(run_id, "create"))
            .await
            .map_err(|source| StoreError::Delta {
                table: table.name(),
                source,
            })
    }

    /// Takes the lock, rolls back an interrupted run's commits and releases
    /// the lock again (`graphloom recover`). A rollback is a Delta RESTORE,
    /// itself a new version; when there was one, a `runs` row (command
    /// `recover`) pins the restored versions, so the graph's pinned and
    /// latest versions agree again and a second recover finds nothing.
    pub async fn recover(&self) -> Result<Vec<Rollback>> {
        let tx = self.begin("recover", "").await?;
        let rollbacks = tx.rollbacks.clone();
        if rollbacks.is_empty() {
            tx.abandon().await?;
        } else {
            let ontology_hash = tx
                .head
                .last_completed
                .as_ref()
                .map(|r| r.ontology_hash.clone())
                .unwrap_or_default();
            tx.commit(RunStats {
                ontology_hash,
                ..RunStats::default()
            })
            .await?;
        }
        Ok(rollbacks)
    }
}

/// Whether `delta` lacks columns of `table`'s schema (written by an older
/// graphloom).
fn lacks_columns(table: Table, delta: &DeltaTable) -> bool {
    let Ok(state) = delta.snapshot() else {
        return false;
    };
    let have = state.schema();
    table
        .schema()
        .fields()
        .iter()
        .any(|f| have.field(f.name()).is_none())
}

fn version_of(delta: &DeltaTable) -> u64 {
    delta.version().unwrap_or(0)
}

fn commit_props(run_id: &str, operation: &str) -> CommitProperties {
    CommitProperties::default()
        .with_max_retries(0)
        .with_metadata([
            ("graphloom.run_id".to_string(), serde_json::json!(run_id)),
            (
                "graphloom.operation".to_string(),
                serde_json::json!(operation),
            ),
        ])
}

/// Reads every row of a Delta table.
async fn read_all(table: Table, delta: &DeltaTable) -> Result<Vec<RecordBatch>> {
    let ctx = SessionContext::new();
    delta
        .update_datafusion_session(&ctx.state())
        .map_err(|source| StoreError::Delta {
            table: table.name(),
            source,
        })?;
    let provider = delta
        .table_provider()
        .await
        .map_err(step("reading a whole table"))?;
    let frame = ctx
        .read_table(provider)
        .map_err(step("reading a whole table"))?;
    frame.collect().await.map_err(step("reading a whole table"))
}

/// An open write to the graph. Stage writes, then [`Transaction::commit`].
pub struct Transaction {
    store: GraphStore,
    lock: Option<lock::LockGuard>,
    run_id: String,
    run_seq: i64,
    command: String,
    group_id: String,
    started_at: chrono::DateTime<Utc>,
    head: Head,
    tables: BTreeMap<Table, DeltaTable>,
    staged: Vec<(Table, WriteMode, Vec<RecordBatch>)>,
    rollbacks: Vec<Rollback>,
}

/// Counts a command reports in its `runs` row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    pub episodes_seen: i64,
    pub episodes_skipped: i64,
    pub episodes_added: i64,
    pub nodes_added: i64,
    pub edges_added: i64,
    pub failures: i64,
    pub llm_calls: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: Option<f64>,
    pub ontology_hash: String,
}

impl Transaction {
    /// Id of this run (a UUIDv7, so ids sort by start time).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Sequence number of this run in the graph.
    pub fn run_seq(&self) -> i64 {
        self.run_seq
    }

    /// The `runs` view this run started from.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// Tables rolled back when the write began.
    pub fn rollbacks(&self) -> &[Rollback] {
        &self.rollbacks
    }

    /// The state a table is in before this run's writes (equal to the last
    /// completed run's state after recovery).
    pub fn base(&self, table: Table) -> Option<&DeltaTable> {
        self.tables.get(&table)
    }

    /// The tables as they were before this run, as a snapshot (to register
    /// them in a session of the caller's).
    pub fn base_snapshot(&self) -> Snapshot {
        Snapshot {
            head: self.head.clone(),
            tables: Table::ALL
                .iter()
                .map(|t| (*t, self.tables.get(t).cloned()))
                .collect(),
        }
    }

    /// The graph this transaction writes.
    pub fn store(&self) -> &GraphStore {
        &self.store
    }

    /// All rows a table held before this run.
    pub async fn read_base(&self, table: Table) -> Result<Vec<RecordBatch>> {
        match self.tables.get(&table) {
            Some(delta) => read_all(table, delta).await,
            None => Ok(Vec::new()),
        }
    }

    /// Queues a write; nothing is visible until [`Transaction::commit`].
    pub fn stage(&mut self, table: Table, mode: WriteMode, batches: Vec<RecordBatch>) {
        if table == Table::Runs {
            // The runs row is the commit point and is written by `commit`.
            return;
        }
        self.staged.push((table, mode, batches));
    }

    /// Commits every staged write, then the `runs` row that makes them
    /// visible, and releases the lock. Returns that row.
    pub async fn commit(mut self, stats: RunStats) -> Result<RunRow> {
        let result = self.commit_inner(stats).await;
        if let Some(lock) = self.lock.take() {
            lock.release().await.ok();
        }
        result
    }

    async fn commit_inner(&mut self, stats: RunStats) -> Result<RunRow> {
        let staged = std::mem::take(&mut self.staged);
        // Commit in table order so a crash leaves a predictable prefix.
        let mut by_table: BTreeMap<usize, Vec<(Table, WriteMode, Vec<RecordBatch>)>> =
            BTreeMap::new();
        let order: HashMap<Table, usize> = Table::ALL
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, i))
            .collect();
        for s in staged {
            by_table.entry(order[&s.0]).or_default().push(s);
        }
        for (table, mode, batches) in by_table.into_values().flatten() {
            self.commit_table(table, mode, batches).await?;
            failpoint(&format!("after_commit:{table}")).await?;
        }
        let versions: BTreeMap<&str, u64> = self
            .tables
            .iter()
            .filter(|(t, _)| **t != Table::Runs)
            .map(|(t, d)| (t.name(), version_of(d)))
            .collect();
        let run = self.run_row(
            "completed",
            &stats,
            serde_json::to_string(&versions).unwrap_or_default(),
            None,
        );
        let batch = rows::to_batch(Table::Runs, std::slice::from_ref(&run))?;
        self.commit_table(Table::Runs, WriteMode::Append, vec![batch])
            .await?;
        failpoint("after_commit:runs").await?;
        Ok(run)
    }

    fn run_row(
        &self,
        status: &str,
        stats: &RunStats,
        table_versions: String,
        error: Option<String>,
    ) -> RunRow {
        let finished_at = Utc::now();
        RunRow {
            run_id: self.run_id.clone(),
            run_seq: self.run_seq,
            command: self.command.clone(),
            status: status.to_string(),
            group_id: self.group_id.clone(),
            started_at: self.started_at,
            finished_at,
            duration_ms: (finished_at - self.started_at).num_milliseconds(),
            episodes_seen: stats.episodes_seen,
            episodes_skipped: stats.episodes_skipped,
            episodes_added: stats.episodes_added,
            nodes_added: stats.nodes_added,
            edges_added: stats.edges_added,
            failures: stats.failures,
            llm_calls: stats.llm_calls,
            prompt_tokens: stats.prompt_tokens,
            completion_tokens: stats.completion_tokens,
            cost_usd: stats.cost_usd,
            ontology_hash: stats.ontology_hash.clone(),
            table_versions,
            error,
            graphloom_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Commits one write to `table` on top of the version this run holds
    /// and keeps the new version as the base of the next write.
    async fn commit_table(
        &mut self,
        table: Table,
        mode: WriteMode,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let base = self
            .tables
            .remove(&table)
            .ok_or_else(|| StoreError::Corrupt {
                url: self.store.display_url(),
                message: format!("table `{table}` was not opened for writing"),
            })?;
        let next = self.write_table(table, base, mode, batches).await?;
        self.tables.insert(table, next);
        Ok(())
    }

    async fn write_table(
        &self,
        table: Table,
        base: DeltaTable,
        mode: WriteMode,
        batches: Vec<RecordBatch>,
    ) -> Result<DeltaTable> {
        let expected = version_of(&base);
        let props = commit_props(&self.run_id, &self.command);
        let batches = if batches.is_empty() {
            vec![RecordBatch::new_empty(table.schema())]
        } else {
            batches
        };
        let evolve = lacks_columns(table, &base);
        let written = match mode {
            WriteMode::Append | WriteMode::Overwrite => {
                let save_mode = if mode == WriteMode::Append {
                    SaveMode::Append
                } else {
                    SaveMode::Overwrite
                };
                let mut write = base
                    .write(batches)
                    .with_save_mode(save_mode)
                    .with_commit_properties(props);
                if evolve {
                    // A table written by an older graphloom lacks columns
                    // added since (nullable, at the end, e.g.
                    // `llm_calls.endpoint`): the append adds them, and the
                    // older rows read them as null.
                    write = write.with_schema_mode(SchemaMode::Merge);
                }
                write.await
            }
            WriteMode::Upsert(key) => {
                let ctx = SessionContext::new();
                let source = ctx
                    .read_batches(batches)
                    .map_err(step("the rows to merge"))?;
                let columns: Vec<String> = table
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                let merge = base
                    .merge(
                        source,
                        key.iter()
                            .map(|k| format!("target.{k} = source.{k}"))
                            .collect::<Vec<_>>()
                            .join(" AND "),
                    )
                    .with_source_alias("source")
                    .with_target_alias("target")
                    // As for appends: the merge adds columns an older
                    // graphloom did not write (e.g. the nodes' name keys).
                    .with_merge_schema(evolve)
                    .with_commit_properties(props)
                    .when_matched_update(|mut u| {
                        for c in &columns {
                            u = u.update(c.as_str(), format!("source.{c}"));
                        }
                        u
                    })
                    .and_then(|m| {
                        m.when_not_matched_insert(|mut i| {
                            for c in &columns {
                                i = i.set(c.as_str(), format!("source.{c}"));
                            }
                            i
                        })
                    });
                match merge {
                    Ok(m) => m.await.map(|(t, _)| t),
                    Err(e) => Err(e),
                }
            }
            WriteMode::Delete(predicate) => base
                .delete()
                .with_predicate(predicate)
                .with_commit_properties(props)
                .await
                .map(|(t, _)| t),
        };
        match written {
            Ok(next) => Ok(next),
            Err(source) => {
                // Tell a lost race apart from other failures: it is the one
                // error a user fixes by running one writer at a time.
                if let Ok(Some(now)) = self.store.load_latest(table).await {
                    let found = version_of(&now);
                    if found > expected {
                        return Err(StoreError::Concurrent {
                            table: table.name(),
                            expected,
                            found,
                        });
                    }
                }
                Err(StoreError::Delta {
                    table: table.name(),
                    source,
                })
            }
        }
    }

    /// Records a failed run (best effort: a row with status `failed` that
    /// pins nothing new) and releases the lock. Staged writes are dropped.
    pub async fn fail(mut self, error: &str, stats: RunStats) -> Result<()> {
        // A failed run adds nothing and pins the last completed run's versions.
        let stats = RunStats {
            episodes_added: 0,
            nodes_added: 0,
            edges_added: 0,
            ..stats
        };
        let versions = self
            .head
            .last_completed
            .as_ref()
            .map_or_else(|| "{}".to_string(), |r| r.table_versions.clone());
        let run = self.run_row(
            "failed",
            &stats,
            versions,
            Some(error.chars().take(2000).collect()),
        );
        let result = match rows::to_batch(Table::Runs, std::slice::from_ref(&run)) {
            Ok(batch) => {
                self.commit_table(Table::Runs, WriteMode::Append, vec![batch])
                    .await
            }
            Err(e) => Err(e),
        };
        if let Some(lock) = self.lock.take() {
            lock.release().await.ok();
        }
        result.map(|_| ())
    }

    /// Releases the lock without writing anything.
    pub async fn abandon(mut self) -> Result<()> {
        if let Some(lock) = self.lock.take() {
            lock.release().await?;
        }
        Ok(())
    }
}

/// Fault injection for crash tests: `GRAPHLOOM_FAILPOINT` holds
/// `name=action` pairs separated by commas, where action is `abort` (the
/// process dies as if killed), `error`, or `sleep:<ms>`. Names are
/// `after_commit:<table>`. Only in builds with the `testkit` feature;
/// release builds read no such variable.
#[cfg(feature = "testkit")]
async fn failpoint(name: &str) -> Result<()> {
    let Ok(spec) = std::env::var("GRAPHLOOM_FAILPOINT") else {
        return Ok(());
    };
    for entry in spec.split(',') {
        let Some((point, action)) = entry.trim().split_once('=') else {
            continue;
        };
        if point != name {
            continue;
        }
        match action {
            "abort" => std::process::abort(),
            "error" => return Err(StoreError::Failpoint(name.to_string())),
            other => {
                if let Some(ms) = other
                    .strip_prefix("sleep:")
                    .and_then(|m| m.parse::<u64>().ok())
                {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
        }
    }
    Ok(())
}

#[cfg(not(feature = "testkit"))]
async fn failpoint(_name: &str) -> Result<()> {
    Ok(())
}

/// Rows describing the ontology in effect: both type tables and both
/// closures, each to be written in overwrite mode so that a filter on a
/// parent type expands with the current hierarchy.
pub fn ontology_batches(
    ontology: &crate::ontology::Ontology,
    run_id: &str,
) -> Result<Vec<(Table, RecordBatch)>> {
    use rows::{ClosureRow, EdgeTypeRow, EntityTypeRow};
    let entity_rows: Vec<EntityTypeRow> = ontology
        .entity_tree
        .iter()
        .filter_map(|node| {
            let spec = ontology.entity_types.get(&node.name)?;
            Some(EntityTypeRow {
                name: node.name.clone(),
                parent: node.parent.clone(),
                depth: node.depth as i64,
                description: spec.description.clone(),
                properties: to_json(&spec.properties),
                identity_properties: spec.identity_properties.clone(),
                run_id: run_id.to_string(),
            })
        })
        .collect();
    let edge_rows: Vec<EdgeTypeRow> = ontology
        .edge_tree
        .iter()
        .filter_map(|node| {
            let spec = ontology.edge_types.get(&node.name)?;
            Some(EdgeTypeRow {
                name: node.name.clone(),
                parent: node.parent.clone(),
                depth: node.depth as i64,
                description: spec.description.clone(),
                properties: to_json(&spec.properties),
                source_targets: to_json(&spec.source_targets),
                run_id: run_id.to_string(),
            })
        })
        .collect();
    let closure = |tree: &crate::ontology::TypeTree| -> Vec<ClosureRow> {
        tree.closure()
            .into_iter()
            .map(|(ancestor, descendant, distance)| ClosureRow {
                ancestor,
                descendant,
                distance: distance as i64,
            })
            .collect()
    };
    Ok(vec![
        (
            Table::EntityTypes,
            rows::to_batch(Table::EntityTypes, &entity_rows)?,
        ),
        (
            Table::EdgeTypes,
            rows::to_batch(Table::EdgeTypes, &edge_rows)?,
        ),
        (
            Table::EntityTypeClosure,
            rows::to_batch(Table::EntityTypeClosure, &closure(&ontology.entity_tree))?,
        ),
        (
            Table::EdgeTypeClosure,
            rows::to_batch(Table::EdgeTypeClosure, &closure(&ontology.edge_tree))?,
        ),
    ])
}

/// JSON text of a value for JSON-valued columns.
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

impl Transaction {
    /// A DataFusion session over the tables as they were before this run
    /// (the base of its writes), for lookups such as the next short id or
    /// resolution joins against committed nodes.
    pub async fn base_context(&self) -> Result<SessionContext> {
        let ctx = SessionContext::new();
        for (table, delta) in &self.tables {
            delta
                .update_datafusion_session(&ctx.state())
                .map_err(|source| StoreError::Delta {
                    table: table.name(),
                    source,
                })?;
            let provider = delta
                .table_provider()
                .await
                .map_err(step("registering a base table"))?;
            ctx.register_table(table.name(), provider)
                .map_err(step("registering a base table"))?;
        }
        Ok(ctx)
    }
}
