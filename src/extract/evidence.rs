//! What a model was shown, to ground the property values it writes, and
//! the context kept around each name.

use serde_json::{Map, Value};

use super::AttributeOut;
use crate::ontology::{PropertySpec, PropertyType};
use crate::values::coerce_text;

/// What a model saw, for grounding the property values it writes: a value
/// it could not have read there was made up (small models invent e-mail
/// addresses and domains), and a made-up identity value would keep one
/// entity's mentions apart.
#[derive(Debug, Clone)]
pub struct Evidence {
    words: String,
    lower: String,
    numbers: Vec<f64>,
}

impl Evidence {
    /// The evidence of `text`.
    pub fn of(text: &str) -> Self {
        Evidence {
            words: crate::text::grounding_form(text),
            lower: text.to_lowercase(),
            numbers: crate::text::numbers_in(text),
        }
    }

    /// Whether `value` is written in the evidence as it is, ignoring
    /// case: a value of a patterned property (a code, an e-mail address,
    /// a domain) is copied, so "delaware.corporation" is not grounded by
    /// "a Delaware corporation" the way a phrase would be.
    pub fn holds_verbatim(&self, value: &str) -> bool {
        let v = value.trim().to_lowercase();
        v.is_empty() || self.lower.contains(&v)
    }

    /// Whether `value`, of `kind`, is written in the evidence: a text as
    /// whole words after [`crate::text::grounding_form`] on both sides, a
    /// number as a number of equal value. Dates and booleans are not
    /// checked (a model resolves "next Monday" or reads "yes" off the
    /// wording, which no spelling check can follow).
    pub fn holds(&self, kind: PropertyType, value: &Value) -> bool {
        match (kind, value) {
            (PropertyType::Text, Value::String(v)) => {
                let form = crate::text::grounding_form(v);
                form.trim().is_empty() || self.words.contains(&form)
            }
            (PropertyType::Int | PropertyType::Float, v) => v.as_f64().is_none_or(|x| {
                self.numbers
                    .iter()
                    .any(|n| (n - x).abs() <= 1e-9 * x.abs().max(1.0))
            }),
            _ => true,
        }
    }
}

/// Keeps the attributes a model gave that are properties of `properties`,
/// coerced to their kind and written in `evidence`; the rest are dropped.
/// Returns a note for each value dropped for not being in the evidence or
/// not matching the property's pattern (other drops, unknown properties
/// or uncoercible values, are silent).
pub fn typed_attributes(
    properties: &[PropertySpec],
    given: &[AttributeOut],
    evidence: &Evidence,
) -> (Map<String, Value>, Vec<String>) {
    let mut out = Map::new();
    let mut ungrounded = Vec::new();
    for a in given {
        let Some(p) = properties.iter().find(|p| p.name == a.name) else {
            continue;
        };
        let Some(v) = coerce_text(p.kind, &a.value) else {
            continue;
        };
        if let (Some(pattern), Value::String(text)) = (&p.pattern, &v)
            && !crate::text::Pattern::matches(pattern, text)
        {
            let shown: String = text.chars().take(80).collect();
            ungrounded.push(format!(
                "`{}` = `{shown}` does not have the property's shape ({pattern}); not stored",
                p.name
            ));
            continue;
        }
        let verbatim = match (&p.pattern, &v) {
            (Some(_), Value::String(text)) => evidence.holds_verbatim(text),
            _ => true,
        };
        if !verbatim || !evidence.holds(p.kind, &v) {
            let shown: String = a.value.trim().chars().take(80).collect();
            ungrounded.push(format!(
                "`{}` = `{shown}` is not written in the text; not stored",
                p.name
            ));
            continue;
        }
        out.entry(p.name.clone()).or_insert(v);
    }
    (out, ungrounded)
}

/// The part of `content` around the first occurrence of `name` (case
/// insensitive), about `width` characters on each side.
pub fn context_of(content: &str, name: &str, width: usize) -> String {
    let lower = content.to_lowercase();
    let chars: Vec<char> = content.chars().collect();
    context_in(&chars, &lower, name, width)
}

/// [`context_of`] with the content's characters and its lower case
/// computed once for all the names of an episode.
pub(super) fn context_in(chars: &[char], lower: &str, name: &str, width: usize) -> String {
    let at = lower
        .find(&name.to_lowercase())
        .map(|byte| lower[..byte].chars().count())
        .unwrap_or(0);
    let start = at.saturating_sub(width);
    let end = (at + name.chars().count() + width).min(chars.len());
    let mut s: String = chars[start..end].iter().collect();
    s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if start > 0 {
        s.insert_str(0, "… ");
    }
    if end < chars.len() {
        s.push_str(" …");
    }
    s
}
