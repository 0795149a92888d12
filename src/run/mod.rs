//! A run (`graphloom run`): source → anti-join with committed episodes →
//! entity extraction → entity subtype walk → fact extraction → edge subtype
//! walk → in-run merge → one commit. Every episode ends either in
//! `episodes` and the graph, or in `failures` with its reason (and is
//! retried by the next run, since it is not in `episodes`).
//!
//! In batch mode (`llm.mode = "batch"`, `--batch`) a run goes in rounds
//! ([`crate::llm::batch`]): each round executes the stages against the
//! response cache, stops after the first stage whose calls were queued,
//! submits them to the Batch API and waits; the round that needs no new
//! answer commits.

mod batch;
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
use crate::spec::{LlmMode, PipelineSpec};
use crate::stage::{Stage, Timings};
use crate::store::{self, Changes, GraphStore, RunRow, RunStats, StoreError, Transaction};
pub use batch::BatchProgress;
use extraction::Extraction;
pub use plan::{batch_rounds, plan};

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
    /// The cluster resolution runs on could not be reached or used.
    #[error(transparent)]
    Cluster(Box<crate::cluster::ClusterError>),
    /// `resolve.cluster` is not a cluster URL.
    #[error("resolve.cluster: {0}")]
    ClusterSetting(Box<crate::cluster::ClusterError>),
    /// Batch mode: the Batch API or the batch ledger failed.
    #[error(transparent)]
    Batch(#[from] crate::llm::batch::BatchError),
    /// Batch mode needs the response cache: answers arrive there.
    #[error(
        "batch mode needs the response cache (its answers arrive there): set llm.cache = true and run without --no-cache / --refresh-cache / --replay"
    )]
    BatchNeedsCache,
    /// `--no-wait` without batch mode.
    #[error("--no-wait applies to batch mode only: add --batch or set llm.mode = \"batch\"")]
    NoWaitNeedsBatch,
    /// Batch mode went through `llm.batch.max_rounds` rounds and still
    /// queued calls.
    #[error(
        "batch mode: {rounds} rounds and the run still queued calls (last at {stage}); raise llm.batch.max_rounds if the ontology is that deep"
    )]
    TooManyRounds {
        /// Rounds made.
        rounds: u32,
        /// The stage that queued calls in the last round.
        stage: Stage,
    },
    /// The `[[mapping]]` tables break rules.
    #[error(transparent)]
    Mapping(#[from] MappingError),
}

