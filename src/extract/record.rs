//! Where a record (a JSON episode) holds its mentions' names: which
//! values its structure puts together.

use serde_json::Value;

use super::Mention;
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
    pub(super) fn new(content: &str, mentions: &[Mention]) -> Self {
        let Ok(value) = serde_json::from_str::<Value>(content) else {
            return RecordPlaces { places: None };
        };
        let names: Vec<String> = mentions.iter().map(|m| normalize_name(&m.name)).collect();
        let mut places = vec![Vec::new(); mentions.len()];
        let mut next = 0;
        let mut path = Vec::new();
        Self::walk(&value, &names, &mut path, &mut next, &mut places);
        RecordPlaces {
            places: Some(places),
        }
    }

    pub(super) fn walk(
        value: &Value,
        names: &[String],
        path: &mut Vec<Container>,
        next: &mut usize,
        places: &mut [Vec<Vec<Container>>],
    ) {
        let note = |text: &str, path: &[Container], places: &mut [Vec<Vec<Container>>]| {
            let written = normalize_name(text);
            for (i, name) in names.iter().enumerate() {
                if writes(&written, name) {
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
                    Self::walk(v, names, path, next, places);
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
                    Self::walk(v, names, path, next, places);
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
