//! Record linkage: `[[resolve.linkage]]` rules for entity types whose
//! mentions carry fields worth comparing (records mapped from CRM, HR or
//! registry tables), as DataFusion plans.
//!
//! * **blocking**: every mention and node of a linked type gets one key per
//!   blocking rule it has all fields for (`surname:3+postcode` → the first
//!   three folded characters of the surname and the folded postcode); two
//!   rows sharing a key are a candidate pair. Keys are salted with the
//!   group and the rule, so one equi-join finds the pairs of every rule;
//!   keys shared by more than `max_block` rows are skipped.
//! * **scoring**: the weighted mean of the field comparisons both sides
//!   have a value for, or with `model = "probabilistic"` the
//!   Fellegi-Sunter match probability, trained on the run's candidate
//!   pairs before they are scored ([`super::probabilistic`]).
//!
//! A type with a linkage is matched by it alone: its mentions take no part
//! in the name, identity, fuzzy and partial joins as probes (they would
//! merge two people called "John Smith" who differ in every field).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, ListArray, ListBuilder, PrimitiveArray,
    StringBuilder,
};
use arrow::datatypes::{ArrowPrimitiveType, DataType};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, ScalarUDF, Volatility, create_udf};
use datafusion::prelude::SessionContext;
use serde_json::{Map, Value};

use super::compare::similarity;
use super::mentions::{
    Kind, MENTIONS_TABLE, MentionKey, Pair, decode_pairs, list_of, string_lists, strings,
};
use super::probabilistic::{self, Model, NULL_LEVEL};
use crate::scratch::materialize;
use crate::spec::resolve::{CompareSpec, LinkageModel, LinkageSpec, parse_block_key};
use crate::text::normalize_name;

/// One `[[resolve.linkage]]`, ready to key and score.
#[derive(Debug, Clone, PartialEq)]
pub struct Linkage {
    /// The type it matches (and its subtypes: every row whose labels hold it).
    pub entity_type: String,
    blocks: Vec<Vec<(String, Option<usize>)>>,
    compare: Vec<CompareSpec>,
    /// Score at or above which a pair merges.
    pub threshold: f64,
    /// Lower end of the grey band.
    pub grey: f64,
    min_fields: usize,
    max_block: usize,
    model: LinkageModel,
    u_sample_pairs: usize,
    /// The probabilistic model once trained on a run's records.
    trained: Option<Arc<Model>>,
}

impl Linkage {
    /// The rule of a checked spec (bad blocking keys were refused when the
    /// spec was read; one that slips through gives no keys).
    pub fn new(spec: &LinkageSpec) -> Self {
        Linkage {
            entity_type: spec.entity_type.clone(),
            blocks: spec
                .blocking
                .iter()
                .map(|k| parse_block_key(k).unwrap_or_default())
                .collect(),
            compare: spec.compare.clone(),
            threshold: spec.threshold,
            grey: spec.grey_band_min.unwrap_or(spec.threshold),
            min_fields: spec.min_fields,
            max_block: spec.max_block,
            model: spec.model,
            u_sample_pairs: spec.u_sample_pairs,
            trained: None,
        }
    }

    /// The rule with a trained probabilistic model.
    pub fn with_model(&self, model: Model) -> Self {
        Linkage {
            trained: Some(Arc::new(model)),
            ..self.clone()
        }
    }

    /// Its trained probabilistic model, if any.
    pub fn trained(&self) -> Option<&Model> {
        self.trained.as_deref()
    }

    /// Whether the rule scores with the probabilistic model.
    pub fn is_probabilistic(&self) -> bool {
        self.model == LinkageModel::Probabilistic
    }

    /// The level of each comparison for two rows ([`NULL_LEVEL`] where a
    /// side has no value), packed; None with fewer than `min_fields`
    /// comparisons made.
    pub fn pattern(
        &self,
        a: (&str, &Map<String, Value>),
        b: (&str, &Map<String, Value>),
    ) -> Option<u64> {
        self.pattern_of(&self.values(a.0, a.1), &self.values(b.0, b.1))
    }

    /// [`Linkage::pattern`] of two rows' [`Linkage::values`].
    fn pattern_of(&self, a: &[Option<String>], b: &[Option<String>]) -> Option<u64> {
        let mut made = 0;
        let levels = self
            .compare
            .iter()
            .zip(a.iter().zip(b))
            .map(|(c, pair)| match pair {
                (Some(x), Some(y)) => {
                    made += 1;
                    probabilistic::level(c, x, y)
                }
                _ => NULL_LEVEL,
            });
        let p = probabilistic::pack(levels);
        (made >= self.min_fields).then_some(p)
    }

    /// The score of two parsed rows (the values already read).
    fn score_rows(&self, a: &LinkedRow, b: &LinkedRow) -> f64 {
        if self.is_probabilistic() {
            return match (self.trained(), self.pattern_of(&a.values, &b.values)) {
                (Some(model), Some(p)) => model.probability(p),
                _ => 0.0,
            };
        }
        self.score((&a.name, &a.attributes), (&b.name, &b.attributes))
    }

