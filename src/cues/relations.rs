//! Relation type names read as English words: a passive `X_BY` and the
//! active forms of its participle, and a last word that is a preposition.

/// The participle of a relation named in the passive, `X_BY`: SUPPLIED
/// of SUPPLIED_BY.
/// Cue `passive_relation` (with [`active_forms`]).
pub(crate) fn passive_participle(relation: &str) -> Option<&str> {
    relation.strip_suffix("_BY")
}

/// The active forms a participle such as SUPPLIED, OWNED or APPROVED is
/// written in: the participle itself, and its present tense ("SUPPLIES",
/// "OWNS", "APPROVES").
pub(crate) fn active_forms(participle: &str) -> Vec<String> {
    let mut forms = vec![participle.to_string()];
    if let Some(stem) = participle.strip_suffix("IED") {
        forms.push(format!("{stem}IES"));
    } else if let Some(stem) = participle.strip_suffix("ED") {
        forms.push(format!("{stem}S"));
        forms.push(format!("{stem}ES"));
    }
    forms
}

/// Whether `word` (in lower case) is a preposition that may end a
/// relation's name (`ON_CALL_FOR`) and that a text need not write with it.
/// Cue `relation_preposition`.
pub(crate) fn is_preposition(word: &str) -> bool {
    const PREPOSITIONS: [&str; 8] = ["for", "to", "of", "by", "with", "in", "on", "at"];
    PREPOSITIONS.contains(&word)
}
