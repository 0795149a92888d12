//! A run (`graphloom run`): source → anti-join with committed episodes →
//! entity extraction → entity subtype walk → fact extraction → edge subtype
//! walk → in-run merge → one commit. Every episode ends either in
//! `episodes` and the graph, or in `failures` with its reason (and is
//! retried by the next run, since it is not in `episodes`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{AsArray, RecordBatch, StringArray};
use chrono::Utc;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::extract::{self, ExtractSpec, FactMention, Mention, Rejected};
use crate::llm::plan::StagePlan;
use crate::llm::{CacheMode, LlmClient, LlmError, ResponseCache};
use crate::ontology::Ontology;
use crate::resolve::stage::{RunFact, RunMention, StageContext, StageError};
use crate::source::{self, Episode, SourceError};
use crate::spec::PipelineSpec;
use crate::store::rows::{self, EpisodeRow, FailureRow};
use crate::store::{GraphStore, RunRow, RunStats, StoreError, Table, WriteMode};

/// Errors that stop a run (bad items are `failures` rows instead).
#[derive(Debug, thiserror::Error)]
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
    /// A query over the committed graph failed.
    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),
    /// Resolution failed.
    #[error(transparent)]
    Resolve(#[from] StageError),
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
    /// Show a progress bar (a terminal) instead of log lines.
    pub progress_bar: bool,
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
    /// parsing and the anti-join with committed episodes),
    /// `extract_entities`, `classify_entities`, `extract_facts`,
    /// `classify_facts`, `resolve` (resolution and building the rows) and
    /// `commit` (opening the graph for writing, the table commits and the
    /// runs row).
    pub stage_seconds: Vec<(&'static str, f64)>,
}

impl RunReport {
    /// Seconds spent in `stage` (0 when it did not run).
    pub fn stage(&self, stage: &str) -> f64 {
        self.stage_seconds
            .iter()
            .filter(|(s, _)| *s == stage)
            .map(|(_, t)| t)
            .sum()
    }

    fn time(&mut self, stage: &'static str, since: Instant) -> Instant {
        let now = Instant::now();
        self.stage_seconds
            .push((stage, (now - since).as_secs_f64()));
        now
    }

    /// LLM calls per processed episode.
    pub fn calls_per_episode(&self) -> f64 {
        let calls: usize = self.calls_by_stage.values().sum();
        calls as f64 / self.episodes_planned.max(1) as f64
    }
}

/// Ids among `candidates` that are not in the committed `episodes` table:
/// a DataFusion anti-join, so a re-run does no work and a grown archive
/// only processes what is new.
pub async fn new_episode_ids(
    ctx: &SessionContext,
    candidates: &[String],
) -> Result<HashSet<String>, RunError> {
    crate::scratch::register_column(
        ctx,
        "run_candidates",
        "episode_id",
        Arc::new(StringArray::from(candidates.to_vec())),
    )?;
    let batches = ctx
        .sql("SELECT c.episode_id FROM run_candidates c LEFT ANTI JOIN episodes e ON c.episode_id = e.episode_id")
        .await?
        .collect()
        .await?;
    let mut out = HashSet::new();
    for b in batches {
        let ids = b.column(0).as_string::<i32>();
        out.extend(ids.iter().flatten().map(str::to_string));
    }
    Ok(out)
}

/// The episodes of each document (by group), in archive order, so that an
/// episode's context is found without scanning the archive before it.
struct Documents<'a> {
    all: &'a [Episode],
    positions: HashMap<(&'a str, &'a str), Vec<usize>>,
}

impl<'a> Documents<'a> {
    fn new(all: &'a [Episode]) -> Self {
        let mut positions: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        for (i, e) in all.iter().enumerate() {
            if let Some(doc) = &e.document_id {
                positions
                    .entry((e.group_id.as_str(), doc.as_str()))
                    .or_default()
                    .push(i);
            }
        }
        Documents { all, positions }
    }

    /// Episode `index` and its context, owned (for a task of its own).
    fn owned(&self, index: usize, n: usize) -> (Episode, Vec<Episode>) {
        let context = self.context_for(index, n).into_iter().cloned().collect();
        (self.all[index].clone(), context)
    }