    /// Each comparison's value in one row (a pool row for u sampling).
    fn values(&self, name: &str, attributes: &Map<String, Value>) -> Vec<Option<String>> {
        self.compare
            .iter()
            .map(|c| value(name, attributes, &c.field))
            .collect()
    }

    /// The blocking keys of one row, without salt: `<rule>\x1f<values>`.
    pub fn keys(&self, name: &str, attributes: &Map<String, Value>) -> Vec<String> {
        let mut out = Vec::new();
        'rules: for (i, parts) in self.blocks.iter().enumerate() {
            let mut key = i.to_string();
            for (field, prefix) in parts {
                let Some(v) = value(name, attributes, field) else {
                    continue 'rules;
                };
                let folded = normalize_name(&v);
                if folded.is_empty() {
                    continue 'rules;
                }
                key.push('\u{1f}');
                match prefix {
                    Some(n) => key.extend(folded.chars().take(*n)),
                    None => key.push_str(&folded),
                }
            }
            out.push(key);
        }
        out
    }

    /// The score of two rows (name and attributes each), 0 with fewer
    /// than `min_fields` comparisons both have a value for: the weighted
    /// mean of the comparisons, or the match probability of the trained
    /// probabilistic model (0 before training).
    pub fn score(&self, a: (&str, &Map<String, Value>), b: (&str, &Map<String, Value>)) -> f64 {
        if self.is_probabilistic() {
            return match (self.trained(), self.pattern(a, b)) {
                (Some(model), Some(p)) => model.probability(p),
                _ => 0.0,
            };
        }
        let (mut sum, mut weight, mut fields) = (0.0, 0.0, 0usize);
        for c in &self.compare {
            let (Some(x), Some(y)) = (value(a.0, a.1, &c.field), value(b.0, b.1, &c.field)) else {
                continue;
            };
            sum += c.weight * similarity(c.method, &x, &y);
            weight += c.weight;
            fields += 1;
        }
        if fields < self.min_fields || weight == 0.0 {
            0.0
        } else {
            sum / weight
        }
    }
}

/// A field's text: `name` is the entity's name, anything else a property
/// (strings, numbers and booleans; empty strings count as absent).
fn value(name: &str, attributes: &Map<String, Value>, field: &str) -> Option<String> {
    let v = if field == "name" {
        name.trim().to_string()
    } else {
        match attributes.get(field)? {
            Value::String(s) => s.trim().to_string(),
            v @ (Value::Number(_) | Value::Bool(_)) => v.to_string(),
            _ => return None,
        }
    };
    (!v.is_empty()).then_some(v)
}

/// The index of the first rule whose type is among `types` (a row's
/// labels, or a mention's chain).
fn rule_of<'t>(
    linkages: &[Linkage],
    types: impl Iterator<Item = &'t str> + Clone,
) -> Option<usize> {
    linkages
        .iter()
        .position(|l| types.clone().any(|t| t == l.entity_type))
}

/// [`rule_of`] for row `i` of a labels column.
fn rule_of_row(linkages: &[Linkage], labels: &ListArray, i: usize) -> Option<usize> {
    if labels.is_null(i) {
        return None;
    }
    let row = labels.value(i);
    rule_of(linkages, row.as_string::<i32>().iter().flatten())
}

fn attributes_of(text: Option<&str>) -> Map<String, Value> {
    match text.map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    }
}

/// A linked row as the pair UDFs read it: its rule's index, name,
/// attributes and the values its rule compares.
struct LinkedRow {
    at: usize,
    name: String,
    attributes: Map<String, Value>,
    values: Vec<Option<String>>,
}

impl LinkedRow {
    fn new(linkages: &[Linkage], at: usize, name: &str, attributes: Map<String, Value>) -> Self {
        LinkedRow {
            at,
            name: name.to_string(),
            values: linkages[at].values(name, &attributes),
            attributes,
        }
    }
}

/// The run's mentions as the pair UDFs read them: `Some` for each mention
/// under a rule, parsed once. Pairs are scored by mention id, so the joins
/// carry ids, not the mentions' attribute texts (a million mentions'
/// pairs with both sides' JSON overflowed a string column's 2 GiB
/// offsets).
fn linked_rows(linkages: &[Linkage], mentions: &[MentionKey]) -> Vec<Option<LinkedRow>> {
    mentions
        .iter()
        .map(|m| {
            let at = rule_of(linkages, m.chain.iter().map(String::as_str))?;
            Some(LinkedRow::new(
                linkages,
                at,
                &m.name,
                attributes_of(Some(&m.attributes)),
            ))
        })
        .collect()
}

fn ids(a: &ArrayRef) -> Result<Int64Array, DataFusionError> {
    let a = arrow::compute::cast(a, &DataType::Int64)?;
    Ok(a.as_primitive::<arrow::datatypes::Int64Type>().clone())
}

/// What a pair UDF computes for two rows of one rule.
type PairFn<T> = dyn Fn(&Linkage, &LinkedRow, &LinkedRow) -> Option<T> + Send + Sync;

