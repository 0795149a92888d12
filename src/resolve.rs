//! Resolution: deciding which mentions are the same node. This module
//! holds the pieces every matching step shares — name normalisation,
//! corporate-suffix folding, character shingles with MinHash/LSH band keys
//! (used as join keys for fuzzy candidates) and the gate that keeps short
//! or generic names out of fuzzy matching.

use std::collections::BTreeSet;

/// Normalises a name for matching: lower case, every run of characters
/// other than letters and digits becomes one space, trimmed. "ACME corp."
/// and "Acme  Corp" both become "acme corp"; "PO-4471" becomes "po 4471".
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut gap = false;
    for c in name.chars() {
        if c.is_alphanumeric() {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.extend(c.to_lowercase());
        } else {
            gap = true;
        }
    }
    out
}

/// Corporate suffixes folded away by default before names are compared
/// ("Acme Corp", "Acme Corporation" and "ACME corp." are all "acme").
pub const DEFAULT_CORPORATE_SUFFIXES: &[&str] = &[
    "inc",
    "incorporated",
    "corp",
    "corporation",
    "co",
    "company",
    "ltd",
    "limited",
    "llc",
    "llp",
    "plc",
    "gmbh",
    "ag",
    "sa",
    "sas",
    "srl",
    "bv",
    "nv",
    "oy",
    "ab",
    "as",
    "pty",
];

/// Removes trailing corporate suffixes from a normalised name, keeping at
/// least one word ("co" alone stays "co").
pub fn fold_suffixes(normalized: &str, suffixes: &[&str]) -> String {
    let mut words: Vec<&str> = normalized.split(' ').filter(|w| !w.is_empty()).collect();
    while words.len() > 1 && words.last().is_some_and(|w| suffixes.contains(w)) {
        words.pop();
    }
    words.join(" ")
}

/// Character 3-shingles of a normalised name, padded so that short words
/// still yield shingles.
pub fn shingles(normalized: &str) -> BTreeSet<String> {
    let padded: Vec<char> = format!(" {normalized} ").chars().collect();
    padded.windows(3).map(|w| w.iter().collect()).collect()
}

