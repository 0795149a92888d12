//! The prompts and reply schemas of the extraction calls: the system
//! prompt of the ontology, the tasks, and the per-episode requests.

use std::collections::HashSet;
use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use super::reply::{entity_reply_bound, fact_reply_bound};
use super::types::{TypeWords, person_types, role_words};
use super::when::{WHEN_MAX_CHARS, WHEN_PATTERN};
use super::{
    AskedProperties, ExtractSpec, FACT_MAX_CHARS, FACTS_PER_ENTITY, FREE_RELATION_PATTERN,
    FactStart, Mention, NAME_MAX_CHARS, PROMPT_VERSION, RELATION_MAX_CHARS, TIME_PATTERN,
    VALUE_MAX_CHARS,
};
use crate::llm::{ChatRequest, Message};
use crate::ontology::{ENTITY_LABEL, EdgeTypeSpec, Ontology, PropertySpec};
use crate::source::Episode;
use crate::stage::Stage;

/// Describes types for a prompt: name, description and properties.
pub fn describe_type(name: &str, description: &str, properties: &[PropertySpec]) -> String {
    let mut out = format!("- {name}: {}", description.trim());
    if !properties.is_empty() {
        let props: Vec<String> = properties
            .iter()
            .map(|p| {
                if p.description.is_empty() {
                    format!("{} ({})", p.name, p.kind)
                } else {
                    format!("{} ({}): {}", p.name, p.kind, p.description.trim())
                }
            })
            .collect();
        let _ = write!(out, "\n  properties: {}", props.join("; "));
    }
    out
}

/// One line describing an edge type for a prompt: its name, the
/// source → target pairs it allows (if restricted) and its description.
pub fn describe_edge_type(name: &str, t: &EdgeTypeSpec) -> String {
    let pairs: Vec<String> = t
        .source_targets
        .iter()
        .map(|p| format!("{} → {}", p.source, p.target))
        .collect();
    let allowed = if pairs.is_empty() {
        String::new()
    } else {
        format!(" ({})", pairs.join(", "))
    };
    format!("- {name}{allowed}: {}", t.description.trim())
}

pub(super) fn episode_block(
    episode: &Episode,
    context: &[&Episode],
    context_chars: usize,
) -> String {
    let mut out = String::new();
    if !context.is_empty() {
        out.push_str("<PREVIOUS EPISODES>\n");
        for c in context {
            let text: String = c.content.chars().take(context_chars).collect();
            let _ = writeln!(
                out,
                "[{}] {}",
                c.reference_time.format("%Y-%m-%dT%H:%M:%SZ"),
                text.trim()
            );
        }
        out.push_str("</PREVIOUS EPISODES>\n\n");
    }
    let _ = writeln!(
        out,
        "<CURRENT EPISODE kind=\"{}\"{}>\n{}\n</CURRENT EPISODE>",
        episode.kind.as_str(),
        episode
            .source_description
            .as_deref()
            .map(|d| format!(" source=\"{d}\""))
            .unwrap_or_default(),
        episode.content.trim()
    );
    let _ = write!(
        out,
        "\nREFERENCE TIME (when the current episode was written): {}",
        episode.reference_time.format("%Y-%m-%dT%H:%M:%SZ")
    );
    out
}

pub(super) fn custom(spec: &ExtractSpec) -> String {
    if spec.custom_instructions.trim().is_empty() {
        String::new()
    } else {
        format!(
            "\n\nAdditional instructions:\n{}",
            spec.custom_instructions.trim()
        )
    }
}

/// The parts of the extraction prompts that depend only on the ontology
/// and the spec, built once per run instead of per call.
///
/// Both calls of an episode send the same system prompt (the ontology)
/// and the episode next, and only then their task: a server that caches
/// prompt prefixes (llama.cpp's `cache_prompt`) reads the ontology once
/// per slot and the episode once for both calls.
#[derive(Debug, Clone)]
pub struct Prompts {
    system: String,
    entity_task: String,
    entity_schema: Value,
    fact_task: String,
    fact_task_by_source: String,
    pub(super) type_words: TypeWords,
    /// The words the ontology's type descriptions write in lower case
    /// ("customer", "supplier", "employee"): roles and kinds, not names.
    pub(super) role_words: HashSet<String>,
    /// The entity types of people, subtypes included ([`person_types`]).
    pub(super) person_types: HashSet<String>,
    /// Which language cues apply, and their counts
    /// (`extract.language`, `[extract.cues]`).
    pub cues: crate::cues::Switches,
}

