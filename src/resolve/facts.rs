//! Fact resolution: duplicate facts fold into one edge and, within
//! functional edge families or by LLM judgement, a newer fact invalidates
//! an older contradicting one. Nothing is deleted.

use super::{jaccard, normalize_name, shingle_hashes};
use crate::store::rows::EdgeRow;

/// What fact resolution changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FactResolution {
    /// New edges folded into an existing or earlier edge.
    pub duplicates: usize,
    /// Edges invalidated by a newer contradicting fact.
    pub invalidated: usize,
    /// Committed edges that changed and must be written back.
    pub changed_committed: std::collections::BTreeSet<String>,
}

/// Resolves this run's edges against each other and against committed
/// edges of the same source nodes (`committed`, all still unexpired):
///
/// * a new edge with the same endpoints and relation type as another, and
///   a fact text equal after normalisation or at least
///   `duplicate_similarity` alike (3-shingle Jaccard), is a duplicate: the survivor gets the union
///   of episode ids and the earliest `valid_at`;
/// * within a functional family, facts of one source are taken in
///   `valid_at` order (facts without one are left alone); each fact whose
///   target differs from the next one's is invalidated at the next one's
///   `valid_at` and expired at `now` — also when the newer fact came first
///   or in the same batch. Nothing is deleted.
///
/// `family` maps a relation type to its top-level type.
pub fn resolve_facts(
    new_edges: &mut Vec<EdgeRow>,
    committed: &mut [EdgeRow],
    functional: &[String],
    family: &dyn Fn(&str) -> String,
    duplicate_similarity: f64,
    now: chrono::DateTime<chrono::Utc>,
) -> FactResolution {
    use std::collections::HashMap;
    let mut out = FactResolution::default();
    // Duplicates: same endpoints and relation type, and fact texts equal
    // after normalisation or at least `duplicate_similarity` alike;
    // against committed edges first, then earlier new edges.
    type Slot = (bool, usize, Vec<u64>);
    let key = |e: &EdgeRow| {
        (
            e.source_node_id.clone(),
            e.target_node_id.clone(),
            e.relation_type.clone(),
        )
    };
    let mut seen: HashMap<(String, String, String), Vec<Slot>> = HashMap::new();
    for (i, e) in committed.iter().enumerate() {
        seen.entry(key(e))
            .or_default()
            .push((true, i, shingle_hashes(&normalize_name(&e.fact))));
    }
    let mut kept: Vec<EdgeRow> = Vec::with_capacity(new_edges.len());
    let mut episodes_of: HashMap<(bool, usize), std::collections::HashSet<String>> = HashMap::new();
    for e in new_edges.drain(..) {
        let k = key(&e);
        let text = shingle_hashes(&normalize_name(&e.fact));
        let found = seen.get(&k).and_then(|slots| {
            slots
                .iter()
                .find(|(_, _, t)| *t == text || jaccard(t, &text) >= duplicate_similarity)
                .map(|(c, i, _)| (*c, *i))
        });
        match found {
            Some((is_committed, i)) => {
                let t = if is_committed {
                    &mut committed[i]
                } else {
                    &mut kept[i]
                };
                // A set per surviving edge: a fact stated in thousands of
                // episodes must not cost their number squared.
                let ids = episodes_of
                    .entry((is_committed, i))
                    .or_insert_with(|| t.episode_ids.iter().cloned().collect());
                for id in &e.episode_ids {
                    if ids.insert(id.clone()) {
                        t.episode_ids.push(id.clone());
                    }
                }
                t.valid_at = match (t.valid_at, e.valid_at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if is_committed {
                    out.changed_committed.insert(t.edge_id.clone());
                }
                out.duplicates += 1;
            }
            None => {
                seen.entry(k).or_default().push((false, kept.len(), text));
                kept.push(e);
            }
        }
    }
    *new_edges = kept;

    // Contradictions within functional families, in valid_at order.
    let functional: std::collections::BTreeSet<&str> =
        functional.iter().map(String::as_str).collect();
    let mut groups: HashMap<(String, String), Vec<(bool, usize)>> = HashMap::new();
    for (i, e) in committed.iter().enumerate() {
        let f = family(&e.relation_type);
        if functional.contains(f.as_str()) && e.valid_at.is_some() && e.expired_at.is_none() {
            groups
                .entry((e.source_node_id.clone(), f))
                .or_default()
                .push((true, i));
        }
    }
    for (i, e) in new_edges.iter().enumerate() {
        let f = family(&e.relation_type);
        if functional.contains(f.as_str()) && e.valid_at.is_some() {
            groups
                .entry((e.source_node_id.clone(), f))
                .or_default()
                .push((false, i));
        }
    }
    for members in groups.values_mut() {
        // (valid_at, target) of each member, read before any change.
        let facts: Vec<(Option<chrono::DateTime<chrono::Utc>>, String)> = members
            .iter()
            .map(|m| {
                let e = if m.0 {
                    &committed[m.1]
                } else {
                    &new_edges[m.1]
                };
                (e.valid_at, e.target_node_id.clone())
            })
            .collect();
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|k| facts[*k].0);
        for w in 0..order.len().saturating_sub(1) {
            let (older, newer) = (members[order[w]], &facts[order[w + 1]]);
            let (newer_valid, newer_target) = (newer.0, newer.1.clone());
            let e = if older.0 {
                &mut committed[older.1]
            } else {
                &mut new_edges[older.1]
            };
            // Facts that became true at the same time cannot be ordered:
            // neither is taken for the current one, both stay valid.
            if e.target_node_id == newer_target || e.valid_at == newer_valid {
                continue;
            }
            let until = match (e.invalid_at, newer_valid) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if e.expired_at.is_none() {
                e.invalid_at = until;
                e.expired_at = Some(now);
                out.invalidated += 1;
                if older.0 {
                    out.changed_committed.insert(e.edge_id.clone());
                }
            }
        }
    }
    out
}

