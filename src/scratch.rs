//! Scratch tables in a DataFusion session: the small in-memory sides of
//! the semi- and anti-joins that stages run against the graph's tables,
//! and the intermediate tables of resolution, kept in memory or, for a
//! session on a cluster, as Parquet files every process reads. A leaf: it
//! knows DataFusion, Arrow and object stores, nothing of the graph.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, SchemaRef};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use object_store::ObjectStoreExt;

/// Whether the session's plans run on other processes: it keeps its
/// scratch tables as [`ScratchFiles`], which is what such a session needs.
/// Functions that close over this process's memory must then carry what
/// they read.
pub fn runs_elsewhere(ctx: &SessionContext) -> bool {
    ctx.state_ref()
        .read()
        .config()
        .get_extension::<ScratchFiles>()
        .is_some()
}

/// `batch` in buffers of its own when its arrays hold more than twice what
/// its rows need. A slice (an unnest's output, a batch cut into
/// partitions) reports its parent's whole buffers, and an in-memory
/// table's statistics add those up: at 3M mentions × 30M nodes the 2.6M
/// name stems looked like 5.2 GB, more than the committed nodes, so the
/// longer-name join hashed the 30M nodes (6.9 GB, 31 s) and streamed the
/// stems. Sized truly, the small side is the one held.
fn compacted(batch: RecordBatch) -> Result<RecordBatch, DataFusionError> {
    let needed = batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size())
        .sum::<Result<usize, _>>()?;
    if batch.get_array_memory_size() <= needed.saturating_mul(2) {
        return Ok(batch);
    }
    let all = arrow::array::UInt64Array::from_iter_values(0..batch.num_rows() as u64);
    Ok(arrow::compute::take_record_batch(&batch, &all)?)
}

/// Registers `values` as a one-column table `table(column)`, replacing
/// any table of that name: the small side of a semi- or anti-join against
/// the graph's tables. Kept like [`register_batches`] keeps its tables.
pub async fn register_column(
    ctx: &SessionContext,
    table: &str,
    column: &str,
    values: arrow::array::ArrayRef,
) -> Result<(), DataFusionError> {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![Field::new(
        column,
        values.data_type().clone(),
        false,
    )]));
    let batch = arrow::array::RecordBatch::try_new(schema.clone(), vec![values])?;
    register_batches(ctx, table, schema, vec![batch]).await
}

/// Where a session keeps its scratch tables when its plans run on other
/// processes: Parquet files under `root`, a directory every process of
/// the cluster reaches. Set it as a session config extension
/// (`SessionConfig::with_extension`); without it scratch tables stay in
/// memory.
#[derive(Debug)]
pub struct ScratchFiles {
    root: url::Url,
    store: Arc<dyn object_store::ObjectStore>,
    next: std::sync::atomic::AtomicU64,
}

