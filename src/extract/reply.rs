//! The replies of the extraction calls, as models write them, and the
//! token bounds the calls give them.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::ExtractSpec;
use crate::source::Episode;

#[derive(Debug, Deserialize)]
pub(super) struct EntityReply {
    pub(super) entities: Vec<EntityOut>,
}

#[derive(Debug, Deserialize)]
pub(super) struct EntityOut {
    pub(super) name: String,
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) attributes: AttributesOut,
}

/// Attributes as the entity and walk schemas ask for them (an object of
/// property values), or as a list of name/value pairs from a server that
/// ignores the schema and follows an older prompt.
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum AttributesOut {
    /// None given.
    #[default]
    None,
    /// Property name → value.
    Object(Map<String, Value>),
    /// Name/value pairs.
    List(Vec<AttributeOut>),
}

impl AttributesOut {
    /// The values as name/value pairs; a non-text value as its JSON text.
    pub fn pairs(self) -> Vec<AttributeOut> {
        match self {
            AttributesOut::None => Vec::new(),
            AttributesOut::List(list) => list,
            AttributesOut::Object(map) => map
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(name, v)| AttributeOut {
                    value: match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    },
                    name,
                })
                .collect(),
        }
    }
}

/// A property value as a model writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct AttributeOut {
    /// Property name.
    pub name: String,
    /// Value as text.
    pub value: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct FactReply {
    pub(super) facts: FactsOut,
}

/// Facts as one list, or grouped under their source's name
/// (`extract.facts_by_source`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum FactsOut {
    List(Vec<FactOut>),
    BySource(Map<String, Value>),
}

/// A fact of a reply grouped by source.
#[derive(Debug, Deserialize)]
pub(super) struct SourcedFactOut {
    target: String,
    relation_type: String,
    fact: String,
    valid_at: Option<String>,
    #[serde(default)]
    ends: Option<String>,
    #[serde(default)]
    invalid_at: Option<String>,
}

impl FactsOut {
    /// Every fact with its source; a grouped fact that does not have the
    /// shape of one is left out with a note.
    pub(super) fn into_list(self) -> (Vec<FactOut>, Vec<String>) {
        match self {
            FactsOut::List(list) => (list, Vec::new()),
            FactsOut::BySource(map) => {
                let (mut out, mut notes) = (Vec::new(), Vec::new());
                for (source, facts) in map {
                    let items = match facts {
                        Value::Array(items) => items,
                        other => vec![other],
                    };
                    for item in items {
                        match serde_json::from_value::<SourcedFactOut>(item) {
                            Ok(f) => out.push(FactOut {
                                source: source.clone(),
                                target: f.target,
                                relation_type: f.relation_type,
                                fact: f.fact,
                                valid_at: f.valid_at,
                                ends: f.ends,
                                invalid_at: f.invalid_at,
                            }),
                            Err(e) => notes.push(format!("a fact of `{source}` dropped: {e}")),
                        }
                    }
                }
                (out, notes)
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct FactOut {
    pub(super) source: String,
    pub(super) target: String,
    pub(super) relation_type: String,
    pub(super) fact: String,
    pub(super) valid_at: Option<String>,
    /// When the fact ends, in the grammar of [`super::when`] (`no` when
    /// it does not).
    #[serde(default)]
    pub(super) ends: Option<String>,
    /// A date a server that ignores the schema may write instead.
    #[serde(default)]
    pub(super) invalid_at: Option<String>,
}

/// The `max_tokens` of an entity call: `extract.entity_max_tokens`, or
/// less for a short episode, which cannot name many entities. Small models
/// sometimes repeat their list until the bound; a bound sized to the
/// episode stops that sooner, and the items completed before the cut are
/// kept ([`crate::llm::reply::salvage`]).
pub fn entity_reply_bound(spec: &ExtractSpec, episode: &Episode) -> u32 {
    let chars = u32::try_from(episode.content.chars().count()).unwrap_or(u32::MAX);
    spec.entity_max_tokens.min(256u32.saturating_add(chars / 3))
}

/// The `max_tokens` of a fact call about `mentions` entities:
/// `extract.fact_max_tokens`, or less for few entities (200 tokens and
/// 100 an entity: two facts of about 50 tokens each), for the same reason
/// as [`entity_reply_bound`].
pub fn fact_reply_bound(spec: &ExtractSpec, mentions: usize) -> u32 {
    let mentions = u32::try_from(mentions).unwrap_or(u32::MAX);
    spec.fact_max_tokens
        .min(200u32.saturating_add(mentions.saturating_mul(100)))
}
