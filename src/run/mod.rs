//! A run (`graphloom run`): source → anti-join with committed episodes →
//! entity extraction → entity subtype walk → fact extraction → edge subtype
//! walk → in-run merge → one commit. Every episode ends either in
//! `episodes` and the graph, or in `failures` with its reason (and is
//! retried by the next run, since it is not in `episodes`).

mod extraction;
mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use datafusion::prelude::SessionContext;

use crate::llm::plan::StagePlan;
use crate::llm::{CacheMode, LlmClient, LlmError, ResponseCache};
use crate::mapping::{MappingError, Mappings};
use crate::ontology::Ontology;
use crate::resolve::stage::{ResolveError, StageContext, StageOutput};
use crate::rows::FailureRow;
use crate::source::{self, Loaded, SourceError};
use crate::spec::PipelineSpec;
use crate::stage::{Stage, Timings};
use crate::store::{self, Changes, GraphStore, RunRow, RunStats, StoreError, Transaction};
use extraction::Extraction;
pub use plan::plan;

/// Errors that stop a run (bad items are `failures` rows instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The spec has no `[source]`.
    #[error(
        "the pipeline has no [source] table: `graphloom run` needs source.url and source.format"
    )]
    NoSource,
    /// The source could not be read at all.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The graph could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The LLM client could not be set up.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// The cache location is unusable.
    #[error(transparent)]
    Location(#[from] crate::objstore::LocationError),
    /// Resolution failed.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The `[[mapping]]` tables break rules.
    #[error(transparent)]
    Mapping(#[from] MappingError),
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Plan and print, call nothing, write nothing.
    pub dry_run: bool,
    /// Process at most this many new episodes (oldest first).
    pub limit: Option<usize>,
    /// How the response cache is used.
    pub cache: CacheMode,
    /// Where progress goes (nowhere by default).
    pub progress: Progress,
}

/// Progress of a phase that works episode by episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// The phase (`extract_entities` or `extract_facts`).
    pub phase: Stage,
    /// Episodes done; 0 when the phase starts.
    pub done: usize,
    /// Episodes the phase has to do.
    pub total: usize,
    /// LLM calls of the run so far (cache hits included).
    pub calls: usize,
    /// Tokens sent and received so far (cache hits excluded).
    pub tokens: u64,
    /// Episodes failed so far.
    pub failures: usize,
}

/// A receiver of [`Tick`]s: the command line draws a bar or writes log
/// lines; the library itself prints nothing.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<ProgressFn>>);

/// What a [`Progress`] calls.
type ProgressFn = dyn Fn(&Tick) + Send + Sync;

impl Progress {
    /// Progress handed to `f`, called from the run's task.
    pub fn new(f: impl Fn(&Tick) + Send + Sync + 'static) -> Self {
        Progress(Some(Arc::new(f)))
    }

    fn report(&self, tick: &Tick) {
        if let Some(f) = &self.0 {
            f(tick);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Progress(..)"
        } else {
            "Progress(none)"
        })
    }
}

/// What a run did (or, for a dry run, would do).
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// The committed runs row (none for a dry run).
    pub run: Option<RunRow>,
    /// Episodes read from the source.
    pub episodes_seen: usize,
    /// Already committed, skipped.
    pub episodes_skipped: usize,
    /// New episodes this run took on (after `--limit`).
    pub episodes_planned: usize,
    /// Of those, records a `[[mapping]]` applied to (no LLM call).
    pub episodes_mapped: usize,
    /// Episodes committed with their entities and facts.
    pub episodes_added: usize,
    /// Failure rows written, by stage.
    pub failures_by_stage: BTreeMap<String, usize>,
    /// A few failures, for the summary.
    pub failure_samples: Vec<FailureRow>,
    /// New nodes written.
    pub nodes_added: usize,
    /// Committed nodes this run's mentions resolved to (updated in place).
    pub nodes_updated: usize,
    /// New edges written.
    pub edges_added: usize,
    /// New facts folded into an existing or earlier edge.
    pub duplicate_facts: usize,
    /// Facts invalidated by a newer contradicting fact.
    pub invalidated_facts: usize,
    /// Mentions the merge rules left open (several candidates, grey band).
    pub ambiguous_entities: usize,
    /// Of those, merged on the LLM's adjudication.
    pub adjudicated_merges: usize,
    /// LLM calls by stage (hits included).
    pub calls_by_stage: BTreeMap<String, usize>,
    /// Calls answered by the cache.
    pub cache_hits: usize,
    /// Tokens sent and received (hits excluded).
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Cost when prices are set.
    pub cost_usd: Option<f64>,
    /// The plan (dry run).
    pub plan: Vec<StagePlan>,
    /// Wall time.
    pub seconds: f64,
    /// Wall time of each stage, in the order they ran: `source` (listing,
    /// parsing and the anti-join with committed episodes), `open` (the
    /// lock, recovery and reading the graph's base), `extract_entities`,
    /// `classify_entities`, `extract_facts`, `classify_facts`, `resolve`
    /// (resolution and building the rows) and `commit` (the table commits
    /// and the runs row).
    pub timings: Timings,
}

