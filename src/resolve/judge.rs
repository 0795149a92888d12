//! What resolution asks the LLM, always in batches: which candidate an
//! ambiguous mention is (adjudication), which older facts a new fact
//! contradicts, and updated node summaries. A failed call never stops a
//! run: its items keep the conservative answer (stay separate, stay
//! valid, keep the old summary) and are reported.

use std::collections::HashMap;
use std::fmt::Write as _;

use futures::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::llm::{ChatRequest, LlmClient, LlmError, Message};
use crate::rows::FailureRow;
use crate::stage::Stage;

/// Version of the resolution prompts; part of the cache key.
pub const PROMPT_VERSION: &str = "resolve-v1";

/// An item the LLM could not settle, for a `failures` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeFailure {
    /// `adjudicate`, `contradictions` or `summaries`.
    pub stage: Stage,
    /// What was asked about (a name or a fact).
    pub item: String,
    /// Why it is unsettled.
    pub reason: String,
}

impl JudgeFailure {
    /// The `failures` row of this item in run `run_id`.
    pub fn to_row(&self, run_id: &str, created_at: chrono::DateTime<chrono::Utc>) -> FailureRow {
        FailureRow::new(
            run_id,
            self.stage,
            self.item.clone(),
            self.reason.clone(),
            created_at,
        )
    }
}

#[derive(Deserialize)]
struct Items<T> {
    items: Vec<T>,
}

/// An answer item, numbered as its question was (1-based in its batch).
trait Numbered {
    fn id(&self) -> u64;
}

/// One kind of batched question.
struct Question {
    stage: Stage,
    system: &'static str,
    /// What to do, above the numbered items.
    intro: &'static str,
    /// The reply's shape, below them.
    reply: &'static str,
    /// Completion tokens allowed per item (plus 32 per call).
    tokens_per_item: u32,
    /// JSON schema of one answer item.
    item_schema: Value,
}

/// Asks `q` about `labels.len()` cases in batches of `batch_size`,
/// `concurrency` calls at a time; `render(case, number, prompt)` writes
/// one case. Returns the answers by case, and one failure per case the
/// model could not settle (`fallback` says what happens to it).
///
/// A batch degrades item by item: when its call fails (cut at
/// `max_tokens`, malformed, refused) or its reply leaves cases out, the
/// cases without an answer are asked again in batches of half the size,
/// down to one case; only a case that fails alone gets a failure. One
/// runaway case so costs its neighbours a few more calls, never their
/// answers. Answers naming no case of their batch are ignored.
async fn ask<T: DeserializeOwned + Numbered>(
    client: &LlmClient,
    q: &Question,
    batch_size: usize,
    concurrency: usize,
    labels: &[String],
    fallback: &str,
    render: impl Fn(usize, usize, &mut String),
) -> (Vec<(usize, T)>, Vec<JudgeFailure>) {
    let indices: Vec<usize> = (0..labels.len()).collect();
    let mut round: Vec<Vec<usize>> = indices
        .chunks(batch_size.max(1))
        .map(<[usize]>::to_vec)
        .collect();
    let mut answers = Vec::new();
    let mut failures = Vec::new();
    // Each round at least halves the largest batch, so rounds are bounded
    // by log2(batch_size) + 1; the counter only guards that reasoning.
    for _ in 0..=usize::BITS {
        if round.is_empty() {
            break;
        }
        let replies = send_batches::<T>(client, q, concurrency, labels, &render, &round).await;
        let mut next: Vec<Vec<usize>> = Vec::new();
        for (members, reply) in replies {
            let (unanswered, why) = match reply {
                Ok((reply, dropped)) => {
                    let mut open: Vec<bool> = vec![true; members.len()];
                    for item in reply.items {
                        let k = (item.id() as usize).checked_sub(1);
                        if let Some(k) = k.filter(|&k| k < members.len() && open[k]) {
                            open[k] = false;
                            answers.push((members[k], item));
                        }
                    }
                    let left: Vec<usize> = members
                        .iter()
                        .zip(&open)
                        .filter(|(_, o)| **o)
                        .map(|(&m, _)| m)
                        .collect();
                    let why = if dropped.is_empty() {
                        "the reply gave no answer for it".to_string()
                    } else {
                        format!(
                            "the reply gave no usable answer ({})",
                            crate::llm::reply::describe_dropped(&dropped)
                        )
                    };
                    (left, why)
                }
                // Batch mode: the answer comes in a later round, which
                // asks this batch again; nothing to conclude now.
                Err(e) if e.is_deferred() => continue,
                Err(e) => (members.clone(), format!("call failed: {e}")),
            };
            if unanswered.is_empty() {
                continue;
            }
            if members.len() == 1 {
                failures.extend(unanswered.iter().map(|&case| JudgeFailure {
                    stage: q.stage,
                    item: labels[case].clone(),
                    reason: format!("{} asked alone, {why}; {fallback}", q.stage),
                }));
                continue;
            }
            let half = members.len().div_ceil(2);
            next.extend(unanswered.chunks(half).map(<[usize]>::to_vec));
        }
        // Replies arrive in any order; the next round's batches (hence
        // their requests and cache keys) must not depend on it.
        next.sort();
        round = next;
    }
    (answers, failures)
}

