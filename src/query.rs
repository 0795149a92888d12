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
    Array, ArrayRef, AsArray, BooleanArray, BooleanBuilder, RecordBatch, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Field, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;
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
    /// the label functions.
    pub async fn open(store: &GraphStore) -> Result<Self> {
        Self::open_in(store, SessionContext::new(), TableAccess::Delta).await
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

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let rows = args.number_rows;
        // The common case is a literal type name: look its set up once.
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
}