/// `name(a, b)`: `f` over two of the run's mentions by position.
fn mention_pair_udf<T: ArrowPrimitiveType>(
    name: &str,
    all: &Arc<Vec<Linkage>>,
    rows: &Arc<Vec<Option<LinkedRow>>>,
    f: Arc<PairFn<T::Native>>,
) -> ScalarUDF {
    let (all, rows) = (Arc::clone(all), Arc::clone(rows));
    create_udf(
        name,
        vec![DataType::Int64, DataType::Int64],
        T::DATA_TYPE,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (a, b) = (ids(&arrays[0])?, ids(&arrays[1])?);
            let row = |i: i64| rows.get(usize::try_from(i).ok()?)?.as_ref();
            let out: PrimitiveArray<T> = a
                .iter()
                .zip(b.iter())
                .map(|(x, y)| {
                    let (a, b) = (row(x?)?, row(y?)?);
                    f(&all[a.at], a, b)
                })
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    )
}

/// `name(mention, name, attributes)`: `f` over a mention and a node's name
/// and attributes.
fn node_pair_udf<T: ArrowPrimitiveType>(
    name: &str,
    all: &Arc<Vec<Linkage>>,
    rows: &Arc<Vec<Option<LinkedRow>>>,
    f: Arc<PairFn<T::Native>>,
) -> ScalarUDF {
    let (all, rows) = (Arc::clone(all), Arc::clone(rows));
    create_udf(
        name,
        vec![DataType::Int64, DataType::Utf8, DataType::Utf8],
        T::DATA_TYPE,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let a = ids(&arrays[0])?;
            let (names, attrs) = (strings(&arrays[1])?, strings(&arrays[2])?);
            let (names, attrs) = (names.as_string::<i32>(), attrs.as_string::<i32>());
            let out: PrimitiveArray<T> = (0..a.len())
                .map(|i| {
                    let m = rows
                        .get(usize::try_from(a.is_valid(i).then(|| a.value(i))?).ok()?)?
                        .as_ref()?;
                    let name = names.is_valid(i).then(|| names.value(i))?;
                    let attributes = attributes_of(attrs.is_valid(i).then(|| attrs.value(i)));
                    f(&all[m.at], m, &LinkedRow::new(&all, m.at, name, attributes))
                })
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    )
}

/// The UDFs that read a row's rule alone:
/// `linkage_of(labels)` (index of the row's rule, null for none),
/// `linkage_keys(labels, group, name, attributes)` (salted keys) and
/// `linkage_cap(key)` (the key's `max_block`).
pub fn udfs(linkages: &[Linkage]) -> Vec<ScalarUDF> {
    let all = Arc::new(linkages.to_vec());
    let of = {
        let all = Arc::clone(&all);
        create_udf(
            "linkage_of",
            vec![list_of(DataType::Utf8)],
            DataType::Int64,
            Volatility::Immutable,
            Arc::new(move |args: &[ColumnarValue]| {
                let arrays = ColumnarValue::values_to_arrays(args)?;
                let labels = string_lists(&arrays[0])?;
                let labels = labels.as_list::<i32>();
                let out: Int64Array = (0..labels.len())
                    .map(|i| rule_of_row(&all, labels, i).map(|at| at as i64))
                    .collect();
                Ok(ColumnarValue::Array(Arc::new(out)))
            }),
        )
    };
    let keys = {
        let all = Arc::clone(&all);
        create_udf(
            "linkage_keys",
            vec![
                list_of(DataType::Utf8),
                DataType::Utf8,
                DataType::Utf8,
                DataType::Utf8,
            ],
            list_of(DataType::Utf8),
            Volatility::Immutable,
            Arc::new(move |args: &[ColumnarValue]| {
                let arrays = ColumnarValue::values_to_arrays(args)?;
                let labels = string_lists(&arrays[0])?;
                let labels = labels.as_list::<i32>();
                let (groups, names, attrs) = (
                    strings(&arrays[1])?,
                    strings(&arrays[2])?,
                    strings(&arrays[3])?,
                );
                let (groups, names, attrs) = (
                    groups.as_string::<i32>(),
                    names.as_string::<i32>(),
                    attrs.as_string::<i32>(),
                );
                let mut out = ListBuilder::new(StringBuilder::new());
                for i in 0..labels.len() {
                    if let (Some(at), false, false) = (
                        rule_of_row(&all, labels, i),
                        groups.is_null(i),
                        names.is_null(i),
                    ) {
                        let attributes = attributes_of(attrs.is_valid(i).then(|| attrs.value(i)));
                        for k in all[at].keys(names.value(i), &attributes) {
                            // Group and rule first: one join on the key
                            // keeps groups and rules apart.
                            out.values()
                                .append_value(format!("{}\u{1f}{at}\u{1e}{k}", groups.value(i)));
                        }
                    }
                    out.append(true);
                }
                Ok(ColumnarValue::Array(Arc::new(out.finish())))
            }),
        )
    };
    let cap = {
        let all = Arc::clone(&all);
        create_udf(
            "linkage_cap",
            vec![DataType::Utf8],
            DataType::Int64,
            Volatility::Immutable,
            Arc::new(move |args: &[ColumnarValue]| {
                let arrays = ColumnarValue::values_to_arrays(args)?;
                let keys = strings(&arrays[0])?;
                let out: Int64Array = keys
                    .as_string::<i32>()
                    .iter()
                    .map(|k| {
                        let at: usize = k?
                            .split('\u{1f}')
                            .nth(1)?
                            .split('\u{1e}')
                            .next()?
                            .parse()
                            .ok()?;
                        all.get(at).map(|l| l.max_block as i64)
                    })
                    .collect();
                Ok(ColumnarValue::Array(Arc::new(out)))
            }),
        )
    };
    vec![of, keys, cap]
}