    /// Up to `n` earlier episodes of the same document, most recent last.
    fn context_for(&self, index: usize, n: usize) -> Vec<&'a Episode> {
        let ep = &self.all[index];
        let Some(doc) = &ep.document_id else {
            return Vec::new();
        };
        let Some(list) = self.positions.get(&(ep.group_id.as_str(), doc.as_str())) else {
            return Vec::new();
        };
        let end = list.partition_point(|&p| p < index);
        list[end.saturating_sub(n)..end]
            .iter()
            .map(|&p| &self.all[p])
            .collect()
    }
}

/// What the extraction tasks of a run share.
struct Shared {
    ontology: Ontology,
    spec: ExtractSpec,
    prompts: extract::Prompts,
}

/// Progress of one phase: a bar on a terminal, log lines otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    name: &'static str,
    total: usize,
    done: usize,
    last_log: Instant,
}

impl Progress {
    fn new(name: &'static str, total: usize, show_bar: bool) -> Self {
        let bar = show_bar.then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix:>18} [{bar:30}] {pos}/{len} {msg} (eta {eta})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_prefix(name);
            bar
        });
        Progress {
            bar,
            name,
            total,
            done: 0,
            last_log: Instant::now(),
        }
    }

    // The one print in the library: progress moves to the CLI with the
    // run redesign (issue 11, item 3).
    #[allow(clippy::print_stderr)]
    fn tick(&mut self, client: &LlmClient, failures: usize) {
        self.done += 1;
        let (calls, tokens) = client.progress();
        let msg = format!("calls {calls}, tokens {tokens}, failures {failures}");
        match &self.bar {
            Some(bar) => {
                bar.set_position(self.done as u64);
                bar.set_message(msg);
            }
            None => {
                if self.done == self.total || self.last_log.elapsed().as_secs() >= 10 {
                    self.last_log = Instant::now();
                    // Plain lines on stderr when it is not a terminal (CI,
                    // cron): progress shows without raising the log level.
                    eprintln!(
                        "{}: {}/{} episodes, {msg}",
                        self.name, self.done, self.total
                    );
                }
            }
        }
    }

    fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish();
        }
    }
}

fn rejected_row(r: &Rejected, run_id: &str, by_id: &HashMap<&str, &Episode>) -> FailureRow {
    let ep = by_id.get(r.episode_id.as_str());
    let item = ep.map_or_else(|| r.episode_id.clone(), |e| e.source_uri.clone());
    let row = FailureRow::new(run_id, r.stage, item, r.reason.clone(), Utc::now())
        .of_episode(r.episode_id.clone())
        .excerpt(&r.excerpt);
    match ep {
        Some(e) => row.at(e.source_uri.clone(), None),
        None => row,
    }
}

/// Plans the calls of a run over `episodes` without calling anything.
pub fn plan(
    ontology: &Ontology,
    spec: &ExtractSpec,
    all: &[Episode],
    todo: &[usize],
) -> Vec<StagePlan> {
    // Entity and fact calls are one per episode; the walks depend on what
    // extraction finds, so they are bounded with an assumed 6 entities and
    // 4 facts per episode.
    const ENTITIES_PER_EPISODE: u64 = 6;
    const FACTS_PER_EPISODE: u64 = 4;
    let n = todo.len() as u64;
    let mut entity = StagePlan {
        stage: "extract_entities".into(),
        calls: n,
        ..StagePlan::default()
    };
    let mut fact = StagePlan {
        stage: "extract_facts (≤)".into(),
        calls: n,
        ..StagePlan::default()
    };
    let documents = Documents::new(all);
    let prompts = extract::Prompts::new(ontology, spec);
    for &i in todo {
        let context = documents.context_for(i, spec.context_episodes);
        let req = prompts.entity_request(spec, &all[i], &context);
        let prompt = crate::llm::client::estimate_tokens(&req.messages);
        entity.prompt_tokens += prompt;
        entity.max_completion_tokens += req.max_tokens as u64;
        // The fact prompt carries the episode plus the entity list.
        fact.prompt_tokens += prompt + ENTITIES_PER_EPISODE * 8;
        fact.max_completion_tokens += spec.fact_max_tokens as u64;
    }
    let levels = |tree: &crate::ontology::TypeTree| {
        tree.iter().filter(|t| !t.children.is_empty()).count() as u64
    };
    let batch = spec.classify_batch_size.max(1) as u64;
    // A walk makes at most one call per batch of items per parent type;
    // its prompt and reply grow with the batch.
    let walk = |stage: &str,
                parents: u64,
                per_episode: u64,
                (prompt_base, prompt_per_item): (u64, u64),
                (reply_base, reply_per_item): (u64, u64)| {
        let items = n * per_episode;
        let calls = items.div_ceil(batch).min(items) * parents;
        (calls > 0).then(|| StagePlan {
            stage: format!("{stage} (≤)"),
            calls,
            prompt_tokens: calls * (prompt_base + batch * prompt_per_item),
            max_completion_tokens: calls * (reply_base + batch * reply_per_item),
        })
    };
    let mut stages = vec![entity];
    stages.extend(walk(
        "classify_entities",
        levels(&ontology.entity_tree),
        ENTITIES_PER_EPISODE,
        (400, 80),
        (64, 100),
    ));
    stages.push(fact);
    stages.extend(walk(
        "classify_facts",
        levels(&ontology.edge_tree),
        FACTS_PER_EPISODE,
        (300, 50),
        (64, 32),
    ));
    stages
}

