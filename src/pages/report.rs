//! `graphloom report`: per run and stage, what the LLM calls cost and
//! took (calls, cache hits, tokens, cost, time waiting for a slot against
//! time in HTTP, latency distribution), what failed and why with examples,
//! and, with a gold file, the `eval` scores; as one HTML page with plots.
//!
//! Every figure is an aggregate computed by SQL over `runs`, `llm_calls`
//! and `failures`, so the page's size follows the number of runs, stages
//! and failure reasons, not the number of calls.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::{Result, fill, rows, script_json, write_page};
use crate::eval::{Gold, Quality};
use crate::store::GraphStore;

/// The page template (assets/report/template.html).
pub(crate) const TEMPLATE: &str = include_str!("../../assets/report/template.html");

/// Upper bounds of the latency histogram's buckets, in milliseconds: the
/// first bucket starts at 0, the last is open-ended.
pub const LATENCY_BOUNDS_MS: [u64; 11] = [
    0, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000,
];

/// Failure examples kept per (run, stage, reason).
const EXAMPLES: usize = 3;

/// What the report adds to the graph's own tables.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    /// Score the graph against this gold file (as `graphloom eval`).
    pub gold: Option<std::path::PathBuf>,
    /// Prices (USD per million prompt and completion tokens) to split each
    /// run's recorded cost over its stages; without them only runs are
    /// priced (the graph records cost per run, not per call).
    pub prices: Option<(f64, f64)>,
}

/// What a report page holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSummary {
    /// Runs listed.
    pub runs: usize,
    /// (run, stage) rows.
    pub stages: usize,
    /// LLM calls over all runs.
    pub calls: u64,
    /// Failures rows over all runs.
    pub failures: u64,
    /// Whether eval scores are included.
    pub eval: bool,
}

/// The latency bucket of `latency_ms` as a SQL expression: the index of
/// the last bound not above it.
fn bucket_sql() -> String {
    let mut case = String::from("CASE");
    for (i, bound) in LATENCY_BOUNDS_MS.iter().enumerate().rev() {
        case.push_str(&format!(" WHEN latency_ms >= {bound} THEN {i}"));
    }
    case.push_str(" ELSE 0 END");
    case
}

fn num(row: &Map<String, Value>, key: &str) -> f64 {
    row.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Builds the report's data document and counts.
pub async fn report_document(
    store: &GraphStore,
    options: &ReportOptions,
) -> Result<(Value, ReportSummary)> {
    let session = super::open(store).await?;
    let runs = rows(
        &session,
        "reading the runs",
        "SELECT run_id, run_seq, command, status, \
           to_char(started_at, '%Y-%m-%dT%H:%M:%SZ') AS started_at, \
           to_char(finished_at, '%Y-%m-%dT%H:%M:%SZ') AS finished_at, \
           duration_ms, episodes_seen, episodes_added, nodes_added, edges_added, failures, \
           llm_calls, prompt_tokens, completion_tokens, cost_usd, error \
         FROM runs ORDER BY run_seq",
    )
    .await?;
    let mut stages = rows(
        &session,
        "summing the LLM calls per run and stage",
        "SELECT run_id, stage, count(*) AS calls, \
           sum(CASE WHEN cache_hit THEN 1 ELSE 0 END) AS cache_hits, \
           sum(CASE WHEN status <> 'ok' THEN 1 ELSE 0 END) AS errors, \
           sum(CASE WHEN cache_hit THEN 0 ELSE prompt_tokens END) AS prompt_tokens, \
           sum(CASE WHEN cache_hit THEN 0 ELSE completion_tokens END) AS completion_tokens, \
           sum(latency_ms) AS http_ms, sum(wait_ms) AS wait_ms \
         FROM llm_calls GROUP BY run_id, stage ORDER BY run_id, stage",
    )
    .await?;
    price_stages(&mut stages, &runs, options.prices);
    let latency = rows(
        &session,
        "bucketing the call latencies",
        &format!(
            "SELECT run_id, stage, {} AS bucket, count(*) AS calls \
             FROM llm_calls WHERE NOT cache_hit GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            bucket_sql()
        ),
    )
    .await?;
    let failures = rows(
        &session,
        "grouping the failures by reason",
        &format!(
            "SELECT run_id, stage, reason_class AS reason, count(*) AS count, \
               array_slice(array_agg(named_struct('item', item, 'source_uri', source_uri, \
                 'reason', reason, 'excerpt', excerpt) ORDER BY created_at, failure_id), 1, {EXAMPLES}) \
                 AS examples \
             FROM (SELECT *, {} AS reason_class FROM failures) f \
             GROUP BY run_id, stage, reason_class ORDER BY run_id, stage, count DESC, reason",
            reason_class_sql()
        ),
    )
    .await?;
    let eval = match &options.gold {
        None => Value::Null,
        Some(path) => {
            let gold = Gold::from_path(path).map_err(Box::new)?;
            let quality = crate::eval::evaluate(store, &gold)
                .await
                .map_err(Box::new)?;
            eval_json(path, &quality)
        }
    };

    let summary = ReportSummary {
        runs: runs.len(),
        stages: stages.len(),
        calls: stages.iter().map(|s| num(s, "calls") as u64).sum(),
        failures: failures.iter().map(|f| num(f, "count") as u64).sum(),
        eval: !eval.is_null(),
    };
    let document = json!({
        "graph": store.display_url(),
        "generated_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "runs": runs,
        "stages": stages,
        "latency": {
            "bounds_ms": LATENCY_BOUNDS_MS,
            "by_stage": histograms(&latency),
        },
        "failures": failures,
        "eval": eval,
    });
    Ok((document, summary))
}

/// A failure's reason class: its text without a leading `stage: ` and up
/// to the next `: ` (reasons read "what: detail"), numbers replaced by
/// `N`, so "reply cut at 784 tokens" and "reply cut at 512 tokens" count
/// together.
fn reason_class_sql() -> &'static str {
    "substr(regexp_replace(split_part(regexp_replace(reason, '^[a-z_]+: ', ''), ': ', 1), \
     '[0-9]+', 'N', 'g'), 1, 120)"
}