/// One round of batched questions, `concurrency` calls at a time. Each
/// reply's schema bounds it to one item per case of its batch.
async fn send_batches<T: DeserializeOwned>(
    client: &LlmClient,
    q: &Question,
    concurrency: usize,
    labels: &[String],
    render: &impl Fn(usize, usize, &mut String),
    batches: &[Vec<usize>],
) -> Vec<(Vec<usize>, Result<(Items<T>, Vec<String>), LlmError>)> {
    let requests: Vec<(Vec<usize>, ChatRequest, Value)> = batches
        .iter()
        .map(|members| {
            let mut prompt = format!("{}\n", q.intro);
            for (k, &case) in members.iter().enumerate() {
                render(case, k + 1, &mut prompt);
            }
            let _ = write!(prompt, "\nReply with JSON: {}", q.reply);
            let req = ChatRequest {
                stage: q.stage,
                item: labels.get(members[0]).cloned(),
                messages: vec![Message::system(q.system), Message::user(prompt)],
                max_tokens: 32 + q.tokens_per_item * members.len() as u32,
                prompt_version: PROMPT_VERSION.into(),
                budget: None,
            };
            let n = members.len();
            let mut item = q.item_schema.clone();
            item["properties"]["id"] = json!({"type": "integer", "minimum": 1, "maximum": n});
            let schema = json!({
                "type": "object",
                "properties": {"items": {"type": "array", "items": item, "maxItems": n}},
                "required": ["items"],
                "additionalProperties": false
            });
            (members.clone(), req, schema)
        })
        .collect();
    futures::stream::iter(requests)
        .map(|(members, req, schema)| async move {
            let r = client
                .chat_json_with_schema::<Items<T>>(req, schema)
                .await
                .map(|r| (r.value, r.dropped));
            (members, r)
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// An ambiguous mention as the LLM sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdjudicationCase {
    /// The mention's name.
    pub name: String,
    /// Its type chain, root first.
    pub chain: Vec<String>,
    /// A few lines of the episode it came from.
    pub context: String,
    /// Candidates: name and chain.
    pub options: Vec<(String, Vec<String>)>,
}

#[derive(Deserialize)]
struct Choice {
    id: u64,
    choice: u64,
}

impl Numbered for Choice {
    fn id(&self) -> u64 {
        self.id
    }
}

fn type_of(chain: &[String]) -> String {
    if chain.is_empty() {
        crate::ontology::ENTITY_LABEL.to_string()
    } else {
        chain.join(" > ")
    }
}

/// Asks which candidate each case is. Returns, per case index, the chosen
/// option index (cases answered "none", unanswered or failed are absent).
pub async fn adjudicate(
    client: &LlmClient,
    batch_size: usize,
    concurrency: usize,
    cases: &[AdjudicationCase],
) -> (HashMap<usize, usize>, Vec<JudgeFailure>) {
    let q = Question {
        stage: Stage::Adjudicate,
        system: "You resolve entity mentions for a knowledge graph. Reply with JSON only.",
        intro: "For each mention below, decide whether it names the same real-world entity as one \
                of its numbered candidates. Answer with that candidate's number, or 0 when none is \
                clearly the same entity. When unsure, answer 0: a wrong merge corrupts the graph, \
                a missed one can be fixed later.",
        reply: "{\"items\": [{\"id\": <mention number>, \"choice\": <candidate number or 0>}]}, one item per mention.",
        tokens_per_item: 24,
        item_schema: json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "choice": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": cases.iter().map(|c| c.options.len()).max().unwrap_or(0)
                }
            },
            "required": ["id", "choice"],
            "additionalProperties": false
        }),
    };
    let labels: Vec<String> = cases.iter().map(|c| c.name.clone()).collect();
    let (answers, mut failures) = ask::<Choice>(
        client,
        &q,
        batch_size,
        concurrency,
        &labels,
        "the mention stays separate",
        |case, n, prompt| {
            let c = &cases[case];
            let _ = write!(
                prompt,
                "\nMention {n}: \"{}\" ({})\nContext: {}\nCandidates:\n",
                c.name,
                type_of(&c.chain),
                c.context.replace('\n', " ")
            );
            for (j, (name, chain)) in c.options.iter().enumerate() {
                let _ = writeln!(prompt, "  {}. \"{}\" ({})", j + 1, name, type_of(chain));
            }
        },
    )
    .await;
    let mut chosen = HashMap::new();
    for (case, item) in answers {
        let options = cases[case].options.len();
        match item.choice as usize {
            0 => {}
            c if c <= options => {
                chosen.insert(case, c - 1);
            }
            c => failures.push(JudgeFailure {
                stage: Stage::Adjudicate,
                item: cases[case].name.clone(),
                reason: format!(
                    "the model chose candidate {c} of {options}; the mention stays separate"
                ),
            }),
        }
    }
    (chosen, failures)
}

