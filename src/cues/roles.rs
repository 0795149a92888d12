//! Words that name a role or a kind rather than a thing: the lower-case
//! words of the ontology's descriptions, and the words for people.

use std::collections::HashSet;

/// The lower-case words of type descriptions ("A business organisation
/// such as a customer, a supplier or a reseller"): a one-word name among
/// them is a role or a kind, however a contract capitalises it as a
/// defined term ("the Customer"). Capitalised words of a description (an
/// example name) are not taken.
pub(crate) fn role_words<'d>(descriptions: impl Iterator<Item = &'d str>) -> HashSet<String> {
    let mut out = HashSet::new();
    for d in descriptions {
        for w in crate::text::words(d) {
            if w.chars().all(|c| c.is_lowercase()) {
                out.insert(w.to_string());
            }
        }
    }
    out
}

/// Whether `name` is one word (after a leading "the") of `role_words`
/// ([`role_words`]).
pub(crate) fn is_role_word(role_words: &HashSet<String>, name: &str) -> bool {
    let words: Vec<String> = crate::text::words(name).map(str::to_lowercase).collect();
    let words = match words.split_first() {
        Some((first, rest)) if first == "the" => rest,
        _ => &words[..],
    };
    matches!(words, [one] if role_words.contains(one))
}

/// Whether a type named `name` and described by `description` is a type
/// of people: named as people are (`Person`, `Employee`, `Contact`, …),
/// or its description's first sentence says "person", "individual" or
/// "human".
/// Cue `people_types`.
pub(crate) fn names_people(name: &str, description: &str) -> bool {
    const NAMES: [&str; 7] = [
        "person",
        "people",
        "employee",
        "contact",
        "individual",
        "human",
        "staff",
    ];
    const WORDS: [&str; 4] = ["person", "individual", "human", "people"];
    let first = description.split(['.', ';']).next().unwrap_or_default();
    NAMES.contains(&name.to_lowercase().as_str())
        || crate::text::words(first).any(|w| WORDS.contains(&w.to_lowercase().as_str()))
}
