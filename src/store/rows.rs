//! Conversion of the graph's typed rows ([`crate::rows`], re-exported here)
//! to and from Arrow record batches. Conversion goes through arrow-json's
//! serde support so that one function serves every table and the schema in
//! [`Table::schema`] stays the single source of column types.

use arrow::array::RecordBatch;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Result, StoreError, Table};
pub use crate::rows::*;

/// Encodes rows into one batch with `table`'s schema.
pub fn to_batch<T: Serialize>(table: Table, rows: &[T]) -> Result<RecordBatch> {
    let schema = table.schema();
    let mut decoder = arrow::json::ReaderBuilder::new(schema.clone())
        .build_decoder()
        .map_err(|e| encode_err(table, e))?;
    decoder.serialize(rows).map_err(|e| encode_err(table, e))?;
    match decoder.flush().map_err(|e| encode_err(table, e))? {
        Some(batch) => Ok(batch),
        None => Ok(RecordBatch::new_empty(schema)),
    }
}

/// Decodes batches of `table` back into rows.
pub fn from_batches<T: DeserializeOwned>(table: Table, batches: &[RecordBatch]) -> Result<Vec<T>> {
    Ok(crate::rows::decode(table.name(), batches)?)
}

fn encode_err(table: Table, source: arrow::error::ArrowError) -> StoreError {
    StoreError::Encode {
        table: table.name(),
        source,
    }
}