impl ScratchFiles {
    /// Scratch files under `root` (a directory URL ending in `/`), written
    /// through `store` (rooted at the store's root, as DataFusion's
    /// object store registry keys it).
    pub fn new(root: url::Url, store: Arc<dyn object_store::ObjectStore>) -> Self {
        ScratchFiles {
            root,
            store,
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The directory the files go under.
    pub fn root(&self) -> &url::Url {
        &self.root
    }

    /// Writes `partitions` as one Parquet file each under a fresh
    /// directory for `name` (a table of that name that plans still read
    /// keeps its files) and returns a listing table over them.
    async fn write(
        &self,
        name: &str,
        schema: SchemaRef,
        partitions: Vec<Vec<RecordBatch>>,
    ) -> Result<Arc<dyn datafusion::catalog::TableProvider>, DataFusionError> {
        use datafusion::datasource::file_format::parquet::ParquetFormat;
        use datafusion::datasource::listing::{
            ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
        };
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self
            .root
            .join(&format!("{name}-{n}/"))
            .map_err(|e| DataFusionError::Plan(format!("scratch directory for {name}: {e}")))?;
        for (i, batches) in partitions.into_iter().enumerate() {
            if batches.iter().all(|b| b.num_rows() == 0) && i > 0 {
                continue;
            }
            let mut buffer = Vec::new();
            let mut writer =
                parquet::arrow::ArrowWriter::try_new(&mut buffer, schema.clone(), None)?;
            for b in &batches {
                writer.write(b)?;
            }
            writer.close()?;
            let file = dir
                .join(&format!("part-{i}.parquet"))
                .map_err(|e| DataFusionError::Plan(format!("scratch file for {name}: {e}")))?;
            let path = object_store::path::Path::from_url_path(file.path())
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            self.store
                .put(&path, buffer.into())
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        let options =
            ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
        let config = ListingTableConfig::new(ListingTableUrl::parse(dir.as_str())?)
            .with_listing_options(options)
            .with_schema(schema);
        Ok(Arc::new(ListingTable::try_new(config)?))
    }
}

/// Registers `batches` as the scratch table `name` (replacing one of that
/// name), dealt round-robin over the session's partitions for parallel
/// work: in memory, or as Parquet files when the session has
/// [`ScratchFiles`] (its plans run on a cluster, which cannot read this
/// process's memory).
pub async fn register_batches(
    ctx: &SessionContext,
    name: &str,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(), DataFusionError> {
    let state = ctx.state();
    let parts = state.config().target_partitions().max(1);
    let mut partitions: Vec<Vec<RecordBatch>> = vec![Vec::new(); parts];
    for (i, b) in batches.into_iter().enumerate() {
        partitions[i % parts].push(b);
    }
    let table: Arc<dyn datafusion::catalog::TableProvider> =
        match state.config().get_extension::<ScratchFiles>() {
            Some(files) => files.write(name, schema, partitions).await?,
            None => {
                let partitions = partitions
                    .into_iter()
                    .map(|p| p.into_iter().map(compacted).collect())
                    .collect::<Result<Vec<Vec<_>>, _>>()?;
                Arc::new(datafusion::datasource::MemTable::try_new(
                    schema, partitions,
                )?)
            }
        };
    let _ = ctx.deregister_table(name);
    ctx.register_table(name, table)?;
    Ok(())
}

/// Runs `sql` and keeps its result as the scratch table `name` (kept like
/// [`register_batches`] keeps its tables), its batches spread over the
/// session's partitions for parallel work.
pub async fn materialize(
    ctx: &SessionContext,
    name: &str,
    sql: &str,
) -> Result<(), DataFusionError> {
    materialize_inner(ctx, name, sql)
        .await
        .map_err(|e| e.context(format!("building the scratch table {name}")))
}

/// Plans and runs `sql`, returning its schema and rows. At trace level
/// (`RUST_LOG=graphloom=trace`) it logs the executed plan with each
/// operator's metrics (rows, time), which is where a slow step shows why.
pub async fn run_sql(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(SchemaRef, Vec<RecordBatch>), DataFusionError> {
    let frame = ctx.sql(sql).await?;
    let schema = Arc::clone(frame.schema().inner());
    let plan = frame.create_physical_plan().await?;
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    if tracing::enabled!(tracing::Level::TRACE) {
        let shown = datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
            plan.as_ref(),
        )
        .indent(true);
        tracing::trace!("executed plan:\n{shown}");
    }
    Ok((schema, batches))
}

/// Registers `batch` as the scratch table `name`, sliced over the
/// session's partitions for parallel work.
pub async fn register_partitioned(
    ctx: &SessionContext,
    name: &str,
    batch: RecordBatch,
) -> Result<(), DataFusionError> {
    let parts = ctx.state().config().target_partitions().max(1);
    let size = batch.num_rows().div_ceil(parts).max(1);
    let slices = (0..batch.num_rows())
        .step_by(size)
        .map(|offset| batch.slice(offset, size.min(batch.num_rows() - offset)))
        .collect();
    register_batches(ctx, name, batch.schema(), slices).await
}

async fn materialize_inner(
    ctx: &SessionContext,
    name: &str,
    sql: &str,
) -> Result<(), DataFusionError> {
    let (schema, batches) = run_sql(ctx, sql).await?;
    register_batches(ctx, name, schema, batches).await
}

#[cfg(test)]
mod compaction_tests {
    use super::*;

    #[test]
    fn a_slice_is_copied_into_buffers_of_its_own_and_a_whole_batch_is_kept() {
        let values = arrow::array::Int64Array::from_iter_values(0..100_000);
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![Field::new(
            "v",
            arrow::datatypes::DataType::Int64,
            false,
        )]));
        let whole = RecordBatch::try_new(schema, vec![Arc::new(values)]).expect("batch");
        let slice = whole.slice(10, 100);
        assert!(
            slice.get_array_memory_size() >= 8 * whole.num_rows(),
            "a slice reports its parent's whole buffer"
        );
        let copied = compacted(slice.clone()).expect("compacts");
        assert_eq!(copied, slice, "the same rows");
        assert!(
            copied.get_array_memory_size() < slice.get_array_memory_size() / 100,
            "{} bytes for 100 rows",
            copied.get_array_memory_size()
        );
        let kept = compacted(whole.clone()).expect("compacts");
        assert!(
            kept.column(0).to_data().buffers()[0].as_ptr()
                == whole.column(0).to_data().buffers()[0].as_ptr(),
            "a batch that owns its buffers is not copied"
        );
    }
}
