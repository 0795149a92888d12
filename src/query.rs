//! SQL over the graph: a DataFusion session with every table registered at
//! the last completed run, plus functions for label and type filters.
//!
//! The functions are plain [`ScalarUDF`]s built from data, so they can be
//! registered on any `SessionContext` (including a distributed one):
//!
//! * `has_label(labels, 'Contract')`: the node carries the label; labels
//!   hold the whole chain, so a parent label matches every subtype node;
//! * `edge_type_matches(relation_type, 'EMPLOYED_BY')`: the relation type is
//!   the type or one of its subtypes, per `edge_type_closure`;
//! * `entity_type_matches(type, 'Contract')`: the same for `nodes.type`,
//!   per `entity_type_closure`;
//! * `json_get_str(attributes, 'status')`: one key of a JSON object column
//!   as text (NULL when absent).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, BooleanBuilder, GenericListArray, OffsetSizeTrait,
    RecordBatch, Scalar, StringArray, StringBuilder,
};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Field, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::DFParser;

use crate::store::rows::{self, ClosureRow};
use crate::store::{GraphStore, Snapshot, StoreError, Table};

/// Errors of the query layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The SQL failed to parse, plan or run; DataFusion's message names the
    /// table or column.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    /// The statement would change something; `graphloom sql` only reads.
    #[error("graphloom sql is read-only: {0} is not allowed (the graph changes only through runs)")]
    ReadOnly(String),
    /// No statement in the input.
    #[error("no SQL statement given")]
    Empty,
    /// The tables could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A query file could not be read.
    #[error("cannot read SQL file {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Results could not be printed.
    #[error("cannot format results: {0}")]
    Format(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Result alias for the query layer.
pub type Result<T, E = QueryError> = std::result::Result<T, E>;

/// A session over one graph, pinned to its last completed run.
pub struct GraphSession {
    ctx: SessionContext,
    snapshot: Snapshot,
}

/// How a session reaches the snapshot's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableAccess {
    /// Delta table providers pinned to the snapshot's versions: the
    /// in-process default.
    Delta,
    /// Plain Parquet listings of the snapshot's data files, which a plan
    /// can carry to other processes (see
    /// [`Snapshot::register_files`](crate::store::Snapshot::register_files)).
    Files,
}

/// Result of one statement.
pub struct StatementResult {
    /// Schema of the result (also for zero rows).
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

impl StatementResult {
    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }
}

impl GraphSession {
    /// Opens the graph's last completed run and registers its tables and
    /// the label functions. DataFusion settings come from `DATAFUSION_*`
    /// environment variables (e.g. `DATAFUSION_EXECUTION_TARGET_PARTITIONS=8`
    /// for `datafusion.execution.target_partitions`); a value DataFusion
    /// does not accept is an error naming it. Join dynamic filters are off
    /// unless the environment turns them on.
    pub async fn open(store: &GraphStore) -> Result<Self> {
        let mut config = SessionConfig::from_env()
            .map_err(|e| e.context("reading DATAFUSION_* settings from the environment"))?;
        // A join's build side pushed into the probe scan as a filter pays
        // off when the build side is small; joins of edges to nodes filtered
        // by type have millions of keys, where re-hashing every probe row
        // cost more than it saved: the edge-family join of `bench sql` took
        // 0.28 s with it and 0.19 s without at 1M nodes, 1.56 s and 0.95 s
        // at 10M. An explicit setting in the environment wins.
        if [
            "DATAFUSION_OPTIMIZER_ENABLE_JOIN_DYNAMIC_FILTER_PUSHDOWN",
            "DATAFUSION_OPTIMIZER_ENABLE_DYNAMIC_FILTER_PUSHDOWN",
        ]
        .iter()
        .all(|v| std::env::var_os(v).is_none())
        {
            config
                .options_mut()
                .optimizer
                .enable_join_dynamic_filter_pushdown = false;
        }
        let ctx = SessionContext::new_with_config(config);
        Self::open_in(store, ctx, TableAccess::Delta).await
    }