/// Splits each run's recorded cost over its stages in proportion to what
/// their tokens cost at `prices`; `cost_usd` stays null without prices or
/// for runs with no recorded cost.
fn price_stages(
    stages: &mut [Map<String, Value>],
    runs: &[Map<String, Value>],
    prices: Option<(f64, f64)>,
) {
    let weight = |s: &Map<String, Value>| match prices {
        Some((p, c)) => num(s, "prompt_tokens") * p + num(s, "completion_tokens") * c,
        None => 0.0,
    };
    for i in 0..stages.len() {
        let run_id = stages[i].get("run_id").cloned();
        let run_cost = runs
            .iter()
            .find(|r| r.get("run_id") == run_id.as_ref())
            .and_then(|r| r.get("cost_usd"))
            .and_then(Value::as_f64);
        let total: f64 = stages
            .iter()
            .filter(|s| s.get("run_id") == run_id.as_ref())
            .map(weight)
            .sum();
        let cost = match (prices, run_cost) {
            (Some(_), Some(cost)) if total > 0.0 => json!(cost * weight(&stages[i]) / total),
            (Some(_), Some(_)) => json!(0.0),
            _ => Value::Null,
        };
        stages[i].insert("cost_usd".into(), cost);
    }
}

/// Bucket rows to one count vector per (run, stage).
fn histograms(latency: &[Map<String, Value>]) -> Vec<Value> {
    let mut out: Vec<(Value, Value, Vec<u64>)> = Vec::new();
    for row in latency {
        let (run, stage) = (row["run_id"].clone(), row["stage"].clone());
        let bucket = num(row, "bucket") as usize;
        if out.last().is_none_or(|(r, s, _)| *r != run || *s != stage) {
            out.push((run, stage, vec![0; LATENCY_BOUNDS_MS.len()]));
        }
        if let Some((_, _, counts)) = out.last_mut()
            && let Some(c) = counts.get_mut(bucket)
        {
            *c += num(row, "calls") as u64;
        }
    }
    out.into_iter()
        .map(|(run_id, stage, counts)| json!({"run_id": run_id, "stage": stage, "counts": counts}))
        .collect()
}

fn eval_json(gold: &Path, q: &Quality) -> Value {
    let (calls, tokens, seconds) = q.per_episode();
    let (calls, tokens, seconds) = (round3(calls), round3(tokens), round3(seconds));
    json!({
        "gold": gold.display().to_string(),
        "metrics": [
            {"name": "entity precision", "value": round3(q.entity_precision())},
            {"name": "entity recall", "value": round3(q.entity_recall())},
            {"name": "chain accuracy", "value": round3(q.chain_accuracy())},
            {"name": "nodes per gold entity", "value": round3(q.nodes_per_entity())},
            {"name": "fact recall (family)", "value": round3(q.fact_recall())},
            {"name": "fact recall (exact type)", "value": round3(q.fact_recall_exact())},
            {"name": "ended facts found", "value": q.ended_found},
            {"name": "of those stored invalid", "value": q.ended_stored_invalid},
            {"name": "current facts found", "value": q.current_found},
            {"name": "of those stored live", "value": q.current_stored_live},
            {"name": "episodes lost", "value": q.episodes_lost},
            {"name": "LLM calls per episode", "value": calls},
            {"name": "tokens per episode", "value": tokens},
            {"name": "seconds per episode", "value": seconds},
        ],
        "text": q.to_string(),
    })
}

/// Three decimals: the page shows scores, not float noise.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The page's HTML for a data document.
pub fn render(document: &Value) -> String {
    fill(TEMPLATE, "/*GRAPHLOOM_DATA*/", &script_json(document))
}

/// Writes the report of `store` to `out`.
pub async fn write_report(
    store: &GraphStore,
    options: &ReportOptions,
    out: &Path,
) -> Result<ReportSummary> {
    let (document, summary) = report_document(store, options).await?;
    write_page(out, &render(&document))?;
    Ok(summary)
}