/// The pair UDFs over the run's mentions (`rows`, from [`linked_rows`]):
/// `linkage_score_mentions(a, b)` (two mentions by position) and
/// `linkage_score_node(mention, name, attributes)` (a mention against a
/// node), both null below the rule's grey band;
/// `linkage_pattern_mentions` and `linkage_pattern_node` (same arguments:
/// the rule's index in the top byte and the pair's levels below, null for
/// weighted rules and below `min_fields`); and
/// `linkage_sure(mention, score)` (true at or above the mention's
/// threshold, false in its grey band).
fn pair_udfs(linkages: &[Linkage], rows: &Arc<Vec<Option<LinkedRow>>>) -> Vec<ScalarUDF> {
    use arrow::datatypes::{Float64Type, Int64Type};
    let all = Arc::new(linkages.to_vec());
    let score: Arc<PairFn<f64>> = Arc::new(|l, a, b| {
        let s = l.score_rows(a, b);
        (s >= l.grey).then_some(s)
    });
    let pattern: Arc<PairFn<i64>> = Arc::new(|l, a, b| {
        if !l.is_probabilistic() {
            return None;
        }
        Some(((a.at as i64) << 56) | l.pattern_of(&a.values, &b.values)? as i64)
    });
    let sure = {
        let (all, rows) = (Arc::clone(&all), Arc::clone(rows));
        create_udf(
            "linkage_sure",
            vec![DataType::Int64, DataType::Float64],
            DataType::Boolean,
            Volatility::Immutable,
            Arc::new(move |args: &[ColumnarValue]| {
                let arrays = ColumnarValue::values_to_arrays(args)?;
                let a = ids(&arrays[0])?;
                let scores = arrow::compute::cast(&arrays[1], &DataType::Float64)?;
                let scores = scores.as_primitive::<arrow::datatypes::Float64Type>();
                let out: BooleanArray = a
                    .iter()
                    .zip(scores.iter())
                    .map(|(m, s)| {
                        let row = rows.get(usize::try_from(m?).ok()?)?.as_ref()?;
                        Some(s? >= all[row.at].threshold)
                    })
                    .collect();
                Ok(ColumnarValue::Array(Arc::new(out)))
            }),
        )
    };
    vec![
        mention_pair_udf::<Float64Type>("linkage_score_mentions", &all, rows, Arc::clone(&score)),
        node_pair_udf::<Float64Type>("linkage_score_node", &all, rows, score),
        mention_pair_udf::<Int64Type>("linkage_pattern_mentions", &all, rows, Arc::clone(&pattern)),
        node_pair_udf::<Int64Type>("linkage_pattern_node", &all, rows, pattern),
        sure,
    ]
}

/// The family under which the pair UDFs travel to other processes
/// ([`crate::portable`]).
pub const PAIR_FUNCTION_FAMILY: &str = "resolve.linkage_pairs";

/// What the pair UDFs are rebuilt from in another process: the rules,
/// their trained models, and the run's linked mentions as (rule, name,
/// attributes as the mentions table writes them, parsed there as here).
#[derive(serde::Serialize, serde::Deserialize)]
struct PairState {
    specs: Vec<LinkageSpec>,
    models: Vec<Option<Model>>,
    rows: Vec<Option<(usize, String, String)>>,
}

/// Registers the pair UDFs over `rows` (the linked rows of `mentions`) on
/// `ctx`. In a session whose plans run on
/// other processes (one with [`crate::scratch::ScratchFiles`]), they carry
/// the rules and the run's linked mentions with them, so an executor
/// rebuilds them ([`pair_functions_from_state`]); in process they only
/// point at `rows`, and nothing is serialized.
fn register_pair_udfs(
    ctx: &SessionContext,
    specs: &[LinkageSpec],
    linkages: &[Linkage],
    mentions: &[MentionKey],
    rows: &Arc<Vec<Option<LinkedRow>>>,
) -> Result<(), DataFusionError> {
    let udfs = pair_udfs(linkages, rows);
    if !crate::scratch::runs_elsewhere(ctx) {
        for f in udfs {
            ctx.register_udf(f);
        }
        return Ok(());
    }
    let state = PairState {
        specs: specs.to_vec(),
        models: linkages.iter().map(|l| l.trained().cloned()).collect(),
        rows: rows
            .iter()
            .zip(mentions)
            .map(|(r, m)| {
                r.as_ref()
                    .map(|r| (r.at, r.name.clone(), m.attributes.clone()))
            })
            .collect(),
    };
    let state: Arc<[u8]> = serde_json::to_vec(&state)
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .into();
    for f in udfs {
        ctx.register_udf(crate::portable::wrap(
            f,
            PAIR_FUNCTION_FAMILY,
            Arc::clone(&state),
        ));
    }
    Ok(())
}

