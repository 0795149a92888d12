//! Quality of a graph against a gold file (`graphloom eval`): entity
//! precision and recall, chain accuracy and fact recall, over the episodes
//! the graph has processed.
//!
//! Gold file: `{"entities": [{"name", "chain", "aliases", "episodes"}],
//! "facts": [{"source", "target", "relation_type", "chain", "valid_at",
//! "invalid_at", "episodes"}]}`; episode ids are the records' own `id`s
//! (`episodes.source_id`).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use crate::store::rows::{self, EdgeRow, EdgeTypeRow, EpisodeRow, FailureRow, NodeRow, RunRow};
use crate::store::{GraphStore, StoreError, Table};
use crate::text::normalize_name;

/// Errors of the evaluation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// The gold file could not be read or parsed.
    #[error("cannot read gold file {path}: {source}")]
    Gold {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The graph could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A gold entity.
#[derive(Debug, Clone, Deserialize)]
pub struct GoldEntity {
    pub name: String,
    pub chain: Vec<String>,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub episodes: Vec<String>,
}

/// A gold fact.
#[derive(Debug, Clone, Deserialize)]
pub struct GoldFact {
    pub source: String,
    pub target: String,
    pub relation_type: String,
    #[serde(default)]
    pub chain: Vec<String>,
    #[serde(default)]
    pub episodes: Vec<String>,
    /// When the relationship ended, if the corpus says it did.
    #[serde(default)]
    pub invalid_at: Option<String>,
}

/// A gold file.
#[derive(Debug, Clone, Deserialize)]
pub struct Gold {
    pub entities: Vec<GoldEntity>,
    pub facts: Vec<GoldFact>,
}

impl Gold {
    /// Reads a gold file.
    pub fn from_path(path: &Path) -> Result<Gold, EvalError> {
        let err = |source: Box<dyn std::error::Error + Send + Sync>| EvalError::Gold {
            path: path.display().to_string(),
            source,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.into()))?;
        serde_json::from_str(&text).map_err(|e| err(e.into()))
    }
}

/// The figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quality {
    /// Episodes of the gold file the graph has processed.
    pub episodes_in_scope: usize,
    /// Gold entities mentioned in those episodes.
    pub gold_entities: usize,
    /// Of those, found by at least one node.
    pub entities_found: usize,
    /// Extracted nodes.
    pub nodes: usize,
    /// Nodes that match a gold entity in scope.
    pub nodes_matching: usize,
    /// Found entities with a node of exactly the gold chain.
    pub chains_exact: usize,
    /// Found entities with a node of the gold top-level type (the first
    /// level of the walk).
    pub top_right: usize,
    /// Found entities whose gold chain goes below its top-level type and
    /// that have a node of that top-level type: the subtype walks asked.
    pub sub_asked: usize,
    /// Of those, with a node whose chain is the gold one (as deep).
    pub sub_right: usize,
    /// Of those not right, with a node that stopped on the gold chain
    /// above its end (left at a parent).
    pub sub_at_parent: usize,
    /// Gold facts stated in processed episodes.
    pub gold_facts: usize,
    /// Of those, found as an edge between the right nodes with a relation
    /// type of the same top-level family.
    pub facts_found: usize,
    /// Of the found facts, those with exactly the gold relation type.
    pub relation_exact: usize,
    /// Found gold facts that ended, all of whose episodes were processed.
    pub ended_found: usize,
    /// Of those, stored with no live edge that started before the gold end
    /// (every matching edge of the relationship ended).
    pub ended_stored_invalid: usize,
    /// Of the found ended facts, those with a matching edge that ended
    /// within [`END_TOLERANCE_DAYS`] of the gold end.
    pub ended_dated: usize,
    /// Found gold facts the corpus never ends.
    pub current_found: usize,
    /// Of those, with a live matching edge: not ended by a later fact, a
    /// contradiction judgement or an end the model made up.
    pub current_stored_live: usize,
    /// Episodes a run tried and did not commit (a failed call).
    pub episodes_lost: usize,
    /// Completed runs (`graphloom run`) the figures below add up.
    pub runs: usize,
    /// Episodes those runs committed.
    pub episodes_added: usize,
    /// LLM calls of those runs (cache hits excluded).
    pub llm_calls: usize,
    /// Prompt plus completion tokens of those calls.
    pub tokens: usize,
    /// Wall time of those runs, in seconds.
    pub seconds: f64,
}