impl Prompts {
    /// The prompts of `ontology` under `spec`.
    pub fn new(ontology: &Ontology, spec: &ExtractSpec) -> Self {
        let cues = crate::cues::Switches::new(spec.language.trim(), &spec.cues);
        Prompts {
            system: system_prompt(ontology, spec),
            entity_task: entity_task(spec),
            entity_schema: entity_schema(ontology, spec),
            fact_task: fact_task(ontology, spec, false),
            fact_task_by_source: fact_task(ontology, spec, true),
            type_words: TypeWords::new(ontology),
            role_words: role_words(ontology),
            person_types: if cues.on("people_types") {
                person_types(ontology)
            } else {
                HashSet::new()
            },
            cues,
        }
    }

    /// The system message that opens both calls of every episode.
    pub fn system_message(&self) -> Message {
        Message::system(self.system.clone())
    }

    /// The request of an entity call; its schema is [`Prompts::entity_schema`].
    pub fn entity_request(
        &self,
        spec: &ExtractSpec,
        episode: &Episode,
        context: &[&Episode],
    ) -> ChatRequest {
        let user = format!(
            "{}\n\n{}",
            episode_block(episode, context, spec.context_chars),
            self.entity_task
        );
        ChatRequest {
            stage: Stage::ExtractEntities,
            item: Some(episode.episode_id.clone()),
            messages: vec![Message::system(self.system.clone()), Message::user(user)],
            max_tokens: entity_reply_bound(spec, episode),
            prompt_version: PROMPT_VERSION.into(),
            budget: Some(std::time::Duration::from_secs(spec.call_budget_secs)),
        }
    }

    /// The reply schema of every entity call.
    pub fn entity_schema(&self) -> &Value {
        &self.entity_schema
    }
}

/// The system prompt both extraction calls share: what the job is, the
/// entity types (top level; subtypes are chosen by the walk) and the fact
/// types the fact call may name.
pub(super) fn system_prompt(ontology: &Ontology, spec: &ExtractSpec) -> String {
    let mut types = String::new();
    for t in ontology.entity_tree.top_level() {
        if let Some(ts) = ontology.entity_types.get(&t.name) {
            let asked = spec.properties.of(ts);
            types.push_str(&describe_type(&t.name, &ts.description, &asked));
            types.push('\n');
        }
    }
    let mut facts = String::new();
    for name in fact_types(ontology, spec) {
        if let Some(et) = ontology.edge_types.get(&name) {
            let depth = ontology.edge_tree.get(&name).map_or(1, |n| n.depth);
            let indent = "  ".repeat(depth - 1);
            let _ = writeln!(facts, "{indent}{}", describe_edge_type(&name, et));
        }
    }
    format!(
        "You turn episodes from an organisation's records (emails, chat messages, document chunks, data records) into a knowledge graph: the named entities an episode mentions and the facts it states about them. Answer in JSON.\n\n\
         ENTITY TYPES:\n{types}\n\
         FACT TYPES (allowed source → target types in brackets):\n{facts}{}",
        custom(spec)
    )
}

/// The task of entity calls, written after the episode.
pub(super) fn entity_task(spec: &ExtractSpec) -> String {
    let attributes = match spec.properties {
        AskedProperties::None => "",
        AskedProperties::All | AskedProperties::Identity => {
            "\n- attributes: only property values the episode writes out, copied from it; leave out every property it does not write."
        }
    };
    format!(
        "TASK: list the named entities the CURRENT EPISODE mentions.\n\
         - Each distinct entity once, under the most complete name the current episode gives it, written exactly as in the text (keep codes and numbers such as order numbers).\n\
         - Only entities named or uniquely identified in the current episode; previous episodes only help to resolve pronouns and short references.\n\
         - Dates, amounts, quantities, statuses and generic nouns are not entities. Never use a type name as an entity name.\n\
         - Contracts, orders, tickets and other documents are entities too when the episode gives their code or number; name them as written, code included.\n\
         - type: the entity type whose description fits; {ENTITY_LABEL} when none fits.{attributes}"
    )
}