/// The pair UDFs rebuilt from the state [`register_pair_udfs`] sent, or
/// `None` for state this build cannot read.
pub fn pair_functions_from_state(state: &[u8]) -> Option<Vec<ScalarUDF>> {
    let state: PairState = serde_json::from_slice(state).ok()?;
    if state.models.len() != state.specs.len() {
        return None;
    }
    let linkages: Vec<Linkage> = state
        .specs
        .iter()
        .zip(state.models)
        .map(|(spec, model)| match model {
            Some(model) => Linkage::new(spec).with_model(model),
            None => Linkage::new(spec),
        })
        .collect();
    let rows: Vec<Option<LinkedRow>> = state
        .rows
        .into_iter()
        .map(|r| {
            let (at, name, attributes) = r?;
            (at < linkages.len())
                .then(|| LinkedRow::new(&linkages, at, &name, attributes_of(Some(&attributes))))
        })
        .collect();
    Some(pair_udfs(&linkages, &Arc::new(rows)))
}

const PK: &str = "resolve_probe_keys";
const TK: &str = "resolve_target_keys";

/// The candidate pairs among the run's mentions (`mention_id < target`),
/// as the CTEs `small` and `pairs`.
fn mention_pairs_sql(every: u64) -> String {
    format!(
        "small AS (SELECT k FROM {PK} GROUP BY k HAVING count(*) <= linkage_cap(k)), \
         pairs AS (SELECT DISTINCT p.id AS mention_id, t.id AS target \
           FROM {PK} p JOIN small ON p.k = small.k JOIN {PK} t ON p.k = t.k \
           WHERE p.id < t.id{})",
        sampled("p.id", every)
    )
}

/// The condition keeping the pairs of every `every`th mention (none for
/// 1): a sample of whole mentions, so that each keeps all its pairs.
fn sampled(id: &str, every: u64) -> String {
    if every > 1 {
        format!(" AND {id} % {every} = 0")
    } else {
        String::new()
    }
}

/// The candidate pairs of a run's mention and a committed node (its
/// `short_id` as `target`), as the CTEs `small` and `pairs`.
fn node_pairs_sql(every: u64) -> String {
    format!(
        "small AS (SELECT k FROM (SELECT k FROM {PK} UNION ALL SELECT k FROM {TK}) \
           GROUP BY k HAVING count(*) <= linkage_cap(k)), \
         pairs AS (SELECT DISTINCT p.id AS mention_id, t.id AS target \
           FROM {PK} p JOIN small ON p.k = small.k JOIN {TK} t ON p.k = t.k WHERE true{})",
        sampled("p.id", every)
    )
}