/// Counts the chain and walk-by-level figures of the `found` gold
/// entities over their nodes (`gold_of_node`: node id → gold entity).
fn score_chains(
    q: &mut Quality,
    gold: &Gold,
    nodes: &[&NodeRow],
    gold_of_node: &HashMap<&str, usize>,
    found: &HashSet<usize>,
) {
    for &g in found {
        let want = &gold.entities[g].chain[..];
        // Labels hold `Entity` first, then the chain.
        let chains: Vec<&[String]> = nodes
            .iter()
            .filter(|n| gold_of_node.get(n.node_id.as_str()) == Some(&g))
            .map(|n| n.labels.get(1..).unwrap_or_default())
            .collect();
        let exact = chains.contains(&want);
        q.chains_exact += usize::from(exact);
        let top = |c: &[String]| !want.is_empty() && c.first() == want.first();
        if !chains.iter().any(|c| top(c)) {
            continue;
        }
        q.top_right += 1;
        if want.len() > 1 {
            q.sub_asked += 1;
            if exact {
                q.sub_right += 1;
            } else if chains
                .iter()
                .any(|c| top(c) && c.len() < want.len() && want.starts_with(c))
            {
                q.sub_at_parent += 1;
            }
        }
    }
}

/// How far a stored end may lie from the gold end and still count as
/// the right date (days, either way).
pub const END_TOLERANCE_DAYS: i64 = 3;

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

impl Quality {
    /// Nodes that match a gold entity / nodes.
    pub fn entity_precision(&self) -> f64 {
        ratio(self.nodes_matching, self.nodes)
    }
    /// Gold entities found / gold entities.
    pub fn entity_recall(&self) -> f64 {
        ratio(self.entities_found, self.gold_entities)
    }
    /// Found entities with the exact chain / found entities.
    pub fn chain_accuracy(&self) -> f64 {
        ratio(self.chains_exact, self.entities_found)
    }
    /// Found entities of the right top-level type / found entities.
    pub fn top_accuracy(&self) -> f64 {
        ratio(self.top_right, self.entities_found)
    }
    /// Subtype walks that reached the gold chain / walks asked (entities
    /// of the right top-level type that have a subtype to reach).
    pub fn subtype_accuracy(&self) -> f64 {
        ratio(self.sub_right, self.sub_asked)
    }
    /// Gold facts found / gold facts.
    pub fn fact_recall(&self) -> f64 {
        ratio(self.facts_found, self.gold_facts)
    }
    /// Gold facts found with exactly the gold type / gold facts.
    pub fn fact_recall_exact(&self) -> f64 {
        ratio(self.relation_exact, self.gold_facts)
    }
    /// Nodes matching a gold entity / gold entities found (1.0: one node
    /// per entity; more: an entity split over several nodes).
    pub fn nodes_per_entity(&self) -> f64 {
        ratio(self.nodes_matching, self.entities_found)
    }
    /// What the runs cost per committed episode: (calls, tokens, seconds).
    pub fn per_episode(&self) -> (f64, f64, f64) {
        let n = self.episodes_added.max(1) as f64;
        (
            self.llm_calls as f64 / n,
            self.tokens as f64 / n,
            self.seconds / n,
        )
    }
}

impl std::fmt::Display for Quality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "episodes evaluated: {}", self.episodes_in_scope)?;
        writeln!(
            f,
            "entities: precision {:.2} ({}/{} nodes match a gold entity), recall {:.2} ({}/{} gold entities found)",
            self.entity_precision(),
            self.nodes_matching,
            self.nodes,
            self.entity_recall(),
            self.entities_found,
            self.gold_entities
        )?;
        writeln!(
            f,
            "chains: {:.2} of found entities have exactly the gold chain ({}/{})",
            self.chain_accuracy(),
            self.chains_exact,
            self.entities_found
        )?;
        writeln!(
            f,
            "walk by level: top-level type right {:.2} ({}/{}); subtype reached {:.2} ({}/{} with one to reach; {} left at a parent, {} at another type)",
            self.top_accuracy(),
            self.top_right,
            self.entities_found,
            self.subtype_accuracy(),
            self.sub_right,
            self.sub_asked,
            self.sub_at_parent,
            self.sub_asked - self.sub_right - self.sub_at_parent
        )?;
        writeln!(
            f,
            "nodes per found gold entity: {:.2} ({} nodes for {} entities)",
            self.nodes_per_entity(),
            self.nodes_matching,
            self.entities_found
        )?;
        writeln!(
            f,
            "facts: recall {:.2} ({}/{} gold facts found with a relation of the right family; {} with exactly the gold type: {:.2})",
            self.fact_recall(),
            self.facts_found,
            self.gold_facts,
            self.relation_exact,
            self.fact_recall_exact()
        )?;
        writeln!(
            f,
            "ended facts: {}/{} found ones stored ended (no live edge from before the end), {} with the right date (±{END_TOLERANCE_DAYS} days)",
            self.ended_stored_invalid, self.ended_found, self.ended_dated
        )?;
        writeln!(
            f,
            "current facts: {}/{} found ones stored live (the corpus never ends them)",
            self.current_stored_live, self.current_found
        )?;
        let (calls, tokens, seconds) = self.per_episode();
        write!(
            f,
            "runs: {} ({} episodes committed, {} lost to failed calls): {calls:.2} calls, {tokens:.0} tokens, {seconds:.1} s per episode",
            self.runs, self.episodes_added, self.episodes_lost
        )
    }
}

