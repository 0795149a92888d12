//! A run (`graphloom run`): source → anti-join with committed episodes →
//! entity extraction → entity subtype walk → fact extraction → edge subtype
//! walk → in-run merge → one commit. Every episode ends either in
//! `episodes` and the graph, or in `failures` with its reason (and is
//! retried by the next run, since it is not in `episodes`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use chrono::Utc;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use serde_json::{Map, Value};

use crate::extract::{self, ExtractSpec, FactMention, Mention, Rejected};
use crate::llm::plan::StagePlan;
use crate::llm::{CacheMode, LlmClient, LlmError, ResponseCache};
use crate::ontology::Ontology;
use crate::resolve::entities::{MentionKey, resolve_entities};
use crate::resolve::facts::{EdgeRef, apply_contradictions, contradiction_candidates};
use crate::resolve::judge::{AdjudicationCase, ContradictionCase, JudgeFailure, SummaryCase};
use crate::resolve::normalize_name;
use crate::source::{self, Episode, SourceError};
use crate::spec::PipelineSpec;
use crate::store::rows::{self, EdgeRow, EpisodeRow, FailureRow, NodeRow};
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
}

impl RunReport {
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
    let schema = Arc::new(Schema::new(vec![Field::new(
        "episode_id",
        DataType::Utf8,
        false,
    )]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(StringArray::from(candidates.to_vec()))],
    )
    .map_err(datafusion::error::DataFusionError::from)?;
    let table = datafusion::datasource::MemTable::try_new(schema, vec![vec![batch]])?;
    let _ = ctx.deregister_table("run_candidates");
    ctx.register_table("run_candidates", Arc::new(table))?;
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

/// Earlier episodes of the same document, most recent last.
fn context_for(all: &[Episode], index: usize, n: usize) -> Vec<&Episode> {
    let ep = &all[index];
    let Some(doc) = &ep.document_id else {
        return Vec::new();
    };
    let mut earlier: Vec<&Episode> = all[..index]
        .iter()
        .filter(|e| e.document_id.as_ref() == Some(doc) && e.group_id == ep.group_id)
        .collect();
    let skip = earlier.len().saturating_sub(n);
    earlier.drain(..skip);
    earlier
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
    FailureRow {
        failure_id: uuid::Uuid::now_v7().to_string(),
        run_id: run_id.to_string(),
        stage: r.stage.to_string(),
        item: ep.map_or_else(|| r.episode_id.clone(), |e| e.source_uri.clone()),
        source_uri: ep.map(|e| e.source_uri.clone()),
        line: None,
        episode_id: Some(r.episode_id.clone()),
        reason: r.reason.clone(),
        excerpt: Some(r.excerpt.chars().take(300).collect()),
        created_at: Utc::now(),
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
    for &i in todo {
        let context = context_for(all, i, spec.context_episodes);
        let (req, _) = extract::entity_request(ontology, spec, &all[i], &context);
        let prompt = crate::llm::client::estimate_tokens(&req.messages);
        entity.prompt_tokens += prompt;
        entity.max_completion_tokens += req.max_tokens as u64;
        // The fact prompt carries the episode plus the entity list.
        fact.prompt_tokens += prompt + ENTITIES_PER_EPISODE * 8;
        fact.max_completion_tokens += spec.fact_max_tokens as u64;
    }
    let mut stages = vec![entity];
    let levels = |tree: &crate::ontology::TypeTree| {
        tree.iter().filter(|t| !t.children.is_empty()).count() as u64
    };
    let batch = spec.classify_batch_size.max(1) as u64;
    let entity_parents = levels(&ontology.entity_tree);
    if entity_parents > 0 && n > 0 {
        let calls = (n * ENTITIES_PER_EPISODE)
            .div_ceil(batch)
            .min(n * ENTITIES_PER_EPISODE)
            * entity_parents;
        stages.push(StagePlan {
            stage: "classify_entities (≤)".into(),
            calls,
            prompt_tokens: calls * (400 + batch * 80),
            max_completion_tokens: calls * (64 + batch * 100),
        });
    }
    stages.push(fact);
    let edge_parents = levels(&ontology.edge_tree);
    if edge_parents > 0 && n > 0 {
        let calls = (n * FACTS_PER_EPISODE)
            .div_ceil(batch)
            .min(n * FACTS_PER_EPISODE)
            * edge_parents;
        stages.push(StagePlan {
            stage: "classify_facts (≤)".into(),
            calls,
            prompt_tokens: calls * (300 + batch * 50),
            max_completion_tokens: calls * (64 + batch * 32),
        });
    }
    stages
}

/// Registers `ids` as a one-column table `name(column)`, for semi-joins.
fn register_ids<T: Into<ArrayRefOf>>(
    ctx: &SessionContext,
    name: &str,
    column: &str,
    ids: T,
) -> Result<(), RunError> {
    let array = ids.into().0;
    let schema = Arc::new(Schema::new(vec![Field::new(
        column,
        array.data_type().clone(),
        false,
    )]));
    let batch = RecordBatch::try_new(schema.clone(), vec![array])
        .map_err(datafusion::error::DataFusionError::from)?;
    let _ = ctx.deregister_table(name);
    ctx.register_table(
        name,
        Arc::new(datafusion::datasource::MemTable::try_new(
            schema,
            vec![vec![batch]],
        )?),
    )?;
    Ok(())
}

/// A column for [`register_ids`].
struct ArrayRefOf(arrow::array::ArrayRef);

impl From<Vec<i64>> for ArrayRefOf {
    fn from(v: Vec<i64>) -> Self {
        ArrayRefOf(Arc::new(arrow::array::Int64Array::from(v)))
    }
}

impl From<Vec<String>> for ArrayRefOf {
    fn from(v: Vec<String>) -> Self {
        ArrayRefOf(Arc::new(StringArray::from(v)))
    }
}

/// The committed nodes with these short ids (a semi-join).
async fn committed_nodes(
    ctx: &SessionContext,
    short_ids: Vec<i64>,
) -> Result<HashMap<i64, NodeRow>, RunError> {
    if short_ids.is_empty() {
        return Ok(HashMap::new());
    }
    register_ids(ctx, "run_node_ids", "short_id", short_ids)?;
    let batches = ctx
        .sql("SELECT n.* FROM nodes n LEFT SEMI JOIN run_node_ids i ON n.short_id = i.short_id")
        .await?
        .collect()
        .await?;
    let rows: Vec<NodeRow> = rows::from_batches(Table::Nodes, &batches)?;
    Ok(rows.into_iter().map(|n| (n.short_id, n)).collect())
}

/// Builds one node from the mentions of a cluster, taken in episode
/// (reference-time) order: the fullest name (most words, first seen on a
/// tie), the longest chain, attributes of mentions typed with that chain
/// with newer values winning, and every episode id.
fn node_from_mentions(
    members: &[&Mention],
    group_id: &str,
    now: chrono::DateTime<Utc>,
    run_id: &str,
) -> (NodeRow, Vec<String>) {
    let chain = members
        .iter()
        .map(|m| &m.chain)
        .max_by_key(|c| c.len())
        .cloned()
        .unwrap_or_default();
    let mut name = members[0].name.clone();
    for m in members {
        if m.name.split_whitespace().count() > name.split_whitespace().count() {
            name = m.name.clone();
        }
    }
    let mut attributes = Map::new();
    let mut episode_ids: Vec<String> = Vec::new();
    for m in members {
        if m.chain == chain {
            for (k, v) in &m.attributes {
                attributes.insert(k.clone(), v.clone());
            }
        }
        if !episode_ids.contains(&m.episode_id) {
            episode_ids.push(m.episode_id.clone());
        }
    }
    let row = NodeRow {
        node_id: uuid::Uuid::now_v7().to_string(),
        short_id: 0,
        group_id: group_id.to_string(),
        name_normalized: normalize_name(&name),
        name,
        node_type: String::new(),
        labels: Vec::new(),
        summary: None,
        attributes: Value::Object(attributes).to_string(),
        episode_ids,
        created_at: now,
        updated_at: now,
        rank: 0,
        name_embedding: None,
        origin: "extract".into(),
        run_id: run_id.to_string(),
    };
    (row, chain)
}

/// The unexpired committed edges whose source is a source of `edges`
/// (a DataFusion semi-join against `edges`).
async fn committed_edges_of(
    ctx: &SessionContext,
    edges: &[EdgeRow],
) -> Result<Vec<EdgeRow>, RunError> {
    if edges.is_empty() {
        return Ok(Vec::new());
    }
    let sources: BTreeSet<&str> = edges.iter().map(|e| e.source_node_id.as_str()).collect();
    let sources: Vec<String> = sources.into_iter().map(str::to_string).collect();
    register_ids(ctx, "run_sources", "node_id", sources)?;
    let batches = ctx
        .sql(
            "SELECT e.* FROM edges e LEFT SEMI JOIN run_sources s ON e.source_node_id = s.node_id \
             WHERE e.expired_at IS NULL",
        )
        .await?
        .collect()
        .await?;
    Ok(rows::from_batches(Table::Edges, &batches)?)
}

/// Folds what this run learnt about a node into its committed row: the
/// longer chain wins (with the attributes of its last type), equal chains
/// overlay the new attributes on the old (newer values win), episode ids
/// and degree add up. The name, id, short id and origin stay.
fn merge_into(
    mut existing: NodeRow,
    draft: NodeRow,
    chain: &[String],
    now: chrono::DateTime<Utc>,
    run_id: &str,
    ontology: &Ontology,
) -> NodeRow {
    let old_chain: Vec<String> = existing.labels.get(1..).unwrap_or_default().to_vec();
    if chain.len() > old_chain.len() {
        existing.node_type = draft.node_type.clone();
        existing.labels = ontology
            .labels_for(&existing.node_type)
            .unwrap_or(draft.labels.clone());
        existing.attributes = draft.attributes.clone();
    } else if chain == old_chain.as_slice() {
        let mut attrs: Map<String, Value> =
            serde_json::from_str(&existing.attributes).unwrap_or_default();
        let new: Map<String, Value> = serde_json::from_str(&draft.attributes).unwrap_or_default();
        attrs.extend(new);
        existing.attributes = Value::Object(attrs).to_string();
    }
    for e in draft.episode_ids {
        if !existing.episode_ids.contains(&e) {
            existing.episode_ids.push(e);
        }
    }
    existing.rank += draft.rank;
    existing.updated_at = now;
    existing.run_id = run_id.to_string();
    existing
}

fn judge_row(f: &JudgeFailure, run_id: &str, now: chrono::DateTime<Utc>) -> FailureRow {
    FailureRow {
        failure_id: uuid::Uuid::now_v7().to_string(),
        run_id: run_id.to_string(),
        stage: f.stage.to_string(),
        item: f.item.clone(),
        source_uri: None,
        line: None,
        episode_id: None,
        reason: f.reason.clone(),
        excerpt: None,
        created_at: now,
    }
}

/// Brings the summaries of `nodes` touched by `new_edges` up to date.
async fn summarize(
    client: &LlmClient,
    rs: &crate::resolve::ResolveSpec,
    concurrency: usize,
    nodes: &mut [NodeRow],
    new_edges: &[EdgeRow],
) -> Vec<JudgeFailure> {
    let mut facts_of: HashMap<&str, Vec<String>> = HashMap::new();
    for e in new_edges {
        for id in [&e.source_node_id, &e.target_node_id] {
            facts_of
                .entry(id.as_str())
                .or_default()
                .push(e.fact.clone());
        }
    }
    let touched: Vec<usize> = (0..nodes.len())
        .filter(|&i| facts_of.contains_key(nodes[i].node_id.as_str()))
        .collect();
    if touched.is_empty() {
        return Vec::new();
    }
    let cases: Vec<SummaryCase> = touched
        .iter()
        .map(|&i| SummaryCase {
            name: nodes[i].name.clone(),
            chain: nodes[i].labels.get(1..).unwrap_or_default().to_vec(),
            summary: nodes[i].summary.clone(),
            facts: facts_of[nodes[i].node_id.as_str()].clone(),
        })
        .collect();
    let (done, failures) =
        crate::resolve::judge::summaries(client, rs.summary_batch_size, concurrency, &cases).await;
    for (case, text) in done {
        nodes[touched[case]].summary = Some(text);
    }
    failures
}

/// Embeds names of nodes without an embedding and the text of new facts.
async fn embed(
    client: &LlmClient,
    nodes: &mut [NodeRow],
    new_edges: &mut [EdgeRow],
    run_id: &str,
    now: chrono::DateTime<Utc>,
) -> Vec<FailureRow> {
    let mut failures = Vec::new();
    let todo: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].name_embedding.is_none())
        .collect();
    let names: Vec<String> = todo.iter().map(|&i| nodes[i].name.clone()).collect();
    let texts: Vec<String> = new_edges.iter().map(|e| e.fact.clone()).collect();
    for (stage, inputs) in [("embed_names", names), ("embed_facts", texts)] {
        if inputs.is_empty() {
            continue;
        }
        match client.embed(stage, &inputs).await {
            Ok(vectors) if stage == "embed_names" => {
                for (&i, v) in todo.iter().zip(vectors) {
                    nodes[i].name_embedding = Some(v);
                }
            }
            Ok(vectors) => {
                for (e, v) in new_edges.iter_mut().zip(vectors) {
                    e.fact_embedding = Some(v);
                }
            }
            Err(e) => failures.push(judge_row(
                &JudgeFailure {
                    stage: if stage == "embed_names" {
                        "embed_names"
                    } else {
                        "embed_facts"
                    },
                    item: format!("{} texts", inputs.len()),
                    reason: format!("embedding call failed, stored without embeddings: {e}"),
                },
                run_id,
                now,
            )),
        }
    }
    failures
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
        Ok((writes, stats)) => {
            for (table, mode, batch) in writes {
                tx.stage(table, mode, vec![batch]);
            }
            let run = tx.commit(stats).await?;
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
) -> Result<(Writes, RunStats), RunError> {
    let run_id = tx.run_id().to_string();
    let ctx = tx.base_context().await?;
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

    let cache = if spec.llm.cache && options.cache != CacheMode::Off {
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
    let client = LlmClient::new(&spec.llm, cache, &run_id)?;
    let concurrency = (spec.llm.max_concurrency as usize).max(1);
    let xs = &spec.extract;

    // 1. Entities, one call per episode.
    let mut progress = Progress::new("entities", todo.len(), options.progress_bar);
    let mut entity_results: HashMap<usize, Result<Vec<Mention>, LlmError>> = HashMap::new();
    let mut rejected: Vec<Rejected> = Vec::new();
    {
        let client = &client;
        let mut stream = futures::stream::iter(todo.iter().copied())
            .map(|i| async move {
                let context = context_for(all, i, xs.context_episodes);
                (
                    i,
                    extract::extract_entities(client, ontology, xs, &all[i], &context).await,
                )
            })
            .buffer_unordered(concurrency * 2);
        while let Some((i, r)) = stream.next().await {
            let r = r.map(|(m, rej)| {
                rejected.extend(rej);
                m
            });
            entity_results.insert(i, r);
            progress.tick(
                client,
                entity_results.values().filter(|r| r.is_err()).count(),
            );
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

    // 2. The entity subtype walk, batched across episodes.
    let (walk, rej) =
        crate::classify::walk_entities(&client, ontology, xs, concurrency, &mut mentions).await;
    tracing::info!(
        "entity subtype walk: {} calls, {} entities refined",
        walk.calls,
        walk.refined
    );
    rejected.extend(rej);

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
        let client = &client;
        let mentions = &mentions;
        let mention_range = &mention_range;
        let mut stream = futures::stream::iter(with_entities.iter().copied())
            .map(|i| async move {
                let (a, b) = mention_range[&i];
                let context = context_for(all, i, xs.context_episodes);
                (
                    i,
                    extract::extract_facts(
                        client,
                        ontology,
                        xs,
                        &all[i],
                        &context,
                        &mentions[a..b],
                    )
                    .await,
                )
            })
            .buffer_unordered(concurrency * 2);
        while let Some((i, r)) = stream.next().await {
            match r {
                Ok((f, rej)) => {
                    rejected.extend(rej);
                    fact_owner.extend(std::iter::repeat_n(i, f.len()));
                    facts.extend(f);
                }
                Err(e) => {
                    failed.insert(i, ("extract_facts".into(), e));
                }
            }
            progress.tick(client, failed.len());
        }
    }
    progress.finish();

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

    // 5. Rows. An episode counts only when both of its calls succeeded;
    // otherwise its output is dropped and it is retried by the next run.
    let now = Utc::now();
    for (i, (stage, e)) in &failed {
        let ep = &all[*i];
        failures.push(FailureRow {
            failure_id: uuid::Uuid::now_v7().to_string(),
            run_id: run_id.clone(),
            stage: stage.clone(),
            item: ep.source_uri.clone(),
            source_uri: Some(ep.source_uri.clone()),
            line: None,
            episode_id: Some(ep.episode_id.clone()),
            reason: e.to_string(),
            excerpt: Some(ep.content.chars().take(200).collect()),
            created_at: now,
        });
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
    // 6. Entity resolution: this run's mentions against each other and
    // the committed nodes (DataFusion joins, then the merge rules), with
    // what stays ambiguous adjudicated by the LLM in batches.
    let mut keys: Vec<MentionKey> = Vec::new();
    let mut key_mention: Vec<usize> = Vec::new();
    for &i in &succeeded {
        let Some(&(a, b)) = mention_range.get(&i) else {
            continue;
        };
        for (k, m) in mentions[a..b].iter().enumerate() {
            keys.push(MentionKey {
                group_id: all[i].group_id.clone(),
                name: m.name.clone(),
                chain: m.chain.clone(),
                attributes: Value::Object(m.attributes.clone()).to_string(),
            });
            key_mention.push(a + k);
        }
    }
    let identity: BTreeMap<String, Vec<String>> = ontology
        .entity_types
        .values()
        .filter(|t| !t.identity_properties.is_empty())
        .map(|t| (t.name.clone(), t.identity_properties.clone()))
        .collect();
    let rs = &spec.resolve;
    let (mut clusters, open) =
        resolve_entities(&ctx, Table::Nodes.name(), &keys, rs, &identity).await?;
    report.ambiguous_entities = open.len();
    if !open.is_empty() && rs.adjudicate {
        let cases: Vec<AdjudicationCase> = open
            .iter()
            .map(|o| {
                let m = &mentions[key_mention[o.mention]];
                AdjudicationCase {
                    name: m.name.clone(),
                    chain: m.chain.clone(),
                    context: m.context.chars().take(300).collect(),
                    options: o
                        .options
                        .iter()
                        .take(rs.max_candidates)
                        .map(|p| (p.name.clone(), p.chain.clone()))
                        .collect(),
                }
            })
            .collect();
        let (chosen, fails) = crate::resolve::judge::adjudicate(
            &client,
            rs.adjudication_batch_size,
            concurrency,
            &cases,
        )
        .await;
        for (case, option) in chosen {
            let o = &open[case];
            if clusters.link(o.mention, &o.options[option]) {
                report.adjudicated_merges += 1;
            }
        }
        failures.extend(fails.iter().map(|f| judge_row(f, &run_id, now)));
    }
    let resolved = clusters.finish();
    let committed =
        committed_nodes(&ctx, resolved.committed.iter().flatten().copied().collect()).await?;
    let mut members: Vec<Vec<&Mention>> = vec![Vec::new(); resolved.committed.len()];
    let mut group_of: Vec<&str> = vec![""; resolved.committed.len()];
    for (k, &c) in resolved.cluster_of.iter().enumerate() {
        members[c].push(&mentions[key_mention[k]]);
        group_of[c] = &keys[k].group_id;
    }
    let mut drafts: Vec<(NodeRow, Vec<String>)> = members
        .iter()
        .enumerate()
        .map(|(c, list)| {
            let (mut row, chain) = node_from_mentions(list, group_of[c], now, &run_id);
            if let Some(existing) = resolved.committed[c].and_then(|id| committed.get(&id)) {
                row.node_id = existing.node_id.clone();
            }
            (row, chain)
        })
        .collect();
    let mut node_of_mention: HashMap<usize, usize> = HashMap::new();
    for (k, &c) in resolved.cluster_of.iter().enumerate() {
        node_of_mention.insert(key_mention[k], c);
    }
    let succeeded_set: HashSet<usize> = succeeded.iter().copied().collect();
    let mut edges: Vec<EdgeRow> = Vec::new();
    for (f, owner) in facts.iter().zip(&fact_owner) {
        if !succeeded_set.contains(owner) {
            continue;
        }
        let (a, _) = mention_range[owner];
        let (Some(&s), Some(&t)) = (
            node_of_mention.get(&(a + f.source)),
            node_of_mention.get(&(a + f.target)),
        ) else {
            continue;
        };
        // Duplicates, also across episodes of this run, are folded by
        // fact resolution below.
        edges.push(EdgeRow {
            edge_id: uuid::Uuid::now_v7().to_string(),
            group_id: drafts[s].0.group_id.clone(),
            source_node_id: drafts[s].0.node_id.clone(),
            target_node_id: drafts[t].0.node_id.clone(),
            relation_type: f.relation_type().to_string(),
            fact: f.fact.clone(),
            attributes: "{}".into(),
            episode_ids: vec![f.episode_id.clone()],
            valid_at: f.valid_at,
            invalid_at: f.invalid_at,
            created_at: now,
            expired_at: None,
            fact_embedding: None,
            origin: "extract".into(),
            run_id: run_id.clone(),
        });
    }
    // Fact resolution: duplicates fold into one edge, and within functional
    // families a newer fact invalidates an older one, against this run's
    // edges and the committed edges of the same source nodes.
    let mut committed_edges = committed_edges_of(&ctx, &edges).await?;
    let family = |r: &str| -> String {
        ontology
            .edge_tree
            .chain(r)
            .and_then(|c| c.first().cloned())
            .unwrap_or_else(|| r.to_string())
    };
    let functional = &rs.functional_edge_types;
    let mut facts = crate::resolve::resolve_facts(
        &mut edges,
        &mut committed_edges,
        functional,
        &family,
        rs.duplicate_fact_similarity,
        now,
    );
    // Other contradictions are for the LLM to judge, in batches.
    if rs.judge_contradictions {
        let open = contradiction_candidates(
            &edges,
            &committed_edges,
            functional,
            &family,
            rs.max_candidates,
        );
        if !open.is_empty() {
            let text = |r: &EdgeRef| match *r {
                EdgeRef::Committed(j) => committed_edges[j].fact.clone(),
                EdgeRef::New(j) => edges[j].fact.clone(),
            };
            let cases: Vec<ContradictionCase> = open
                .iter()
                .map(|(i, others)| ContradictionCase {
                    fact: edges[*i].fact.clone(),
                    existing: others.iter().map(text).collect(),
                })
                .collect();
            let (verdicts, fails) = crate::resolve::judge::contradictions(
                &client,
                rs.contradiction_batch_size,
                concurrency,
                &cases,
            )
            .await;
            let mut pairs: Vec<(usize, EdgeRef)> = Vec::new();
            for (case, picked) in verdicts {
                let (i, others) = &open[case];
                pairs.extend(picked.into_iter().map(|j| (*i, others[j])));
            }
            pairs.sort();
            apply_contradictions(&mut edges, &mut committed_edges, &pairs, now, &mut facts);
            failures.extend(fails.iter().map(|f| judge_row(f, &run_id, now)));
        }
    }
    report.duplicate_facts = facts.duplicates;
    report.invalidated_facts = facts.invalidated;
    // Degrees count the edges that stay.
    let mut degree: HashMap<String, i64> = HashMap::new();
    for e in &edges {
        *degree.entry(e.source_node_id.clone()).or_default() += 1;
        *degree.entry(e.target_node_id.clone()).or_default() += 1;
    }
    for (row, _) in drafts.iter_mut() {
        row.rank += degree.remove(&row.node_id).unwrap_or(0);
    }
    let edges_added = edges.len();
    let changed_edges = facts.changed_committed.len();

    let mut nodes: Vec<NodeRow> = Vec::with_capacity(drafts.len());
    let mut updated: BTreeMap<String, NodeRow> = BTreeMap::new();
    let mut next_short_id = base_short_id;
    for (c, (mut row, chain)) in drafts.into_iter().enumerate() {
        row.node_type = chain
            .last()
            .cloned()
            .unwrap_or_else(|| crate::ontology::ENTITY_LABEL.into());
        row.labels = ontology
            .labels_for(&row.node_type)
            .unwrap_or_else(|| vec![crate::ontology::ENTITY_LABEL.into()]);
        match resolved.committed[c].and_then(|id| committed.get(&id)) {
            Some(existing) => {
                let base = updated
                    .remove(&existing.node_id)
                    .unwrap_or_else(|| existing.clone());
                updated.insert(
                    existing.node_id.clone(),
                    merge_into(base, row, &chain, now, &run_id, ontology),
                );
            }
            None => {
                next_short_id += 1;
                row.short_id = next_short_id;
                nodes.push(row);
            }
        }
    }
    let nodes_added = nodes.len();
    let updated_ids: Vec<String> = updated.keys().cloned().collect();
    nodes.extend(updated.into_values());
    // Optional stages: summaries of the nodes this run's facts touch, and
    // embeddings of new names and facts.
    if rs.summaries {
        failures.extend(
            summarize(&client, rs, concurrency, &mut nodes, &edges[..edges_added])
                .await
                .iter()
                .map(|f| judge_row(f, &run_id, now)),
        );
    }
    if rs.embeddings {
        failures.extend(embed(&client, &mut nodes, &mut edges[..edges_added], &run_id, now).await);
    }
    edges.extend(
        committed_edges
            .into_iter()
            .filter(|e| facts.changed_committed.contains(&e.edge_id)),
    );
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
    Ok((writes, stats))
}
