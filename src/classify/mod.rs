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
//! may be chosen, or those that an end at a parent type allows once it is
//! refined to a subtype; a choice that breaks them leaves the fact at its
//! parent type and is reported. Relations then refine the types of their
//! ends ([`refine_by_relations`]).

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

mod refine;

pub use refine::{Refined, refine_by_relations};

/// Version of the classification prompts; part of the cache key.
pub const PROMPT_VERSION: &str = "classify-v3";

const NONE: &str = "none";

/// A walk reply: each item's number (`"1"`, `"2"`, …) with its answer.
/// Keyed by number rather than a list of `{"id": …, "subtype": …}`
/// objects: the 1.5B model wrote about half the tokens for the same
/// answers (167 against 94 for 11 edge-walk items).
#[derive(Debug, Deserialize)]
#[serde(transparent)]
struct ClassifyReply(serde_json::Map<String, Value>);

/// One item's answer: the subtype alone, or with the subtype's property
/// values when the walk asks for them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Answer {
    Subtype(String),
    WithAttributes {
        subtype: String,
        #[serde(default)]
        attributes: AttributesOut,
    },
}

struct ItemOut {
    subtype: String,
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

/// The reply schema of a walk call over `n` items: an object with one
/// member per item, `"1"` to `"n"` in order, each a subtype of `subtypes`
/// or `none`. With attributes, a subtype that has properties is answered
/// as `{"subtype": …, "attributes": {…}}` offering that subtype's own
/// properties (`subtypes` pairs a name with them), all optional; other
/// answers are the bare name.
fn reply_schema(
    subtypes: &[(String, Vec<PropertySpec>)],
    with_attributes: bool,
    n: usize,
) -> Value {
    let mut bare: Vec<&str> = Vec::new();
    let mut shapes: Vec<Value> = Vec::new();
    for (subtype, properties) in subtypes {
        match crate::extract::attributes_schema(properties).filter(|_| with_attributes) {
            Some(attributes) => shapes.push(json!({
                "type": "object",
                "properties": {
                    "subtype": {"type": "string", "enum": [subtype]},
                    "attributes": attributes
                },
                "required": ["subtype"],
                "additionalProperties": false
            })),
            None => bare.push(subtype),
        }
    }
    bare.push(NONE);
    let name = json!({"type": "string", "enum": bare});
    let answer = if shapes.is_empty() {
        name
    } else {
        shapes.push(name);
        json!({"anyOf": shapes})
    };
    let keys: Vec<String> = (1..=n).map(|k| k.to_string()).collect();
    let properties: serde_json::Map<String, Value> =
        keys.iter().map(|k| (k.clone(), answer.clone())).collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": keys,
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

/// The reply's answer for each of `n` items (numbered from 1); `None` for
/// an item the reply skipped or answered with something that is not an
/// answer (it is asked again). Other keys are ignored.
fn by_position(reply: ClassifyReply, n: usize) -> Vec<Option<ItemOut>> {
    let mut out: Vec<Option<ItemOut>> = (0..n).map(|_| None).collect();
    for (key, value) in reply.0 {
        let Some(slot) = key
            .trim()
            .parse::<usize>()
            .ok()
            .and_then(|k| k.checked_sub(1))
            .and_then(|p| out.get_mut(p))
        else {
            continue;
        };
        *slot = match serde_json::from_value::<Answer>(value) {
            Ok(Answer::Subtype(subtype)) => Some(ItemOut {
                subtype,
                attributes: AttributesOut::None,
            }),
            Ok(Answer::WithAttributes {
                subtype,
                attributes,
            }) => Some(ItemOut {
                subtype,
                attributes,
            }),
            Err(_) => None,
        };
    }
    out
}

/// What differs between the entity and the edge subtype walks: the items,
/// which of them wait under which parent, the request for a batch and
/// what an answer does to its item. [`walk`] is the loop they share.
trait Walk {
    /// A mention or a fact.
    type Item;
    /// The stage of the calls and the rejections.
    const STAGE: Stage;
    /// The item in a failure's reason ("entity", "fact").
    const NOUN: &'static str;

    /// The items waiting for a call, by the parent type they are asked
    /// about, in item order; may stop items that need no call.
    fn waiting(&self, items: &[Self::Item], stopped: &mut [bool]) -> BTreeMap<String, Vec<usize>>;

    /// The request and reply schema for `batch`.
    fn request(&self, batch: &Batch, items: &[Self::Item]) -> (ChatRequest, Value);

    /// The subtypes of `parent`.
    fn children(&self, parent: &str) -> Vec<String>;

    /// The episode of an item and its excerpt in rejections.
    fn noted(item: &Self::Item) -> (String, String);

    /// Moves `item` to the answered subtype (one of `parent`'s children);
    /// false when the item stays where it is.
    fn take(
        &self,
        item: &mut Self::Item,
        answer: ItemOut,
        parent: &str,
        rejected: &mut Vec<Rejected>,
    ) -> bool;
}

/// A rejection of `item` for `reason`.
fn rejection<W: Walk>(item: &W::Item, reason: String) -> Rejected {
    let (episode_id, excerpt) = W::noted(item);
    Rejected {
        stage: W::STAGE,
        episode_id,
        reason,
        excerpt,
    }
}

/// The subtype walk: level by level, every waiting item is asked about in
/// batches until no item waits.
async fn walk<W: Walk>(
    client: &Arc<LlmClient>,
    w: &W,
    spec: &ExtractSpec,
    concurrency: usize,
    items: &mut [W::Item],
) -> (WalkStats, Vec<Rejected>) {
    let mut stats = WalkStats::default();
    let mut rejected = Vec::new();
    let mut stopped = vec![false; items.len()];
    let mut refined = vec![false; items.len()];
    let mut cap = vec![spec.classify_batch_size.max(1); items.len()];
    loop {
        let waiting = w.waiting(items, &mut stopped);
        if waiting.is_empty() {
            break;
        }
        let work = batches(&waiting, &cap);
        let requests: Vec<(Batch, ChatRequest, Value)> = work
            .into_iter()
            .map(|b| {
                let (req, schema) = w.request(&b, items);
                (b, req, schema)
            })
            .collect();
        let replies = send(client, concurrency, requests).await;
        for (batch, reply) in replies {
            stats.calls += 1;
            let children = w.children(&batch.parent);
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
                    let reason = format!(
                        "subtype classification under `{}` failed for this {} alone; it stays at `{}`: {e}",
                        batch.parent,
                        W::NOUN,
                        batch.parent
                    );
                    rejected.push(rejection::<W>(&items[i], reason));
                    continue;
                }
            };
            let (reply, dropped) = reply;
            for (pos, answer) in by_position(reply, batch.members.len())
                .into_iter()
                .enumerate()
            {
                let i = batch.members[pos];
                let Some(item) = answer else {
                    if !ask_again_after_skip(&batch, i, &mut cap) {
                        stopped[i] = true;
                        let reason = skipped_alone(&batch.parent, &dropped);
                        rejected.push(rejection::<W>(&items[i], reason));
                    }
                    continue;
                };
                if item.subtype == NONE || !children.contains(&item.subtype) {
                    stopped[i] = true;
                    continue;
                }
                if w.take(&mut items[i], item, &batch.parent, &mut rejected) {
                    refined[i] = true;
                } else {
                    stopped[i] = true;
                }
            }
        }
    }
    stats.refined = refined.iter().filter(|r| **r).count();
    (stats, rejected)
}

