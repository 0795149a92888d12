//! Relations refine types (domain and range inference): a fact whose
//! relation only holds between subtypes of its ends' types says which
//! subtype an end is. "Lumen Foundation hosts quillparse" under `HOSTS`
//! (Foundation → Project) makes an `Organization` the walk left at its
//! parent a `Foundation`, whatever the one-line descriptions told the walk.
//!
//! The fact call and the edge walk offer such relations for ends still at a
//! parent type ([`Ontology::entity_may_be`]); this step, after both, reads
//! what each end's facts require of it. An end takes the deepest type its
//! facts require when they all lie on one chain below its type; when two
//! facts require two different subtypes it stays where it is. Every fact
//! whose relation still does not allow its ends' final types is then kept
//! under the nearest type that does ([`fitting_relation`]), with a
//! `failures` row saying so, and dropped (with a row) only when none does.

use std::collections::BTreeMap;

use crate::extract::{ExtractSpec, FactMention, Mention, Rejected, fitting_relation};
use crate::ontology::Ontology;
use crate::stage::Stage;

/// What [`refine_by_relations`] did to one episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refined {
    /// Mentions moved down to a subtype by their facts.
    pub mentions: usize,
    /// Facts kept under another type than the one given, because an end
    /// could not be refined.
    pub refit: usize,
    /// Facts dropped: no type fits their ends.
    pub dropped: usize,
}

/// The subtype each end of a fact of `relation` must be for the relation
/// to hold between ends of types `source` and `target`, when its
/// `source_targets` say so with one voice; `None` for an end that fits
/// already, or whose pairs disagree about it (a `DEPENDS_ON` from a
/// `Project` may start at either of two kinds of project).
fn required(
    ontology: &Ontology,
    relation: &str,
    source: &str,
    target: &str,
) -> (Option<String>, Option<String>) {
    if ontology.edge_allows(relation, source, target) {
        return (None, None);
    }
    let Some(pairs) = ontology.edge_pairs_maybe(relation, source, target) else {
        return (None, None);
    };
    let one = |have: &str, wants: Vec<&str>| -> Option<String> {
        let mut kinds: Vec<&str> = wants
            .into_iter()
            .map(|w| {
                if ontology.entity_fits(have, w) {
                    have
                } else {
                    w
                }
            })
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        match kinds.as_slice() {
            [kind] if *kind != have => Some(kind.to_string()),
            _ => None,
        }
    };
    (
        one(source, pairs.iter().map(|p| p.0).collect()),
        one(target, pairs.iter().map(|p| p.1).collect()),
    )
}

