//! The resolve stage of a run: from the classified mentions and facts of
//! the committed episodes to node and edge rows. Entities go through
//! [`super::entities`] (DataFusion joins, merge rules) and batched LLM
//! adjudication; facts through [`super::facts`] (duplicates, functional
//! invalidation) and batched contradiction calls; then, when asked for,
//! summaries and embeddings. Committed nodes and edges that change come
//! back with their ids, for an in-place update.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, StringArray};
use chrono::Utc;
use datafusion::prelude::SessionContext;
use serde_json::{Map, Value};

use super::entities::{Resolved, identity_properties, resolve_entities};
use super::facts::{
    EdgeRef, FactResolution, Withdrawn, apply_contradictions, apply_withdrawals,
    contradiction_candidates,
};
use super::judge::{AdjudicationCase, ContradictionCase, JudgeFailure, SummaryCase};
use super::mentions::{MentionKey, strings};
use super::{ResolveSpec, normalize_name};
use crate::extract::{FactMention, Mention};
use crate::llm::LlmClient;
use crate::ontology::Ontology;
use crate::rows::{self, DecodeError, EdgeRow, FailureRow, NodeRow};
use crate::stage::Stage;

/// Errors that stop resolution (unsettled items are `failures` rows).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// A DataFusion step of resolution failed.
    #[error("resolve: {step}: {source}")]
    DataFusion {
        /// What resolution was doing.
        step: &'static str,
        #[source]
        source: datafusion::error::DataFusionError,
    },
    /// Committed rows could not be read.
    #[error("resolve: {0}")]
    Decode(#[from] DecodeError),
    /// Batch mode: this step's LLM calls were queued for the Batch API;
    /// the run's next round gets past it.
    #[error("resolve: {stage}: waiting for the Batch API")]
    Waiting {
        /// The step whose calls were queued.
        stage: Stage,
    },
}

/// Batch mode: stops resolution after a step whose calls were queued
/// (what follows would be built on missing answers).
fn settled(cx: &StageContext<'_>, stage: Stage) -> Result<(), ResolveError> {
    if cx.client.deferred() > 0 {
        return Err(ResolveError::Waiting { stage });
    }
    Ok(())
}

/// Turns a DataFusion error into resolution's, naming the step.
fn step(step: &'static str) -> impl FnOnce(datafusion::error::DataFusionError) -> ResolveError {
    move |source| ResolveError::DataFusion { step, source }
}

/// What the stage works with.
pub struct StageContext<'a> {
    /// A context with the committed tables registered.
    pub ctx: &'a SessionContext,
    /// The run's LLM client (adjudication, contradictions, summaries).
    pub client: &'a LlmClient,
    /// The ontology in effect.
    pub ontology: &'a Ontology,
    /// `[resolve]` settings.
    pub spec: &'a ResolveSpec,
    /// LLM calls in flight at once.
    pub concurrency: usize,
    /// The run writing the rows.
    pub run_id: &'a str,
    /// The run's time (`created_at`, `expired_at`).
    pub now: chrono::DateTime<Utc>,
    /// The largest committed `short_id`; new nodes count on from it.
    pub base_short_id: i64,
}

/// A mention of a committed episode, in reference-time order.
pub struct RunMention<'a> {
    /// The episode's group.
    pub group_id: &'a str,
    /// The classified mention.
    pub mention: &'a Mention,
}

/// A fact between two of the run's mentions (indices into them).
pub struct RunFact<'a> {
    /// Source mention.
    pub source: usize,
    /// Target mention.
    pub target: usize,
    /// The classified fact.
    pub fact: &'a FactMention,
    /// When its episode was written: the fact held then, whatever its
    /// `valid_at` says.
    pub episode_time: chrono::DateTime<Utc>,
}

/// An end stated for every relationship of a type that one of the run's
/// mentions has ([`Withdrawal`](crate::extract::Withdrawal)).
pub struct RunWithdrawal<'a> {
    /// The mention whose relationships end.
    pub subject: usize,
    /// What ends, and when.
    pub withdrawal: &'a crate::extract::Withdrawal,
}