/// The entity subtype walk.
struct EntityWalk<'a> {
    ontology: &'a Ontology,
    spec: &'a ExtractSpec,
}

impl Walk for EntityWalk<'_> {
    type Item = Mention;
    const STAGE: Stage = Stage::ClassifyEntities;
    const NOUN: &'static str = "entity";

    fn waiting(&self, mentions: &[Mention], stopped: &mut [bool]) -> BTreeMap<String, Vec<usize>> {
        let mut waiting: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, m) in mentions.iter().enumerate() {
            let Some(last) = m.chain.last() else { continue };
            let has_children = self
                .ontology
                .entity_tree
                .get(last)
                .is_some_and(|n| !n.children.is_empty());
            if has_children && !stopped[i] {
                waiting.entry(last.clone()).or_default().push(i);
            }
        }
        waiting
    }

    fn request(&self, batch: &Batch, mentions: &[Mention]) -> (ChatRequest, Value) {
        entity_request(self.ontology, self.spec, batch, mentions)
    }

    fn children(&self, parent: &str) -> Vec<String> {
        let node = self.ontology.entity_tree.get(parent);
        node.map(|n| n.children.clone()).unwrap_or_default()
    }

    fn noted(m: &Mention) -> (String, String) {
        (m.episode_id.clone(), m.name.clone())
    }

    fn take(
        &self,
        m: &mut Mention,
        item: ItemOut,
        _parent: &str,
        rejected: &mut Vec<Rejected>,
    ) -> bool {
        let props = self
            .ontology
            .entity_types
            .get(&item.subtype)
            .map(|t| self.spec.properties.of(t))
            .unwrap_or_default();
        // Properties of the new last type replace the parent's.
        // Grounded in what the walk showed: the name and its context
        // (a code named by its value, PO-1, grounds itself).
        let evidence = Evidence::of(&format!("{}\n{}", m.name, m.context));
        let (mut attributes, ungrounded) =
            typed_attributes(&props, &item.attributes.pairs(), &evidence);
        rejected.extend(
            ungrounded
                .into_iter()
                .map(|reason| rejection::<Self>(m, reason)),
        );
        for (k, v) in &m.attributes {
            if props.iter().any(|p| &p.name == k) {
                attributes.entry(k.clone()).or_insert(v.clone());
            }
        }
        m.chain.push(item.subtype);
        m.attributes = attributes;
        true
    }
}