/// Where an edge lives during fact resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EdgeRef {
    /// A committed edge, by position.
    Committed(usize),
    /// A new edge of this run, by position.
    New(usize),
}

/// Facts the LLM should judge for contradiction: for each valid new edge
/// outside the functional families, the other valid edges of the same
/// source and relation family that point elsewhere or say something else
/// about the same target (at most `max` of them, most recent first).
pub fn contradiction_candidates(
    new_edges: &[EdgeRow],
    committed: &[EdgeRow],
    functional: &[String],
    family: &dyn Fn(&str) -> String,
    max: usize,
) -> Vec<(usize, Vec<EdgeRef>)> {
    use std::cmp::Reverse;
    use std::collections::{BTreeSet, HashMap};
    let live = |e: &EdgeRow| e.expired_at.is_none() && e.invalid_at.is_none();
    // Peers per (source, family), committed first, then new, each in
    // order; functional families are settled without the LLM.
    let mut by_source: HashMap<(&str, String), Vec<EdgeRef>> = HashMap::new();
    for (i, e) in committed.iter().enumerate().filter(|(_, e)| live(e)) {
        by_source
            .entry((e.source_node_id.as_str(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::Committed(i));
    }
    for (i, e) in new_edges.iter().enumerate().filter(|(_, e)| live(e)) {
        by_source
            .entry((e.source_node_id.as_str(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::New(i));
    }
    let get = |r: EdgeRef| match r {
        EdgeRef::Committed(i) => &committed[i],
        EdgeRef::New(i) => &new_edges[i],
    };
    let mut found: Vec<(usize, Vec<EdgeRef>)> = Vec::new();
    for ((_, f), peers) in &by_source {
        if functional.contains(f) {
            continue;
        }
        // A new edge is asked about the committed peers and the new peers
        // before it (each pair of new edges once: the later one asks),
        // most recent first, ties in peer order, skipping those with its
        // target and its normalised text. `ready` holds exactly those
        // peers, ordered so, as the new edges are taken in order: each
        // question reads the first few, not the whole group.
        let texts: Vec<String> = peers
            .iter()
            .map(|r| normalize_name(&get(*r).fact))
            .collect();
        let key = |k: usize| (Reverse(get(peers[k]).valid_at), k);
        let mut ready: BTreeSet<(Reverse<Option<chrono::DateTime<chrono::Utc>>>, usize)> =
            BTreeSet::new();
        for (k, r) in peers.iter().enumerate() {
            match r {
                EdgeRef::Committed(_) => {
                    ready.insert(key(k));
                }
                EdgeRef::New(i) => {
                    let e = &new_edges[*i];
                    let others: Vec<EdgeRef> = ready
                        .iter()
                        .filter(|(_, j)| {
                            get(peers[*j]).target_node_id != e.target_node_id
                                || texts[*j] != texts[k]
                        })
                        .take(max.max(1))
                        .map(|(_, j)| peers[*j])
                        .collect();
                    if !others.is_empty() {
                        found.push((*i, others));
                    }
                    ready.insert(key(k));
                }
            }
        }
    }
    found.sort_by_key(|(i, _)| *i);
    found
}

/// Applies contradiction verdicts: of each contradicting pair the fact
/// that became true earlier (`valid_at`, else when it was recorded) is
/// invalidated at the other's `valid_at` and expired at `now`. Already
/// expired facts, and pairs that became true at the same moment (no
/// order to go by), stay as they are.
pub fn apply_contradictions(
    new_edges: &mut [EdgeRow],
    committed: &mut [EdgeRow],
    pairs: &[(usize, EdgeRef)],
    now: chrono::DateTime<chrono::Utc>,
    out: &mut FactResolution,
) {
    for &(i, other) in pairs {
        let new_time = new_edges[i].valid_at.unwrap_or(new_edges[i].created_at);
        let (o_time, o_valid) = match other {
            EdgeRef::Committed(j) => (
                committed[j].valid_at.unwrap_or(committed[j].created_at),
                committed[j].valid_at,
            ),
            EdgeRef::New(j) => (
                new_edges[j].valid_at.unwrap_or(new_edges[j].created_at),
                new_edges[j].valid_at,
            ),
        };
        // Facts that became true at the same time cannot be ordered:
        // neither is taken for the current one, both stay valid.
        if o_time == new_time {
            continue;
        }
        let (older, until) = if o_time < new_time {
            (other, new_edges[i].valid_at.or(Some(now)))
        } else {
            (EdgeRef::New(i), o_valid.or(Some(now)))
        };
        let e = match older {
            EdgeRef::Committed(j) => &mut committed[j],
            EdgeRef::New(j) => &mut new_edges[j],
        };
        if e.expired_at.is_some() {
            continue;
        }
        e.invalid_at = until;
        e.expired_at = Some(now);
        out.invalidated += 1;
        if let EdgeRef::Committed(_) = older {
            out.changed_committed.insert(e.edge_id.clone());
        }
    }
}

#[cfg(test)]
mod fact_tests {
    use super::*;
    use crate::store::rows::EdgeRow;
    use chrono::{TimeZone, Utc};

    fn edge(id: &str, target: &str, valid: Option<i32>) -> EdgeRow {
        EdgeRow {
            edge_id: id.into(),
            group_id: "g".into(),
            source_node_id: "priya".into(),
            target_node_id: target.into(),
            relation_type: "WORKS_FULL_TIME_FOR".into(),
            fact: format!("Priya works for {target}."),
            attributes: "{}".into(),
            episode_ids: vec![format!("ep-{id}")],
            valid_at: valid.map(|y| Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap()),
            invalid_at: None,
            created_at: Utc::now(),
            expired_at: None,
            fact_embedding: None,
            origin: "extract".into(),
            run_id: "r".into(),
        }
    }

    fn family(_: &str) -> String {
        "EMPLOYED_BY".into()
    }

    #[test]
    fn a_new_fact_that_predates_a_committed_one_is_stored_already_invalid() {
        let mut committed = vec![edge("c", "brightline", Some(2025))];
        let mut new = vec![edge("n", "acme", Some(2021))];
        let now = Utc::now();
        let r = resolve_facts(
            &mut new,
            &mut committed,
            &["EMPLOYED_BY".into()],
            &family,
            0.9,
            now,
        );
        assert_eq!(r.invalidated, 1);
        assert!(
            r.changed_committed.is_empty(),
            "the committed, newer fact stays valid"
        );
        assert_eq!(new[0].invalid_at, committed[0].valid_at);
        assert_eq!(new[0].expired_at, Some(now));
        assert_eq!(committed[0].expired_at, None);
    }

    #[test]
    fn non_functional_types_and_same_targets_are_left_alone() {
        let mut committed = vec![edge("c", "acme", Some(2021))];
        let mut new = vec![edge("n", "brightline", Some(2025))];
        let r = resolve_facts(&mut new, &mut committed, &[], &family, 0.9, Utc::now());
        assert_eq!(r.invalidated, 0);
        let mut committed = vec![edge("c", "acme", Some(2021))];
        let mut new = vec![edge("n", "acme", Some(2023))];
        new[0].fact = "Priya still works for acme.".into();
        let r = resolve_facts(
            &mut new,
            &mut committed,
            &["EMPLOYED_BY".into()],
            &family,
            0.9,
            Utc::now(),
        );
        assert_eq!((r.invalidated, r.duplicates), (0, 0));
    }

    #[test]
    fn a_duplicate_of_a_committed_fact_merges_into_it() {
        let mut committed = vec![edge("c", "acme", Some(2022))];
        let mut new = vec![edge("n", "acme", Some(2021))];
        let r = resolve_facts(&mut new, &mut committed, &[], &family, 0.9, Utc::now());
        assert_eq!(r.duplicates, 1);
        assert!(new.is_empty());
        assert_eq!(
            committed[0].episode_ids,
            vec!["ep-c".to_string(), "ep-n".to_string()]
        );
        assert_eq!(
            committed[0].valid_at,
            Some(Utc.with_ymd_and_hms(2021, 1, 1, 0, 0, 0).unwrap()),
            "earliest valid_at kept"
        );
        assert!(r.changed_committed.contains("c"));
    }

    #[test]
    fn near_identical_fact_texts_are_one_fact() {
        let mut committed = vec![edge("c", "acme", Some(2022))];
        committed[0].fact = "Priya Raman works for Acme as a buyer.".into();
        let mut new = vec![edge("n", "acme", Some(2022))];
        new[0].fact = "Priya Raman works for Acme as a buyer".into();
        let r = resolve_facts(&mut new, &mut committed, &[], &family, 0.9, Utc::now());
        assert_eq!(r.duplicates, 1);
        let mut new = vec![edge("n", "acme", Some(2022))];
        new[0].fact = "Priya Raman left Acme.".into();
        let r = resolve_facts(&mut new, &mut committed, &[], &family, 0.9, Utc::now());
        assert_eq!(r.duplicates, 0, "a different statement is not a duplicate");
    }

    #[test]
    fn a_judged_contradiction_invalidates_the_older_fact_whichever_came_first() {
        let now = Utc::now();
        let mut committed = vec![edge("c", "acme", Some(2020))];
        let mut new = vec![edge("n", "brightline", Some(2024))];
        let cases = contradiction_candidates(&new, &committed, &[], &family, 4);
        assert_eq!(cases, vec![(0, vec![EdgeRef::Committed(0)])]);
        let mut out = FactResolution::default();
        apply_contradictions(
            &mut new,
            &mut committed,
            &[(0, EdgeRef::Committed(0))],
            now,
            &mut out,
        );
        assert_eq!(committed[0].invalid_at, new[0].valid_at);
        assert_eq!(committed[0].expired_at, Some(now));
        assert!(out.changed_committed.contains("c"));
        assert_eq!(new[0].expired_at, None);

        // Out of order: the new fact is the older one.
        let mut committed = vec![edge("c", "acme", Some(2024))];
        let mut new = vec![edge("n", "brightline", Some(2020))];
        let mut out = FactResolution::default();
        apply_contradictions(
            &mut new,
            &mut committed,
            &[(0, EdgeRef::Committed(0))],
            now,
            &mut out,
        );
        assert_eq!(new[0].invalid_at, committed[0].valid_at);
        assert_eq!(committed[0].expired_at, None);
        assert!(out.changed_committed.is_empty());
    }

    #[test]
    fn functional_types_are_not_sent_to_the_judge() {
        let committed = vec![edge("c", "acme", Some(2020))];
        let new = vec![edge("n", "brightline", Some(2024))];
        let cases = contradiction_candidates(&new, &committed, &["EMPLOYED_BY".into()], &family, 4);
        assert!(cases.is_empty());
    }

    #[test]
    fn facts_that_became_true_at_the_same_moment_both_stay_valid() {
        let now = Utc::now();
        let mut committed = vec![edge("c", "acme", Some(2024))];
        let mut new = vec![edge("n", "brightline", Some(2024))];
        let mut out = FactResolution::default();
        apply_contradictions(
            &mut new,
            &mut committed,
            &[(0, EdgeRef::Committed(0))],
            now,
            &mut out,
        );
        assert_eq!(out.invalidated, 0);
        assert_eq!((committed[0].expired_at, new[0].expired_at), (None, None));
        let r = resolve_facts(
            &mut new,
            &mut committed,
            &["EMPLOYED_BY".into()],
            &family,
            0.9,
            now,
        );
        assert_eq!(r.invalidated, 0, "functional types too");
    }
}
