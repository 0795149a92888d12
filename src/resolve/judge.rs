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

/// Version of the resolution prompts; part of the cache key.
pub const PROMPT_VERSION: &str = "resolve-v1";

/// An item the LLM could not settle, for a `failures` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeFailure {
    /// `adjudicate`, `contradictions` or `summaries`.
    pub stage: &'static str,
    /// What was asked about (a name or a fact).
    pub item: String,
    /// Why it is unsettled.
    pub reason: String,
}

/// Sends batches `concurrency` at a time; each result keeps its batch.
async fn send<T: DeserializeOwned>(
    client: &LlmClient,
    concurrency: usize,
    requests: Vec<(Vec<usize>, ChatRequest, Value)>,
) -> Vec<(Vec<usize>, Result<T, LlmError>)> {
    futures::stream::iter(requests)
        .map(|(members, req, schema)| async move {
            let r = client
                .chat_json_with_schema::<T>(req, schema)
                .await
                .map(|r| r.value);
            (members, r)
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

fn items_schema(item: Value) -> Value {
    json!({
        "type": "object",
        "properties": {"items": {"type": "array", "items": item}},
        "required": ["items"],
        "additionalProperties": false
    })
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
struct Choices {
    items: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    id: u64,
    choice: u64,
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
    let mut requests = Vec::new();
    let indices: Vec<usize> = (0..cases.len()).collect();
    for chunk in indices.chunks(batch_size.max(1)) {
        let mut prompt = String::from(
            "For each mention below, decide whether it names the same real-world entity as one \
             of its numbered candidates. Answer with that candidate's number, or 0 when none is \
             clearly the same entity. When unsure, answer 0: a wrong merge corrupts the graph, \
             a missed one can be fixed later.\n",
        );
        for (k, &i) in chunk.iter().enumerate() {
            let c = &cases[i];
            let _ = write!(
                prompt,
                "\nMention {}: \"{}\" ({})\nContext: {}\nCandidates:\n",
                k + 1,
                c.name,
                type_of(&c.chain),
                c.context.replace('\n', " ")
            );
            for (j, (name, chain)) in c.options.iter().enumerate() {
                let _ = writeln!(prompt, "  {}. \"{}\" ({})", j + 1, name, type_of(chain));
            }
        }
        let _ = write!(
            prompt,
            "\nReply with JSON: {{\"items\": [{{\"id\": <mention number>, \"choice\": <candidate number or 0>}}]}}, one item per mention."
        );
        let req = ChatRequest {
            stage: "adjudicate".into(),
            item: Some(cases[chunk[0]].name.clone()),
            messages: vec![
                Message::system(
                    "You resolve entity mentions for a knowledge graph. Reply with JSON only.",
                ),
                Message::user(prompt),
            ],
            max_tokens: 32 + 24 * chunk.len() as u32,
            prompt_version: PROMPT_VERSION.into(),
        };
        let schema = items_schema(json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}, "choice": {"type": "integer"}},
            "required": ["id", "choice"],
            "additionalProperties": false
        }));
        requests.push((chunk.to_vec(), req, schema));
    }
    let mut chosen = HashMap::new();
    let mut failures = Vec::new();
    for (members, reply) in send::<Choices>(client, concurrency, requests).await {
        match reply {
            Ok(reply) => {
                for item in reply.items {
                    let Some(&case) = (item.id as usize)
                        .checked_sub(1)
                        .and_then(|k| members.get(k))
                    else {
                        continue;
                    };
                    let options = cases[case].options.len();
                    match item.choice as usize {
                        0 => {}
                        c if c <= options => {
                            chosen.insert(case, c - 1);
                        }
                        c => failures.push(JudgeFailure {
                            stage: "adjudicate",
                            item: cases[case].name.clone(),
                            reason: format!(
                                "the model chose candidate {c} of {options}; the mention stays separate"
                            ),
                        }),
                    }
                }
            }
            Err(e) => {
                for &case in &members {
                    failures.push(JudgeFailure {
                        stage: "adjudicate",
                        item: cases[case].name.clone(),
                        reason: format!(
                            "adjudication call failed, the mention stays separate: {e}"
                        ),
                    });
                }
            }
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
}

#[derive(Deserialize)]
struct Verdicts {
    items: Vec<Verdict>,
}

#[derive(Deserialize)]
struct Verdict {
    id: u64,
    contradicts: Vec<u64>,
}

/// Asks which of its existing facts each new fact contradicts (they can
/// no longer both be true). Returns, per case, the contradicted indices.
pub async fn contradictions(
    client: &LlmClient,
    batch_size: usize,
    concurrency: usize,
    cases: &[ContradictionCase],
) -> (HashMap<usize, Vec<usize>>, Vec<JudgeFailure>) {
    let mut requests = Vec::new();
    let indices: Vec<usize> = (0..cases.len()).collect();
    for chunk in indices.chunks(batch_size.max(1)) {
        let mut prompt = String::from(
            "For each new fact below, list the numbers of the existing facts it contradicts: \
             facts that can no longer both be true (a changed value, role, owner or state). Facts \
             that merely add detail do not contradict. Answer [] when none does.\n",
        );
        for (k, &i) in chunk.iter().enumerate() {
            let c = &cases[i];
            let _ = write!(
                prompt,
                "\nNew fact {}: {}\nExisting facts:\n",
                k + 1,
                c.fact
            );
            for (j, f) in c.existing.iter().enumerate() {
                let _ = writeln!(prompt, "  {}. {}", j + 1, f);
            }
        }
        let _ = write!(
            prompt,
            "\nReply with JSON: {{\"items\": [{{\"id\": <new fact number>, \"contradicts\": [<existing fact numbers>]}}]}}."
        );
        let req = ChatRequest {
            stage: "contradictions".into(),
            item: Some(cases[chunk[0]].fact.chars().take(80).collect()),
            messages: vec![
                Message::system(
                    "You keep a temporal knowledge graph consistent. Reply with JSON only.",
                ),
                Message::user(prompt),
            ],
            max_tokens: 32 + 32 * chunk.len() as u32,
            prompt_version: PROMPT_VERSION.into(),
        };
        let schema = items_schema(json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "contradicts": {"type": "array", "items": {"type": "integer"}}
            },
            "required": ["id", "contradicts"],
            "additionalProperties": false
        }));
        requests.push((chunk.to_vec(), req, schema));
    }
    let mut out: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut failures = Vec::new();
    for (members, reply) in send::<Verdicts>(client, concurrency, requests).await {
        match reply {
            Ok(reply) => {
                for item in reply.items {
                    let Some(&case) = (item.id as usize)
                        .checked_sub(1)
                        .and_then(|k| members.get(k))
                    else {
                        continue;
                    };
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
            }
            Err(e) => {
                for &case in &members {
                    failures.push(JudgeFailure {
                        stage: "contradictions",
                        item: cases[case].fact.chars().take(200).collect(),
                        reason: format!("contradiction call failed, older facts stay valid: {e}"),
                    });
                }
            }
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
struct Summaries {
    items: Vec<SummaryOut>,
}

#[derive(Deserialize)]
struct SummaryOut {
    id: u64,
    summary: String,
}

/// Updated summaries, per case index (failed cases keep their old one).
pub async fn summaries(
    client: &LlmClient,
    batch_size: usize,
    concurrency: usize,
    cases: &[SummaryCase],
) -> (HashMap<usize, String>, Vec<JudgeFailure>) {
    let mut requests = Vec::new();
    let indices: Vec<usize> = (0..cases.len()).collect();
    for chunk in indices.chunks(batch_size.max(1)) {
        let mut prompt = String::from(
            "Write an up-to-date summary (at most two sentences) of each entity below from its \
             current summary and its new facts. State only what the facts say.\n",
        );
        for (k, &i) in chunk.iter().enumerate() {
            let c = &cases[i];
            let _ = write!(
                prompt,
                "\nEntity {}: \"{}\" ({})\nCurrent summary: {}\nNew facts:\n",
                k + 1,
                c.name,
                type_of(&c.chain),
                c.summary.as_deref().unwrap_or("(none)")
            );
            for f in &c.facts {
                let _ = writeln!(prompt, "  - {f}");
            }
        }
        let _ = write!(
            prompt,
            "\nReply with JSON: {{\"items\": [{{\"id\": <entity number>, \"summary\": \"...\"}}]}}."
        );
        let req = ChatRequest {
            stage: "summaries".into(),
            item: Some(cases[chunk[0]].name.clone()),
            messages: vec![
                Message::system(
                    "You summarise entities of a knowledge graph. Reply with JSON only.",
                ),
                Message::user(prompt),
            ],
            max_tokens: 32 + 96 * chunk.len() as u32,
            prompt_version: PROMPT_VERSION.into(),
        };
        let schema = items_schema(json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}, "summary": {"type": "string"}},
            "required": ["id", "summary"],
            "additionalProperties": false
        }));
        requests.push((chunk.to_vec(), req, schema));
    }
    let mut out = HashMap::new();
    let mut failures = Vec::new();
    for (members, reply) in send::<Summaries>(client, concurrency, requests).await {
        match reply {
            Ok(reply) => {
                for item in reply.items {
                    let Some(&case) = (item.id as usize)
                        .checked_sub(1)
                        .and_then(|k| members.get(k))
                    else {
                        continue;
                    };
                    let text = item.summary.trim();
                    if !text.is_empty() {
                        out.insert(case, text.to_string());
                    }
                }
            }
            Err(e) => {
                for &case in &members {
                    failures.push(JudgeFailure {
                        stage: "summaries",
                        item: cases[case].name.clone(),
                        reason: format!("summary call failed, the old summary stays: {e}"),
                    });
                }
            }
        }
    }
    (out, failures)
}
