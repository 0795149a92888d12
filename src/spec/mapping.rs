//! `[[mapping]]`: structured records turned into entities and facts by
//! rules instead of LLM calls (the stage is [`crate::mapping`]).
//!
//! ```toml
//! [[mapping]]
//! files = "erp*.jsonl"
//! when = { record_type = "purchase_order" }
//!
//! [[mapping.entities]]
//! id = "po"
//! type = "PurchaseOrder"
//! name = "{po_number}"
//! properties = { po_number = "po_number", status = "status" }
//!
//! [[mapping.entities]]
//! id = "vendor"
//! type = "Company"
//! name = "{vendor}"
//!
//! [[mapping.facts]]
//! relation = "PARTY_TO"
//! source = "vendor"
//! target = "po"
//! valid_at = "issued_on"
//! invalid_at = "cancelled_on"
//!
//! # A leaver record's last day ends every responsibility of the person.
//! [[mapping.ends]]
//! entity = "person"
//! relation = "RESPONSIBLE_FOR"
//! at = "last_day"
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One `[[mapping]]` table: which records it applies to and what it makes
/// of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MappingSpec {
    /// Glob (`*`, `?`) on the record's file path below `source.url`
    /// (e.g. `erp.jsonl`, `crm/*.parquet`); every file when absent.
    #[serde(default)]
    pub files: Option<String>,
    /// Field → value: the record applies only when every field holds that
    /// value (strings, numbers and booleans compare by their text).
    #[serde(default)]
    pub when: BTreeMap<String, toml::Value>,
    /// The entities one record makes.
    #[serde(default)]
    pub entities: Vec<EntityMapSpec>,
    /// The facts between them.
    #[serde(default)]
    pub facts: Vec<FactMapSpec>,
    /// Ends the record states for every relationship of a kind that one
    /// of its entities has, whichever episodes stated them.
    #[serde(default)]
    pub ends: Vec<EndMapSpec>,
}

/// `[[mapping.entities]]`: one entity of a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntityMapSpec {
    /// The name facts use for this entity (`source`, `target`).
    pub id: String,
    /// A declared entity type (or `Entity` unless `ontology.strict`).
    #[serde(rename = "type")]
    pub entity_type: String,
    /// Name template: text with `{field}` (or `{a.b}` for a nested field)
    /// placeholders; `{{` and `}}` write braces.
    pub name: String,
    /// Templates tried in order when `name` lacks a field or renders
    /// empty (`["{company}", "customer {customer_id}"]`); the first that
    /// renders a name is used.
    #[serde(default)]
    pub name_fallback: Vec<String>,
    /// Property → field of the record. A missing or null field leaves the
    /// property out.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// When true, a record whose name fields are missing or empty simply
    /// has no such entity (and none of its facts); when false (the
    /// default) the record fails with a `failures` row.
    #[serde(default)]
    pub optional: bool,
    /// A field holding a list of objects (an order's `lines`): one entity
    /// per item, its `name` and `properties` read from the item. Facts
    /// with such an entity are made once per item; between two entities
    /// of the same list, item by item.
    #[serde(default)]
    pub each: Option<String>,
}

/// `[[mapping.facts]]`: one fact between two entities of a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactMapSpec {
    /// A declared edge type whose `source_targets` allow the two entity
    /// types.
    pub relation: String,
    /// `id` of the source entity.
    pub source: String,
    /// `id` of the target entity.
    pub target: String,
    /// Fact text template, like an entity's `name`; by default
    /// "<source name> <relation in words> <target name>".
    #[serde(default)]
    pub fact: Option<String>,
    /// Field holding when the fact started (RFC 3339, a date or a year).
    #[serde(default)]
    pub valid_at: Option<String>,
    /// Field holding when it ended; a missing or null field means it holds.
    #[serde(default)]
    pub invalid_at: Option<String>,
    /// Field → value: the fact is made only when every field holds that
    /// value (read from the list item first for a fact made per item,
    /// then from the record): `{ role = "team lead" }`.
    #[serde(default)]
    pub when: BTreeMap<String, toml::Value>,
    /// Field → value: the fact is not made when any field holds that value.
    #[serde(default)]
    pub unless: BTreeMap<String, toml::Value>,
}

/// `[[mapping.ends]]`: the record ends every live relationship of one
/// type (subtypes included) that one of its entities is the source of,
/// at a time a field gives: a leaver's `last_day` ends the on-call shifts
/// and tickets the person answers for, stated by any episode of the run
/// (chat, mail, other records) that started before that day.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndMapSpec {
    /// `id` of the entity whose relationships end.
    pub entity: String,
    /// A declared edge type whose `source_targets` allow the entity as a
    /// source: its facts and its subtypes' facts end.
    pub relation: String,
    /// Field holding when they end (RFC 3339, a date or a year); a
    /// missing or null field ends nothing.
    pub at: String,
    /// Field → value: the end applies only when every field holds that
    /// value.
    #[serde(default)]
    pub when: BTreeMap<String, toml::Value>,
    /// Field → value: the end does not apply when any field holds that
    /// value.
    #[serde(default)]
    pub unless: BTreeMap<String, toml::Value>,
}
