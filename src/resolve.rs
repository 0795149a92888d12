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