/// Candidate pairs of the run's linked mentions against the committed
/// `nodes` and against each other, scored: [`Kind::Linked`] at or above
/// the rule's threshold, [`Kind::LinkGrey`] in its grey band, lower scores
/// dropped. Probabilistic rules are trained on these candidates first.
/// The UDFs of [`udfs`] and of the entity module must be registered on
/// `ctx`; `mentions` are the run's distinct mentions, as the mentions
/// table lays them out.
pub(super) async fn linkage_pairs(
    ctx: &SessionContext,
    nodes: &str,
    specs: &[LinkageSpec],
    mentions: &[MentionKey],
    out: &mut Vec<Pair>,
) -> Result<(), DataFusionError> {
    let m = MENTIONS_TABLE;
    materialize(
        ctx,
        PK,
        &format!(
            "SELECT mention_id AS id, unnest(linkage_keys(labels, group_id, name, attributes)) AS k \
             FROM {m} WHERE linkage_of(labels) IS NOT NULL"
        ),
    )
    .await?;
    materialize(
        ctx,
        TK,
        &format!(
            "SELECT x.id, x.k FROM (SELECT DISTINCT k FROM {PK}) pk \
             JOIN (SELECT short_id AS id, unnest(linkage_keys(labels, group_id, name, attributes)) AS k \
               FROM {nodes} WHERE linkage_of(labels) IS NOT NULL) x ON x.k = pk.k"
        ),
    )
    .await?;
    tracing::debug!("linkage: blocking keys of mentions and nodes kept");
    let mut linkages: Vec<Linkage> = specs.iter().map(Linkage::new).collect();
    let rows = Arc::new(linked_rows(&linkages, mentions));
    register_pair_udfs(ctx, specs, &linkages, mentions, &rows)?;
    if linkages.iter().any(Linkage::is_probabilistic) {
        linkages = train(ctx, nodes, &linkages, &rows).await?;
        register_pair_udfs(ctx, specs, &linkages, mentions, &rows)?;
    }
    for is_mention in [false, true] {
        let started = std::time::Instant::now();
        let before = out.len();
        // Pairs of mentions are ids until they are scored; only pairs in or
        // above a grey band get the texts the rules and prompts need.
        let sql = if is_mention {
            format!(
                "WITH {}, \
                 kept AS (SELECT mention_id, target, linkage_score_mentions(mention_id, target) AS score \
                   FROM pairs WHERE linkage_score_mentions(mention_id, target) IS NOT NULL) \
                 SELECT kept.mention_id, kept.target, kept.score, CAST(1 AS BIGINT) AS n, s.name, s.labels, \
                   identity_keys(s.type, s.attributes) AS ids, linkage_sure(kept.mention_id, kept.score) AS sure \
                 FROM kept JOIN {m} mm ON mm.mention_id = kept.mention_id \
                 JOIN {m} s ON s.mention_id = kept.target \
                 WHERE chains_compatible(mm.labels, s.labels)",
                mention_pairs_sql(1)
            )
        } else {
            format!(
                "WITH {}, \
                 c AS (SELECT pairs.mention_id, pairs.target, \
                   linkage_score_node(pairs.mention_id, s.name, s.attributes) AS score, \
                   s.name, s.labels, s.type, s.attributes \
                   FROM pairs JOIN {m} mm ON mm.mention_id = pairs.mention_id \
                   JOIN (SELECT short_id AS target, name, type, labels, attributes FROM {nodes}) s \
                     ON s.target = pairs.target \
                   WHERE chains_compatible(mm.labels, s.labels)) \
                 SELECT mention_id, target, score, CAST(1 AS BIGINT) AS n, name, labels, \
                   identity_keys(type, attributes) AS ids, linkage_sure(mention_id, score) AS sure \
                 FROM c WHERE score IS NOT NULL",
                node_pairs_sql(1)
            )
        };
        let side = if is_mention {
            "the run's mentions"
        } else {
            nodes
        };
        let batches = collect(ctx, &sql, || {
            format!("record-linkage candidate join against {side}")
        })
        .await?;
        for b in &batches {
            let first = out.len();
            decode_pairs(b, Kind::Linked, is_mention, out)?;
            let sure = b.column(7).as_boolean();
            for (p, i) in out[first..].iter_mut().zip(0..) {
                if !sure.value(i) {
                    p.kind = Kind::LinkGrey;
                }
            }
        }
        tracing::debug!(
            "linkage candidates against {side}: {} pairs in {:.2} s",
            out.len() - before,
            started.elapsed().as_secs_f64()
        );
    }
    let _ = ctx.deregister_table(PK);
    let _ = ctx.deregister_table(TK);
    Ok(())
}

async fn collect(
    ctx: &SessionContext,
    sql: &str,
    what: impl FnOnce() -> String,
) -> Result<Vec<arrow::record_batch::RecordBatch>, DataFusionError> {
    match ctx.sql(sql).await {
        Ok(frame) => frame.collect().await,
        Err(e) => Err(e),
    }
    .map_err(|e| e.context(what()))
}

/// Linked mentions whose candidate pairs train the probabilistic rules;
/// a run with more trains on the pairs of a sample of this many.
const TRAINING_MENTIONS: u64 = 100_000;

/// Records per rule drawn for u sampling (half from the run's mentions,
/// half from committed nodes, when both have that many).
const U_POOL: usize = 5000;