/// Jaccard similarity of two shingle sets: shared over all.
pub fn jaccard(a: &BTreeSet<String>, b: &BTreeSet<String>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

/// Whether a name may be matched fuzzily. Names with digits are codes
/// (order numbers, SKUs) whose every character matters; short names and
/// names with little variety ("aaa", "ab ab") match too much by chance.
/// Such names only ever match exactly.
pub fn fuzzy_eligible(normalized: &str) -> bool {
    let letters: Vec<char> = normalized.chars().filter(|c| !c.is_whitespace()).collect();
    if letters.len() < 6 || letters.iter().any(|c| c.is_ascii_digit()) {
        return false;
    }
    // Shannon entropy of the characters, in bits.
    let mut counts = std::collections::BTreeMap::new();
    for c in &letters {
        *counts.entry(*c).or_insert(0usize) += 1;
    }
    let n = letters.len() as f64;
    let entropy: f64 = counts
        .values()
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum();
    entropy >= 2.5
}

fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// MinHash signature of a shingle set with `n` hash functions.
pub fn minhash(shingles: &BTreeSet<String>, n: usize) -> Vec<u64> {
    let bases: Vec<u64> = shingles.iter().map(|s| fnv1a(s)).collect();
    (0..n)
        .map(|i| {
            let seed = splitmix(i as u64 + 1);
            bases
                .iter()
                .map(|b| splitmix(b ^ seed))
                .min()
                .unwrap_or(u64::MAX)
        })
        .collect()
}

/// LSH band keys of a signature: `bands` keys of `signature.len() / bands`
/// rows each. Two names share a key when a whole band agrees; with b bands
/// of r rows, names of Jaccard similarity s share one with probability
/// 1 − (1 − s^r)^b. The band index is mixed in, so keys of different bands
/// never collide by construction.
pub fn band_keys(signature: &[u64], bands: usize) -> Vec<u64> {
    let rows = (signature.len() / bands.max(1)).max(1);
    signature
        .chunks(rows)
        .take(bands)
        .enumerate()
        .map(|(band, chunk)| {
            chunk
                .iter()
                .fold(splitmix(band as u64), |h, v| splitmix(h ^ v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_punctuation_and_spacing_do_not_split_a_name() {
        assert_eq!(normalize_name("ACME corp."), "acme corp");
        assert_eq!(normalize_name("  Acme   Corp "), "acme corp");
        assert_eq!(normalize_name("PO-4471"), "po 4471");
    }

    #[test]
    fn different_digits_stay_different() {
        assert_ne!(normalize_name("PO 4471"), normalize_name("PO 4417"));
    }

    #[test]
    fn non_ascii_letters_are_kept() {
        assert_eq!(normalize_name("Müller GmbH"), "müller gmbh");
    }

    #[test]
    fn corporate_suffixes_fold_to_one_name() {
        let fold = |n: &str| fold_suffixes(&normalize_name(n), DEFAULT_CORPORATE_SUFFIXES);
        assert_eq!(fold("Acme Corp"), "acme");
        assert_eq!(fold("Acme Corporation"), "acme");
        assert_eq!(fold("ACME corp."), "acme");
        assert_eq!(fold("Halvorsen IT Services AS"), "halvorsen it services");
        // A suffix alone is a name, not nothing.
        assert_eq!(fold("Co"), "co");
    }

    #[test]
    fn codes_short_and_repetitive_names_never_match_fuzzily() {
        assert!(!fuzzy_eligible("po 4471"));
        assert!(!fuzzy_eligible("sarah"));
        assert!(!fuzzy_eligible("aaaaaaaa"));
        assert!(fuzzy_eligible("brightline systems"));
        assert!(fuzzy_eligible("priya raman"));
    }

    #[test]
    fn similar_names_share_band_keys_and_different_ones_do_not() {
        let keys = |n: &str| band_keys(&minhash(&shingles(&normalize_name(n)), 64), 16);
        let shared = |a: &str, b: &str| {
            keys(a)
                .iter()
                .zip(keys(b))
                .filter(|(x, y)| **x == *y)
                .count()
        };
        assert!(shared("Brightline Systems", "Brightline System") > 0);
        assert_eq!(shared("Brightline Systems", "Quillfeather Software"), 0);
        let j = jaccard(
            &shingles("brightline systems"),
            &shingles("brightline system"),
        );
        assert!(j > 0.8, "{j}");
        assert!(jaccard(&shingles("acme"), &shingles("apex")) < 0.3);
        assert_eq!(keys("Priya Raman"), keys("Priya Raman"), "deterministic");
    }
}

/// `[resolve]` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResolveSpec {
    /// Edge types (with their subtypes) under which a source node holds at
    /// most one valid fact at a time, e.g. `EMPLOYED_BY`: a newer fact to a
    /// different target invalidates the older one.
    pub functional_edge_types: Vec<String>,
}

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
/// * a new edge with the same endpoints, relation type and fact text (after
///   normalisation) as another is a duplicate: the survivor gets the union
///   of episode ids and the earliest `valid_at`;
/// * within a functional family, facts of one source are taken in
///   `valid_at` order (facts without one are left alone); each fact whose
///   target differs from the next one's is invalidated at the next one's
///   `valid_at` and expired at `now` — also when the newer fact came first
///   or in the same batch. Nothing is deleted.
///
/// `family` maps a relation type to its top-level type.
pub fn resolve_facts(
    new_edges: &mut Vec<crate::store::rows::EdgeRow>,
    committed: &mut [crate::store::rows::EdgeRow],
    functional: &[String],
    family: &dyn Fn(&str) -> String,
    now: chrono::DateTime<chrono::Utc>,
) -> FactResolution {
    use std::collections::HashMap;
    let mut out = FactResolution::default();
    let key = |e: &crate::store::rows::EdgeRow| {
        (
            e.source_node_id.clone(),
            e.target_node_id.clone(),
            e.relation_type.clone(),
            normalize_name(&e.fact),
        )
    };
    // Duplicates: against committed edges first, then earlier new edges.
    let mut seen: HashMap<(String, String, String, String), (bool, usize)> = HashMap::new();
    for (i, e) in committed.iter().enumerate() {
        seen.entry(key(e)).or_insert((true, i));
    }
    let mut kept: Vec<crate::store::rows::EdgeRow> = Vec::with_capacity(new_edges.len());
    for e in new_edges.drain(..) {
        let k = key(&e);
        let target = match seen.get(&k) {
            Some((true, i)) => Some(&mut committed[*i]),
            Some((false, i)) => Some(&mut kept[*i]),
            None => None,
        };
        match target {
            Some(t) => {
                for id in &e.episode_ids {
                    if !t.episode_ids.contains(id) {
                        t.episode_ids.push(id.clone());
                    }
                }
                t.valid_at = match (t.valid_at, e.valid_at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if seen.get(&k).is_some_and(|(c, _)| *c) {
                    out.changed_committed.insert(t.edge_id.clone());
                }
                out.duplicates += 1;
            }
            None => {
                seen.insert(k, (false, kept.len()));
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
            if e.target_node_id == newer_target {
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
        let r = resolve_facts(&mut new, &mut committed, &[], &family, Utc::now());
        assert_eq!(r.invalidated, 0);
        let mut committed = vec![edge("c", "acme", Some(2021))];
        let mut new = vec![edge("n", "acme", Some(2023))];
        new[0].fact = "Priya still works for acme.".into();
        let r = resolve_facts(
            &mut new,
            &mut committed,
            &["EMPLOYED_BY".into()],
            &family,
            Utc::now(),
        );
        assert_eq!((r.invalidated, r.duplicates), (0, 0));
    }

    #[test]
    fn a_duplicate_of_a_committed_fact_merges_into_it() {
        let mut committed = vec![edge("c", "acme", Some(2022))];
        let mut new = vec![edge("n", "acme", Some(2021))];
        let r = resolve_facts(&mut new, &mut committed, &[], &family, Utc::now());
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
}