    /// Opens the graph's last completed run in a session the caller built
    /// (for example one whose plans run on a Ballista cluster), with the
    /// tables registered as `access` says.
    pub async fn open_in(
        store: &GraphStore,
        ctx: SessionContext,
        access: TableAccess,
    ) -> Result<Self> {
        let snapshot = store.existing_snapshot().await?;
        match access {
            TableAccess::Delta => snapshot.register(&ctx).await?,
            TableAccess::Files => snapshot.register_files(&ctx).await?,
        }
        let entity = closure_map(&snapshot, Table::EntityTypeClosure).await?;
        let edge = closure_map(&snapshot, Table::EdgeTypeClosure).await?;
        register_functions(&ctx, entity, edge);
        Ok(GraphSession { ctx, snapshot })
    }

    /// The DataFusion session, for callers that build their own plans.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The snapshot the session reads.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Runs every statement of `sql` (separated by `;`) read-only.
    pub async fn run(&self, sql: &str) -> Result<Vec<StatementResult>> {
        let statements = DFParser::parse_sql(sql)?;
        if statements.is_empty() {
            return Err(QueryError::Empty);
        }
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let state = self.ctx.state();
        let mut out = Vec::with_capacity(statements.len());
        for statement in statements {
            let plan = state.statement_to_plan(statement).await?;
            if let Err(e) = options.verify_plan(&plan) {
                return Err(QueryError::ReadOnly(read_only_reason(&e)));
            }
            let df = self.ctx.execute_logical_plan(plan).await?;
            let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await?;
            out.push(StatementResult { schema, batches });
        }
        Ok(out)
    }
}

fn read_only_reason(e: &DataFusionError) -> String {
    let msg = e.to_string();
    // DataFusion says e.g. "DDL not supported: CreateMemoryTable"; keep the
    // part that names the statement.
    match msg.split_once("Error during planning: ") {
        Some((_, rest)) => rest.to_string(),
        None => msg,
    }
}

async fn closure_map(
    snapshot: &Snapshot,
    table: Table,
) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let batches = snapshot.read(table).await?;
    let rows: Vec<ClosureRow> = rows::from_batches(table, &batches)?;
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in rows {
        map.entry(r.ancestor).or_default().insert(r.descendant);
    }
    Ok(map)
}

pub use crate::scratch::register_column;

/// Registers `has_label`, `edge_type_matches`, `entity_type_matches` and
/// `json_get_str` on `ctx`. The closures map each type to itself and every
/// subtype; types missing from them match only themselves.
pub fn register_functions(
    ctx: &SessionContext,
    entity_closure: BTreeMap<String, BTreeSet<String>>,
    edge_closure: BTreeMap<String, BTreeSet<String>>,
) {
    ctx.register_udf(ScalarUDF::new_from_impl(HasLabel::new()));
    ctx.register_udf(ScalarUDF::new_from_impl(TypeMatches::new(
        "edge_type_matches",
        edge_closure,
    )));
    ctx.register_udf(ScalarUDF::new_from_impl(TypeMatches::new(
        "entity_type_matches",
        entity_closure,
    )));
    ctx.register_udf(ScalarUDF::new_from_impl(JsonGetStr::new()));
}

/// What another process needs to rebuild one of the functions
/// [`register_functions`] registers (the type closures they carry), or
/// `None` for any other function. A plan that travels to a cluster carries
/// these bytes with each call, so executors need no copy of the graph's
/// ontology.
pub fn function_state(udf: &ScalarUDF) -> Option<Vec<u8>> {
    let inner = udf.inner();
    let state = if let Some(t) = inner.downcast_ref::<TypeMatches>() {
        FunctionState::TypeMatches {
            name: t.name.to_string(),
            closure: t.closure.clone(),
        }
    } else if inner.downcast_ref::<HasLabel>().is_some() {
        FunctionState::HasLabel
    } else if inner.downcast_ref::<JsonGetStr>().is_some() {
        FunctionState::JsonGetStr
    } else {
        return None;
    };
    serde_json::to_vec(&state).ok()
}

/// Rebuilds a function from [`function_state`]'s bytes; `None` when the
/// bytes are not one of this module's functions.
pub fn function_from_state(state: &[u8]) -> Option<ScalarUDF> {
    let state: FunctionState = serde_json::from_slice(state).ok()?;
    Some(match state {
        FunctionState::HasLabel => ScalarUDF::new_from_impl(HasLabel::new()),
        FunctionState::JsonGetStr => ScalarUDF::new_from_impl(JsonGetStr::new()),
        FunctionState::TypeMatches { name, closure } => {
            let name = match name.as_str() {
                "edge_type_matches" => "edge_type_matches",
                "entity_type_matches" => "entity_type_matches",
                _ => return None,
            };
            ScalarUDF::new_from_impl(TypeMatches::new(name, closure))
        }
    })
}