/// Scores the graph's last completed state against `gold`.
pub async fn evaluate(store: &GraphStore, gold: &Gold) -> Result<Quality, EvalError> {
    let snapshot = store.existing_snapshot().await?;
    let episodes: Vec<EpisodeRow> =
        rows::from_batches(Table::Episodes, &snapshot.read(Table::Episodes).await?)?;
    let nodes: Vec<NodeRow> =
        rows::from_batches(Table::Nodes, &snapshot.read(Table::Nodes).await?)?;
    let edges: Vec<EdgeRow> =
        rows::from_batches(Table::Edges, &snapshot.read(Table::Edges).await?)?;
    let processed: HashSet<&str> = episodes
        .iter()
        .filter_map(|e| e.source_id.as_deref())
        .collect();
    let in_scope = |eps: &[String]| eps.iter().any(|e| processed.contains(e.as_str()));
    // Nodes the run made (from text or records), not those `graphloom add` loaded.
    let nodes: Vec<&NodeRow> = nodes.iter().filter(|n| n.origin != "add").collect();

    // Every surface form of an in-scope gold entity → its index.
    let mut forms: HashMap<String, usize> = HashMap::new();
    for (i, g) in gold.entities.iter().enumerate() {
        if !in_scope(&g.episodes) {
            continue;
        }
        for form in std::iter::once(&g.name).chain(&g.aliases) {
            forms.entry(normalize_name(form)).or_insert(i);
        }
    }
    let gold_of_node: HashMap<&str, usize> = nodes
        .iter()
        .filter_map(|n| {
            forms
                .get(&n.name_normalized)
                .map(|g| (n.node_id.as_str(), *g))
        })
        .collect();
    let mut q = Quality {
        episodes_in_scope: processed.len(),
        gold_entities: gold
            .entities
            .iter()
            .filter(|g| in_scope(&g.episodes))
            .count(),
        nodes: nodes.len(),
        nodes_matching: gold_of_node.len(),
        ..Quality::default()
    };
    let found: HashSet<usize> = gold_of_node.values().copied().collect();
    q.entities_found = found.len();
    score_chains(&mut q, gold, &nodes, &gold_of_node, &found);
    let gold_index: HashMap<String, usize> = gold
        .entities
        .iter()
        .enumerate()
        .map(|(i, g)| (normalize_name(&g.name), i))
        .collect();
    // A relation's top-level type, by the ontology the graph holds: an edge
    // of a subtype (WORKS_FULL_TIME_FOR) is in its parent's family
    // (EMPLOYED_BY) as much as the parent itself.
    let edge_types: Vec<EdgeTypeRow> =
        rows::from_batches(Table::EdgeTypes, &snapshot.read(Table::EdgeTypes).await?)?;
    let parent_of: HashMap<String, String> = edge_types
        .into_iter()
        .filter_map(|t| Some((t.name, t.parent?)))
        .collect();
    let family = |relation: &str, chain: &[String]| {
        chain
            .first()
            .is_some_and(|gold_top| *gold_top == top_level(&parent_of, relation))
    };
    for f in gold.facts.iter().filter(|f| in_scope(&f.episodes)) {
        q.gold_facts += 1;
        let (Some(&gs), Some(&gt)) = (
            gold_index.get(&normalize_name(&f.source)),
            gold_index.get(&normalize_name(&f.target)),
        ) else {
            continue;
        };
        let chain = if f.chain.is_empty() {
            vec![f.relation_type.clone()]
        } else {
            f.chain.clone()
        };
        // A live edge that starts on or after the gold end is the pair's
        // next relationship (Tomás rejoins his old team), not this one
        // left standing.
        let gold_end = f
            .invalid_at
            .as_deref()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        let mut found_any = false;
        let mut exact = false;
        let mut live = false;
        let mut any_live = false;
        let mut dated = false;
        for e in &edges {
            let (s, t) = (
                gold_of_node.get(e.source_node_id.as_str()),
                gold_of_node.get(e.target_node_id.as_str()),
            );
            let ends = (s == Some(&gs) && t == Some(&gt)) || (s == Some(&gt) && t == Some(&gs));
            if ends && family(&e.relation_type, &chain) {
                found_any = true;
                exact |= e.relation_type == f.relation_type;
                any_live |= e.invalid_at.is_none();
                dated |= match (gold_end, e.invalid_at) {
                    (Some(end), Some(stored)) => {
                        (stored - end.with_timezone(&chrono::Utc)).num_days().abs()
                            <= END_TOLERANCE_DAYS
                    }
                    _ => false,
                };
                live |= e.invalid_at.is_none()
                    && match (gold_end, e.valid_at) {
                        (Some(end), Some(start)) => start < end,
                        _ => true,
                    };
            }
        }
        if found_any {
            q.facts_found += 1;
        }
        let end_seen = f.episodes.iter().all(|e| processed.contains(e.as_str()));
        if found_any && f.invalid_at.is_some() && end_seen {
            q.ended_found += 1;
            if !live {
                q.ended_stored_invalid += 1;
            }
            if dated {
                q.ended_dated += 1;
            }
        }
        if found_any && f.invalid_at.is_none() {
            q.current_found += 1;
            if any_live {
                q.current_stored_live += 1;
            }
        }
        if exact {
            q.relation_exact += 1;
        }
    }
    run_costs(&snapshot, &episodes, &mut q).await?;
    Ok(q)
}