/// The probabilistic rules of `linkages` trained on the run: u from random
/// pairs of their records, m and the prior by EM over the pattern counts
/// of the candidate pairs (both against `nodes` and among the mentions).
async fn train(
    ctx: &SessionContext,
    nodes: &str,
    linkages: &[Linkage],
    rows: &[Option<LinkedRow>],
) -> Result<Vec<Linkage>, DataFusionError> {
    let started = std::time::Instant::now();
    // The candidates of a sample of whole mentions, each count scaled
    // back up: the estimates stay those of all candidates, and training
    // stops growing with the run past TRAINING_MENTIONS.
    let linked = rows.iter().flatten().count() as u64;
    let every = linked.div_ceil(TRAINING_MENTIONS).max(1);
    let counts = pattern_counts(ctx, nodes, linkages.len(), every, started).await?;
    // Committed nodes per rule, and a sample of them for u.
    let node_counts = linkage_node_counts(ctx, nodes, linkages.len()).await?;
    let mut mention_rows: Vec<Vec<&LinkedRow>> = vec![Vec::new(); linkages.len()];
    for r in rows.iter().flatten() {
        mention_rows[r.at].push(r);
    }
    let pools = u_pools(ctx, nodes, linkages, &mention_rows, &node_counts).await?;
    let mut trained = linkages.to_vec();
    for (i, l) in linkages.iter().enumerate() {
        if !l.is_probabilistic() {
            continue;
        }
        let (nm, nn) = (mention_rows[i].len() as f64, node_counts[i] as f64);
        let total_pairs = nm * nn + nm * (nm - 1.0).max(0.0) / 2.0;
        tracing::debug!(
            "linkage training: pools at {:.2} s",
            started.elapsed().as_secs_f64()
        );
        let u = probabilistic::estimate_u(&l.compare, &pools[i], l.u_sample_pairs);
        tracing::debug!(
            "linkage training: u at {:.2} s",
            started.elapsed().as_secs_f64()
        );
        let model = probabilistic::expectation_maximisation(
            &l.compare,
            &counts[i],
            u,
            total_pairs,
            nm / 2.0,
        );
        log_model(l, &counts[i], every, pools[i].len(), &model);
        trained[i] = l.with_model(model);
    }
    tracing::debug!(
        "linkage training took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(trained)
}

/// Per rule (of `rules`), the level patterns of the candidate pairs of 1
/// in `every` linked mentions, against the run's mentions and `nodes`,
/// each with its count scaled back up.
async fn pattern_counts(
    ctx: &SessionContext,
    nodes: &str,
    rules: usize,
    every: u64,
    started: std::time::Instant,
) -> Result<Vec<Vec<(u64, u64)>>, DataFusionError> {
    let m = MENTIONS_TABLE;
    let mut counts: Vec<Vec<(u64, u64)>> = vec![Vec::new(); rules];
    for (sql, side) in [
        (
            format!(
                // Chains are not checked here: mentions of one rule share
                // its type, and a pair of sibling subtypes among the
                // training pairs moves no estimate that matters (joining
                // labels back to every pair was most of the cost).
                "WITH {} SELECT pat, count(*) AS n FROM ( \
                   SELECT linkage_pattern_mentions(mention_id, target) AS pat FROM pairs) \
                 WHERE pat IS NOT NULL GROUP BY pat",
                mention_pairs_sql(every)
            ),
            "the run's mentions",
        ),
        (
            format!(
                "WITH {} SELECT pat, count(*) AS n FROM ( \
                   SELECT linkage_pattern_node(pairs.mention_id, s.name, s.attributes) AS pat FROM pairs \
                   JOIN {m} mm ON mm.mention_id = pairs.mention_id \
                   JOIN (SELECT short_id AS target, name, labels, attributes FROM {nodes}) s \
                     ON s.target = pairs.target \
                   WHERE chains_compatible(mm.labels, s.labels)) WHERE pat IS NOT NULL GROUP BY pat",
                node_pairs_sql(every)
            ),
            nodes,
        ),
    ] {
        let batches = collect(ctx, &sql, || {
            format!("counting the level patterns of the record-linkage candidates against {side}")
        })
        .await?;
        tracing::debug!(
            "linkage training: level patterns against {side} at {:.2} s",
            started.elapsed().as_secs_f64()
        );
        for b in &batches {
            let (pat, n) = (ids(b.column(0))?, ids(b.column(1))?);
            for (p, n) in pat.iter().zip(n.iter()) {
                let (Some(p), Some(n)) = (p, n) else { continue };
                let (at, p) = ((p >> 56) as usize, (p as u64) & ((1 << 56) - 1));
                if let Some(c) = counts.get_mut(at) {
                    c.push((p, n as u64 * every));
                }
            }
        }
    }
    Ok(counts)
}

/// The committed nodes of `nodes` per rule (of `rules`).
async fn linkage_node_counts(
    ctx: &SessionContext,
    nodes: &str,
    rules: usize,
) -> Result<Vec<usize>, DataFusionError> {
    let batches = collect(
        ctx,
        &format!(
            "SELECT linkage_of(labels) AS r, count(*) AS n FROM {nodes} \
             WHERE linkage_of(labels) IS NOT NULL GROUP BY 1"
        ),
        || format!("counting the record-linkage nodes of {nodes}"),
    )
    .await?;
    let mut node_counts = vec![0usize; rules];
    for b in &batches {
        let (r, n) = (ids(b.column(0))?, ids(b.column(1))?);
        for (r, n) in r.iter().zip(n.iter()) {
            if let (Some(r), Some(n)) = (r, n)
                && let Some(c) = node_counts.get_mut(r as usize)
            {
                *c = n as usize;
            }
        }
    }
    Ok(node_counts)
}

/// Per rule, the records u is estimated from: a sample of the run's
/// mentions of it (`mention_rows`) and of its committed nodes
/// (`node_counts` of them in `nodes`), at most [`U_POOL`] in all.
async fn u_pools(
    ctx: &SessionContext,
    nodes: &str,
    linkages: &[Linkage],
    mention_rows: &[Vec<&LinkedRow>],
    node_counts: &[usize],
) -> Result<Vec<Vec<Vec<Option<String>>>>, DataFusionError> {
    // Mentions fill half of the pool, or more when there are few nodes.
    let takes: Vec<(usize, usize)> = (0..linkages.len())
        .map(|i| {
            let (nm, nn) = (mention_rows[i].len(), node_counts[i]);
            let from_mentions = nm.min((U_POOL / 2).max(U_POOL.saturating_sub(nn)));
            (from_mentions, nn.min(U_POOL - from_mentions))
        })
        .collect();
    let step = (0..linkages.len())
        .filter(|&i| linkages[i].is_probabilistic() && takes[i].1 > 0)
        .map(|i| node_counts[i].div_ceil(takes[i].1))
        .min()
        .unwrap_or(0);
    let mut pools: Vec<Vec<Vec<Option<String>>>> = (0..linkages.len())
        .map(|i| {
            let (from_mentions, _) = takes[i];
            let every = mention_rows[i].len().div_ceil(from_mentions.max(1)).max(1);
            mention_rows[i]
                .iter()
                .step_by(every)
                .map(|r| r.values.clone())
                .collect()
        })
        .collect();
    if step > 0 {
        let batches = collect(
            ctx,
            &format!(
                "SELECT linkage_of(labels) AS r, name, attributes FROM {nodes} \
                 WHERE linkage_of(labels) IS NOT NULL AND short_id % {step} = 0"
            ),
            || format!("sampling record-linkage nodes of {nodes}"),
        )
        .await?;
        for b in &batches {
            let r = ids(b.column(0))?;
            let (names, attrs) = (strings(b.column(1))?, strings(b.column(2))?);
            let (names, attrs) = (names.as_string::<i32>(), attrs.as_string::<i32>());
            for i in 0..b.num_rows() {
                let Some(at) = r.is_valid(i).then(|| r.value(i) as usize) else {
                    continue;
                };
                if at < pools.len()
                    && pools[at].len() < takes[at].0 + takes[at].1
                    && names.is_valid(i)
                {
                    let a = attributes_of(attrs.is_valid(i).then(|| attrs.value(i)));
                    pools[at].push(linkages[at].values(names.value(i), &a));
                }
            }
        }
    }
    Ok(pools)
}

/// Logs the model trained for `l` from `counts` (of the pairs of 1 in
/// `every` mentions) and `pool` records for u.
fn log_model(l: &Linkage, counts: &[(u64, u64)], every: u64, pool: usize, model: &Model) {
    tracing::info!(
        "linkage {}: probabilistic model from {} candidate pairs{} ({} level patterns) and {} records for u; \
         EM {} rounds, {:.0} matches expected, prior {:.3e}",
        l.entity_type,
        counts.iter().map(|(_, n)| n).sum::<u64>(),
        if every > 1 {
            format!(" (counted on the pairs of 1 in {every} mentions)")
        } else {
            String::new()
        },
        counts.len(),
        pool,
        model.rounds,
        model.expected_matches,
        model.prior
    );
    for (c, spec) in l.compare.iter().enumerate() {
        tracing::debug!(
            "linkage {} {} ({:?}): m {:?} u {:?}",
            l.entity_type,
            spec.field,
            spec.method,
            model.m[c],
            model.u[c]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(toml_text: &str) -> LinkageSpec {
        toml::from_str(toml_text).expect("linkage spec")
    }

    fn attrs(json: serde_json::Value) -> Map<String, Value> {
        json.as_object().expect("object").clone()
    }

    #[test]
    fn blocking_keys_need_every_part_and_cut_prefixes() {
        let l = Linkage::new(&spec(
            r#"
            type = "Person"
            blocking = ["surname:3+postcode", "date_of_birth", "name"]
            compare = [{ field = "surname", method = "name" }]
            min_fields = 1
            "#,
        ));
        let a = attrs(serde_json::json!({"surname": "O'Brien", "postcode": 2600}));
        assert_eq!(
            l.keys("Kate O'Brien", &a),
            ["0\u{1f}o b\u{1f}2600", "2\u{1f}kate o brien"],
            "no date of birth: no key of the second rule"
        );
    }

    #[test]
    fn the_score_is_the_weighted_mean_of_the_fields_both_sides_have() {
        let l = Linkage::new(&spec(
            r#"
            type = "Person"
            blocking = ["surname"]
            compare = [
              { field = "surname", method = "exact", weight = 2 },
              { field = "postcode", method = "exact" },
              { field = "phone", method = "exact" },
            ]
            "#,
        ));
        let a = attrs(serde_json::json!({"surname": "Reid", "postcode": "2600", "phone": "1"}));
        let b = attrs(serde_json::json!({"surname": "Reid", "postcode": "2601"}));
        // phone is missing on one side: (2·1 + 1·0) / 3.
        assert!((l.score(("x", &a), ("y", &b)) - 2.0 / 3.0).abs() < 1e-9);
        let c = attrs(serde_json::json!({"surname": "Reid"}));
        assert_eq!(l.score(("x", &a), ("y", &c)), 0.0, "one field < min_fields");
    }

    #[test]
    fn comparisons_score_typos_dates_and_numbers_by_their_documented_rules() {
        use crate::spec::resolve::CompareMethod::*;
        assert_eq!(similarity(Name, "Priya Raman", "RAMAN, Priya"), 1.0);
        let jw = similarity(Name, "jonathan", "jonathon");
        assert!(jw > 0.9 && jw < 1.0, "{jw}");
        assert_eq!(similarity(Date, "1956-04-09", "19560409"), 1.0);
        assert_eq!(similarity(Date, "19560409", "19560429"), 0.875);
        assert_eq!(similarity(Date, "19560409", "April 9"), 0.0);
        assert_eq!(similarity(Number, "100", "75"), 0.75);
        assert!((similarity(Code, "5304218", "5304281") - 5.0 / 7.0).abs() < 1e-9);
        assert_eq!(similarity(Folded, "ACME corp.", "acme Corp"), 1.0);
        assert_eq!(similarity(Exact, "ACME corp.", "acme Corp"), 0.0);
        assert!(similarity(Text, "12 high street", "12 high st") > 0.5);
    }
}
