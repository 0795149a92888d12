//! `graphloom run --dry-run`: the calls a run would make, with estimated
//! tokens, without calling anything.

use super::extraction::Documents;
use crate::extract::{self, ExtractSpec};
use crate::llm::plan::StagePlan;
use crate::ontology::{Ontology, TypeTree};
use crate::resolve::ResolveSpec;
use crate::source::Episode;
use crate::stage::Stage;

/// Entity and fact calls are one per episode; the walks depend on what
/// extraction finds, so they are bounded with an assumed number of
/// entities and facts per episode.
const ENTITIES_PER_EPISODE: u64 = 6;
const FACTS_PER_EPISODE: u64 = 4;

/// Plans the calls of a run over the episodes `todo` (indices into `all`).
pub fn plan(
    ontology: &Ontology,
    spec: &ExtractSpec,
    all: &[Episode],
    todo: &[usize],
) -> Vec<StagePlan> {
    let n = todo.len() as u64;
    let exact = |stage| StagePlan {
        stage,
        upper_bound: false,
        calls: n,
        prompt_tokens: 0,
        max_completion_tokens: 0,
    };
    let mut entity = exact(Stage::ExtractEntities);
    let mut fact = StagePlan {
        upper_bound: true,
        ..exact(Stage::ExtractFacts)
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
        fact.max_completion_tokens +=
            extract::fact_reply_bound(spec, ENTITIES_PER_EPISODE as usize) as u64;
    }
    let levels = |tree: &TypeTree| tree.iter().filter(|t| !t.children.is_empty()).count() as u64;
    let batch = spec.classify_batch_size.max(1) as u64;
    // A walk makes at most one call per batch of items per parent type;
    // its prompt and reply grow with the batch.
    let walk = |stage,
                parents: u64,
                per_episode: u64,
                (prompt_base, prompt_per_item): (u64, u64),
                (reply_base, reply_per_item): (u64, u64)| {
        let items = n * per_episode;
        let calls = items.div_ceil(batch).min(items) * parents;
        (calls > 0).then(|| StagePlan {
            stage,
            upper_bound: true,
            calls,
            prompt_tokens: calls * (prompt_base + batch * prompt_per_item),
            max_completion_tokens: calls * (reply_base + batch * reply_per_item),
        })
    };
    let mut stages = vec![entity];
    stages.extend(walk(
        Stage::ClassifyEntities,
        levels(&ontology.entity_tree),
        ENTITIES_PER_EPISODE,
        (400, 80),
        (64, 100),
    ));
    stages.push(fact);
    if spec.fold_edge_subtypes {
        // The fact call already chose among the subtypes.
        return stages;
    }
    stages.extend(walk(
        Stage::ClassifyFacts,
        levels(&ontology.edge_tree),
        FACTS_PER_EPISODE,
        (300, 50),
        (64, 32),
    ));
    stages
}

/// Batch mode: the rounds a run makes at most, one per stage level (a
/// level's questions are built on the answers of the one before): entity
/// extraction, each level of the entity walk, fact extraction, each level
/// of the edge walk, then adjudication, contradictions, summaries and
/// embeddings when they are on. The last round only commits.
pub fn batch_rounds(ontology: &Ontology, extract: &ExtractSpec, resolve: &ResolveSpec) -> u32 {
    // A walk asks one level per round: as deep as the deepest parent.
    let depth = |tree: &TypeTree| {
        tree.iter()
            .filter(|t| !t.children.is_empty())
            .filter_map(|t| tree.chain(&t.name).map(|c| c.len() as u32))
            .max()
            .unwrap_or(0)
    };
    let edge_walk = if extract.fold_edge_subtypes {
        0
    } else {
        depth(&ontology.edge_tree)
    };
    let optional = [
        resolve.embedding_candidates,
        resolve.adjudicate,
        resolve.judge_contradictions,
        resolve.summaries,
        resolve.embeddings || resolve.embedding_candidates,
    ];
    2 + depth(&ontology.entity_tree)
        + edge_walk
        + optional.iter().filter(|on| **on).count() as u32
        + 1
}