/// Runs the pipeline.
pub async fn run(
    spec: &PipelineSpec,
    ontology: &Ontology,
    store: &GraphStore,
    options: &RunOptions,
) -> Result<RunReport, RunError> {
    let started = Instant::now();
    let source_spec = spec.source.as_ref().ok_or(RunError::NoSource)?;
    let group_id = &spec.output.group_id;
    let loaded = source::load(source_spec, group_id, &spec.output.storage_options).await?;
    let mut report = RunReport {
        episodes_seen: loaded.episodes.len(),
        ..RunReport::default()
    };
    let mut mark = report.time("source", started);
    let ids: Vec<String> = loaded
        .episodes
        .iter()
        .map(|e| e.episode_id.clone())
        .collect();

    if options.dry_run {
        let snapshot = store.snapshot().await?;
        let ctx = SessionContext::new();
        snapshot.register(&ctx).await?;
        let fresh = new_episode_ids(&ctx, &ids).await?;
        let mut todo: Vec<usize> = (0..loaded.episodes.len())
            .filter(|i| fresh.contains(&ids[*i]))
            .collect();
        report.episodes_skipped = loaded.episodes.len() - todo.len();
        if let Some(limit) = options.limit {
            todo.truncate(limit);
        }
        report.episodes_planned = todo.len();
        report.plan = plan(ontology, &spec.extract, &loaded.episodes, &todo);
        *report.failures_by_stage.entry("source".into()).or_default() += loaded.failures.len();
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(report);
    }

    let mut tx = store.begin("run", group_id).await?;
    report.time("open", mark);
    let outcome = execute(
        spec,
        ontology,
        store,
        options,
        &loaded,
        &ids,
        &mut tx,
        &mut report,
    )
    .await;
    match outcome {
        Ok((writes, stats, since)) => {
            mark = since;
            for (table, mode, batch) in writes {
                tx.stage(table, mode, vec![batch]);
            }
            let run = tx.commit(stats).await?;
            report.time("commit", mark);
            report.run = Some(run);
            report.seconds = started.elapsed().as_secs_f64();
            Ok(report)
        }
        Err(e) => {
            tx.fail(&e.to_string(), RunStats::default()).await.ok();
            Err(e)
        }
    }
}

type Writes = Vec<(Table, WriteMode, RecordBatch)>;

