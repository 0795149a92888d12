//! Classification: the subtype walk. An entity (or fact) typed with a type
//! that has subtypes is classified one level at a time until no subtype
//! fits or a leaf is reached. Unlike one call per entity per level, every
//! item waiting at the same parent type, across episodes, shares one call
//! (up to `extract.classify_batch_size` items). A type without subtypes
//! costs no call, and an ontology without hierarchies adds none.
//!
//! Entity calls also return the chosen subtype's properties, since a node
//! keeps the properties of its last type only (no inheritance). For facts,
//! only subtypes whose own `source_targets` allow the fact's endpoint types
//! may be chosen; a choice that breaks them leaves the fact at its parent
//! type and is reported.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::extract::{
    AttributesOut, Evidence, ExtractSpec, FactMention, Mention, Rejected, describe_edge_type,
    describe_type, typed_attributes,
};
use crate::llm::{ChatRequest, LlmClient, LlmError, Message};
use crate::ontology::{Ontology, PropertySpec};
use crate::stage::Stage;

/// Version of the classification prompts; part of the cache key.
pub const PROMPT_VERSION: &str = "classify-v2";

const NONE: &str = "none";

#[derive(Debug, Deserialize)]
struct ClassifyReply {
    items: Vec<ItemOut>,
}

#[derive(Debug, Deserialize)]
struct ItemOut {
    id: u64,
    subtype: String,
    #[serde(default)]
    attributes: AttributesOut,
}

/// Counts of a walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Calls made (cache hits included).
    pub calls: usize,
    /// Items that moved down at least one level.
    pub refined: usize,
}

struct Batch {
    parent: String,
    members: Vec<usize>,
}

/// The level's batches: items under one parent, in order, at most
/// `cap[i]` to a batch (items with a smaller cap are batched apart).
fn batches(waiting: &BTreeMap<String, Vec<usize>>, cap: &[usize]) -> Vec<Batch> {
    let mut out = Vec::new();
    for (parent, members) in waiting {
        let mut by_cap: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &i in members {
            by_cap.entry(cap[i].max(1)).or_default().push(i);
        }
        for (size, members) in by_cap.iter().rev() {
            for chunk in members.chunks(*size) {
                out.push(Batch {
                    parent: parent.clone(),
                    members: chunk.to_vec(),
                });
            }
        }
    }
    out
}

/// After a batch's call failed: true if its items are asked again in
/// halves (their cap lowered), false if it held one item, which then
/// stays at its parent. One item whose answer runs away (cut at
/// `max_tokens`, unparseable) so costs its neighbours one more call,
/// not their answers.
fn split_after_failure(batch: &Batch, cap: &mut [usize]) -> bool {
    let n = batch.members.len();
    if n <= 1 {
        return false;
    }
    for &i in &batch.members {
        cap[i] = n.div_ceil(2);
    }
    true
}

/// The reply schema of a walk call about `n` items, bounded: one answer
/// per item, ids in range, attribute values of at most
/// [`VALUE_MAX_CHARS`](crate::extract::VALUE_MAX_CHARS) characters.
/// An item the reply gave no answer for: true if it is asked again in a
/// batch of at most half the size (its cap lowered), false if it was asked
/// alone, and then stays at its parent.
fn ask_again_after_skip(batch: &Batch, item: usize, cap: &mut [usize]) -> bool {
    let n = batch.members.len();
    if n <= 1 {
        return false;
    }
    cap[item] = cap[item].min(n.div_ceil(2));
    true
}

/// The reason of an item that got no answer when asked alone.
fn skipped_alone(parent: &str, dropped: &[String]) -> String {
    let why = if dropped.is_empty() {
        "the reply gave no answer for it".to_string()
    } else {
        format!(
            "the reply gave no usable answer ({})",
            crate::llm::reply::describe_dropped(dropped)
        )
    };
    format!("subtype classification under `{parent}`, asked alone: {why}; it stays at `{parent}`")
}