/// Rows and counts of the stage.
#[derive(Debug, Default)]
pub struct StageOutput {
    /// New nodes, then updated committed nodes.
    pub nodes: Vec<NodeRow>,
    /// How many of `nodes` are new.
    pub nodes_added: usize,
    /// Ids of the updated committed nodes.
    pub updated_node_ids: Vec<String>,
    /// New edges, then changed committed edges.
    pub edges: Vec<EdgeRow>,
    /// How many of `edges` are new.
    pub edges_added: usize,
    /// How many committed edges changed.
    pub changed_edges: usize,
    /// Items resolution could not settle.
    pub failures: Vec<FailureRow>,
    /// Mentions the rules left open.
    pub ambiguous: usize,
    /// Of those, merged on adjudication.
    pub adjudicated: usize,
    /// Facts folded into another.
    pub duplicates: usize,
    /// Facts invalidated.
    pub invalidated: usize,
}

/// Resolves the run's mentions and facts; see the module docs.
pub async fn resolve_run(
    cx: &StageContext<'_>,
    mentions: &[RunMention<'_>],
    facts: &[RunFact<'_>],
    withdrawals: &[RunWithdrawal<'_>],
) -> Result<StageOutput, ResolveError> {
    let mut out = StageOutput::default();
    let resolved = cluster_mentions(cx, mentions, &mut out).await?;
    let committed = committed_nodes(
        cx.ctx,
        resolved.committed.iter().flatten().copied().collect(),
    )
    .await?;
    let mut drafts = draft_nodes(cx, mentions, &resolved, &committed);
    let (mut edges, mut stated) = draft_edges(cx, facts, &resolved, &drafts, &mut out);
    stated.withdrawn = withdrawals
        .iter()
        .map(|w| Withdrawn {
            node_id: drafts[resolved.cluster_of[w.subject]].0.node_id.clone(),
            relation_type: w.withdrawal.relation_type.clone(),
            at: w.withdrawal.at,
        })
        .collect();
    // The text around each node in each of this run's episodes, for the
    // contradiction judge (node id, episode id → the first mention's).
    let mut contexts: HashMap<(&str, &str), &str> = HashMap::new();
    if cx.spec.judge_contradictions {
        for (k, m) in mentions.iter().enumerate() {
            let node = drafts[resolved.cluster_of[k]].0.node_id.as_str();
            contexts
                .entry((node, m.mention.episode_id.as_str()))
                .or_insert(m.mention.context.as_str());
        }
    }
    let (committed_edges, changed) =
        resolve_edges(cx, &mut edges, &drafts, &mut stated, &contexts, &mut out).await?;
    settled(cx, Stage::Contradictions)?;
    // Degrees count the edges that stay.
    let mut degree: HashMap<String, i64> = HashMap::new();
    for e in &edges {
        *degree.entry(e.source_node_id.clone()).or_default() += 1;
        *degree.entry(e.target_node_id.clone()).or_default() += 1;
    }
    for (row, _) in drafts.iter_mut() {
        row.rank += degree.remove(&row.node_id).unwrap_or(0);
    }
    let (mut nodes, updated_node_ids) = finish_nodes(cx, drafts, &resolved, &committed);
    let edges_added = edges.len();
    // Optional stages: summaries of the nodes this run's facts touch, and
    // embeddings of new names and facts.
    let rs = cx.spec;
    if rs.summaries {
        let fails = summarize(cx.client, rs, cx.concurrency, &mut nodes, &edges).await;
        settled(cx, Stage::Summaries)?;
        out.failures
            .extend(fails.iter().map(|f| f.to_row(cx.run_id, cx.now)));
    }
    if rs.embeddings || rs.embedding_candidates {
        let fails = embed(cx.client, &mut nodes, &mut edges, cx.run_id, cx.now).await;
        settled(cx, Stage::EmbedFacts)?;
        out.failures.extend(fails);
    }
    out.changed_edges = changed.len();
    edges.extend(
        committed_edges
            .into_iter()
            .filter(|e| changed.contains(&e.edge_id)),
    );
    out.nodes_added = nodes.len() - updated_node_ids.len();
    out.updated_node_ids = updated_node_ids;
    out.nodes = nodes;
    out.edges_added = edges_added;
    out.edges = edges;
    Ok(out)
}

/// Entities: DataFusion candidate joins and the merge rules, then what
/// stays ambiguous adjudicated by the LLM in batches. Returns the clusters.
async fn cluster_mentions(
    cx: &StageContext<'_>,
    mentions: &[RunMention<'_>],
    out: &mut StageOutput,
) -> Result<Resolved, ResolveError> {
    let keys: Vec<MentionKey> = mentions
        .iter()
        .map(|m| MentionKey {
            group_id: m.group_id.to_string(),
            name: m.mention.name.clone(),
            chain: m.mention.chain.clone(),
            attributes: Value::Object(m.mention.attributes.clone()).to_string(),
        })
        .collect();
    let identity = identity_properties(cx.ontology);
    let rs = cx.spec;
    let vectors = if rs.embedding_candidates {
        let vectors = mention_vectors(cx, &keys, out).await;
        settled(cx, Stage::EmbedNames)?;
        vectors
    } else {
        Vec::new()
    };
    let (mut clusters, open) = resolve_entities(cx.ctx, "nodes", &keys, &vectors, rs, &identity)
        .await
        .map_err(step("entity resolution"))?;
    out.ambiguous = open.len();
    if !open.is_empty() && rs.adjudicate {
        let cases: Vec<AdjudicationCase> = open
            .iter()
            .map(|o| {
                let m = mentions[o.mention].mention;
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
            cx.client,
            rs.adjudication_batch_size,
            cx.concurrency,
            &cases,
        )
        .await;
        settled(cx, Stage::Adjudicate)?;
        for (case, option) in chosen {
            let o = &open[case];
            if clusters.link(o.mention, &o.options[option]) {
                out.adjudicated += 1;
            }
        }
        out.failures
            .extend(fails.iter().map(|f| f.to_row(cx.run_id, cx.now)));
    }
    Ok(clusters.finish())
}

/// Name vectors of the mentions for embedding candidates, one call per 64
/// distinct names (the node names embedded after resolution are mostly
/// the same texts, so they come from the response cache). When the
/// embeddings endpoint fails, the run resolves without these candidates
/// and says so in `failures`.
async fn mention_vectors(
    cx: &StageContext<'_>,
    keys: &[MentionKey],
    out: &mut StageOutput,
) -> Vec<Option<Arc<[f32]>>> {
    // Types with a record-linkage rule are matched by it alone: their
    // mentions (often thousands of mapped records) are not embedded.
    let linked = |k: &MentionKey| cx.spec.is_linked(&k.chain);
    let names: Vec<String> = keys
        .iter()
        .filter(|k| !linked(k))
        .map(|k| k.name.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if names.is_empty() {
        return Vec::new();
    }
    match cx.client.embed(Stage::EmbedNames, &names).await {
        Ok(vectors) => {
            let by_name: HashMap<&str, Arc<[f32]>> = names
                .iter()
                .map(String::as_str)
                .zip(vectors.into_iter().map(Arc::from))
                .collect();
            keys.iter()
                .map(|k| {
                    if linked(k) {
                        None
                    } else {
                        by_name.get(k.name.as_str()).cloned()
                    }
                })
                .collect()
        }
        Err(e) => {
            let failure = JudgeFailure {
                stage: Stage::EmbedNames,
                item: format!("{} names", names.len()),
                reason: format!(
                    "embedding call failed, resolved without embedding candidates: {e}"
                ),
            };
            out.failures.push(failure.to_row(cx.run_id, cx.now));
            Vec::new()
        }
    }
}

/// One draft node per cluster (with its chain), built from its mentions;
/// a cluster that resolved to a committed node keeps that node's id.
fn draft_nodes(
    cx: &StageContext<'_>,
    mentions: &[RunMention<'_>],
    resolved: &Resolved,
    committed: &HashMap<i64, NodeRow>,
) -> Vec<(NodeRow, Vec<String>)> {
    let mut members: Vec<Vec<&Mention>> = vec![Vec::new(); resolved.committed.len()];
    let mut group_of: Vec<&str> = vec![""; resolved.committed.len()];
    for (k, &c) in resolved.cluster_of.iter().enumerate() {
        members[c].push(mentions[k].mention);
        group_of[c] = mentions[k].group_id;
    }
    members
        .iter()
        .enumerate()
        .map(|(c, list)| {
            let (mut row, chain) = node_from_mentions(list, group_of[c], cx.now, cx.run_id);
            if let Some(existing) = resolved.committed[c].and_then(|id| committed.get(&id)) {
                row.node_id = existing.node_id.clone();
            }
            (row, chain)
        })
        .collect()
}

/// What the episodes stated beyond the new edges' rows, which may end
/// older facts: marks on new edges (by edge id), and ends stated for
/// every relationship of a type a node has.
#[derive(Debug, Default)]
struct Stated {
    /// Edges whose start was stated ([`FactMention::start_stated`]).
    started: HashSet<String>,
    /// Edges whose source the text moved to their target
    /// ([`FactMention::moved`]).
    moved: HashSet<String>,
    /// Ends stated for every relationship of a type a node has.
    withdrawn: Vec<Withdrawn>,
    /// When the episode of each edge without a `valid_at` was written:
    /// the edge held by then.
    seen_at: HashMap<String, chrono::DateTime<Utc>>,
}

/// One edge per fact between the draft nodes of its endpoints, and what
/// their episodes stated of them. A fact whose two ends resolved to one
/// node is dropped with a `failures` row.
fn draft_edges(
    cx: &StageContext<'_>,
    facts: &[RunFact<'_>],
    resolved: &Resolved,
    drafts: &[(NodeRow, Vec<String>)],
    out: &mut StageOutput,
) -> (Vec<EdgeRow>, Stated) {
    let mut edges: Vec<EdgeRow> = Vec::new();
    let mut stated = Stated::default();
    for f in facts {
        let (s, t) = (resolved.cluster_of[f.source], resolved.cluster_of[f.target]);
        let seen_at = f.episode_time;
        let f = f.fact;
        if s == t {
            // Both ends turned out to be one entity ("Acme Corp supplies
            // ACME corp."): a fact about nothing else is dropped, visibly.
            let failure = JudgeFailure {
                stage: Stage::ResolveFacts,
                item: f.fact.chars().take(200).collect(),
                reason: format!(
                    "source and target resolve to the same node `{}`; fact dropped",
                    drafts[s].0.name
                ),
            };
            out.failures.push(failure.to_row(cx.run_id, cx.now));
            continue;
        }
        // Duplicates, also across episodes of this run, are folded by
        // fact resolution.
        let edge_id = uuid::Uuid::now_v7().to_string();
        if f.start_stated {
            stated.started.insert(edge_id.clone());
        }
        if f.moved {
            stated.moved.insert(edge_id.clone());
        }
        if f.valid_at.is_none() {
            stated.seen_at.insert(edge_id.clone(), seen_at);
        }
        edges.push(EdgeRow {
            edge_id,
            group_id: drafts[s].0.group_id.clone(),
            source_node_id: drafts[s].0.node_id.clone(),
            target_node_id: drafts[t].0.node_id.clone(),
            relation_type: f.relation_type().to_string(),
            fact: f.fact.clone(),
            attributes: "{}".into(),
            episode_ids: vec![f.episode_id.clone()],
            valid_at: f.valid_at,
            invalid_at: f.invalid_at,
            created_at: cx.now,
            expired_at: None,
            fact_embedding: None,
            origin: if f.mapped { "map" } else { "extract" }.into(),
            run_id: cx.run_id.to_string(),
        });
    }
    (edges, stated)
}

/// Fact resolution: duplicates fold into one edge, and within functional
/// families facts take effect in valid time order, against this run's
/// edges and the committed edges (with their history) of the same source
/// nodes; other contradictions are for the LLM to judge, in batches.
/// Returns the committed edges read and the ids of those that changed.
async fn resolve_edges(
    cx: &StageContext<'_>,
    edges: &mut Vec<EdgeRow>,
    drafts: &[(NodeRow, Vec<String>)],
    stated: &mut Stated,
    contexts: &HashMap<(&str, &str), &str>,
    out: &mut StageOutput,
) -> Result<(Vec<EdgeRow>, BTreeSet<String>), ResolveError> {
    let rs = cx.spec;
    // The committed edges of every node a new fact starts from or a
    // withdrawal ends the relationships of.
    let sources = edges
        .iter()
        .map(|e| e.source_node_id.as_str())
        .chain(stated.withdrawn.iter().map(|w| w.node_id.as_str()));
    let mut committed_edges = committed_edges_of(cx.ctx, sources).await?;
    let family = |r: &str| -> String {
        cx.ontology
            .edge_tree
            .chain(r)
            .and_then(|c| c.first().cloned())
            .unwrap_or_else(|| r.to_string())
    };
    let is_a = |r: &str, ancestor: &str| cx.ontology.edge_tree.is_a(r, ancestor);
    let functional = &rs.functional_edge_types;
    let mut facts = crate::resolve::resolve_facts(
        edges,
        &mut committed_edges,
        functional,
        &family,
        &is_a,
        rs.duplicate_fact_similarity,
        cx.now,
    );
    // A move stated of a fact is stated of the edge it folded into.
    for (from, into) in &facts.folds {
        if stated.moved.contains(from) {
            stated.moved.insert(into.clone());
        }
    }
    let stated = &*stated;
    // The type of every target, for moves and the judge: this run's from
    // its drafts, the committed edges' from the nodes table. A fact
    // replaces another of its kind only (a supplier for a supplier).
    let type_of: HashMap<String, String> = if rs.judge_contradictions || !stated.moved.is_empty() {
        let mut type_of = committed_types(cx.ctx, &committed_edges).await?;
        type_of.extend(
            drafts
                .iter()
                .map(|(row, chain)| (row.node_id.clone(), chain_type(chain))),
        );
        type_of
    } else {
        HashMap::new()
    };
    let same_kind =
        |a: &EdgeRow, b: &EdgeRow| type_of.get(&a.target_node_id) == type_of.get(&b.target_node_id);
    // A move the text states ("Notification Hub moves to Skylark on 1
    // July") ends the mover's live facts of the family with other things
    // of that kind that started before it, as a judge's verdict would.
    if !stated.moved.is_empty() {
        end_stated_moves(
            cx,
            edges,
            &mut committed_edges,
            &family,
            &same_kind,
            stated,
            &mut facts,
        );
    }
    // A record's end for every relationship of a type ("last_day" of a
    // leaver for their on-call shifts) ends those of its node that
    // started before it, whichever episode stated them.
    if !stated.withdrawn.is_empty() {
        end_withdrawn(cx, edges, &mut committed_edges, &is_a, stated, &mut facts);
    }
    let open = if rs.judge_contradictions {
        let replaceable = |new: &EdgeRow, older: &EdgeRow| {
            stated.started.contains(&new.edge_id) && same_kind(new, older)
        };
        contradiction_candidates(
            edges,
            &committed_edges,
            functional,
            &family,
            &replaceable,
            rs.max_candidates,
        )
    } else {
        Vec::new()
    };
    if !open.is_empty() {
        let (pairs, fails) =
            judge_contradictions(cx, edges, &committed_edges, &open, contexts).await;
        apply_contradictions(edges, &mut committed_edges, &pairs, cx.now, &mut facts);
        out.failures
            .extend(fails.iter().map(|f| f.to_row(cx.run_id, cx.now)));
    }
    out.duplicates = facts.duplicates;
    out.invalidated = facts.invalidated;
    Ok((committed_edges, facts.changed_committed))
}

/// Ends what a move the text states ends: the mover's live facts of the
/// family with other things of the kind (`same_kind`) that started before
/// it, as a judge's verdict would.
fn end_stated_moves(
    cx: &StageContext<'_>,
    edges: &mut [EdgeRow],
    committed_edges: &mut [EdgeRow],
    family: &dyn Fn(&str) -> String,
    same_kind: &dyn Fn(&EdgeRow, &EdgeRow) -> bool,
    stated: &Stated,
    facts: &mut FactResolution,
) {
    let functional = &cx.spec.functional_edge_types;
    let moves = |new: &EdgeRow, older: &EdgeRow| {
        let (to, from) = if stated.moved.contains(&new.edge_id) {
            (new, older)
        } else if stated.moved.contains(&older.edge_id) {
            (older, new)
        } else {
            return false;
        };
        let start = |e: &EdgeRow| e.valid_at.unwrap_or(e.created_at);
        same_kind(to, from) && start(from) < start(to)
    };
    let found = contradiction_candidates(
        edges,
        committed_edges,
        functional,
        family,
        &moves,
        usize::MAX,
    );
    let pairs: Vec<(usize, EdgeRef)> = found
        .into_iter()
        .flat_map(|(i, left)| left.into_iter().map(move |r| (i, r)))
        .collect();
    let before = facts.invalidated;
    apply_contradictions(edges, committed_edges, &pairs, cx.now, facts);
    tracing::info!(
        "moves the episodes state ended {} facts",
        facts.invalidated - before
    );
}

/// Ends the relationships of a type that a record's end stated for all of
/// them ends: those of its node that started before it.
fn end_withdrawn(
    cx: &StageContext<'_>,
    edges: &mut [EdgeRow],
    committed_edges: &mut [EdgeRow],
    is_a: &dyn Fn(&str, &str) -> bool,
    stated: &Stated,
    facts: &mut FactResolution,
) {
    let before = facts.invalidated;
    // An edge of unknown start held when its episode was written; a
    // committed one is taken to have started before the end.
    let started = |e: &EdgeRow| {
        e.valid_at
            .or_else(|| stated.seen_at.get(&e.edge_id).copied())
    };
    apply_withdrawals(
        edges,
        committed_edges,
        &stated.withdrawn,
        is_a,
        &started,
        cx.now,
        facts,
    );
    tracing::info!(
        "{} ends stated for every relationship of a type ended {} facts",
        stated.withdrawn.len(),
        facts.invalidated - before
    );
}

/// Asks the judge which older facts each open new fact (`open`: the new
/// edge's index and its candidates) replaces: the pairs to end, in order,
/// and the calls that failed.
async fn judge_contradictions(
    cx: &StageContext<'_>,
    edges: &[EdgeRow],
    committed_edges: &[EdgeRow],
    open: &[(usize, Vec<EdgeRef>)],
    contexts: &HashMap<(&str, &str), &str>,
) -> (Vec<(usize, EdgeRef)>, Vec<JudgeFailure>) {
    let rs = cx.spec;
    let cases: Vec<ContradictionCase> = open
        .iter()
        .map(|(i, others)| {
            let e = &edges[*i];
            let since = |v: Option<chrono::DateTime<chrono::Utc>>| {
                v.map(|v| format!(" (from {})", v.date_naive()))
                    .unwrap_or_default()
            };
            let dated = |r: &EdgeRef| {
                let older = r.row(edges, committed_edges);
                format!("{}{}", older.fact, since(older.valid_at))
            };
            ContradictionCase {
                fact: format!("{}{}", e.fact, since(e.valid_at)),
                existing: others.iter().map(dated).collect(),
                text: e.episode_ids.first().and_then(|ep| {
                    contexts
                        .get(&(e.target_node_id.as_str(), ep.as_str()))
                        .map(|t| t.to_string())
                }),
            }
        })
        .collect();
    let (verdicts, fails) = crate::resolve::judge::contradictions(
        cx.client,
        rs.contradiction_batch_size,
        cx.concurrency,
        &cases,
    )
    .await;
    let mut pairs: Vec<(usize, EdgeRef)> = Vec::new();
    for (case, picked) in verdicts {
        let (i, others) = &open[case];
        pairs.extend(picked.into_iter().map(|j| (*i, others[j])));
    }
    pairs.sort();
    (pairs, fails)
}

/// The type a node of `chain` is stored with: its last type, or the
/// generic label for an empty chain.
fn chain_type(chain: &[String]) -> String {
    chain
        .last()
        .cloned()
        .unwrap_or_else(|| crate::ontology::ENTITY_LABEL.into())
}

/// The node rows: a draft of a new cluster gets the next short id; a
/// draft of a committed node is merged into it. Returns new nodes, then
/// updated ones, and the updated nodes' ids.
fn finish_nodes(
    cx: &StageContext<'_>,
    drafts: Vec<(NodeRow, Vec<String>)>,
    resolved: &Resolved,
    committed: &HashMap<i64, NodeRow>,
) -> (Vec<NodeRow>, Vec<String>) {
    let mut nodes: Vec<NodeRow> = Vec::with_capacity(drafts.len());
    let mut updated: BTreeMap<String, NodeRow> = BTreeMap::new();
    let mut next_short_id = cx.base_short_id;
    for (c, (mut row, chain)) in drafts.into_iter().enumerate() {
        row.node_type = chain_type(&chain);
        row.labels = cx
            .ontology
            .labels_for(&row.node_type)
            .unwrap_or_else(|| vec![crate::ontology::ENTITY_LABEL.into()]);
        match resolved.committed[c].and_then(|id| committed.get(&id)) {
            Some(existing) => {
                let base = updated
                    .remove(&existing.node_id)
                    .unwrap_or_else(|| existing.clone());
                updated.insert(
                    existing.node_id.clone(),
                    merge_into(base, row, &chain, cx.now, cx.run_id, cx.ontology),
                );
            }
            None => {
                next_short_id += 1;
                row.short_id = next_short_id;
                nodes.push(row);
            }
        }
    }
    let updated_ids: Vec<String> = updated.keys().cloned().collect();
    nodes.extend(updated.into_values());
    (nodes, updated_ids)
}

/// The committed nodes with these short ids (a semi-join).
async fn committed_nodes(
    ctx: &SessionContext,
    short_ids: Vec<i64>,
) -> Result<HashMap<i64, NodeRow>, ResolveError> {
    if short_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let what = "reading the committed nodes the run's mentions resolved to";
    crate::scratch::register_column(
        ctx,
        "run_node_ids",
        "short_id",
        Arc::new(Int64Array::from(short_ids)),
    )
    .await
    .map_err(step(what))?;
    let batches = ctx
        .sql("SELECT n.* FROM nodes n LEFT SEMI JOIN run_node_ids i ON n.short_id = i.short_id")
        .await
        .map_err(step(what))?
        .collect()
        .await
        .map_err(step(what))?;
    let rows: Vec<NodeRow> = rows::decode("nodes", &batches)?;
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
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for m in members {
        if m.chain == chain {
            for (k, v) in &m.attributes {
                attributes.insert(k.clone(), v.clone());
            }
        }
        if seen.insert(&m.episode_id) {
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
        // A record's entity (a node a mapping made) says so: its type is
        // the one text mentions of its name take.
        origin: if members.iter().any(|m| m.mapped) {
            "map"
        } else {
            "extract"
        }
        .into(),
        run_id: run_id.to_string(),
    };
    (row, chain)
}

/// The committed edges whose source is one of `sources`, expired ones
/// included: a functional family's timeline needs the edges that already
/// ended to tell a restatement of a valid edge from a new interval (a
/// DataFusion semi-join against `edges`).
async fn committed_edges_of<'a>(
    ctx: &SessionContext,
    sources: impl Iterator<Item = &'a str>,
) -> Result<Vec<EdgeRow>, ResolveError> {
    let mut sources = sources.peekable();
    if sources.peek().is_none() {
        return Ok(Vec::new());
    }
    let batches = by_node_ids(
        ctx,
        "run_sources",
        sources,
        "SELECT e.* FROM edges e LEFT SEMI JOIN run_sources s ON e.source_node_id = s.node_id",
        "reading the committed edges of the run's fact sources",
    )
    .await?;
    Ok(rows::decode("edges", &batches)?)
}

/// Registers the distinct `ids` as the scratch table `name` (one column,
/// `node_id`) and collects `select`, which joins it.
async fn by_node_ids<'a>(
    ctx: &SessionContext,
    name: &str,
    ids: impl Iterator<Item = &'a str>,
    select: &str,
    what: &'static str,
) -> Result<Vec<datafusion::arrow::record_batch::RecordBatch>, ResolveError> {
    let ids: BTreeSet<&str> = ids.collect();
    let ids: Vec<String> = ids.into_iter().map(str::to_string).collect();
    crate::scratch::register_column(ctx, name, "node_id", Arc::new(StringArray::from(ids)))
        .await
        .map_err(step(what))?;
    ctx.sql(select)
        .await
        .map_err(step(what))?
        .collect()
        .await
        .map_err(step(what))
}

/// The type of each target node of the live `edges` (the only ones the
/// contradiction judge is asked about), read from the committed nodes
/// table.
async fn committed_types(
    ctx: &SessionContext,
    edges: &[EdgeRow],
) -> Result<HashMap<String, String>, ResolveError> {
    let live = |e: &&EdgeRow| e.expired_at.is_none() && e.invalid_at.is_none();
    if !edges.iter().any(|e| live(&e)) {
        return Ok(HashMap::new());
    }
    let what = "reading the types of the committed edges' targets";
    let batches = by_node_ids(
        ctx,
        "run_targets",
        edges.iter().filter(live).map(|e| e.target_node_id.as_str()),
        "SELECT n.node_id, n.type FROM nodes n LEFT SEMI JOIN run_targets t ON n.node_id = t.node_id",
        what,
    )
    .await?;
    let mut types = HashMap::new();
    for b in &batches {
        // The reader may hand out string views: cast to plain strings.
        let ids = strings(b.column(0)).map_err(step(what))?;
        let kinds = strings(b.column(1)).map_err(step(what))?;
        let (ids, kinds) = (ids.as_string::<i32>(), kinds.as_string::<i32>());
        for r in 0..b.num_rows() {
            types.insert(ids.value(r).to_string(), kinds.value(r).to_string());
        }
    }
    Ok(types)
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
    let mut seen: std::collections::HashSet<String> =
        existing.episode_ids.iter().cloned().collect();
    for e in draft.episode_ids {
        if seen.insert(e.clone()) {
            existing.episode_ids.push(e);
        }
    }
    existing.rank += draft.rank;
    existing.updated_at = now;
    existing.run_id = run_id.to_string();
    existing
}

/// Brings the summaries of `nodes` touched by `new_edges` up to date.
async fn summarize(
    client: &LlmClient,
    rs: &ResolveSpec,
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
    for (stage, inputs) in [(Stage::EmbedNames, names), (Stage::EmbedFacts, texts)] {
        if inputs.is_empty() {
            continue;
        }
        match client.embed(stage, &inputs).await {
            Ok(vectors) if stage == Stage::EmbedNames => {
                for (&i, v) in todo.iter().zip(vectors) {
                    nodes[i].name_embedding = Some(v);
                }
            }
            Ok(vectors) => {
                for (e, v) in new_edges.iter_mut().zip(vectors) {
                    e.fact_embedding = Some(v);
                }
            }
            Err(e) => {
                let failure = JudgeFailure {
                    stage,
                    item: format!("{} texts", inputs.len()),
                    reason: format!("embedding call failed, stored without embeddings: {e}"),
                };
                failures.push(failure.to_row(run_id, now));
            }
        }
    }
    failures
}