#[allow(clippy::too_many_arguments)]
async fn execute(
    spec: &PipelineSpec,
    ontology: &Ontology,
    store: &GraphStore,
    options: &RunOptions,
    loaded: &source::Loaded,
    ids: &[String],
    tx: &mut crate::store::Transaction,
    report: &mut RunReport,
) -> Result<(Writes, RunStats, Instant), RunError> {
    let run_id = tx.run_id().to_string();
    let mut mark = Instant::now();
    let ctx = tx.base_context().await?;
    mark = report.time("open", mark);
    let fresh = new_episode_ids(&ctx, ids).await?;
    let all = &loaded.episodes;
    let mut todo: Vec<usize> = (0..all.len())
        .filter(|i| fresh.contains(&ids[*i]))
        .collect();
    report.episodes_skipped = all.len() - todo.len();
    if let Some(limit) = options.limit {
        todo.truncate(limit);
    }
    report.episodes_planned = todo.len();
    let by_id: HashMap<&str, &Episode> = all.iter().map(|e| (e.episode_id.as_str(), e)).collect();
    let mut failures: Vec<FailureRow> = loaded
        .failures
        .iter()
        .map(|f| f.to_row(&run_id, Utc::now()))
        .collect();

    // --replay reads the cache even with llm.cache = false: the flag asks
    // for exactly that, and without a cache it could only fail every call.
    let cache = if (spec.llm.cache && options.cache != CacheMode::Off)
        || options.cache == CacheMode::Replay
    {
        let location = match &spec.llm.cache_url {
            Some(u) => u.clone(),
            None => format!("{}_cache/llm/", store.url()),
        };
        Some(ResponseCache::open(
            &location,
            &spec.output.storage_options,
            options.cache,
        )?)
    } else {
        None
    };
    let client = Arc::new(LlmClient::new(&spec.llm, cache, &run_id)?);
    let concurrency = (spec.llm.max_concurrency as usize).max(1);
    let xs = &spec.extract;
    mark = report.time("source", mark);

    let documents = &Documents::new(all);
    // Each episode's calls run as a task of their own, so that building
    // prompts, hashing cache keys and parsing replies use every core (a
    // replay from the cache is nothing but that work).
    let shared = Arc::new(Shared {
        ontology: ontology.clone(),
        spec: xs.clone(),
        prompts: extract::Prompts::new(ontology, xs),
    });

    // 1. Entities, one call per episode.
    let mut progress = Progress::new("entities", todo.len(), options.progress_bar);
    let mut entity_results: HashMap<usize, Result<Vec<Mention>, LlmError>> = HashMap::new();
    let mut rejected: Vec<Rejected> = Vec::new();
    {
        let mut stream = futures::stream::iter(todo.iter().copied())
            .map(|i| {
                let (client, shared) = (client.clone(), shared.clone());
                let (episode, context) = documents.owned(i, xs.context_episodes);
                let task = crate::llm::in_task(async move {
                    let context: Vec<&Episode> = context.iter().collect();
                    let s = &*shared;
                    extract::extract_entities(
                        &client,
                        &s.ontology,
                        &s.spec,
                        &s.prompts,
                        &episode,
                        &context,
                    )
                    .await
                });
                async move { (i, task.await) }
            })
            .buffer_unordered(concurrency * 2);
        let mut entity_failures = 0;
        while let Some((i, r)) = stream.next().await {
            let r = r.map(|(m, rej)| {
                rejected.extend(rej);
                m
            });
            entity_failures += usize::from(r.is_err());
            entity_results.insert(i, r);
            progress.tick(&client, entity_failures);
        }
    }
    progress.finish();

    // Episodes whose entity call failed are done for this run.
    let mut mentions: Vec<Mention> = Vec::new();
    let mut mention_range: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut failed: HashMap<usize, (String, LlmError)> = HashMap::new();
    for &i in &todo {
        match entity_results.remove(&i) {
            Some(Ok(m)) => {
                let start = mentions.len();
                mentions.extend(m);
                mention_range.insert(i, (start, mentions.len()));
            }
            Some(Err(e)) => {
                failed.insert(i, ("extract_entities".into(), e));
            }
            None => {}
        }
    }

    mark = report.time("extract_entities", mark);

    // 2. The entity subtype walk, batched across episodes.
    let (walk, rej) =
        crate::classify::walk_entities(&client, ontology, xs, concurrency, &mut mentions).await;
    tracing::info!(
        "entity subtype walk: {} calls, {} entities refined",
        walk.calls,
        walk.refined
    );
    rejected.extend(rej);
    mark = report.time("classify_entities", mark);

    // 3. Facts, one call per episode with two or more entities.
    let with_entities: Vec<usize> = todo
        .iter()
        .copied()
        .filter(|i| mention_range.contains_key(i))
        .collect();
    let mut progress = Progress::new("facts", with_entities.len(), options.progress_bar);
    let mut facts: Vec<FactMention> = Vec::new();
    let mut fact_owner: Vec<usize> = Vec::new();
    {
        let mentions = &mentions;
        let mention_range = &mention_range;
        let mut stream = futures::stream::iter(with_entities.iter().copied())
            .map(|i| {
                let (client, shared) = (client.clone(), shared.clone());
                let (a, b) = mention_range[&i];
                let own: Vec<Mention> = mentions[a..b].to_vec();
                let (episode, context) = documents.owned(i, xs.context_episodes);
                let task = crate::llm::in_task(async move {
                    let context: Vec<&Episode> = context.iter().collect();
                    let s = &*shared;
                    extract::extract_facts(
                        &client,
                        &s.ontology,
                        &s.spec,
                        &s.prompts,
                        &episode,
                        &context,
                        &own,
                    )
                    .await
                });
                async move { (i, task.await) }
            })
            .buffer_unordered(concurrency * 2);
        let mut replies = HashMap::new();
        let mut fact_failures = 0;
        while let Some((i, r)) = stream.next().await {
            fact_failures += usize::from(r.is_err());
            replies.insert(i, r);
            progress.tick(&client, failed.len() + fact_failures);
        }
        // Facts in episode order, not in the order replies arrived: the edge
        // walk batches them by position, and its requests (hence cache keys)
        // must be the same on every run over the same episodes.
        for &i in &with_entities {
            match replies.remove(&i) {
                Some(Ok((f, rej))) => {
                    rejected.extend(rej);
                    fact_owner.extend(std::iter::repeat_n(i, f.len()));
                    facts.extend(f);
                }
                Some(Err(e)) => {
                    failed.insert(i, ("extract_facts".into(), e));
                }
                None => {}
            }
        }
    }
    progress.finish();
    mark = report.time("extract_facts", mark);

    // 4. The edge subtype walk.
    let index_of: HashMap<&str, usize> = all
        .iter()
        .enumerate()
        .map(|(i, e)| (e.episode_id.as_str(), i))
        .collect();
    let endpoint_types = |f: &FactMention| -> (String, String) {
        let Some(&i) = index_of.get(f.episode_id.as_str()) else {
            return ("Entity".into(), "Entity".into());
        };
        let (a, _) = mention_range.get(&i).copied().unwrap_or((0, 0));
        (
            mentions[a + f.source].type_name().to_string(),
            mentions[a + f.target].type_name().to_string(),
        )
    };
    let (walk, rej) = crate::classify::walk_facts(
        &client,
        ontology,
        xs,
        concurrency,
        &mut facts,
        &endpoint_types,
    )
    .await;
    tracing::info!(
        "edge subtype walk: {} calls, {} facts refined",
        walk.calls,
        walk.refined
    );
    rejected.extend(rej);
    mark = report.time("classify_facts", mark);

    // 5. Rows. An episode counts only when both of its calls succeeded;
    // otherwise its output is dropped and it is retried by the next run.
    let now = Utc::now();
    for (i, (stage, e)) in &failed {
        let ep = &all[*i];
        failures.push(
            FailureRow::new(&run_id, stage, ep.source_uri.clone(), e.to_string(), now)
                .at(ep.source_uri.clone(), None)
                .of_episode(ep.episode_id.clone())
                .excerpt(&ep.content),
        );
    }
    failures.extend(rejected.iter().map(|r| rejected_row(r, &run_id, &by_id)));
    let succeeded: Vec<usize> = todo
        .iter()
        .copied()
        .filter(|i| !failed.contains_key(i))
        .collect();

    let base_short_id = {
        let b = ctx
            .sql("SELECT coalesce(max(short_id), 0) FROM nodes")
            .await?
            .collect()
            .await?;
        b.first()
            .map(|b| {
                b.column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .value(0)
            })
            .unwrap_or(0)
    };
    // 6. Resolution: this run's mentions and facts against each other and
    // the committed graph (module `resolve::stage`).
    let mut run_mentions: Vec<RunMention> = Vec::new();
    let mut index_of_mention: HashMap<usize, usize> = HashMap::new();
    for &i in &succeeded {
        let Some(&(a, b)) = mention_range.get(&i) else {
            continue;
        };
        for (k, m) in mentions[a..b].iter().enumerate() {
            index_of_mention.insert(a + k, run_mentions.len());
            run_mentions.push(RunMention {
                group_id: &all[i].group_id,
                mention: m,
            });
        }
    }
    let mut run_facts: Vec<RunFact> = Vec::new();
    for (f, owner) in facts.iter().zip(&fact_owner) {
        let Some(&(a, _)) = mention_range.get(owner) else {
            continue;
        };
        if let (Some(&source), Some(&target)) = (
            index_of_mention.get(&(a + f.source)),
            index_of_mention.get(&(a + f.target)),
        ) {
            run_facts.push(RunFact {
                source,
                target,
                fact: f,
            });
        }
    }
    let resolved = crate::resolve::stage::resolve_run(
        &StageContext {
            ctx: &ctx,
            client: &client,
            ontology,
            spec: &spec.resolve,
            concurrency,
            run_id: &run_id,
            now,
            base_short_id,
        },
        &run_mentions,
        &run_facts,
    )
    .await?;
    mark = report.time("resolve", mark);
    failures.extend(resolved.failures);
    report.ambiguous_entities = resolved.ambiguous;
    report.adjudicated_merges = resolved.adjudicated;
    report.duplicate_facts = resolved.duplicates;
    report.invalidated_facts = resolved.invalidated;
    let (nodes, edges) = (resolved.nodes, resolved.edges);
    let (nodes_added, edges_added) = (resolved.nodes_added, resolved.edges_added);
    let (updated_ids, changed_edges) = (resolved.updated_node_ids, resolved.changed_edges);
    let labels = rows::node_label_rows(&nodes);
    let episodes: Vec<EpisodeRow> = succeeded
        .iter()
        .map(|i| {
            let e = &all[*i];
            EpisodeRow {
                episode_id: e.episode_id.clone(),
                group_id: e.group_id.clone(),
                document_id: e.document_id.clone(),
                source_id: e.source_id.clone(),
                source_uri: e.source_uri.clone(),
                source_description: e.source_description.clone(),
                kind: e.kind.as_str().to_string(),
                content: e.content.clone(),
                reference_time: e.reference_time,
                reference_time_source: e.reference_time_source.clone(),
                ingested_at: now,
                run_id: run_id.clone(),
            }
        })
        .collect();
    let calls = client.take_calls();
    let totals = client.totals(&calls);
    for c in &calls {
        *report.calls_by_stage.entry(c.stage.clone()).or_default() += 1;
    }
    report.cache_hits = totals.cache_hits as usize;
    report.prompt_tokens = totals.prompt_tokens;
    report.completion_tokens = totals.completion_tokens;
    report.cost_usd = totals.cost_usd;
    report.episodes_added = episodes.len();
    report.nodes_added = nodes_added;
    report.nodes_updated = updated_ids.len();
    report.edges_added = edges_added;
    for f in &failures {
        *report.failures_by_stage.entry(f.stage.clone()).or_default() += 1;
    }
    report.failure_samples = failures.iter().take(10).cloned().collect();

    let mut writes: Writes = vec![
        (
            Table::Episodes,
            WriteMode::Append,
            rows::to_batch(Table::Episodes, &episodes)?,
        ),
        (
            Table::Nodes,
            if updated_ids.is_empty() {
                WriteMode::Append
            } else {
                WriteMode::Upsert("node_id")
            },
            rows::to_batch(Table::Nodes, &nodes)?,
        ),
        (
            Table::Edges,
            if changed_edges == 0 {
                WriteMode::Append
            } else {
                WriteMode::Upsert("edge_id")
            },
            rows::to_batch(Table::Edges, &edges)?,
        ),
        (
            Table::LlmCalls,
            WriteMode::Append,
            rows::to_batch(Table::LlmCalls, &calls)?,
        ),
        (
            Table::Failures,
            WriteMode::Append,
            rows::to_batch(Table::Failures, &failures)?,
        ),
    ];
    // Labels of updated nodes are replaced: their chain may have grown.
    if !updated_ids.is_empty() {
        let ids: Vec<String> = updated_ids
            .iter()
            .map(|id| format!("'{}'", id.replace('\'', "''")))
            .collect();
        writes.push((
            Table::NodeLabels,
            WriteMode::Delete(format!("node_id IN ({})", ids.join(", "))),
            RecordBatch::new_empty(Table::NodeLabels.schema()),
        ));
    }
    writes.push((
        Table::NodeLabels,
        WriteMode::Append,
        rows::to_batch(Table::NodeLabels, &labels)?,
    ));
    writes.retain(|(_, mode, b)| b.num_rows() > 0 || matches!(mode, WriteMode::Delete(_)));
    let hash = ontology.content_hash();
    if tx
        .head()
        .last_completed
        .as_ref()
        .map(|r| r.ontology_hash.as_str())
        != Some(hash.as_str())
    {
        for (t, b) in crate::store::ontology_batches(ontology, &run_id)? {
            writes.push((t, WriteMode::Overwrite, b));
        }
    }
    let stats = RunStats {
        episodes_seen: all.len() as i64,
        episodes_skipped: report.episodes_skipped as i64,
        episodes_added: episodes.len() as i64,
        nodes_added: nodes_added as i64,
        edges_added: edges_added as i64,
        failures: failures.len() as i64,
        llm_calls: calls.len() as i64,
        prompt_tokens: totals.prompt_tokens as i64,
        completion_tokens: totals.completion_tokens as i64,
        cost_usd: totals.cost_usd,
        ontology_hash: hash,
    };
    Ok((writes, stats, mark))
}