/// The reply schema of a walk call over `n` items: exactly one answer per
/// item (ids in range), each a subtype of `subtypes` or `none`. With
/// attributes, each subtype's answer offers that subtype's own
/// properties (`subtypes` pairs a name with them), all optional.
fn reply_schema(
    subtypes: &[(String, Vec<PropertySpec>)],
    with_attributes: bool,
    n: usize,
) -> Value {
    let id = json!({"type": "integer", "minimum": 1, "maximum": n});
    let shape = |subtype: &str, properties: &[PropertySpec]| {
        let mut item = json!({
            "type": "object",
            "properties": {"id": id, "subtype": {"type": "string", "enum": [subtype]}},
            "required": ["id", "subtype"],
            "additionalProperties": false
        });
        if with_attributes && let Some(attributes) = crate::extract::attributes_schema(properties) {
            item["properties"]["attributes"] = attributes;
        }
        item
    };
    let mut shapes: Vec<Value> = subtypes.iter().map(|(t, props)| shape(t, props)).collect();
    shapes.push(shape(NONE, &[]));
    json!({
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"anyOf": shapes}, "minItems": n, "maxItems": n}
        },
        "required": ["items"],
        "additionalProperties": false
    })
}

/// Sends a level's batches, `concurrency` at a time, each call a task of
/// its own (so that cache hits are parsed on every core).
async fn send(
    client: &Arc<LlmClient>,
    concurrency: usize,
    requests: Vec<(Batch, ChatRequest, Value)>,
) -> Vec<(Batch, Result<(ClassifyReply, Vec<String>), LlmError>)> {
    futures::stream::iter(requests)
        .map(|(b, req, schema)| {
            let client = client.clone();
            let reply = crate::llm::in_task(async move {
                client
                    .chat_json_with_schema::<ClassifyReply>(req, schema)
                    .await
                    .map(|r| (r.value, r.dropped))
            });
            async move { (b, reply.await) }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// The reply's answer for each of `n` items (ids are 1-based), the first
/// one when an id repeats; `None` for an item the reply skipped or for an
/// id out of range.
fn by_position(items: Vec<ItemOut>, n: usize) -> Vec<Option<ItemOut>> {
    let mut out: Vec<Option<ItemOut>> = (0..n).map(|_| None).collect();
    for item in items {
        if let Some(slot) = (item.id as usize)
            .checked_sub(1)
            .and_then(|p| out.get_mut(p))
            && slot.is_none()
        {
            *slot = Some(item);
        }
    }
    out
}

/// Runs the entity subtype walk over `mentions` in place.
pub async fn walk_entities(
    client: &Arc<LlmClient>,
    ontology: &Ontology,
    spec: &ExtractSpec,
    concurrency: usize,
    mentions: &mut [Mention],
) -> (WalkStats, Vec<Rejected>) {
    let mut stats = WalkStats::default();
    let mut rejected = Vec::new();
    let mut stopped = vec![false; mentions.len()];
    let mut refined = vec![false; mentions.len()];
    let mut cap = vec![spec.classify_batch_size.max(1); mentions.len()];
    loop {
        let mut waiting: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, m) in mentions.iter().enumerate() {
            let Some(last) = m.chain.last() else { continue };
            let has_children = ontology
                .entity_tree
                .get(last)
                .is_some_and(|n| !n.children.is_empty());
            if has_children && !stopped[i] {
                waiting.entry(last.clone()).or_default().push(i);
            }
        }
        if waiting.is_empty() {
            break;
        }
        let work = batches(&waiting, &cap);
        let requests: Vec<(Batch, ChatRequest, Value)> = work
            .into_iter()
            .map(|b| {
                let (req, schema) = entity_request(ontology, spec, &b, mentions);
                (b, req, schema)
            })
            .collect();
        let replies = send(client, concurrency, requests).await;
        for (batch, reply) in replies {
            stats.calls += 1;
            let node = ontology.entity_tree.get(&batch.parent);
            let children: Vec<String> = node.map(|n| n.children.clone()).unwrap_or_default();
            let reply = match reply {
                Ok(r) => r,
                // Batch mode: the answer comes in a later round, which
                // asks these items again; nothing to conclude now.
                Err(e) if e.is_deferred() => {
                    for &i in &batch.members {
                        stopped[i] = true;
                    }
                    continue;
                }
                Err(_) if split_after_failure(&batch, &mut cap) => continue,
                Err(e) => {
                    let i = batch.members[0];
                    stopped[i] = true;
                    rejected.push(Rejected {
                        stage: Stage::ClassifyEntities,
                        episode_id: mentions[i].episode_id.clone(),
                        reason: format!(
                            "subtype classification under `{}` failed for this entity alone; it stays at `{}`: {e}",
                            batch.parent, batch.parent
                        ),
                        excerpt: mentions[i].name.clone(),
                    });
                    continue;
                }
            };
            let (reply, dropped) = reply;
            for (pos, answer) in by_position(reply.items, batch.members.len())
                .into_iter()
                .enumerate()
            {
                let i = batch.members[pos];
                let Some(item) = answer else {
                    if !ask_again_after_skip(&batch, i, &mut cap) {
                        stopped[i] = true;
                        rejected.push(Rejected {
                            stage: Stage::ClassifyEntities,
                            episode_id: mentions[i].episode_id.clone(),
                            reason: skipped_alone(&batch.parent, &dropped),
                            excerpt: mentions[i].name.clone(),
                        });
                    }
                    continue;
                };
                if item.subtype == NONE || !children.contains(&item.subtype) {
                    stopped[i] = true;
                    continue;
                }
                let props = ontology
                    .entity_types
                    .get(&item.subtype)
                    .map(|t| spec.properties.of(t))
                    .unwrap_or_default();
                // Properties of the new last type replace the parent's.
                // Grounded in what the walk showed: the name and its context
                // (a code named by its value, PO-1, grounds itself).
                let evidence =
                    Evidence::of(&format!("{}\n{}", mentions[i].name, mentions[i].context));
                let (mut attributes, ungrounded) =
                    typed_attributes(&props, &item.attributes.pairs(), &evidence);
                rejected.extend(ungrounded.into_iter().map(|reason| Rejected {
                    stage: Stage::ClassifyEntities,
                    episode_id: mentions[i].episode_id.clone(),
                    reason,
                    excerpt: mentions[i].name.clone(),
                }));
                for (k, v) in &mentions[i].attributes {
                    if props.iter().any(|p| &p.name == k) {
                        attributes.entry(k.clone()).or_insert(v.clone());
                    }
                }
                mentions[i].chain.push(item.subtype);
                mentions[i].attributes = attributes;
                refined[i] = true;
            }
        }
    }
    stats.refined = refined.iter().filter(|r| **r).count();
    (stats, rejected)
}

fn entity_request(
    ontology: &Ontology,
    spec: &ExtractSpec,
    batch: &Batch,
    mentions: &[Mention],
) -> (ChatRequest, Value) {
    let node = ontology.entity_tree.get(&batch.parent);
    let children: Vec<String> = node.map(|n| n.children.clone()).unwrap_or_default();
    let mut types = String::new();
    let mut subtypes: Vec<(String, Vec<PropertySpec>)> = Vec::new();
    for c in &children {
        if let Some(t) = ontology.entity_types.get(c) {
            let asked = spec.properties.of(t);
            types.push_str(&describe_type(c, &t.description, &asked));
            types.push('\n');
            subtypes.push((c.clone(), asked));
        }
    }
    let most_properties = subtypes.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
    let parent_description = ontology
        .entity_types
        .get(&batch.parent)
        .map(|t| t.description.trim().to_string())
        .unwrap_or_default();
    let values = if most_properties > 0 {
        "For the chosen subtype, also give the values of its properties that the item's text states; leave out the rest. "
    } else {
        ""
    };
    let system = format!(
        "Each item below is an entity already classified as {parent} ({parent_description}). Choose for each item the subtype of {parent} that fits it, or \"{NONE}\" when no subtype fits or its text does not say enough to tell. The subtypes do not overlap.\n\
         {values}Write the JSON compactly on one line.\n\n\
         SUBTYPES OF {parent}:\n{types}",
        parent = batch.parent
    );
    let mut user = String::new();
    for (k, &i) in batch.members.iter().enumerate() {
        let m = &mentions[i];
        let _ = writeln!(
            user,
            "[{}] name: {}\n    text: {}",
            k + 1,
            m.name,
            m.context
        );
    }
    let _ = write!(user, "\nAnswer for every item by its number.");
    let per_item = 24 + 24 * most_properties as u32;
    (
        ChatRequest {
            stage: Stage::ClassifyEntities,
            item: Some(format!("{} × {}", batch.parent, batch.members.len())),
            messages: vec![Message::system(system), Message::user(user)],
            max_tokens: (64 + per_item * batch.members.len() as u32)
                .min(spec.entity_max_tokens.max(512) * 2),
            prompt_version: PROMPT_VERSION.into(),
        },
        reply_schema(&subtypes, most_properties > 0, batch.members.len()),
    )
}

/// Runs the edge subtype walk over `facts` in place; `mentions` gives each
/// fact's endpoints (by episode).
pub async fn walk_facts(
    client: &Arc<LlmClient>,
    ontology: &Ontology,
    spec: &ExtractSpec,
    concurrency: usize,
    facts: &mut [FactMention],
    endpoint_types: &dyn Fn(&FactMention) -> (String, String),
) -> (WalkStats, Vec<Rejected>) {
    let mut stats = WalkStats::default();
    let mut rejected = Vec::new();
    let mut stopped = vec![false; facts.len()];
    let mut refined = vec![false; facts.len()];
    let mut cap = vec![spec.classify_batch_size.max(1); facts.len()];
    loop {
        let mut waiting: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, f) in facts.iter().enumerate() {
            if stopped[i] {
                continue;
            }
            let Some(node) = ontology.edge_tree.get(f.relation_type()) else {
                continue;
            };
            if node.children.is_empty() {
                continue;
            }
            let (st, tt) = endpoint_types(f);
            // Only subtypes whose own source_targets allow this fact count;
            // with none, the fact stays at its type without a call.
            if node
                .children
                .iter()
                .any(|c| ontology.edge_allows(c, &st, &tt))
            {
                waiting.entry(node.name.clone()).or_default().push(i);
            } else {
                stopped[i] = true;
            }
        }
        if waiting.is_empty() {
            break;
        }
        let work = batches(&waiting, &cap);
        let requests: Vec<(Batch, ChatRequest, Value)> = work
            .into_iter()
            .map(|b| {
                let (req, schema) = fact_request(ontology, spec, &b, facts, endpoint_types);
                (b, req, schema)
            })
            .collect();
        let replies = send(client, concurrency, requests).await;
        for (batch, reply) in replies {
            stats.calls += 1;
            let reply = match reply {
                Ok(r) => r,
                // Batch mode: the answer comes in a later round, which
                // asks these items again; nothing to conclude now.
                Err(e) if e.is_deferred() => {
                    for &i in &batch.members {
                        stopped[i] = true;
                    }
                    continue;
                }
                Err(_) if split_after_failure(&batch, &mut cap) => continue,
                Err(e) => {
                    let i = batch.members[0];
                    stopped[i] = true;
                    rejected.push(Rejected {
                        stage: Stage::ClassifyFacts,
                        episode_id: facts[i].episode_id.clone(),
                        reason: format!(
                            "subtype classification under `{}` failed for this fact alone; it stays at `{}`: {e}",
                            batch.parent, batch.parent
                        ),
                        excerpt: facts[i].fact.clone(),
                    });
                    continue;
                }
            };
            let children = ontology
                .edge_tree
                .get(&batch.parent)
                .map(|n| n.children.clone())
                .unwrap_or_default();
            let (reply, dropped) = reply;
            for (pos, answer) in by_position(reply.items, batch.members.len())
                .into_iter()
                .enumerate()
            {
                let i = batch.members[pos];
                let Some(item) = answer else {
                    if !ask_again_after_skip(&batch, i, &mut cap) {
                        stopped[i] = true;
                        rejected.push(Rejected {
                            stage: Stage::ClassifyFacts,
                            episode_id: facts[i].episode_id.clone(),
                            reason: skipped_alone(&batch.parent, &dropped),
                            excerpt: facts[i].fact.clone(),
                        });
                    }
                    continue;
                };
                if item.subtype == NONE || !children.contains(&item.subtype) {
                    stopped[i] = true;
                    continue;
                }
                let (st, tt) = endpoint_types(&facts[i]);
                if !ontology.edge_allows(&item.subtype, &st, &tt) {
                    stopped[i] = true;
                    rejected.push(Rejected {
                        stage: Stage::ClassifyFacts,
                        episode_id: facts[i].episode_id.clone(),
                        reason: format!(
                            "subtype `{}` does not allow {st} → {tt} (subtypes do not inherit source_targets); the fact stays `{}`",
                            item.subtype, batch.parent
                        ),
                        excerpt: facts[i].fact.clone(),
                    });
                    continue;
                }
                facts[i].chain.push(item.subtype);
                refined[i] = true;
            }
        }
    }
    stats.refined = refined.iter().filter(|r| **r).count();
    (stats, rejected)
}

fn fact_request(
    ontology: &Ontology,
    _spec: &ExtractSpec,
    batch: &Batch,
    facts: &[FactMention],
    endpoint_types: &dyn Fn(&FactMention) -> (String, String),
) -> (ChatRequest, Value) {
    let children: Vec<String> = ontology
        .edge_tree
        .get(&batch.parent)
        .map(|n| n.children.clone())
        .unwrap_or_default();
    let mut types = String::new();
    for c in &children {
        if let Some(t) = ontology.edge_types.get(c) {
            let _ = writeln!(types, "{}", describe_edge_type(c, t));
        }
    }
    let parent_description = ontology
        .edge_types
        .get(&batch.parent)
        .map(|t| t.description.trim().to_string())
        .unwrap_or_default();
    let system = format!(
        "Each item below is a fact already classified as {parent} ({parent_description}). Choose for each fact the subtype of {parent} that fits it, or \"{NONE}\" when no subtype fits or the fact does not say enough to tell. The subtypes do not overlap, and a subtype only applies between the entity types it names.\n\n\
         SUBTYPES OF {parent}:\n{types}",
        parent = batch.parent
    );
    let subtypes: Vec<(String, Vec<PropertySpec>)> =
        children.iter().map(|c| (c.clone(), Vec::new())).collect();
    let mut user = String::new();
    for (k, &i) in batch.members.iter().enumerate() {
        let f = &facts[i];
        let (st, tt) = endpoint_types(f);
        let _ = writeln!(user, "[{}] ({st} → {tt}) {}", k + 1, f.fact);
    }
    let _ = write!(user, "\nAnswer for every item by its number.");
    (
        ChatRequest {
            stage: Stage::ClassifyFacts,
            item: Some(format!("{} × {}", batch.parent, batch.members.len())),
            messages: vec![Message::system(system), Message::user(user)],
            max_tokens: 64 + 32 * batch.members.len() as u32,
            prompt_version: PROMPT_VERSION.into(),
        },
        reply_schema(&subtypes, false, batch.members.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn property(name: &str) -> PropertySpec {
        PropertySpec {
            name: name.into(),
            kind: crate::ontology::PropertyType::Text,
            description: String::new(),
            may_change: false,
            pattern: None,
        }
    }

    #[test]
    fn a_walk_reply_answers_every_item_with_its_subtypes_own_properties() {
        let subtypes = vec![
            ("PurchaseOrder".to_string(), vec![property("po_number")]),
            ("MSA".to_string(), Vec::new()),
        ];
        let schema = reply_schema(&subtypes, true, 3);
        let items = &schema["properties"]["items"];
        // A grammar-constrained server cannot leave an item out.
        assert_eq!(
            (&items["minItems"], &items["maxItems"]),
            (&json!(3), &json!(3))
        );
        let shapes = items["items"]["anyOf"]
            .as_array()
            .expect("one shape per subtype");
        let names: Vec<&Value> = shapes
            .iter()
            .map(|s| &s["properties"]["subtype"]["enum"][0])
            .collect();
        assert_eq!(
            names,
            [&json!("PurchaseOrder"), &json!("MSA"), &json!(NONE)]
        );
        assert!(shapes[0]["properties"]["attributes"]["properties"]["po_number"].is_object());
        assert!(shapes[1]["properties"].get("attributes").is_none());
        assert_eq!(shapes[0]["required"], json!(["id", "subtype"]));
        // Without attributes (the edge walk), no shape offers any.
        let bare = reply_schema(&subtypes, false, 2);
        assert!(
            bare["properties"]["items"]["items"]["anyOf"]
                .as_array()
                .expect("shapes")
                .iter()
                .all(|s| s["properties"].get("attributes").is_none())
        );
    }
}