/// The serialized form of the query functions (tagged, so that other
/// modules' function states never parse as one of these).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "graphloom_query_function")]
enum FunctionState {
    HasLabel,
    JsonGetStr,
    TypeMatches {
        name: String,
        closure: BTreeMap<String, BTreeSet<String>>,
    },
}

fn exec_err(msg: String) -> DataFusionError {
    DataFusionError::Execution(msg)
}

/// Casts an argument to `to` and expands it to an array of `rows` rows.
fn arg_array(
    arg: &ColumnarValue,
    to: &DataType,
    rows: usize,
) -> datafusion::error::Result<ArrayRef> {
    let array = arg.to_array(rows)?;
    Ok(arrow::compute::cast(&array, to)?)
}

fn utf8_list() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

/// `has_label(labels, label)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct HasLabel {
    signature: Signature,
}

impl HasLabel {
    fn new() -> Self {
        HasLabel {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for HasLabel {
    fn name(&self) -> &str {
        "has_label"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::error::Result<DataType> {
        if !matches!(
            args[0],
            DataType::List(_) | DataType::LargeList(_) | DataType::Null
        ) {
            return Err(DataFusionError::Plan(format!(
                "has_label expects a list of labels (e.g. nodes.labels) as its first argument, got {}",
                args[0]
            )));
        }
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let rows = args.number_rows;
        // The common case is a literal label: one comparison kernel over all
        // labels of the batch instead of a list slice per row.
        if let ColumnarValue::Scalar(wanted) = &args.args[1] {
            if wanted.is_null() {
                return Ok(ColumnarValue::Scalar(ScalarValue::Boolean(None)));
            }
            let labels = args.args[0].to_array(rows)?;
            if let Some(out) = lists_containing(&labels, wanted)? {
                return Ok(ColumnarValue::Array(Arc::new(out)));
            }
        }
        let labels = arg_array(&args.args[0], &utf8_list(), rows)?;
        let wanted = arg_array(&args.args[1], &DataType::Utf8, rows)?;
        let labels = labels.as_list::<i32>();
        let wanted: &StringArray = wanted.as_string::<i32>();
        let mut out = BooleanBuilder::with_capacity(rows);
        for i in 0..rows {
            if labels.is_null(i) || wanted.is_null(i) {
                out.append_null();
                continue;
            }
            let row = labels.value(i);
            let row = row.as_string::<i32>();
            let w = wanted.value(i);
            out.append_value(row.iter().any(|l| l == Some(w)));
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// The string types the functions compare in place, without a cast.
fn is_text(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// For each list of `lists`, whether it holds `wanted` (null for a null
/// list); `None` when `lists` is not a list of values `wanted` converts to,
/// so the caller falls back to casting.
fn lists_containing(
    lists: &ArrayRef,
    wanted: &ScalarValue,
) -> datafusion::error::Result<Option<BooleanArray>> {
    match lists.data_type() {
        DataType::List(_) => lists_containing_in(lists.as_list::<i32>(), wanted),
        DataType::LargeList(_) => lists_containing_in(lists.as_list::<i64>(), wanted),
        _ => Ok(None),
    }
}

fn lists_containing_in<O: OffsetSizeTrait>(
    lists: &GenericListArray<O>,
    wanted: &ScalarValue,
) -> datafusion::error::Result<Option<BooleanArray>> {
    let offsets = lists.value_offsets();
    let first = offsets[0].as_usize();
    let last = offsets[lists.len()].as_usize();
    // A sliced list still points into its whole values array: compare only
    // the part its rows use.
    let values = lists.values().slice(first, last - first);
    // The needle takes the values' own string type (Utf8, LargeUtf8 or
    // Utf8View, as the Parquet reader chose), so nothing is cast per row.
    if !is_text(values.data_type()) {
        return Ok(None);
    }
    let Ok(needle) = wanted.cast_to(values.data_type()) else {
        return Ok(None);
    };
    let hits = arrow::compute::kernels::cmp::eq(&values, &Scalar::new(needle.to_array()?))?;
    // A null label equals nothing.
    let hits = match hits.nulls() {
        Some(valid) => hits.values() & valid.inner(),
        None => hits.values().clone(),
    };
    let found = BooleanBuffer::collect_bool(lists.len(), |row| {
        let start = offsets[row].as_usize() - first;
        let end = offsets[row + 1].as_usize() - first;
        (start..end).any(|i| hits.value(i))
    });
    Ok(Some(BooleanArray::new(found, lists.nulls().cloned())))
}

/// `edge_type_matches(relation_type, type)` / `entity_type_matches(type, type)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TypeMatches {
    name: &'static str,
    signature: Signature,
    closure: BTreeMap<String, BTreeSet<String>>,
}

impl TypeMatches {
    fn new(name: &'static str, closure: BTreeMap<String, BTreeSet<String>>) -> Self {
        TypeMatches {
            name,
            signature: Signature::any(2, Volatility::Immutable),
            closure,
        }
    }

    fn matches(&self, value: &str, wanted: &str) -> bool {
        value == wanted || self.closure.get(wanted).is_some_and(|d| d.contains(value))
    }
}

impl ScalarUDFImpl for TypeMatches {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Boolean)
    }

    /// With a literal type name the call becomes `value IN (type, subtypes…)`:
    /// DataFusion evaluates that with a hash set, prunes row groups by their
    /// statistics, and ships it to a cluster as a plain expression.
    fn simplify(
        &self,
        mut args: Vec<Expr>,
        info: &SimplifyContext,
    ) -> datafusion::error::Result<ExprSimplifyResult> {
        let Expr::Literal(wanted, _) = &args[1] else {
            return Ok(ExprSimplifyResult::Original(args));
        };
        let wanted = match wanted.cast_to(&DataType::Utf8) {
            Ok(ScalarValue::Utf8(Some(w))) => w,
            Ok(ScalarValue::Utf8(None)) => {
                return Ok(ExprSimplifyResult::Simplified(Expr::Literal(
                    ScalarValue::Boolean(None),
                    None,
                )));
            }
            _ => return Ok(ExprSimplifyResult::Original(args)),
        };
        let value_type = info.get_data_type(&args[0])?;
        if !is_text(&value_type) {
            return Ok(ExprSimplifyResult::Original(args));
        }
        let mut names: BTreeSet<&str> = BTreeSet::from([wanted.as_str()]);
        if let Some(descendants) = self.closure.get(&wanted) {
            names.extend(descendants.iter().map(String::as_str));
        }
        let list = names
            .into_iter()
            .map(|n| {
                ScalarValue::Utf8(Some(n.to_string()))
                    .cast_to(&value_type)
                    .map(|v| Expr::Literal(v, None))
            })
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let value = args.swap_remove(0);
        Ok(ExprSimplifyResult::Simplified(Expr::InList(InList::new(
            Box::new(value),
            list,
            false,
        ))))
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let rows = args.number_rows;
        // A literal type name is normally rewritten by `simplify`; plans
        // built without the simplifier still come here: look its set up once.
        if let ColumnarValue::Scalar(s) = &args.args[1] {
            let wanted = match s.cast_to(&DataType::Utf8)? {
                ScalarValue::Utf8(Some(w)) => w,
                ScalarValue::Utf8(None) => {
                    return Ok(ColumnarValue::Scalar(ScalarValue::Boolean(None)));
                }
                other => {
                    return Err(exec_err(format!(
                        "{}: unexpected type name {other}",
                        self.name
                    )));
                }
            };
            let values = arg_array(&args.args[0], &DataType::Utf8, rows)?;
            let values = values.as_string::<i32>();
            let out: BooleanArray = values
                .iter()
                .map(|v| v.map(|v| self.matches(v, &wanted)))
                .collect();
            return Ok(ColumnarValue::Array(Arc::new(out)));
        }
        let values = arg_array(&args.args[0], &DataType::Utf8, rows)?;
        let wanted = arg_array(&args.args[1], &DataType::Utf8, rows)?;
        let (values, wanted) = (values.as_string::<i32>(), wanted.as_string::<i32>());
        let out: BooleanArray = values
            .iter()
            .zip(wanted.iter())
            .map(|(v, w)| Some(self.matches(v?, w?)))
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `json_get_str(json_text, key)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonGetStr {
    signature: Signature,
}

impl JsonGetStr {
    fn new() -> Self {
        JsonGetStr {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for JsonGetStr {
    fn name(&self) -> &str {
        "json_get_str"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let rows = args.number_rows;
        let docs = arg_array(&args.args[0], &DataType::Utf8, rows)?;
        let keys = arg_array(&args.args[1], &DataType::Utf8, rows)?;
        let (docs, keys) = (docs.as_string::<i32>(), keys.as_string::<i32>());
        let mut out = StringBuilder::with_capacity(rows, rows * 8);
        for (doc, key) in docs.iter().zip(keys.iter()) {
            let value = match (doc, key) {
                (Some(doc), Some(key)) => serde_json::from_str::<serde_json::Value>(doc)
                    .ok()
                    .and_then(|v| v.get(key).cloned())
                    .and_then(|v| match v {
                        serde_json::Value::Null => None,
                        serde_json::Value::String(s) => Some(s),
                        other => Some(other.to_string()),
                    }),
                _ => None,
            };
            out.append_option(value);
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// Output formats of `graphloom sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum OutputFormat {
    /// An aligned text table.
    Table,
    /// CSV with a header row; lists are written as `[a, b]`.
    Csv,
    /// A JSON array of objects per statement.
    Json,
}

/// Renders one statement's result.
pub fn render(result: &StatementResult, format: OutputFormat) -> Result<String> {
    let fmt_err = |e: arrow::error::ArrowError| QueryError::Format(e.into());
    match format {
        OutputFormat::Table => {
            let table = arrow::util::pretty::pretty_format_batches_with_schema(
                result.schema.clone(),
                &result.batches,
            )
            .map_err(fmt_err)?;
            let n = result.num_rows();
            Ok(format!(
                "{table}\n({n} row{})\n",
                if n == 1 { "" } else { "s" }
            ))
        }
        OutputFormat::Csv => {
            let mut out = String::new();
            let header: Vec<String> = result
                .schema
                .fields()
                .iter()
                .map(|f| csv_cell(f.name()))
                .collect();
            out.push_str(&header.join(","));
            out.push('\n');
            let options = FormatOptions::default().with_null("");
            for batch in &result.batches {
                let formatters = batch
                    .columns()
                    .iter()
                    .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(fmt_err)?;
                for row in 0..batch.num_rows() {
                    let cells: Vec<String> = formatters
                        .iter()
                        .map(|f| csv_cell(&f.value(row).to_string()))
                        .collect();
                    let _ = writeln!(out, "{}", cells.join(","));
                }
            }
            Ok(out)
        }
        OutputFormat::Json => {
            let mut writer = arrow::json::ArrayWriter::new(Vec::new());
            for batch in &result.batches {
                writer.write(batch).map_err(fmt_err)?;
            }
            writer.finish().map_err(fmt_err)?;
            let mut text =
                String::from_utf8(writer.into_inner()).map_err(|e| QueryError::Format(e.into()))?;
            if text.is_empty() {
                text.push_str("[]");
            }
            text.push('\n');
            Ok(text)
        }
    }
}

fn csv_cell(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::FunctionRegistry;

    #[tokio::test]
    async fn functions_rebuilt_from_their_state_answer_as_the_originals() {
        let ctx = SessionContext::new();
        let entity = BTreeMap::from([(
            "Contract".to_string(),
            BTreeSet::from(["Contract".to_string(), "MSA".to_string()]),
        )]);
        register_functions(&ctx, entity, BTreeMap::new());
        let rebuilt = SessionContext::new();
        for name in [
            "has_label",
            "entity_type_matches",
            "edge_type_matches",
            "json_get_str",
        ] {
            let udf = ctx.udf(name).expect("registered");
            let state = function_state(&udf).expect("a query function");
            let again = function_from_state(&state).expect("its state parses");
            assert_eq!(again.name(), name);
            rebuilt.register_udf(again);
        }
        // Not one of ours: no state, and no bytes parse as ours.
        assert!(function_state(&ctx.udf("abs").expect("built in")).is_none());
        assert!(function_from_state(b"{\"other\": 1}").is_none());
        let sql = "SELECT entity_type_matches('MSA', 'Contract') AS a, \
                   entity_type_matches('MSA', 'Person') AS b, \
                   has_label(['Contract', 'MSA'], 'MSA') AS c, \
                   json_get_str('{\"status\": \"open\"}', 'status') AS d";
        let show = |batches: Vec<RecordBatch>| {
            arrow::util::pretty::pretty_format_batches(&batches)
                .expect("format")
                .to_string()
        };
        let a = show(
            ctx.sql(sql)
                .await
                .expect("plan")
                .collect()
                .await
                .expect("run"),
        );
        let b = show(
            rebuilt
                .sql(sql)
                .await
                .expect("plan")
                .collect()
                .await
                .expect("run"),
        );
        assert_eq!(a, b);
        assert!(a.contains("| true | false | true | open |"), "{a}");
    }

    /// Lists with a null list, an empty list, a null label, and labels
    /// before and after the wanted one.
    fn label_rows() -> Vec<Option<Vec<Option<&'static str>>>> {
        vec![
            Some(vec![Some("Contract"), Some("MSA")]),
            None,
            Some(vec![]),
            Some(vec![None, Some("Contract")]),
            Some(vec![Some("Person")]),
            Some(vec![Some("Party"), Some("Contractor")]),
            Some(vec![Some("Contract")]),
        ]
    }

    fn utf8_lists(rows: &[Option<Vec<Option<&str>>>]) -> ArrayRef {
        let mut builder = arrow::array::ListBuilder::new(StringBuilder::new());
        for row in rows {
            match row {
                Some(labels) => {
                    for l in labels {
                        builder.values().append_option(*l);
                    }
                    builder.append(true);
                }
                None => builder.append(false),
            }
        }
        Arc::new(builder.finish())
    }

    #[test]
    fn has_label_kernel_answers_as_row_by_row_for_every_list_and_string_type() {
        let rows = label_rows();
        let expected = |rows: &[Option<Vec<Option<&str>>>], wanted: &str| -> Vec<Option<bool>> {
            rows.iter()
                .map(|r| r.as_ref().map(|ls| ls.contains(&Some(wanted))))
                .collect()
        };
        let base = utf8_lists(&rows);
        let item = |t: DataType| Arc::new(Field::new("item", t, true));
        let shapes = [
            DataType::List(item(DataType::Utf8)),
            DataType::List(item(DataType::Utf8View)),
            DataType::List(item(DataType::LargeUtf8)),
            DataType::LargeList(item(DataType::Utf8)),
            DataType::LargeList(item(DataType::Utf8View)),
        ];
        for shape in shapes {
            let lists = arrow::compute::cast(&base, &shape).expect("cast lists");
            for wanted in ["Contract", "MSA", "Contractor", "Nothing"] {
                let scalar = ScalarValue::Utf8(Some(wanted.to_string()));
                let got = lists_containing(&lists, &scalar)
                    .expect("kernel")
                    .expect("a list of strings");
                let got: Vec<Option<bool>> = got.iter().collect();
                assert_eq!(got, expected(&rows, wanted), "{shape} / {wanted}");
                // A slice keeps its parent's values: only its rows count.
                let sliced = lists.slice(2, 4);
                let got = lists_containing(&sliced, &scalar)
                    .expect("kernel")
                    .expect("a list of strings");
                let got: Vec<Option<bool>> = got.iter().collect();
                assert_eq!(
                    got,
                    expected(&rows[2..6], wanted),
                    "sliced {shape} / {wanted}"
                );
            }
        }
        // Not a list of strings: the caller falls back to casting.
        let ints = arrow::array::ListArray::from_iter_primitive::<arrow::datatypes::Int32Type, _, _>(
            vec![Some(vec![Some(1)])],
        );
        let none = lists_containing(&(Arc::new(ints) as ArrayRef), &ScalarValue::from("1"))
            .expect("no error");
        assert!(none.is_none());
    }

    /// A session with the functions and a table `t` of labels and types,
    /// its string columns as `Utf8View` (what the Parquet reader yields).
    async fn typed_session() -> SessionContext {
        use arrow::datatypes::Schema;
        let ctx = SessionContext::new();
        let entity = BTreeMap::from([(
            "Contract".to_string(),
            BTreeSet::from(["MSA".to_string(), "OrderForm".to_string()]),
        )]);
        register_functions(&ctx, entity, BTreeMap::new());
        let rows = label_rows();
        let labels = arrow::compute::cast(
            &utf8_lists(&rows),
            &DataType::List(Arc::new(Field::new("item", DataType::Utf8View, true))),
        )
        .expect("cast");
        let types = [
            "MSA",
            "Person",
            "Contract",
            "OrderForm",
            "Party",
            "Contractor",
            "MSA",
        ];
        let nullable_types: ArrayRef = Arc::new(StringArray::from(vec![
            Some("MSA"),
            None,
            Some("Contract"),
            Some("OrderForm"),
            None,
            Some("Contractor"),
            Some("Person"),
        ]));
        let view: ArrayRef = Arc::new(arrow::array::StringViewArray::from(types.to_vec()));
        let wanted: ArrayRef = Arc::new(StringArray::from(vec!["Contract"; types.len()]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("labels", labels.data_type().clone(), true),
            Field::new("v", DataType::Utf8, true),
            Field::new("u", DataType::Utf8View, false),
            Field::new("w", DataType::Utf8, false),
        ]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![labels, nullable_types, view, wanted])
                .expect("batch");
        let table =
            datafusion::datasource::MemTable::try_new(schema, vec![vec![batch]]).expect("table");
        ctx.register_table("t", Arc::new(table)).expect("register");
        ctx
    }

    /// `EXPLAIN sql` as text.
    async fn explain(ctx: &SessionContext, sql: &str) -> String {
        let plan = ctx
            .sql(&format!("EXPLAIN {sql}"))
            .await
            .expect("plan")
            .collect()
            .await
            .expect("explain");
        arrow::util::pretty::pretty_format_batches(&plan)
            .expect("format")
            .to_string()
    }

    async fn column_values(ctx: &SessionContext, sql: &str) -> Vec<Vec<Option<bool>>> {
        let batches = ctx
            .sql(sql)
            .await
            .expect("plan")
            .collect()
            .await
            .expect("run");
        let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("concat");
        batch
            .columns()
            .iter()
            .map(|c| c.as_boolean().iter().collect())
            .collect()
    }

    #[tokio::test]
    async fn type_filters_with_a_literal_become_in_lists_that_answer_as_the_closure() {
        let ctx = typed_session().await;
        // Column `w` holds the same type name per row, so its calls take
        // the row-by-row path: the reference for the rewritten literal calls.
        let cols = column_values(
            &ctx,
            "SELECT entity_type_matches(v, 'Contract'), entity_type_matches(v, w), \
                    entity_type_matches(u, 'Contract'), entity_type_matches(u, w), \
                    entity_type_matches(v, NULL) FROM t",
        )
        .await;
        assert_eq!(cols[0], cols[1], "nullable Utf8 column");
        assert_eq!(cols[2], cols[3], "non-null Utf8View column");
        assert_eq!(cols[3].iter().filter(|b| **b == Some(true)).count(), 4);
        assert!(
            cols[4].iter().all(Option::is_none),
            "NULL type matches nothing"
        );
        let plan = explain(
            &ctx,
            "SELECT count(*) FROM t WHERE entity_type_matches(u, 'Contract')",
        )
        .await;
        // The planner sees the closure's names (as an IN list, or as ORs
        // for a list this short), not an opaque function.
        assert!(!plan.contains("entity_type_matches"), "{plan}");
        assert!(plan.contains("MSA") && plan.contains("OrderForm"), "{plan}");
    }

    #[tokio::test]
    async fn has_label_in_a_plan_answers_for_literal_null_and_column_labels() {
        let ctx = typed_session().await;
        let cols = column_values(
            &ctx,
            "SELECT has_label(labels, 'Contract'), has_label(labels, w), \
                    has_label(labels, NULL) FROM t",
        )
        .await;
        assert_eq!(cols[0], cols[1]);
        assert_eq!(
            cols[0],
            label_rows()
                .iter()
                .map(|r| r.as_ref().map(|ls| ls.contains(&Some("Contract"))))
                .collect::<Vec<_>>()
        );
        assert!(cols[2].iter().all(Option::is_none));
    }

    #[tokio::test]
    async fn a_type_filter_wrapped_to_travel_still_becomes_an_in_list() {
        let ctx = typed_session().await;
        let udf = ctx.udf("entity_type_matches").expect("registered");
        let wrapped =
            crate::portable::wrap(udf.as_ref().clone(), "query", Arc::from(&b"unused"[..]));
        ctx.register_udf(wrapped);
        let plan = explain(
            &ctx,
            "SELECT count(*) FROM t WHERE entity_type_matches(u, 'Contract')",
        )
        .await;
        assert!(!plan.contains("entity_type_matches"), "{plan}");
        assert!(plan.contains("OrderForm"), "{plan}");
    }
}