/// A new fact and the facts it may contradict.
#[derive(Debug, Clone, PartialEq)]
pub struct ContradictionCase {
    /// The new fact's text.
    pub fact: String,
    /// Texts of the facts it may contradict.
    pub existing: Vec<String>,
    /// The words of its episode around it, when known.
    pub text: Option<String>,
}

#[derive(Deserialize)]
struct Verdict {
    id: u64,
    contradicts: Vec<u64>,
}

impl Numbered for Verdict {
    fn id(&self) -> u64 {
        self.id
    }
}

/// Asks which of its existing facts each new fact contradicts (they can
/// no longer both be true). Returns, per case, the contradicted indices.
pub async fn contradictions(
    client: &LlmClient,
    batch_size: usize,
    concurrency: usize,
    cases: &[ContradictionCase],
) -> (HashMap<usize, Vec<usize>>, Vec<JudgeFailure>) {
    let most_existing = cases.iter().map(|c| c.existing.len()).max().unwrap_or(0);
    let q = Question {
        stage: Stage::Contradictions,
        system: "You keep a temporal knowledge graph consistent. Reply with JSON only.",
        intro: "For each new fact below, list the numbers of the existing facts it replaces: facts \
                that stop being true once the new one is, because the same subject changed to \
                another value, partner or state (a new supplier instead of the old one, a new \
                status). A fact that adds one more relationship of the same kind (one more thing \
                someone is responsible for, works on or owns) replaces nothing, and neither does \
                one that adds detail. Answer [] when it replaces none.",
        reply: "{\"items\": [{\"id\": <new fact number>, \"contradicts\": [<existing fact numbers>]}]}.",
        tokens_per_item: 32,
        item_schema: json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "contradicts": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1, "maximum": most_existing},
                    "maxItems": most_existing
                }
            },
            "required": ["id", "contradicts"],
            "additionalProperties": false
        }),
    };
    let labels: Vec<String> = cases
        .iter()
        .map(|c| c.fact.chars().take(200).collect())
        .collect();
    let (answers, failures) = ask::<Verdict>(
        client,
        &q,
        batch_size,
        concurrency,
        &labels,
        "older facts stay valid",
        |case, n, prompt| {
            let c = &cases[case];
            let _ = write!(prompt, "\nNew fact {n}: {}\n", c.fact);
            if let Some(text) = &c.text {
                let _ = writeln!(prompt, "Its text: \"{text}\"");
            }
            let _ = writeln!(prompt, "Existing facts:");
            for (j, f) in c.existing.iter().enumerate() {
                let _ = writeln!(prompt, "  {}. {}", j + 1, f);
            }
        },
    )
    .await;
    let mut out: HashMap<usize, Vec<usize>> = HashMap::new();
    for (case, item) in answers {
        let n = cases[case].existing.len();
        let picked: Vec<usize> = item
            .contradicts
            .iter()
            .filter_map(|&j| (j as usize).checked_sub(1))
            .filter(|&j| j < n)
            .collect();
        if !picked.is_empty() {
            out.insert(case, picked);
        }
    }
    (out, failures)
}

