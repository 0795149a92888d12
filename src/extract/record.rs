//! Where a record (a JSON episode) holds its mentions' names: which
//! values its structure puts together.

use serde_json::Value;

use super::Mention;
use crate::cues::Switches;
use crate::cues::names::writes;
use crate::text::normalize_name;

/// Where a record (a JSON episode) holds each mention's name: per
/// mention, the containers (objects and lists, by number, the outermost
/// first) around each value or key that writes it.
pub(super) struct RecordPlaces {
    /// `None` when the episode is not JSON: nothing can be judged.
    places: Option<Vec<Vec<Vec<Container>>>>,
}

/// An object or list of a record, numbered in the order the walk meets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Container {
    id: usize,
    is_object: bool,
}

impl RecordPlaces {
    /// With the cue `record_writes_name` off, a value writes a name only
    /// when it is the name (case and punctuation aside).
    pub(super) fn new(content: &str, mentions: &[Mention], cues: &Switches) -> Self {
        let Ok(value) = serde_json::from_str::<Value>(content) else {
            return RecordPlaces { places: None };
        };
        let names: Vec<String> = mentions.iter().map(|m| normalize_name(&m.name)).collect();
        let mut places = vec![Vec::new(); mentions.len()];
        let mut next = 0;
        let mut path = Vec::new();
        Self::walk(&value, &names, cues, &mut path, &mut next, &mut places);
        RecordPlaces {
            places: Some(places),
        }
    }

    pub(super) fn walk(
        value: &Value,
        names: &[String],
        cues: &Switches,
        path: &mut Vec<Container>,
        next: &mut usize,
        places: &mut [Vec<Vec<Container>>],
    ) {
        let note = |text: &str, path: &[Container], places: &mut [Vec<Vec<Container>>]| {
            let written = normalize_name(text);
            for (i, name) in names.iter().enumerate() {
                if written == *name || cues.fires("record_writes_name", || writes(&written, name)) {
                    places[i].push(path.to_vec());
                }
            }
        };
        match value {
            Value::Object(map) => {
                path.push(Container {
                    id: *next,
                    is_object: true,
                });
                *next += 1;
                for (key, v) in map {
                    note(key, path, places);
                    Self::walk(v, names, cues, path, next, places);
                }
                path.pop();
            }
            Value::Array(items) => {
                path.push(Container {
                    id: *next,
                    is_object: false,
                });
                *next += 1;
                for v in items {
                    Self::walk(v, names, cues, path, next, places);
                }
                path.pop();
            }
            Value::String(text) => note(text, path, places),
            Value::Number(n) => note(&n.to_string(), path, places),
            Value::Bool(_) | Value::Null => {}
        }
    }

    /// Whether the record relates `a` and `b`: one is written as a field
    /// (a value or a key) of an object that holds the other, at any depth
    /// ("buyer" of a report and an order in its list); two values in
    /// different items of one list are not related. A mention the record
    /// does not write (the model took it from elsewhere) passes.
    pub(super) fn pair_stated(&self, a: usize, b: usize) -> bool {
        let Some(places) = &self.places else {
            return true;
        };
        if places[a].is_empty() || places[b].is_empty() {
            return true;
        }
        places[a].iter().any(|pa| {
            places[b].iter().any(|pb| {
                let common = pa.iter().zip(pb).take_while(|(x, y)| x == y).count();
                // The innermost container holding both: an object of which
                // one of the two is a field of its own.
                common > 0 && pa[common - 1].is_object && (pa.len() == common || pb.len() == common)
            })
        })
    }
}

/// The identity values a record states for its mentions: where an object
/// of the record has a field named like an identity property of a
/// mention's type (`package_id`, case ignored) and a field whose value is
/// the mention's name ("quillparse"), that property's value is the
/// mention's. The field names are the ontology's, so this reads the
/// record's structure, not its wording. Returns `(mention, property,
/// value)` for each mention without a value of that property yet; nothing
/// for an episode that is not JSON, and nothing from an object that names
/// two mentions which could both hold the property.
pub fn stated_identities(
    content: &str,
    mentions: &[Mention],
    identity_of: impl Fn(&str) -> Vec<String>,
) -> Vec<(usize, String, Value)> {
    let Ok(record) = serde_json::from_str::<Value>(content) else {
        return Vec::new();
    };
    let wanted: Vec<(usize, String, Vec<String>)> = mentions
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let props: Vec<String> = identity_of(m.type_name())
                .into_iter()
                .filter(|p| !m.attributes.contains_key(p))
                .collect();
            (!props.is_empty()).then(|| (i, normalize_name(&m.name), props))
        })
        .collect();
    let mut out = Vec::new();
    if wanted.is_empty() {
        return out;
    }
    let mut stack = vec![&record];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                let values: Vec<String> = map
                    .values()
                    .filter_map(|v| v.as_str().map(normalize_name))
                    .collect();
                for (key, v) in map {
                    if !matches!(v, Value::String(_) | Value::Number(_)) {
                        continue;
                    }
                    // The mentions this object names that could hold the
                    // property: one, or the value is nobody's for sure.
                    let mut holders = wanted
                        .iter()
                        .filter(|(_, name, _)| values.contains(name))
                        .filter_map(|(i, _, props)| {
                            let p = props.iter().find(|p| key.eq_ignore_ascii_case(p))?;
                            Some((i, p))
                        });
                    if let (Some((i, p)), None) = (holders.next(), holders.next())
                        && !out.iter().any(|(j, q, _)| j == i && q == p)
                    {
                        out.push((*i, p.clone(), v.clone()));
                    }
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}
