//! Scratch tables in a DataFusion session: the small in-memory sides of
//! the semi- and anti-joins that stages run against the graph's tables. A
//! leaf: it knows DataFusion and Arrow, nothing of the graph.

use std::sync::Arc;

use arrow::datatypes::Field;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

/// Registers `values` as a one-column in-memory table `table(column)`,
/// replacing any table of that name: the small side of a semi- or
/// anti-join against the graph's tables.
pub fn register_column(
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
    let _ = ctx.deregister_table(table);
    ctx.register_table(
        table,
        Arc::new(datafusion::datasource::MemTable::try_new(
            schema,
            vec![vec![batch]],
        )?),
    )?;
    Ok(())
}