/// The schema of a property value a model writes: bounded text, of the
/// property's shape when it has a pattern.
pub fn value_schema(property: &PropertySpec) -> Value {
    let mut schema = json!({"type": "string", "maxLength": VALUE_MAX_CHARS});
    if let Some(pattern) = &property.pattern {
        schema["pattern"] = json!(pattern);
    }
    schema
}

/// The schema of the `attributes` a reply gives for a type with
/// `properties`: an object of their values, each optional; `None` for a
/// type without properties.
pub fn attributes_schema(properties: &[PropertySpec]) -> Option<Value> {
    let values: Map<String, Value> = properties
        .iter()
        .map(|p| (p.name.clone(), value_schema(p)))
        .collect();
    (!values.is_empty()).then(|| {
        json!({
            "type": "object",
            "properties": values,
            "additionalProperties": false
        })
    })
}

/// The reply schema of entity calls: one shape per top-level type, whose
/// `attributes` object offers only that type's properties, all optional
/// (a model asked for a property tends to invent a value for it).
pub(super) fn entity_schema(ontology: &Ontology, spec: &ExtractSpec) -> Value {
    let name = json!({"type": "string", "maxLength": NAME_MAX_CHARS});
    let mut shapes: Vec<Value> = Vec::new();
    for t in ontology.entity_tree.top_level() {
        let Some(ts) = ontology.entity_types.get(&t.name) else {
            continue;
        };
        let mut properties = json!({"name": name, "type": {"type": "string", "enum": [t.name]}});
        if let Some(attributes) = attributes_schema(&spec.properties.of(ts)) {
            properties["attributes"] = attributes;
        }
        shapes.push(json!({
            "type": "object",
            "properties": properties,
            "required": ["name", "type"],
            "additionalProperties": false
        }));
    }
    shapes.push(json!({
        "type": "object",
        "properties": {"name": name, "type": {"type": "string", "enum": [ENTITY_LABEL]}},
        "required": ["name", "type"],
        "additionalProperties": false
    }));
    json!({
        "type": "object",
        "properties": {
            "entities": {
                "type": "array",
                "maxItems": spec.max_entities_per_episode,
                "items": {"anyOf": shapes}
            }
        },
        "required": ["entities"],
        "additionalProperties": false
    })
}

/// The edge types a fact call may name: every declared type when the
/// spec folds the edge subtype choice into the call, else the top-level
/// ones (subtypes are then chosen by the edge walk).
pub(super) fn fact_types(ontology: &Ontology, spec: &ExtractSpec) -> Vec<String> {
    if spec.fold_edge_subtypes {
        ontology.edge_tree.iter().map(|t| t.name.clone()).collect()
    } else {
        ontology
            .edge_tree
            .top_level()
            .map(|t| t.name.clone())
            .collect()
    }
}

/// The task of fact calls, written after the episode and its entities.
pub(super) fn fact_task(ontology: &Ontology, spec: &ExtractSpec, by_source: bool) -> String {
    let layout = if by_source {
        "- facts: under each entity's name, the facts whose source it is (the entity that does, holds or owns what the fact says); [] when there are none. Go through every entity.\n- target: a name copied exactly from ENTITIES, another entity."
    } else {
        "- source and target: names copied exactly from ENTITIES; two different entities."
    };
    let subtypes = if spec.fold_edge_subtypes && ontology.edge_tree.iter().any(|t| t.depth > 1) {
        "\n- An indented fact type is a more specific kind of the type above it: use it when the episode says which kind; otherwise the type above."
    } else {
        ""
    };
    let valid_at = match spec.fact_start {
        FactStart::Model => {
            "- valid_at: the date the relationship started, when the episode gives one; else null.\n"
        }
        FactStart::Text => "",
    };
    format!(
        "TASK: state every fact the CURRENT EPISODE gives about a relationship between two of the ENTITIES.\n\
         {layout}\n\
         - relation_type: the FACT TYPE whose source → target types fit the two entities' types. When none fits, a short lowercase verb phrase.{subtypes}\n\
         - fact: one short sentence that paraphrases what the episode says, with entity names instead of pronouns.\n\
         {valid_at}\
         - ends: when the relationship ends, if the episode says it has ended or will end (left, leaves, no longer, until, stepping down, in any language), written in English whatever the episode's language, as one of: a date YYYY-MM-DD; 31 december 2025; today; yesterday; tomorrow; last/this/next friday (any weekday); last/this/next week, month or year; end of this/next month; june or end of june (any month, a year may follow); 3 days ago; 2 weeks later. \"no\" when it does not end. \"X left A and joined B\" states two facts: X with A (ended) and X with B.\n\
         - Dates as YYYY-MM-DD; resolve relative dates (last Tuesday, next month, tonight) against the REFERENCE TIME.\n\
         - Only facts the current episode states or clearly implies; previous episodes only help to resolve references. No duplicates."
    )
}

