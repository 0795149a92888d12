//! Relation fitting: the declared type a model's relation is stored
//! under, given the types of the fact's two ends.

use super::GENERIC_RELATION;
use crate::cues::Switches;
use crate::cues::relations::{active_forms, is_preposition, passive_participle};
use crate::ontology::Ontology;

/// Turns what a model wrote as a relation type into SCREAMING_SNAKE_CASE.
pub fn relation_type_of(text: &str) -> String {
    let mut out = String::new();
    let mut gap = false;
    for c in text.trim().chars() {
        if c.is_ascii_alphanumeric() {
            if gap && !out.is_empty() {
                out.push('_');
            }
            gap = false;
            out.push(c.to_ascii_uppercase());
        } else {
            gap = true;
        }
    }
    if out.chars().next().is_some_and(|c| c.is_ascii_digit()) {
        out.insert_str(0, "R_");
    }
    out
}

/// The declared type an undeclared relation name spells another way, and
/// whether it is written in the other voice (its endpoints then go the
/// other way round). Small models write `SUPPLIEDBY` or `SuppliedBy` for
/// SUPPLIED_BY, and "Skylark supplies Notification Hub" as SUPPLIED or
/// SUPPLIES: the active voice of SUPPLIED_BY, turned round; OWNED_BY is
/// the passive of a declared OWNS. Read in this order: the same letters
/// without the underscores; a passive `X_BY` whose active form of X is
/// declared; an active form of X for a declared `X_BY`. The active forms
/// of a participle X are X itself ("SUPPLIED"), and its present tense
/// ("SUPPLIES", "OWNS", "APPROVES"). `None` for a declared type, or when
/// no declared type is spelled.
pub fn declared_spelling(
    ontology: &Ontology,
    relation: &str,
    cues: &Switches,
) -> Option<(String, bool)> {
    if ontology.edge_types.contains_key(relation) {
        return None;
    }
    let bare = |r: &str| r.replace('_', "");
    let wanted = bare(relation);
    if let Some(name) = ontology.edge_types.keys().find(|n| bare(n) == wanted) {
        return Some((name.clone(), false));
    }
    if !cues.on("passive_relation") {
        return None;
    }
    if let Some(participle) = passive_participle(relation)
        && let Some(active) = active_forms(participle)
            .into_iter()
            .find(|f| ontology.edge_types.contains_key(f))
    {
        return Some((active, true));
    }
    ontology.edge_types.keys().find_map(|name| {
        let participle = passive_participle(name)?;
        active_forms(participle)
            .iter()
            .any(|f| *f == relation)
            .then(|| (name.clone(), true))
    })
}

/// The relation type a fact is stored under, and whether its endpoints are
/// swapped. A declared type must allow the endpoint types (`source_targets`):
/// as written; reversed (small models often reverse a direction they
/// clearly mean); or else the nearest parent type that allows them; or
/// else the fact is kept as [`GENERIC_RELATION`], so that no fact is lost
/// to a server that ignores the reply schema. `None` only when the
/// ontology declares the generic type itself and it does not fit either.
pub fn fitting_relation(
    ontology: &Ontology,
    relation: &str,
    source: &str,
    target: &str,
) -> Option<(String, bool)> {
    let fit = |r: &str| fits_either_way(ontology, r, source, target);
    // An undeclared relation is a chain of itself.
    let chain = ontology
        .edge_tree
        .chain(relation)
        .unwrap_or_else(|| vec![relation.to_string()]);
    chain
        .iter()
        .rev()
        .find_map(|r| fit(r))
        .or_else(|| fit(GENERIC_RELATION))
}

/// Whether a declared `relation` that does not allow endpoints of these
/// types either way round would once an end is refined to a subtype
/// ([`Ontology::edge_may_allow`]), and whether it is then turned round:
/// `SPONSORS` (Company → Project) stated of an `Organization` and a
/// `Project` keeps its type, and refines the organization later
/// ([`crate::classify::refine_by_relations`]). `None` when the type fits
/// as it is, is not declared, or cannot fit.
pub fn refinable(ontology: &Ontology, relation: &str, source: &str, target: &str) -> Option<bool> {
    if !ontology.edge_types.contains_key(relation)
        || fits_either_way(ontology, relation, source, target).is_some()
    {
        return None;
    }
    if ontology.edge_may_allow(relation, source, target) {
        Some(false)
    } else if ontology.edge_may_allow(relation, target, source) {
        Some(true)
    } else {
        None
    }
}