/// The top-level type of `relation` by the `parent_of` links of a type
/// hierarchy (itself for a top-level or undeclared type).
fn top_level(parent_of: &HashMap<String, String>, relation: &str) -> String {
    let mut at = relation.to_string();
    // Bounded, should a table ever hold a cycle.
    for _ in 0..=parent_of.len() {
        match parent_of.get(&at) {
            Some(parent) => at = parent.clone(),
            None => break,
        }
    }
    at
}

/// What the graph's completed runs cost, and the episodes they lost.
async fn run_costs(
    snapshot: &crate::store::Snapshot,
    episodes: &[EpisodeRow],
    q: &mut Quality,
) -> Result<(), EvalError> {
    let runs: Vec<RunRow> = rows::from_batches(Table::Runs, &snapshot.read(Table::Runs).await?)?;
    for r in runs
        .iter()
        .filter(|r| r.command == "run" && r.status == "completed")
    {
        q.runs += 1;
        q.episodes_added += r.episodes_added.max(0) as usize;
        q.llm_calls += r.llm_calls.max(0) as usize;
        q.tokens += (r.prompt_tokens + r.completion_tokens).max(0) as usize;
        q.seconds += r.duration_ms.max(0) as f64 / 1000.0;
    }
    let failures: Vec<FailureRow> =
        rows::from_batches(Table::Failures, &snapshot.read(Table::Failures).await?)?;
    let committed: HashSet<&str> = episodes.iter().map(|e| e.episode_id.as_str()).collect();
    let lost: HashSet<&str> = failures
        .iter()
        .filter_map(|f| f.episode_id.as_deref())
        .filter(|e| !committed.contains(e))
        .collect();
    q.episodes_lost = lost.len();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subtype_is_in_its_parents_family() {
        let parent_of: HashMap<String, String> = [
            ("WORKS_FULL_TIME_FOR", "EMPLOYED_BY"),
            ("INTERN_OF", "WORKS_FULL_TIME_FOR"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(top_level(&parent_of, "INTERN_OF"), "EMPLOYED_BY");
        assert_eq!(top_level(&parent_of, "WORKS_FULL_TIME_FOR"), "EMPLOYED_BY");
        assert_eq!(top_level(&parent_of, "EMPLOYED_BY"), "EMPLOYED_BY");
        assert_eq!(top_level(&parent_of, "RELATES_TO"), "RELATES_TO");
    }

    #[test]
    fn ratios_of_nothing_are_zero() {
        let q = Quality::default();
        assert_eq!(
            (q.entity_precision(), q.entity_recall(), q.fact_recall()),
            (0.0, 0.0, 0.0)
        );
    }
}