impl From<crate::cluster::ClusterError> for RunError {
    fn from(e: crate::cluster::ClusterError) -> Self {
        RunError::Cluster(Box::new(e))
    }
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
    /// Batch mode even when the spec says `llm.mode = "sync"`.
    pub batch: bool,
    /// Batch mode: submit what the next round needs and return without
    /// waiting (for schedulers); the next run collects.
    pub no_wait: bool,
    /// Resolve on this Ballista cluster (over the spec's
    /// `resolve.cluster`).
    pub cluster: Option<crate::cluster::ClusterUrl>,
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
    /// Text mentions that took the type a record gives their name
    /// (`resolve.record_types_win`).
    pub retyped_mentions: usize,
    /// Text mentions that took the type most episodes give their name
    /// (`resolve.majority_types`).
    pub majority_retyped: usize,
    /// Text mentions moved down to a subtype because a fact's relation
    /// holds only for it (relations refine types).
    pub refined_by_relations: usize,
    /// How often each language cue that was on changed an outcome, in
    /// registry order (`extract.language`, `[extract.cues]`).
    pub cue_fires: Vec<(String, u64)>,
    /// The cues that were off.
    pub cues_off: Vec<String>,
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
    /// What each LLM endpoint did, in the order of `llm.endpoints`; empty
    /// with a single endpoint.
    pub endpoints: Vec<EndpointReport>,
    /// The fewest and the most calls the client let go at once
    /// (`llm.adaptive_concurrency`), and `llm.max_concurrency`.
    pub in_flight: (usize, usize, usize),
    /// The plan (dry run).
    pub plan: Vec<StagePlan>,
    /// Dry run: the rounds batch mode would make at most.
    pub batch_rounds: u32,
    /// Batch mode: rounds, submissions and what is still running.
    pub batch: Option<batch::BatchProgress>,
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

/// What one of several LLM endpoints did in a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointReport {
    /// Its base URL without credentials, query or fragment (as in
    /// `llm_calls.endpoint`).
    pub endpoint: String,
    /// Calls whose last attempt went there.
    pub calls: usize,
    /// Of those, calls that failed.
    pub failed_calls: usize,
    /// Tokens of those calls.
    pub prompt_tokens: u64,
    /// Completion tokens of those calls.
    pub completion_tokens: u64,
    /// HTTP attempts sent there (a call retried elsewhere counts where
    /// each attempt went).
    pub attempts: u64,
    /// Attempts that failed there (no reply, timeout, 5xx, 429).
    pub failed_attempts: u64,
    /// Times it was rested after failing repeatedly.
    pub rests: u64,
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

/// Per endpoint: the client's attempt counts and the calls of `rows` that
/// ended there (none with a single endpoint).
fn endpoint_reports(client: &LlmClient, rows: &[crate::rows::LlmCallRow]) -> Vec<EndpointReport> {
    let stats = client.endpoint_stats();
    if stats.len() < 2 {
        return Vec::new();
    }
    stats
        .into_iter()
        .map(|s| {
            let mut r = EndpointReport {
                attempts: s.attempts,
                failed_attempts: s.failed_attempts,
                rests: s.rests,
                ..EndpointReport::default()
            };
            for row in rows
                .iter()
                .filter(|row| row.endpoint.as_deref() == Some(s.endpoint.as_str()))
            {
                r.calls += 1;
                r.failed_calls += usize::from(row.status != "ok");
                r.prompt_tokens += row.prompt_tokens.max(0) as u64;
                r.completion_tokens += row.completion_tokens.max(0) as u64;
            }
            r.endpoint = s.endpoint;
            r
        })
        .collect()
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
    /// A session on the cluster that resolution runs on, if any.
    cluster: Option<SessionContext>,
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
    report.timings.lap(Stage::Source, started);
    let cluster = match (&options.cluster, &spec.resolve.cluster) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(text)) => {
            let url = crate::cluster::ClusterUrl::parse(text)
                .map_err(|e| RunError::ClusterSetting(Box::new(e)))?;
            Some(url)
        }
        (None, None) => None,
    };
    // Connected before any LLM call: a cluster that is down fails the run
    // at once, not after the extraction was paid for.
    let cluster = match cluster {
        Some(url) if !options.dry_run => Some(crate::cluster::connect(&url).await?),
        _ => None,
    };
    let job = Job {
        spec,
        ontology,
        options,
        loaded: &loaded,
        mappings,
        default_cache: format!("{}_cache/llm/", store.url()),
        cluster,
    };
    let batch_mode = options.batch || spec.llm.mode == LlmMode::Batch;
    if options.no_wait && !batch_mode {
        return Err(RunError::NoWaitNeedsBatch);
    }
    if options.dry_run {
        dry_run(&job, store, &mut report).await?;
    } else if batch_mode {
        batch::rounds(&job, store, &mut report).await?;
    } else {
        attempt(&job, store, &mut report, None).await?;
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// One pass over the stages in a transaction of its own: commits, or in
/// batch mode abandons the transaction (writing nothing) and returns the
/// stage whose calls were queued.
async fn attempt(
    job: &Job<'_>,
    store: &GraphStore,
    report: &mut RunReport,
    batch: Option<&batch::Round>,
) -> Result<Option<Stage>, RunError> {
    let mark = Instant::now();
    let mut tx = store.begin("run", &job.spec.output.group_id).await?;
    report.timings.lap(Stage::Open, mark);
    match execute(job, &mut tx, report, batch).await {
        Ok(Outcome::Done(done)) => {
            let (changes, mut stats) = *done;
            let mark = Instant::now();
            stats.ontology_hash =
                tx.stage_changes(&changes, job.ontology, &job.spec.resolve.name_keys())?;
            report.run = Some(tx.commit(stats).await?);
            report.timings.lap(Stage::Commit, mark);
            Ok(None)
        }
        Ok(Outcome::Waiting(stage)) => {
            tx.abandon().await?;
            Ok(Some(stage))
        }
        Err(e) => {
            tx.fail(&e.to_string(), RunStats::default()).await.ok();
            Err(e)
        }
    }
}

/// How [`execute`] ended.
enum Outcome {
    /// The rows to commit and the run's counts.
    Done(Box<(Changes, RunStats)>),
    /// Batch mode: this stage's calls were queued; nothing to commit yet.
    Waiting(Stage),
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
    report.batch_rounds = plan::batch_rounds(job.ontology, &job.spec.extract, &job.spec.resolve);
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

/// The response cache the spec and options ask for, if any.
fn open_cache(job: &Job<'_>) -> Result<Option<ResponseCache>, RunError> {
    let (spec, mode) = (job.spec, job.options.cache);
    // --replay reads the cache even with llm.cache = false: the flag asks
    // for exactly that, and without a cache it could only fail every call.
    if (spec.llm.cache && mode != CacheMode::Off) || mode == CacheMode::Replay {
        let location = spec.llm.cache_url.as_deref().unwrap_or(&job.default_cache);
        Ok(Some(ResponseCache::open(
            location,
            &spec.output.storage_options,
            mode,
        )?))
    } else {
        Ok(None)
    }
}

/// The run's LLM client, with the response cache the spec and options ask
/// for, and in batch mode the round's queue.
fn open_client(
    job: &Job<'_>,
    run_id: &str,
    batch: Option<&batch::Round>,
) -> Result<LlmClient, RunError> {
    let client = LlmClient::new(&job.spec.llm, open_cache(job)?, run_id)?;
    Ok(match batch {
        Some(round) => client.with_batch_queue(round.queue.clone()),
        None => client,
    })
}

/// Batch mode: returns from [`execute`] when the stage just run queued
/// calls.
macro_rules! settled {
    ($client:expr, $stage:expr) => {
        if $client.deferred() > 0 {
            return Ok(Outcome::Waiting($stage));
        }
    };
}

/// Every stage of a run between opening the graph and committing: what to
/// do, extraction, resolution, and the rows to commit.
async fn execute(
    job: &Job<'_>,
    tx: &mut Transaction,
    report: &mut RunReport,
    batch: Option<&batch::Round>,
) -> Result<Outcome, RunError> {
    let run_id = tx.run_id().to_string();
    let mark = Instant::now();
    let ctx = tx.base_context().await?;
    let mark = report.timings.lap(Stage::Open, mark);
    let todo = todo(&ctx, job, report).await?;
    let client = Arc::new(open_client(job, &run_id, batch)?);
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
    settled!(client, Stage::ExtractEntities);
    work.classify_entities().await;
    mark = report.timings.lap(Stage::ClassifyEntities, mark);
    settled!(client, Stage::ClassifyEntities);
    (report.retyped_mentions, report.majority_retyped) = work
        .take_named_types(&ctx, &job.spec.resolve)
        .await
        .map_err(|source| ResolveError::DataFusion {
            step: "matching text names to the types records and other episodes give them",
            source,
        })?;
    work.facts(&to_extract).await;
    mark = report.timings.lap(Stage::ExtractFacts, mark);
    settled!(client, Stage::ExtractFacts);
    work.classify_facts().await;
    mark = report.timings.lap(Stage::ClassifyFacts, mark);
    settled!(client, Stage::ClassifyFacts);
    report.refined_by_relations = work.refine_types().mentions;
    work.stated_identities();
    work.join_mapped();
    (report.cue_fires, report.cues_off) = work.cue_counts();

    let now = Utc::now();
    let succeeded = work.succeeded(&todo);
    let run = work.for_resolution(&succeeded);
    let resolution_ctx = match &job.cluster {
        Some(remote) => {
            crate::cluster::prepare_resolution(remote, tx).await?;
            remote
        }
        None => &ctx,
    };
    let cx = StageContext {
        ctx: resolution_ctx,
        client: &client,
        ontology: job.ontology,
        spec: &job.spec.resolve,
        concurrency,
        run_id: &run_id,
        now,
        base_short_id: store::max_short_id(&ctx).await?,
    };
    let resolved =
        crate::resolve::stage::resolve_run(&cx, &run.mentions, &run.facts, &run.withdrawals).await;
    if job.cluster.is_some() {
        // The scratch tables are no use once resolution has ended; a run
        // killed before this line leaves them to the next one's clean-up.
        if let Err(e) = tx.store().clear_scratch().await {
            tracing::warn!("could not delete resolution's scratch files: {e}");
        }
    }
    let resolved = match resolved {
        Err(ResolveError::Waiting { stage }) => return Ok(Outcome::Waiting(stage)),
        resolved => resolved?,
    };
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
        llm_calls: match batch {
            // The Batch API's answers are accounted by the run that uses
            // them; this round's own rows are cache reads.
            Some(round) => [round.call_rows(&ctx, &run_id).await?, client.take_calls()].concat(),
            None => client.take_calls(),
        },
        failures: [failures, resolved.failures].concat(),
    };
    let stats = report.account(&client, &changes);
    report.timings.lap(Stage::Resolve, mark);
    Ok(Outcome::Done(Box::new((changes, stats))))
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
        self.endpoints = endpoint_reports(client, &changes.llm_calls);
        self.in_flight = client.in_flight();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::LlmCallRow;
    use crate::spec::{EndpointSpec, LlmSpec};

    fn row(endpoint: Option<&str>, status: &str, tokens: i64) -> LlmCallRow {
        LlmCallRow {
            call_id: uuid::Uuid::now_v7().to_string(),
            run_id: "run".into(),
            stage: "extract_entities".into(),
            model: "m".into(),
            item: None,
            prompt_tokens: tokens,
            completion_tokens: 1,
            latency_ms: 0,
            wait_ms: 0,
            attempts: 1,
            cache_hit: endpoint.is_none(),
            status: status.into(),
            error: None,
            created_at: Utc::now(),
            endpoint: endpoint.map(str::to_string),
        }
    }

    #[test]
    fn the_report_counts_calls_failures_and_tokens_per_endpoint() {
        let endpoint = |url: &str| EndpointSpec {
            base_url: url.into(),
            max_concurrency: None,
            weight: 1,
        };
        let spec = LlmSpec {
            endpoints: vec![
                endpoint("http://user:pw@10.0.0.1:8000/v1?key=k"),
                endpoint("http://10.0.0.2:8000/v1/"),
            ],
            ..LlmSpec::default()
        };
        let client = LlmClient::with_key(&spec, None, None, "run").expect("client");
        let (a, b) = ("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1");
        let rows = [
            row(Some(a), "ok", 10),
            row(Some(a), "error", 0),
            row(Some(b), "ok", 7),
            row(None, "ok", 3),
        ];
        let got: Vec<(String, usize, usize, u64, u64)> = endpoint_reports(&client, &rows)
            .into_iter()
            .map(|r| {
                (
                    r.endpoint,
                    r.calls,
                    r.failed_calls,
                    r.prompt_tokens,
                    r.completion_tokens,
                )
            })
            .collect();
        assert_eq!(
            got,
            [(a.to_string(), 2, 1, 10, 2), (b.to_string(), 1, 0, 7, 1)]
        );
        // One endpoint: no per-endpoint lines.
        let single = LlmClient::with_key(&LlmSpec::default(), None, None, "run").expect("client");
        assert!(endpoint_reports(&single, &rows).is_empty());
    }
}