/// Refines the types of one episode's `mentions` by its `facts` (whose
/// `source` and `target` index `mentions`), then refits every fact whose
/// relation its ends' types do not allow. Returns the counts and the
/// `failures` rows.
pub fn refine_by_relations(
    ontology: &Ontology,
    spec: &ExtractSpec,
    mentions: &mut [Mention],
    facts: &mut Vec<FactMention>,
) -> (Refined, Vec<Rejected>) {
    let mut counts = Refined::default();
    let mut rejected = Vec::new();
    // Each mention's requirements, with the relation that makes each.
    let mut wants: BTreeMap<usize, Vec<(String, String)>> = BTreeMap::new();
    for f in facts.iter() {
        let relation = f.relation_type();
        let (st, tt) = (
            mentions[f.source].type_name(),
            mentions[f.target].type_name(),
        );
        let (s, t) = required(ontology, relation, st, tt);
        for (end, kind) in [(f.source, s), (f.target, t)] {
            if let Some(kind) = kind {
                wants
                    .entry(end)
                    .or_default()
                    .push((kind, relation.to_string()));
            }
        }
    }
    for (end, kinds) in wants {
        let m = &mut mentions[end];
        let deepest = kinds
            .iter()
            .max_by_key(|(k, _)| ontology.entity_tree.get(k).map_or(0, |n| n.depth))
            .map(|(k, _)| k.clone())
            .unwrap_or_default();
        let on_one_chain = kinds
            .iter()
            .all(|(k, _)| ontology.entity_tree.is_a(&deepest, k));
        if !on_one_chain {
            let asked: Vec<String> = kinds.iter().map(|(k, r)| format!("{k} ({r})")).collect();
            rejected.push(Rejected {
                stage: Stage::ClassifyEntities,
                episode_id: m.episode_id.clone(),
                reason: format!(
                    "its facts call for different kinds of `{}`: {}; it stays `{}`",
                    m.type_name(),
                    asked.join(", "),
                    m.type_name()
                ),
                excerpt: m.name.clone(),
            });
            continue;
        }
        let Some(chain) = ontology.entity_tree.chain(&deepest) else {
            continue;
        };
        // Properties of the new last type replace the parent's, as in the
        // walk: those the subtype declares too are kept.
        let declared: Vec<String> = ontology
            .entity_types
            .get(&deepest)
            .map(|t| spec.properties.of(t).into_iter().map(|p| p.name).collect())
            .unwrap_or_default();
        m.attributes.retain(|k, _| declared.contains(k));
        m.chain = chain;
        counts.mentions += 1;
    }
    facts.retain_mut(|f| {
        let relation = f.relation_type().to_string();
        let (st, tt) = (
            mentions[f.source].type_name(),
            mentions[f.target].type_name(),
        );
        if ontology.edge_allows(&relation, st, tt) {
            return true;
        }
        let row = |reason: String| Rejected {
            stage: Stage::ClassifyFacts,
            episode_id: f.episode_id.clone(),
            reason,
            excerpt: f.fact.clone(),
        };
        let Some((fitted, swap)) = fitting_relation(ontology, &relation, st, tt) else {
            rejected.push(row(format!(
                "`{relation}` does not allow {st} → {tt}, the ends' types could not be refined to fit it, and no other type fits; fact dropped"
            )));
            counts.dropped += 1;
            return false;
        };
        rejected.push(row(format!(
            "`{relation}` does not allow {st} → {tt} and the ends' types could not be refined to fit it; kept as {fitted}"
        )));
        f.chain = ontology
            .edge_tree
            .chain(&fitted)
            .unwrap_or_else(|| vec![fitted.clone()]);
        if swap {
            std::mem::swap(&mut f.source, &mut f.target);
        }
        counts.refit += 1;
        true
    });
    (counts, rejected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    /// Two hierarchies whose relations name subtypes, as a user writes them
    /// for an archive of open-source projects.
    fn projects() -> Ontology {
        let spec: crate::ontology::OntologySpec = toml::from_str(
            r#"
            [[entity_types]]
            name = "Organization"
            description = "A group."
            [[entity_types]]
            name = "Foundation"
            description = "A non-profit."
            [[entity_types]]
            name = "Company"
            description = "A business."
            [[entity_types]]
            name = "Project"
            description = "A project."
            [[entity_types]]
            name = "Library"
            description = "A library."
            [[entity_types]]
            name = "CommandLineTool"
            description = "A tool."
            [[edge_types]]
            name = "SUPPORTS"
            description = "Backs."
            source_targets = [{ source = "Organization", target = "Project" }]
            [[edge_types]]
            name = "HOSTS"
            description = "Hosts."
            source_targets = [{ source = "Foundation", target = "Project" }]
            [[edge_types]]
            name = "SPONSORS"
            description = "Pays."
            source_targets = [{ source = "Company", target = "Project" }]
            [[edge_types]]
            name = "DEPENDS_ON"
            description = "Uses."
            source_targets = [{ source = "CommandLineTool", target = "Library" }, { source = "Library", target = "Library" }]
            [entity_type_hierarchy]
            Organization = { Foundation = {}, Company = {} }
            Project = { Library = {}, CommandLineTool = {} }
            [edge_type_hierarchy]
            SUPPORTS = { HOSTS = {}, SPONSORS = {} }
            "#,
        )
        .expect("ontology spec");
        Ontology::try_from(&spec).expect("valid ontology")
    }

    fn mention(name: &str, chain: &[&str]) -> Mention {
        Mention {
            episode_id: "e".into(),
            name: name.into(),
            chain: chain.iter().map(|t| t.to_string()).collect(),
            attributes: Map::new(),
            context: String::new(),
            mapped: false,
        }
    }

    fn fact(source: usize, target: usize, chain: &[&str]) -> FactMention {
        FactMention {
            episode_id: "e".into(),
            source,
            target,
            chain: chain.iter().map(|t| t.to_string()).collect(),
            fact: "stated".into(),
            valid_at: None,
            invalid_at: None,
            mapped: false,
            written_types: Vec::new(),
            start_stated: false,
            moved: false,
        }
    }

    fn chains(mentions: &[Mention]) -> Vec<String> {
        mentions.iter().map(|m| m.chain.join("/")).collect()
    }

    #[test]
    fn a_relation_between_subtypes_refines_ends_left_at_their_parent() {
        let o = projects();
        let mut mentions = vec![
            mention("Lumen Foundation", &["Organization"]),
            mention("quillparse", &["Project"]),
            mention("Brightforge", &["Organization"]),
        ];
        let mut facts = vec![
            fact(0, 1, &["SUPPORTS", "HOSTS"]),
            fact(2, 1, &["SUPPORTS", "SPONSORS"]),
        ];
        let (counts, rejected) =
            refine_by_relations(&o, &ExtractSpec::default(), &mut mentions, &mut facts);
        assert_eq!(
            chains(&mentions),
            ["Organization/Foundation", "Project", "Organization/Company"]
        );
        assert_eq!(counts.mentions, 2);
        assert_eq!(counts.refit, 0);
        assert!(rejected.is_empty(), "{rejected:?}");
        let kept: Vec<&str> = facts.iter().map(FactMention::relation_type).collect();
        assert_eq!(kept, ["HOSTS", "SPONSORS"]);
    }

    #[test]
    fn an_end_whose_facts_want_two_subtypes_stays_and_its_facts_fall_back_to_the_parent_type() {
        let o = projects();
        let mut mentions = vec![
            mention("Lumen", &["Organization"]),
            mention("quillparse", &["Project"]),
        ];
        let mut facts = vec![
            fact(0, 1, &["SUPPORTS", "HOSTS"]),
            fact(0, 1, &["SUPPORTS", "SPONSORS"]),
        ];
        let (counts, rejected) =
            refine_by_relations(&o, &ExtractSpec::default(), &mut mentions, &mut facts);
        assert_eq!(chains(&mentions), ["Organization", "Project"]);
        assert_eq!(
            counts,
            Refined {
                mentions: 0,
                refit: 2,
                dropped: 0
            }
        );
        let kept: Vec<&str> = facts.iter().map(FactMention::relation_type).collect();
        assert_eq!(kept, ["SUPPORTS", "SUPPORTS"]);
        // One row for the entity, one per fact kept under its parent.
        assert_eq!(rejected.len(), 3, "{rejected:?}");
        assert!(
            rejected[0].reason.contains("Foundation (HOSTS)"),
            "{rejected:?}"
        );
        assert!(
            rejected[1].reason.contains("kept as SUPPORTS"),
            "{rejected:?}"
        );
    }

    #[test]
    fn an_end_the_pairs_disagree_about_stays_while_the_other_end_is_refined() {
        let o = projects();
        let mut mentions = vec![
            mention("quillcli", &["Project"]),
            mention("quillparse", &["Project"]),
        ];
        let mut facts = vec![fact(0, 1, &["DEPENDS_ON"])];
        let (counts, rejected) =
            refine_by_relations(&o, &ExtractSpec::default(), &mut mentions, &mut facts);
        // Both kinds of project may depend on a library: the target is a
        // library, the source is left to other evidence, and the fact,
        // which `DEPENDS_ON` cannot hold from a bare project, is kept
        // under the generic type with a row.
        assert_eq!(chains(&mentions), ["Project", "Project/Library"]);
        assert_eq!(counts.mentions, 1);
        assert_eq!(facts.len(), 1);
        assert_eq!(facts[0].relation_type(), crate::extract::GENERIC_RELATION);
        assert_eq!(rejected.len(), 1, "{rejected:?}");
    }

    #[test]
    fn a_fact_that_fits_already_changes_nothing() {
        let o = projects();
        let mut mentions = vec![
            mention("Brightforge", &["Organization", "Company"]),
            mention("quillparse", &["Project", "Library"]),
        ];
        let mut facts = vec![
            fact(0, 1, &["SUPPORTS"]),
            fact(0, 1, &["SUPPORTS", "SPONSORS"]),
        ];
        let before = facts.clone();
        let (counts, rejected) =
            refine_by_relations(&o, &ExtractSpec::default(), &mut mentions, &mut facts);
        assert_eq!(counts, Refined::default());
        assert!(rejected.is_empty());
        assert_eq!(facts, before);
    }
}