/// A node whose summary is brought up to date.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryCase {
    /// The node's name.
    pub name: String,
    /// Its type chain.
    pub chain: Vec<String>,
    /// The summary so far (none for a new node).
    pub summary: Option<String>,
    /// Facts learnt in this run.
    pub facts: Vec<String>,
}

#[derive(Deserialize)]
struct SummaryOut {
    id: u64,
    summary: String,
}

impl Numbered for SummaryOut {
    fn id(&self) -> u64 {
        self.id
    }
}

/// Longest summary a reply may write: two sentences, with room.
const SUMMARY_MAX_CHARS: usize = 400;

/// Updated summaries, per case index (failed cases keep their old one).
pub async fn summaries(
    client: &LlmClient,
    batch_size: usize,
    concurrency: usize,
    cases: &[SummaryCase],
) -> (HashMap<usize, String>, Vec<JudgeFailure>) {
    let q = Question {
        stage: Stage::Summaries,
        system: "You summarise entities of a knowledge graph. Reply with JSON only.",
        intro: "Write an up-to-date summary (at most two sentences) of each entity below from its \
                current summary and its new facts. State only what the facts say.",
        reply: "{\"items\": [{\"id\": <entity number>, \"summary\": \"...\"}]}.",
        tokens_per_item: 96,
        item_schema: json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "summary": {"type": "string", "maxLength": SUMMARY_MAX_CHARS}
            },
            "required": ["id", "summary"],
            "additionalProperties": false
        }),
    };
    let labels: Vec<String> = cases.iter().map(|c| c.name.clone()).collect();
    let (answers, failures) = ask::<SummaryOut>(
        client,
        &q,
        batch_size,
        concurrency,
        &labels,
        "the old summary stays",
        |case, n, prompt| {
            let c = &cases[case];
            let _ = write!(
                prompt,
                "\nEntity {n}: \"{}\" ({})\nCurrent summary: {}\nNew facts:\n",
                c.name,
                type_of(&c.chain),
                c.summary.as_deref().unwrap_or("(none)")
            );
            for f in &c.facts {
                let _ = writeln!(prompt, "  - {f}");
            }
        },
    )
    .await;
    let mut out = HashMap::new();
    for (case, item) in answers {
        let text = item.summary.trim();
        if !text.is_empty() {
            out.insert(case, text.to_string());
        }
    }
    (out, failures)
}