/// [`fitting_relation`] for a fact whose words write the declared types
/// `written` ([`types_written`]): where the type the model gave cannot
/// hold the endpoints (it falls back to [`GENERIC_RELATION`]) or is no
/// declared type (a free relation), the written type that fits them.
/// "Kenji Mori: I'm no longer on call for Fare Engine", given as WORKS_FOR
/// between a person and a service, is ON_CALL_FOR; so is a free "was on
/// call for". When the written types that fit lie on one chain the most
/// specific is taken; types of two families leave the choice to no one.
pub fn fitting_relation_in(
    ontology: &Ontology,
    relation: &str,
    written: &[String],
    source: &str,
    target: &str,
) -> Option<(String, bool)> {
    let fit = fitting_relation(ontology, relation, source, target);
    let declared_fit = fit
        .as_ref()
        .is_some_and(|(r, _)| r != GENERIC_RELATION && ontology.edge_types.contains_key(r));
    if declared_fit {
        return fit;
    }
    let fitting: Vec<(String, bool)> = written
        .iter()
        .filter_map(|name| fits_either_way(ontology, name, source, target))
        .collect();
    let deepest = fitting
        .iter()
        .max_by_key(|(n, _)| ontology.edge_tree.get(n).map_or(0, |t| t.depth));
    match deepest {
        Some(d)
            if fitting
                .iter()
                .all(|(n, _)| ontology.edge_tree.is_a(&d.0, n)) =>
        {
            Some(d.clone())
        }
        _ => fit,
    }
}

/// The one declared relation type that entities of types `a` and `b` can
/// be related by, and whether it goes from `b` to `a`: the broadest of the
/// declared types whose `source_targets` allow the pair, when every other
/// one is below it (Person → Service: RESPONSIBLE_FOR, with its kinds
/// ON_CALL_FOR and OWNS). `None` when none fits, when two families do
/// (a type without `source_targets` fits every pair), or when the type
/// fits both ways round.
pub fn only_relation(ontology: &Ontology, a: &str, b: &str) -> Option<(String, bool)> {
    let fitting: Vec<(String, bool)> = ontology
        .edge_tree
        .iter()
        .filter(|t| t.name != GENERIC_RELATION)
        .filter_map(|t| fits_either_way(ontology, &t.name, a, b))
        .collect();
    let (broadest, turned) = fitting.iter().find(|(n, _)| {
        fitting
            .iter()
            .all(|(other, _)| ontology.edge_tree.is_a(other, n))
    })?;
    let both_ways = ontology.edge_allows(broadest, a, b) && ontology.edge_allows(broadest, b, a);
    (!both_ways).then(|| (broadest.clone(), *turned))
}

/// `relation` with whether it must be turned round, when its own
/// `source_targets` allow the endpoint types as given or else reversed.
pub(super) fn fits_either_way(
    ontology: &Ontology,
    relation: &str,
    source: &str,
    target: &str,
) -> Option<(String, bool)> {
    if ontology.edge_allows(relation, source, target) {
        Some((relation.to_string(), false))
    } else if ontology.edge_allows(relation, target, source) {
        Some((relation.to_string(), true))
    } else {
        None
    }
}

/// The declared relation types whose names, without a last word that is
/// a preposition, `text` writes as consecutive words, case and
/// punctuation aside: ON_CALL_FOR in "my on-call shifts", OWNS in "owns".
pub(super) fn types_named(ontology: &Ontology, text: &str, cues: &Switches) -> Vec<String> {
    let words: Vec<String> = crate::text::words(text).map(str::to_lowercase).collect();
    ontology
        .edge_tree
        .iter()
        .filter(|node| {
            let mut phrase: Vec<String> = crate::text::words(&node.name)
                .map(str::to_lowercase)
                .collect();
            if phrase.len() > 1
                && phrase
                    .last()
                    .is_some_and(|w| cues.fires("relation_preposition", || is_preposition(w)))
            {
                phrase.pop();
            }
            !phrase.is_empty() && words.windows(phrase.len()).any(|w| w == phrase)
        })
        .map(|node| node.name.clone())
        .collect()
}

/// The declared relation types whose names `texts` write as consecutive
/// words, case and punctuation aside (ON_CALL_FOR in "no longer on-call
/// for"), in declared order.
pub fn types_written(ontology: &Ontology, texts: &[&str]) -> Vec<String> {
    let words_of =
        |s: &str| -> Vec<String> { crate::text::words(s).map(str::to_lowercase).collect() };
    let texts: Vec<Vec<String>> = texts.iter().map(|t| words_of(t)).collect();
    ontology
        .edge_tree
        .iter()
        .filter(|node| {
            let phrase = words_of(&node.name);
            !phrase.is_empty()
                && texts
                    .iter()
                    .any(|words| words.windows(phrase.len()).any(|w| w == phrase))
        })
        .map(|node| node.name.clone())
        .collect()
}

/// Whether a fact given under `relation` and fitted to `fitted` (by
/// [`fitting_relation`]) names a declared type that its endpoints cannot
/// hold, either way round, nor under a parent: the model meant that type
/// ("party to" is `PARTY_TO`: the free branch of the schema spells a
/// declared type in lower case) for entities it does not relate, and the
/// fact is noise, not a relationship the ontology leaves out.
pub fn misapplied(ontology: &Ontology, relation: &str, fitted: &str) -> bool {
    fitted == GENERIC_RELATION
        && relation != GENERIC_RELATION
        && ontology.edge_types.contains_key(relation)
}
