//! `[ontology]` as written in the spec, before validation: entity and
//! edge types with their properties, and the two hierarchies. The rules
//! that make an ontology valid are in [`crate::ontology`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// Value kinds a property may declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PropertyType {
    /// A string.
    Text,
    /// A whole number (JSON integer).
    Int,
    /// A number (JSON integer or float).
    Float,
    /// `true` / `false`.
    Bool,
    /// A calendar date, `YYYY-MM-DD` (an RFC 3339 timestamp is accepted and
    /// cut to its date).
    Date,
}

impl fmt::Display for PropertyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PropertyType::Text => "text",
            PropertyType::Int => "int",
            PropertyType::Float => "float",
            PropertyType::Bool => "bool",
            PropertyType::Date => "date",
        })
    }
}

/// One property of a type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PropertySpec {
    /// Property name, the key inside `attributes`.
    pub name: String,
    /// Value kind.
    #[serde(rename = "type")]
    pub kind: PropertyType,
    /// What the property holds; shown to the model.
    #[serde(default)]
    pub description: String,
    /// Whether one entity may hold several values over time (an e-mail
    /// address changes with the employer). As an identity property, an
    /// equal value still identifies the entity, but two different values
    /// no longer keep two mentions apart. Off for codes (order numbers),
    /// whose different values mean different entities.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub may_change: bool,
    /// The shape a text value must have, as a regular expression anchored
    /// with `^` and `$` (e.g. `^[a-z0-9-]+(\\.[a-z0-9-]+)+$` for a web
    /// domain). Sent in the reply schema, so a grammar-constrained server
    /// can only write such values, and checked on every value: one that
    /// does not match is not stored (a `failures` row). Keeps a phrase the
    /// episode happens to write ("a Delaware corporation") out of an
    /// identity property.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
}

/// A custom entity type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntityTypeSpec {
    /// Type name, also the node label.
    pub name: String,
    /// Membership rule, an example and a near miss; shown to the model.
    pub description: String,
    /// Properties of this type only (no inheritance from parents).
    #[serde(default)]
    pub properties: Vec<PropertySpec>,
    /// Properties whose equal values identify the same real-world entity.
    #[serde(default)]
    pub identity_properties: Vec<String>,
}

/// An allowed (source, target) entity-type pair of an edge type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceTarget {
    /// Entity type of the source node (`Entity` = any).
    pub source: String,
    /// Entity type of the target node (`Entity` = any).
    pub target: String,
}

/// A custom edge (fact) type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeTypeSpec {
    /// Type name in SCREAMING_SNAKE_CASE; stored as `edges.relation_type`.
    pub name: String,
    /// When a fact is of this type; shown to the model.
    pub description: String,
    /// Properties of this type only.
    #[serde(default)]
    pub properties: Vec<PropertySpec>,
    /// Allowed endpoint types; empty means any. Not inherited by subtypes.
    #[serde(default)]
    pub source_targets: Vec<SourceTarget>,
}

/// Structure of a hierarchy: each key a declared type, each value its
/// subtypes, `{}` a leaf. Subtypes are listed in the order written here;
/// top-level types in the order they are declared. Kept as a list of
/// pairs in document order (a TOML table, read in order); a key written
/// twice at one level is an error.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hierarchy(pub Vec<(String, Hierarchy)>);

impl Hierarchy {
    /// The subtypes' names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }
}

impl Serialize for Hierarchy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Hierarchy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = Hierarchy;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of type names, each with a table of its subtypes")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Hierarchy, A::Error> {
                let mut out: Vec<(String, Hierarchy)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                while let Some((k, v)) = map.next_entry::<String, Hierarchy>()? {
                    if !seen.insert(k.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "`{k}` is listed twice at one level"
                        )));
                    }
                    out.push((k, v));
                }
                Ok(Hierarchy(out))
            }
        }
        d.deserialize_map(Pairs)
    }
}

/// `[ontology]` as written in the spec, before validation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OntologySpec {
    /// Drop extracted entities that fit no declared type instead of keeping
    /// them as plain `Entity` nodes.
    #[serde(default)]
    pub strict: bool,
    /// Every entity type, subtypes included.
    #[serde(default)]
    pub entity_types: Vec<EntityTypeSpec>,
    /// Every edge type, subtypes included.
    #[serde(default)]
    pub edge_types: Vec<EdgeTypeSpec>,
    /// Structure of the entity types.
    #[serde(default)]
    pub entity_type_hierarchy: Hierarchy,
    /// Structure of the edge types.
    #[serde(default)]
    pub edge_type_hierarchy: Hierarchy,
}