impl RunReport {
    /// Seconds spent in `stage` (0 when it did not run).
    pub fn stage(&self, stage: Stage) -> f64 {
        self.timings.of(stage)
    }

    /// LLM calls per processed episode.
    pub fn calls_per_episode(&self) -> f64 {
        let calls: usize = self.calls_by_stage.values().sum();
        calls as f64 / self.episodes_planned.max(1) as f64
    }
}

/// What the stages of one run read.
struct Job<'a> {
    spec: &'a PipelineSpec,
    ontology: &'a Ontology,
    options: &'a RunOptions,
    loaded: &'a Loaded,
    /// The spec's record mappings, checked.
    mappings: Mappings,
    /// Where the response cache lives unless the spec says.
    default_cache: String,
}

/// Runs the pipeline: load the source, then either plan (`--dry-run`) or
/// extract, resolve and commit the new episodes as one run.
pub async fn run(
    spec: &PipelineSpec,
    ontology: &Ontology,
    store: &GraphStore,
    options: &RunOptions,
) -> Result<RunReport, RunError> {
    let started = Instant::now();
    let source_spec = spec.source.as_ref().ok_or(RunError::NoSource)?;
    let mappings = Mappings::compile(&spec.mapping, ontology)?;
    let group_id = &spec.output.group_id;
    let loaded = source::load(source_spec, group_id, &spec.output.storage_options).await?;
    let mut report = RunReport {
        episodes_seen: loaded.episodes.len(),
        ..RunReport::default()
    };
    let mark = report.timings.lap(Stage::Source, started);
    let job = Job {
        spec,
        ontology,
        options,
        loaded: &loaded,
        mappings,
        default_cache: format!("{}_cache/llm/", store.url()),
    };
    if options.dry_run {
        dry_run(&job, store, &mut report).await?;
    } else {
        let mut tx = store.begin("run", group_id).await?;
        report.timings.lap(Stage::Open, mark);
        match execute(&job, &mut tx, &mut report).await {
            Ok((changes, mut stats)) => {
                let mark = Instant::now();
                stats.ontology_hash = tx.stage_changes(&changes, ontology)?;
                report.run = Some(tx.commit(stats).await?);
                report.timings.lap(Stage::Commit, mark);
            }
            Err(e) => {
                tx.fail(&e.to_string(), RunStats::default()).await.ok();
                return Err(e);
            }
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// `--dry-run`: the plan over the episodes a run would take on.
async fn dry_run(
    job: &Job<'_>,
    store: &GraphStore,
    report: &mut RunReport,
) -> Result<(), RunError> {
    let ctx = SessionContext::new();
    store.snapshot().await?.register(&ctx).await?;
    let todo = todo(&ctx, job, report).await?;
    let all = &job.loaded.episodes;
    // Mapped records make no call.
    let to_extract: Vec<usize> = todo
        .iter()
        .copied()
        .filter(|&i| job.mappings.find(&all[i]).is_none())
        .collect();
    report.episodes_mapped = todo.len() - to_extract.len();
    report.plan = plan(job.ontology, &job.spec.extract, all, &to_extract);
    let source_failures = job.loaded.failures.len();
    *report
        .failures_by_stage
        .entry(Stage::Source.into())
        .or_default() += source_failures;
    Ok(())
}

/// The episodes a run takes on (indices into the loaded episodes, in
/// archive order): those not committed yet, at most `--limit` of them.
async fn todo(
    ctx: &SessionContext,
    job: &Job<'_>,
    report: &mut RunReport,
) -> Result<Vec<usize>, RunError> {
    let all = &job.loaded.episodes;
    let ids: Vec<String> = all.iter().map(|e| e.episode_id.clone()).collect();
    let fresh = store::unseen_episodes(ctx, &ids).await?;
    let mut todo: Vec<usize> = (0..all.len())
        .filter(|&i| fresh.contains(&ids[i]))
        .collect();
    report.episodes_skipped = all.len() - todo.len();
    if let Some(limit) = job.options.limit {
        todo.truncate(limit);
    }
    report.episodes_planned = todo.len();
    Ok(todo)
}

/// The run's LLM client, with the response cache the spec and options ask
/// for.
fn open_client(job: &Job<'_>, run_id: &str) -> Result<LlmClient, RunError> {
    let (spec, mode) = (job.spec, job.options.cache);
    // --replay reads the cache even with llm.cache = false: the flag asks
    // for exactly that, and without a cache it could only fail every call.
    let cache = if (spec.llm.cache && mode != CacheMode::Off) || mode == CacheMode::Replay {
        let location = spec.llm.cache_url.as_deref().unwrap_or(&job.default_cache);
        Some(ResponseCache::open(
            location,
            &spec.output.storage_options,
            mode,
        )?)
    } else {
        None
    };
    Ok(LlmClient::new(&spec.llm, cache, run_id)?)
}

/// Every stage of a run between opening the graph and committing: what to
/// do, extraction, resolution, and the rows to commit.
async fn execute(
    job: &Job<'_>,
    tx: &mut Transaction,
    report: &mut RunReport,
) -> Result<(Changes, RunStats), RunError> {
    let run_id = tx.run_id().to_string();
    let mark = Instant::now();
    let ctx = tx.base_context().await?;
    let mark = report.timings.lap(Stage::Open, mark);
    let todo = todo(&ctx, job, report).await?;
    let client = Arc::new(open_client(job, &run_id)?);
    let concurrency = (job.spec.llm.max_concurrency as usize).max(1);
    let mut mark = report.timings.lap(Stage::Source, mark);

    let all = &job.loaded.episodes;
    let progress = &job.options.progress;
    let mut work = Extraction::new(
        all,
        job.ontology,
        &job.spec.extract,
        client.clone(),
        concurrency,
        progress,
    );
    let to_extract = work.map_records(&todo, &job.mappings);
    report.episodes_mapped = todo.len() - to_extract.len();
    mark = report.timings.lap(Stage::MapRecords, mark);
    work.entities(&to_extract).await;
    mark = report.timings.lap(Stage::ExtractEntities, mark);
    work.classify_entities().await;
    mark = report.timings.lap(Stage::ClassifyEntities, mark);
    work.facts(&to_extract).await;
    mark = report.timings.lap(Stage::ExtractFacts, mark);
    work.classify_facts().await;
    mark = report.timings.lap(Stage::ClassifyFacts, mark);
    work.join_mapped();

    let now = Utc::now();
    let succeeded = work.succeeded(&todo);
    let (mentions, facts) = work.for_resolution(&succeeded);
    let cx = StageContext {
        ctx: &ctx,
        client: &client,
        ontology: job.ontology,
        spec: &job.spec.resolve,
        concurrency,
        run_id: &run_id,
        now,
        base_short_id: store::max_short_id(&ctx).await?,
    };
    let resolved = crate::resolve::stage::resolve_run(&cx, &mentions, &facts).await?;
    let mut failures = job
        .loaded
        .failures
        .iter()
        .map(|f| f.to_row(&run_id, now))
        .collect::<Vec<_>>();
    failures.extend(work.failures(&run_id, now));
    let episodes = succeeded
        .iter()
        .map(|&i| all[i].to_row(&run_id, now))
        .collect();
    report.resolved(&resolved);
    let changes = Changes {
        episodes,
        nodes: resolved.nodes,
        updated_node_ids: resolved.updated_node_ids,
        edges: resolved.edges,
        edges_changed: resolved.changed_edges > 0,
        llm_calls: client.take_calls(),
        failures: [failures, resolved.failures].concat(),
    };
    let stats = report.account(&client, &changes);
    report.timings.lap(Stage::Resolve, mark);
    Ok((changes, stats))
}

impl RunReport {
    /// Takes resolution's counts.
    fn resolved(&mut self, resolved: &StageOutput) {
        self.nodes_added = resolved.nodes_added;
        self.nodes_updated = resolved.updated_node_ids.len();
        self.edges_added = resolved.edges_added;
        self.ambiguous_entities = resolved.ambiguous;
        self.adjudicated_merges = resolved.adjudicated;
        self.duplicate_facts = resolved.duplicates;
        self.invalidated_facts = resolved.invalidated;
    }

    /// Takes the counts of what the run commits, and returns the `runs`
    /// row's counts.
    fn account(&mut self, client: &LlmClient, changes: &Changes) -> RunStats {
        let totals = client.totals(&changes.llm_calls);
        for c in &changes.llm_calls {
            *self.calls_by_stage.entry(c.stage.clone()).or_default() += 1;
        }
        self.cache_hits = totals.cache_hits as usize;
        self.prompt_tokens = totals.prompt_tokens;
        self.completion_tokens = totals.completion_tokens;
        self.cost_usd = totals.cost_usd;
        self.episodes_added = changes.episodes.len();
        for f in &changes.failures {
            *self.failures_by_stage.entry(f.stage.clone()).or_default() += 1;
        }
        self.failure_samples = changes.failures.iter().take(10).cloned().collect();
        RunStats {
            episodes_seen: self.episodes_seen as i64,
            episodes_skipped: self.episodes_skipped as i64,
            episodes_added: changes.episodes.len() as i64,
            nodes_added: self.nodes_added as i64,
            edges_added: self.edges_added as i64,
            failures: changes.failures.len() as i64,
            llm_calls: changes.llm_calls.len() as i64,
            prompt_tokens: totals.prompt_tokens as i64,
            completion_tokens: totals.completion_tokens as i64,
            cost_usd: totals.cost_usd,
            // Known once the ontology is staged (Transaction::stage_changes).
            ontology_hash: String::new(),
        }
    }
}