/// The schema of one fact: one branch per declared type and
/// `source_targets` pair, whose source and target are enums of the
/// mentions whose types fit that pair, so a schema-constrained decoder can
/// only name a declared type for endpoints it allows; and one branch for a
/// free lowercase relation between any two mentions.
pub(super) fn fact_item_schema(
    ontology: &Ontology,
    spec: &ExtractSpec,
    mentions: &[Mention],
) -> Value {
    json!({"anyOf": fact_branches(ontology, spec, mentions, None)})
}

/// The branches of [`fact_item_schema`]; with `from`, those of the facts
/// whose source is that mention, without a `source` property (the reply
/// groups facts by source, see `extract.facts_by_source`).
pub(super) fn fact_branches<'a>(
    ontology: &Ontology,
    spec: &ExtractSpec,
    mentions: &'a [Mention],
    from: Option<&'a Mention>,
) -> Vec<Value> {
    let time = json!({"anyOf": [
        // The pattern binds grammar-constrained servers to a date; the
        // length still admits a UTC time from a server that ignores it.
        {"type": "string", "pattern": TIME_PATTERN, "maxLength": 20},
        {"type": "null"}
    ]});
    // A mention still at a parent type is offered where a subtype of it
    // is wanted: the fact the model states refines it (relations refine
    // types, [`crate::classify::refine_by_relations`]).
    let names = |wanted: &str| -> Vec<&'a str> {
        let mut out: Vec<&str> = Vec::new();
        for m in mentions {
            if ontology.entity_may_be(m.type_name(), wanted) && !out.contains(&m.name.as_str()) {
                out.push(&m.name);
            }
        }
        out
    };
    // An end is a time expression in the resolver's grammar
    // ([`super::when`]), not a date the model works out, and always
    // written ("no" when the fact does not end): the 1.5B model filled a
    // nullable end, or a nullable {words, when} object, for none of the
    // suite's ended facts (docs/quality.md).
    let ends = json!({"type": "string", "pattern": WHEN_PATTERN, "maxLength": WHEN_MAX_CHARS});
    let branch = |relation: Value, sources: Vec<&str>, targets: Vec<&str>| {
        let mut item = json!({
            "type": "object",
            "properties": {
                "source": {"type": "string", "enum": sources},
                "relation_type": relation,
                "target": {"type": "string", "enum": targets},
                "fact": {"type": "string", "maxLength": FACT_MAX_CHARS},
                "valid_at": time,
                "ends": ends
            },
            "additionalProperties": false
        });
        if let Some(p) = item["properties"].as_object_mut() {
            if from.is_some() {
                p.shift_remove("source");
            }
            if spec.fact_start == FactStart::Text {
                p.shift_remove("valid_at");
            }
            let required: Vec<String> = p.keys().cloned().collect();
            item["required"] = json!(required);
        }
        item
    };
    // With a source, only it may start a fact, and it cannot be its own
    // target.
    let pick =
        |sources: Vec<&'a str>, targets: Vec<&'a str>| -> Option<(Vec<&'a str>, Vec<&'a str>)> {
            match from {
                None => {
                    let one_and_same = sources.len() == 1 && targets == sources;
                    (!sources.is_empty() && !targets.is_empty() && !one_and_same)
                        .then_some((sources, targets))
                }
                Some(m) => {
                    let targets: Vec<&str> = targets.into_iter().filter(|t| *t != m.name).collect();
                    (sources.contains(&m.name.as_str()) && !targets.is_empty())
                        .then(|| (vec![m.name.as_str()], targets))
                }
            }
        };
    let mut branches: Vec<Value> = Vec::new();
    for name in fact_types(ontology, spec) {
        let Some(et) = ontology.edge_types.get(&name) else {
            continue;
        };
        let any = [(ENTITY_LABEL, ENTITY_LABEL)];
        let pairs: Vec<(&str, &str)> = if et.source_targets.is_empty() {
            any.to_vec()
        } else {
            et.source_targets
                .iter()
                .map(|p| (p.source.as_str(), p.target.as_str()))
                .collect()
        };
        for (s, t) in pairs {
            let Some((sources, targets)) = pick(names(s), names(t)) else {
                continue;
            };
            let b = branch(json!({"type": "string", "enum": [name]}), sources, targets);
            if !branches.contains(&b) {
                branches.push(b);
            }
        }
    }
    let all = names(ENTITY_LABEL);
    if let Some((sources, targets)) = pick(all.clone(), all) {
        branches.push(branch(
            json!({"type": "string", "pattern": FREE_RELATION_PATTERN, "maxLength": RELATION_MAX_CHARS}),
            sources,
            targets,
        ));
    }
    branches
}