/// Runs the entity subtype walk over `mentions` in place.
pub async fn walk_entities(
    client: &Arc<LlmClient>,
    ontology: &Ontology,
    spec: &ExtractSpec,
    concurrency: usize,
    mentions: &mut [Mention],
) -> (WalkStats, Vec<Rejected>) {
    let w = EntityWalk { ontology, spec };
    walk(client, &w, spec, concurrency, mentions).await
}

/// The edge subtype walk.
struct FactWalk<'a> {
    ontology: &'a Ontology,
    spec: &'a ExtractSpec,
    endpoint_types: &'a dyn Fn(&FactMention) -> (String, String),
}

impl Walk for FactWalk<'_> {
    type Item = FactMention;
    const STAGE: Stage = Stage::ClassifyFacts;
    const NOUN: &'static str = "fact";

    fn waiting(&self, facts: &[FactMention], stopped: &mut [bool]) -> BTreeMap<String, Vec<usize>> {
        let mut waiting: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, f) in facts.iter().enumerate() {
            if stopped[i] {
                continue;
            }
            let Some(node) = self.ontology.edge_tree.get(f.relation_type()) else {
                continue;
            };
            if node.children.is_empty() {
                continue;
            }
            let (st, tt) = (self.endpoint_types)(f);
            // Only subtypes whose own source_targets allow this fact count;
            // with none, the fact stays at its type without a call.
            // An end at a parent type may be refined by the subtype chosen.
            if node
                .children
                .iter()
                .any(|c| self.ontology.edge_may_allow(c, &st, &tt))
            {
                waiting.entry(node.name.clone()).or_default().push(i);
            } else {
                stopped[i] = true;
            }
        }
        waiting
    }

    fn request(&self, batch: &Batch, facts: &[FactMention]) -> (ChatRequest, Value) {
        fact_request(self.ontology, self.spec, batch, facts, self.endpoint_types)
    }

    fn children(&self, parent: &str) -> Vec<String> {
        self.ontology
            .edge_tree
            .get(parent)
            .map(|n| n.children.clone())
            .unwrap_or_default()
    }

    fn noted(f: &FactMention) -> (String, String) {
        (f.episode_id.clone(), f.fact.clone())
    }

    fn take(
        &self,
        f: &mut FactMention,
        item: ItemOut,
        parent: &str,
        rejected: &mut Vec<Rejected>,
    ) -> bool {
        let (st, tt) = (self.endpoint_types)(f);
        if !self.ontology.edge_may_allow(&item.subtype, &st, &tt) {
            let reason = format!(
                "subtype `{}` does not allow {st} → {tt}, nor any subtypes of them (subtypes do not inherit source_targets); the fact stays `{}`",
                item.subtype, parent
            );
            rejected.push(rejection::<Self>(f, reason));
            return false;
        }
        f.chain.push(item.subtype);
        true
    }
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
    let w = FactWalk {
        ontology,
        spec,
        endpoint_types,
    };
    walk(client, &w, spec, concurrency, facts).await
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
    let _ = write!(
        user,
        "\nAnswer with one JSON object that maps every item's number to its answer."
    );
    let per_item = 24 + 24 * most_properties as u32;
    (
        ChatRequest {
            stage: Stage::ClassifyEntities,
            item: Some(format!("{} × {}", batch.parent, batch.members.len())),
            messages: vec![Message::system(system), Message::user(user)],
            max_tokens: (64 + per_item * batch.members.len() as u32)
                .min(spec.entity_max_tokens.max(512) * 2),
            prompt_version: PROMPT_VERSION.into(),
            budget: None,
        },
        reply_schema(&subtypes, most_properties > 0, batch.members.len()),
    )
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
        "Each item below is a fact already classified as {parent} ({parent_description}). Choose for each fact the subtype of {parent} that fits it, or \"{NONE}\" when no subtype fits or the fact does not say enough to tell. The subtypes do not overlap, and a subtype only applies between the entity types it names (an entity of a broader type may be one of them).\n\n\
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
    let _ = write!(
        user,
        "\nAnswer with one JSON object that maps every item's number to its answer."
    );
    (
        ChatRequest {
            stage: Stage::ClassifyFacts,
            item: Some(format!("{} × {}", batch.parent, batch.members.len())),
            messages: vec![Message::system(system), Message::user(user)],
            max_tokens: 64 + 32 * batch.members.len() as u32,
            prompt_version: PROMPT_VERSION.into(),
            budget: None,
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

    /// Two subtypes of Contract: one with a property, one without.
    fn contract_subtypes() -> Vec<(String, Vec<PropertySpec>)> {
        vec![
            ("PurchaseOrder".to_string(), vec![property("po_number")]),
            ("MSA".to_string(), Vec::new()),
        ]
    }

    #[test]
    fn a_walk_reply_answers_every_item_by_number_with_its_subtypes_own_properties() {
        let subtypes = contract_subtypes();
        let schema = reply_schema(&subtypes, true, 3);
        // A grammar-constrained server writes every item, in order, and
        // nothing else.
        let keys: Vec<&String> = schema["properties"]
            .as_object()
            .expect("one member per item")
            .keys()
            .collect();
        assert_eq!(keys, ["1", "2", "3"]);
        assert_eq!(schema["required"], json!(["1", "2", "3"]));
        assert_eq!(schema["additionalProperties"], json!(false));
        let shapes = schema["properties"]["2"]["anyOf"]
            .as_array()
            .expect("an object for a subtype with properties, a name otherwise");
        assert_eq!(shapes.len(), 2);
        assert_eq!(
            shapes[0]["properties"]["subtype"]["enum"],
            json!(["PurchaseOrder"])
        );
        assert!(shapes[0]["properties"]["attributes"]["properties"]["po_number"].is_object());
        assert_eq!(shapes[1]["enum"], json!(["MSA", NONE]));
        // Without attributes (the edge walk), every answer is a bare name.
        let bare = reply_schema(&subtypes, false, 2);
        assert_eq!(
            bare["properties"]["1"],
            json!({"type": "string", "enum": ["PurchaseOrder", "MSA", NONE]})
        );
    }

    #[test]
    fn a_keyed_reply_gives_each_item_its_answer_and_leaves_the_rest_unanswered() {
        let reply: ClassifyReply = serde_json::from_value(json!({
            "1": "MSA",
            "3": {"subtype": "PurchaseOrder", "attributes": {"po_number": "PO-1"}},
            "4": 7,
            "9": "MSA",
            "x": "MSA"
        }))
        .expect("an object");
        let answers = by_position(reply, 4);
        let got: Vec<Option<&str>> = answers
            .iter()
            .map(|a| a.as_ref().map(|a| a.subtype.as_str()))
            .collect();
        // 2 is missing and 4 is no answer: both are asked again.
        assert_eq!(got, [Some("MSA"), None, Some("PurchaseOrder"), None]);
        let attributes = answers[2].as_ref().map(|a| match &a.attributes {
            AttributesOut::Object(m) => m.get("po_number").cloned(),
            _ => None,
        });
        assert_eq!(attributes, Some(Some(json!("PO-1"))));
    }

    #[test]
    fn a_keyed_reply_member_past_a_bound_is_dropped_and_the_others_are_kept() {
        let subtypes = contract_subtypes();
        let schema = reply_schema(&subtypes, true, 3);
        let long = "x".repeat(crate::extract::VALUE_MAX_CHARS + 1);
        let content = format!(
            r#"{{"1": "MSA", "2": {{"subtype": "PurchaseOrder", "attributes": {{"po_number": "{long}"}}}}, "3": {{"subtype": "PurchaseOrder", "attributes": {{"po_number": "PO-7"}}}}}}"#
        );
        let (reply, notes) =
            crate::llm::reply::parse_within::<ClassifyReply>(&content, &schema).expect("parses");
        let got: Vec<Option<String>> = by_position(reply, 3)
            .into_iter()
            .map(|a| a.map(|a| a.subtype))
            .collect();
        assert_eq!(
            got,
            [Some("MSA".into()), None, Some("PurchaseOrder".into())],
            "{notes:?}"
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("reply.2 dropped"), "{notes:?}");
    }
}
