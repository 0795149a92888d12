//! Batch-mode rounds of a run (see [`crate::llm::batch`]): collect what
//! ended, execute against the cache, submit what the stopping stage
//! queued, wait, again, until a round commits.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, StringArray};
use datafusion::prelude::SessionContext;

use super::{Job, RunError, RunReport, attempt, open_cache};
use crate::llm::CacheMode;
use crate::llm::batch::{
    BatchApi, BatchQueue, BatchRecord, Ledger, poll_once, stages_text, submit, wait_all,
};
use crate::rows::LlmCallRow;
use crate::stage::Stage;
use crate::store::{GraphStore, StoreError};

/// What batch mode did in a run.
#[derive(Debug, Clone, Default)]
pub struct BatchProgress {
    /// Rounds made (the last one committed, unless `waiting_on`).
    pub rounds: u32,
    /// Batches this run submitted: id (or ledger name) and requests per
    /// stage.
    pub submitted: Vec<(String, BTreeMap<String, usize>)>,
    /// `--no-wait`: the stage whose answers the next run needs.
    pub waiting_on: Option<Stage>,
    /// Batches still running when the run returned.
    pub running: usize,
}

/// One round: the queue its client fills and the ledger as it began.
pub(super) struct Round {
    pub(super) queue: Arc<BatchQueue>,
    records: Vec<BatchRecord>,
}

impl Round {
    /// `llm_calls` rows of the batches that ended and that no committed
    /// run accounted yet (the ledger marks them after the commit; a run
    /// killed in between left them marked only in the table, which is
    /// checked here).
    pub(super) async fn call_rows(
        &self,
        ctx: &SessionContext,
        run_id: &str,
    ) -> Result<Vec<LlmCallRow>, RunError> {
        let rows: Vec<LlmCallRow> = self
            .records
            .iter()
            .filter(|r| r.ended_at.is_some() && r.accounted_by.is_none())
            .flat_map(|r| r.call_rows(run_id))
            .collect();
        if rows.is_empty() {
            return Ok(rows);
        }
        let committed = committed_batch_calls(ctx).await?;
        Ok(rows
            .into_iter()
            .filter(|r| !committed.contains(&r.call_id))
            .collect())
    }
}

/// Call ids of the Batch API answers already in `llm_calls`.
async fn committed_batch_calls(ctx: &SessionContext) -> Result<HashSet<String>, RunError> {
    let step = |source| StoreError::DataFusion {
        step: "reading the committed Batch API calls",
        source,
    };
    let batches = ctx
        .sql("SELECT call_id FROM llm_calls WHERE call_id LIKE 'batch:%'")
        .await
        .map_err(step)?
        .collect()
        .await
        .map_err(step)?;
    let mut out = HashSet::new();
    for b in &batches {
        if let Some(ids) = b.column(0).as_any().downcast_ref::<StringArray>() {
            out.extend(
                (0..ids.len())
                    .filter(|&i| ids.is_valid(i))
                    .map(|i| ids.value(i).to_string()),
            );
        }
    }
    Ok(out)
}

/// Runs rounds until one commits (or, with `--no-wait`, until a round
/// has submitted what it needs).
pub(super) async fn rounds(
    job: &Job<'_>,
    store: &GraphStore,
    report: &mut RunReport,
) -> Result<(), RunError> {
    let llm = &job.spec.llm;
    // Answers arrive in the cache, and every round reads them from it.
    let cache = match (job.options.cache, open_cache(job)?) {
        (CacheMode::ReadWrite, Some(cache)) => cache,
        _ => return Err(RunError::BatchNeedsCache),
    };
    let api = BatchApi::new(llm)?;
    let ledger = Ledger::in_graph(store.object_store(), store.url());
    let mut progress = BatchProgress::default();
    let mut last = Stage::ExtractEntities;
    for round in 1..=llm.batch.max_rounds {
        progress.rounds = round;
        let records = poll_once(&api, &ledger, &cache).await?;
        let current = Round {
            queue: Arc::new(BatchQueue::new(&records, llm.batch.max_attempts)),
            records,
        };
        let Some(stage) = attempt(job, store, report, Some(&current)).await? else {
            if let Some(run) = &report.run {
                mark_accounted(&ledger, current.records, &run.run_id).await?;
            }
            report.batch = Some(progress);
            return Ok(());
        };
        last = stage;
        let deferred = current.queue.deferred();
        let queued = current.queue.take();
        tracing::info!(
            "batch round {round}: {stage} queued {} requests ({} more wait on batches in flight)",
            queued.len(),
            deferred.saturating_sub(queued.len())
        );
        let submitted = submit(&api, &ledger, queued).await?;
        for record in &submitted {
            let id = record.batch_id.clone().unwrap_or(record.name.clone());
            progress.submitted.push((id, record.stages()));
        }
        if job.options.no_wait {
            progress.waiting_on = Some(stage);
            // Nothing was polled since the round began: what runs now is
            // what ran then and what was just submitted.
            progress.running = current
                .records
                .iter()
                .chain(&submitted)
                .filter(|r| r.ended_at.is_none())
                .count();
            report.batch = Some(progress);
            return Ok(());
        }
        wait_all(&api, &ledger, &cache).await?;
    }
    Err(RunError::TooManyRounds {
        rounds: llm.batch.max_rounds,
        stage: last,
    })
}

/// Marks the ended batches whose rows `run_id` committed.
async fn mark_accounted(
    ledger: &Ledger,
    records: Vec<BatchRecord>,
    run_id: &str,
) -> Result<(), RunError> {
    for mut r in records {
        if r.ended_at.is_some() && r.accounted_by.is_none() {
            r.accounted_by = Some(run_id.to_string());
            ledger.put(&r).await?;
            tracing::debug!(
                "batch {} accounted by run {run_id} ({})",
                r.batch_id.as_deref().unwrap_or(&r.name),
                stages_text(&r.stages())
            );
        }
    }
    Ok(())
}