/// The request and reply schema of a fact call about `mentions`: the
/// entity call's system prompt and episode, then the entities and the task.
pub(super) fn fact_request(
    ontology: &Ontology,
    prompts: &Prompts,
    spec: &ExtractSpec,
    episode: &Episode,
    context: &[&Episode],
    mentions: &[Mention],
) -> (ChatRequest, Value) {
    let mut entities = String::new();
    let mut by_source = Map::new();
    for m in mentions {
        if !spec.facts_by_source {
            let _ = writeln!(entities, "- {} ({})", m.name, m.type_name());
            continue;
        }
        // The declared types this entity can start, as a reminder of what
        // to look for; its list in the reply offers exactly those.
        let branches = fact_branches(ontology, spec, mentions, Some(m));
        let mut starts: Vec<&str> = branches
            .iter()
            .filter_map(|b| b["properties"]["relation_type"]["enum"][0].as_str())
            .collect();
        starts.dedup();
        if starts.is_empty() {
            let _ = writeln!(entities, "- {} ({})", m.name, m.type_name());
        } else {
            let _ = writeln!(
                entities,
                "- {} ({}; can be the source of {})",
                m.name,
                m.type_name(),
                starts.join(", ")
            );
        }
        by_source.insert(
            m.name.clone(),
            json!({"type": "array", "maxItems": FACTS_PER_ENTITY, "items": {"anyOf": branches}}),
        );
    }
    let task = if spec.facts_by_source {
        &prompts.fact_task_by_source
    } else {
        &prompts.fact_task
    };
    let user = format!(
        "{}\n\nENTITIES:\n{entities}\n{task}",
        episode_block(episode, context, spec.context_chars),
    );
    let facts = if spec.facts_by_source {
        let names: Vec<&String> = by_source.keys().collect();
        json!({
            "type": "object",
            "properties": by_source,
            "required": names,
            "additionalProperties": false
        })
    } else {
        json!({
            "type": "array",
            "maxItems": (FACTS_PER_ENTITY * mentions.len()).max(8),
            "items": fact_item_schema(ontology, spec, mentions)
        })
    };
    let schema = json!({
        "type": "object",
        "properties": {"facts": facts},
        "required": ["facts"],
        "additionalProperties": false
    });
    (
        ChatRequest {
            stage: Stage::ExtractFacts,
            item: Some(episode.episode_id.clone()),
            messages: vec![Message::system(prompts.system.clone()), Message::user(user)],
            max_tokens: fact_reply_bound(spec, mentions.len()),
            prompt_version: PROMPT_VERSION.into(),
            budget: Some(std::time::Duration::from_secs(spec.call_budget_secs)),
        },
        schema,
    )
}
