//! Cost before a run: the calls each stage plans to make, with estimated
//! tokens, cost and the time the budget needs for them
//! (`graphloom run --dry-run`).

use std::fmt::Write as _;

use crate::spec::LlmSpec;
use crate::stage::Stage;

/// The planned calls of one stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// The stage, as in `llm_calls.stage`.
    pub stage: Stage,
    /// Whether `calls` is an upper bound (the count depends on replies, as
    /// for subtype walks) rather than exact.
    pub upper_bound: bool,
    /// Calls planned.
    pub calls: u64,
    /// Estimated prompt tokens over those calls.
    pub prompt_tokens: u64,
    /// Completion tokens at most (the calls' `max_tokens`).
    pub max_completion_tokens: u64,
}

/// Totals of a plan.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PlanTotals {
    /// Calls.
    pub calls: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens at most.
    pub max_completion_tokens: u64,
    /// Cost at most, when prices are configured.
    pub max_cost_usd: Option<f64>,
    /// Minutes the request and token budgets need at least.
    pub min_minutes: f64,
}

/// Sums stage plans and prices them with the spec's prices and limits.
pub fn totals(stages: &[StagePlan], llm: &LlmSpec) -> PlanTotals {
    let calls: u64 = stages.iter().map(|s| s.calls).sum();
    let prompt_tokens: u64 = stages.iter().map(|s| s.prompt_tokens).sum();
    let max_completion_tokens: u64 = stages.iter().map(|s| s.max_completion_tokens).sum();
    let priced =
        llm.price_per_1m_prompt_tokens.is_some() || llm.price_per_1m_completion_tokens.is_some();
    let max_cost_usd = priced.then(|| {
        prompt_tokens as f64 / 1e6 * llm.price_per_1m_prompt_tokens.unwrap_or(0.0)
            + max_completion_tokens as f64 / 1e6 * llm.price_per_1m_completion_tokens.unwrap_or(0.0)
    });
    let by_requests = calls as f64 / llm.requests_per_minute.max(1) as f64;
    let by_tokens =
        (prompt_tokens + max_completion_tokens) as f64 / llm.tokens_per_minute.max(1) as f64;
    PlanTotals {
        calls,
        prompt_tokens,
        max_completion_tokens,
        max_cost_usd,
        min_minutes: by_requests.max(by_tokens),
    }
}

/// Renders a plan as a table with a total line.
pub fn render(stages: &[StagePlan], llm: &LlmSpec) -> String {
    let t = totals(stages, llm);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>8} {:>14} {:>16}",
        "stage", "calls", "prompt tokens", "max completion"
    );
    for s in stages {
        let name = if s.upper_bound {
            format!("{} (≤)", s.stage)
        } else {
            s.stage.to_string()
        };
        let _ = writeln!(
            out,
            "{:<24} {:>8} {:>14} {:>16}",
            name, s.calls, s.prompt_tokens, s.max_completion_tokens
        );
    }
    let _ = writeln!(
        out,
        "{:<24} {:>8} {:>14} {:>16}",
        "total", t.calls, t.prompt_tokens, t.max_completion_tokens
    );
    match t.max_cost_usd {
        Some(c) => {
            let _ = writeln!(
                out,
                "cost at most: ${c:.4} (llm.price_per_1m_* in the spec)"
            );
        }
        None => {
            let _ = writeln!(
                out,
                "cost: set llm.price_per_1m_prompt_tokens and llm.price_per_1m_completion_tokens to estimate it"
            );
        }
    }
    let _ = writeln!(
        out,
        "time at the configured limits: at least {:.1} min ({} requests/min, {} tokens/min); cache hits cost nothing",
        t.min_minutes, llm.requests_per_minute, llm.tokens_per_minute
    );
    out
}

/// The batch-mode lines of a dry run: the cost at the batch price and the
/// rounds (each waits for its batches: minutes to the completion window).
pub fn render_batch(stages: &[StagePlan], llm: &LlmSpec, rounds: u32) -> String {
    let t = totals(stages, llm);
    let cost = match t.max_cost_usd {
        Some(c) => format!(
            "at most ${:.4} (sync ${c:.4} × llm.batch.price_factor {})",
            c * llm.batch.price_factor,
            llm.batch.price_factor
        ),
        None => "unpriced (set llm.price_per_1m_*)".to_string(),
    };
    format!(
        "batch mode (--batch): {cost}, in at most {rounds} rounds of batches, one per stage level; each round waits for its batches (minutes, up to the {} completion window)\n",
        llm.batch.completion_window
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_price_tokens_and_find_the_binding_limit() {
        let stages = vec![
            StagePlan {
                stage: Stage::ExtractEntities,
                upper_bound: false,
                calls: 100,
                prompt_tokens: 200_000,
                max_completion_tokens: 50_000,
            },
            StagePlan {
                stage: Stage::ClassifyEntities,
                upper_bound: true,
                calls: 20,
                prompt_tokens: 40_000,
                max_completion_tokens: 10_000,
            },
        ];
        let llm = LlmSpec {
            requests_per_minute: 60,
            tokens_per_minute: 100_000,
            price_per_1m_prompt_tokens: Some(0.15),
            price_per_1m_completion_tokens: Some(0.60),
            ..LlmSpec::default()
        };
        let t = totals(&stages, &llm);
        assert_eq!(
            (t.calls, t.prompt_tokens, t.max_completion_tokens),
            (120, 240_000, 60_000)
        );
        let cost = t.max_cost_usd.expect("priced");
        assert!((cost - (0.24 * 0.15 + 0.06 * 0.60)).abs() < 1e-9, "{cost}");
        // 120 calls at 60/min = 2 min; 300k tokens at 100k/min = 3 min.
        assert!((t.min_minutes - 3.0).abs() < 1e-9);
        let text = render(&stages, &llm);
        assert!(text.contains("total") && text.contains("$0.0720"), "{text}");
        assert!(text.contains("classify_entities (≤)"), "{text}");
        assert!(!text.contains("extract_entities (≤)"), "{text}");
        let unpriced = totals(&stages, &LlmSpec::default());
        assert_eq!(unpriced.max_cost_usd, None);
    }
}
