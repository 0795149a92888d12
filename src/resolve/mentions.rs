//! The run's mentions as a table, and the candidate pairs the joins find
//! for them: what every way of finding candidates ([`super::entities`],
//! [`super::linkage`], [`super::embedding`]) shares.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, ListBuilder, RecordBatch, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::DataFusionError;

use crate::text::normalize_name;

/// Name under which [`resolve_entities`] expects the run's mentions.
pub const MENTIONS_TABLE: &str = "resolve_mentions";

/// Schema of the mentions table: one row per mention, `labels` as in
/// `nodes` ("Entity" then the chain, root first), `attributes` a JSON
/// object of the last type's properties.
pub fn mentions_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("mention_id", DataType::Int64, false),
        Field::new("group_id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("name_normalized", DataType::Utf8, false),
        Field::new("type", DataType::Utf8, false),
        Field::new(
            "labels",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            false,
        ),
        Field::new("attributes", DataType::Utf8, false),
    ]))
}

/// One mention, as [`mentions_batches`] lays it out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MentionKey {
    /// Partition of the graph.
    pub group_id: String,
    /// The name as written.
    pub name: String,
    /// Type chain, root first (empty: just "Entity").
    pub chain: Vec<String>,
    /// Properties of the last type, as a JSON object.
    pub attributes: String,
}

/// Lays mentions out as the mentions table, in `partitions` batches so
/// DataFusion can work on them in parallel. `mention_id` is the position.
pub fn mentions_batches(
    mentions: &[MentionKey],
    partitions: usize,
) -> Result<Vec<Vec<RecordBatch>>, DataFusionError> {
    let size = mentions.len().div_ceil(partitions.max(1)).max(1);
    let mut out = Vec::new();
    for (c, chunk) in mentions.chunks(size).enumerate() {
        let first = (c * size) as i64;
        let mut labels = ListBuilder::new(StringBuilder::new());
        for m in chunk {
            labels.values().append_value(crate::ontology::ENTITY_LABEL);
            for t in &m.chain {
                labels.values().append_value(t);
            }
            labels.append(true);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                first..first + chunk.len() as i64,
            )),
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|m| m.group_id.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|m| m.name.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|m| normalize_name(&m.name)),
            )),
            Arc::new(StringArray::from_iter_values(chunk.iter().map(|m| {
                m.chain
                    .last()
                    .map_or(crate::ontology::ENTITY_LABEL, String::as_str)
            }))),
            Arc::new(labels.finish()),
            Arc::new(StringArray::from_iter_values(
                chunk.iter().map(|m| m.attributes.as_str()),
            )),
        ];
        out.push(vec![RecordBatch::try_new(mentions_schema(), columns)?]);
    }
    if out.is_empty() {
        out.push(vec![RecordBatch::new_empty(mentions_schema())]);
    }
    Ok(out)
}

pub(super) fn list_of(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, true)))
}

pub(super) fn strings(array: &ArrayRef) -> Result<ArrayRef, DataFusionError> {
    Ok(arrow::compute::cast(array, &DataType::Utf8)?)
}

/// A list-of-strings column as `List<Utf8>`, whatever the reader chose
/// (Delta scans may give string views or large lists).
pub(super) fn string_lists(array: &ArrayRef) -> Result<ArrayRef, DataFusionError> {
    Ok(arrow::compute::cast(array, &list_of(DataType::Utf8))?)
}

/// What a candidate pair points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A committed node, by `short_id`.
    Node(i64),
    /// Another mention of this run.
    Mention(usize),
}

/// How a candidate was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Equal identity-property value.
    Identity,
    /// Equal folded name.
    Name,
    /// Shared LSH band key, scored.
    Fuzzy,
    /// One-word name against a multi-word name starting with it.
    Partial,
    /// A `[[resolve.linkage]]` score at or above the rule's threshold.
    Linked,
    /// A `[[resolve.linkage]]` score in the rule's grey band.
    LinkGrey,
    /// A nearest neighbour by name embedding (a proposal only).
    Embedding,
    /// The target's name with words added at the end (a proposal only).
    Longer,
}

/// One candidate pair from the joins.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// The mention.
    pub mention: usize,
    /// What it may be.
    pub target: Target,
    /// How the pair was found.
    pub kind: Kind,
    /// Name similarity (1 for name and identity matches).
    pub score: f64,
    /// Committed nodes behind a partial candidate (several: ambiguous).
    pub count: i64,
    /// The target's name, for adjudication prompts.
    pub name: String,
    /// The target's chain (labels without "Entity").
    pub chain: Vec<String>,
    /// The target's identity keys (`property=value`).
    pub identity: Vec<String>,
}

pub(super) fn decode_pairs(
    b: &RecordBatch,
    kind: Kind,
    is_mention: bool,
    out: &mut Vec<Pair>,
) -> Result<(), DataFusionError> {
    let int = |i: usize| -> Result<Int64Array, DataFusionError> {
        let a = arrow::compute::cast(b.column(i), &DataType::Int64)?;
        Ok(a.as_primitive::<arrow::datatypes::Int64Type>().clone())
    };
    let (mention, target, n) = (int(0)?, int(1)?, int(3)?);
    let score = arrow::compute::cast(b.column(2), &DataType::Float64)?;
    let score = score.as_primitive::<arrow::datatypes::Float64Type>();
    let names = strings(b.column(4))?;
    let names = names.as_string::<i32>();
    let labels = string_lists(b.column(5))?;
    let labels = labels.as_list::<i32>();
    let ids = string_lists(b.column(6))?;
    let ids = ids.as_list::<i32>();
    for i in 0..b.num_rows() {
        let chain: Vec<String> = if labels.is_null(i) {
            Vec::new()
        } else {
            let l = labels.value(i);
            let l = l.as_string::<i32>();
            l.iter().skip(1).flatten().map(str::to_string).collect()
        };
        let identity: Vec<String> = if ids.is_null(i) {
            Vec::new()
        } else {
            let l = ids.value(i);
            let l = l.as_string::<i32>();
            l.iter().flatten().map(str::to_string).collect()
        };
        let t = target.value(i);
        out.push(Pair {
            mention: mention.value(i) as usize,
            target: if is_mention {
                Target::Mention(t as usize)
            } else {
                Target::Node(t)
            },
            kind,
            score: score.value(i),
            count: n.value(i),
            name: names.value(i).to_string(),
            chain,
            identity,
        });
    }
    Ok(())
}
