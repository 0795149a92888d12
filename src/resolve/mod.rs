//! Resolution: deciding which mentions are the same node, and which facts
//! are the same or contradict each other.
//!
//! * [`entities`] finds candidates with DataFusion joins (folded names,
//!   identity properties, MinHash/LSH band keys, partial names) and turns
//!   them into clusters under the merge rules;
//! * [`judge`] asks the LLM, in batches, about what the rules leave open
//!   (ambiguous entities, contradicting facts);
//! * [`facts`] folds duplicate facts and invalidates contradicted ones;
//! * [`stage`] puts them together for a run, from classified mentions and
//!   facts to node and edge rows.
//!
//! This file holds the pieces they share: name normalisation,
//! corporate-suffix folding, character shingles with MinHash/LSH band keys
//! and the gate that keeps short or generic names out of fuzzy matching.

pub mod entities;
pub mod facts;
pub mod judge;
pub mod stage;

pub use facts::{FactResolution, resolve_facts};

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
pub fn fold_suffixes<S: AsRef<str>>(normalized: &str, suffixes: &[S]) -> String {
    // Most names end in no suffix: answer those without splitting.
    let last = normalized.rsplit(' ').next().unwrap_or(normalized);
    if last.len() == normalized.trim().len() || !suffixes.iter().any(|s| s.as_ref() == last) {
        return normalized.to_string();
    }
    let mut words: Vec<&str> = normalized.split(' ').filter(|w| !w.is_empty()).collect();
    while words.len() > 1
        && words
            .last()
            .is_some_and(|w| suffixes.iter().any(|s| s.as_ref() == *w))
    {
        words.pop();
    }
    words.join(" ")
}

/// Hashes of the character 3-shingles of a normalised name, sorted and
/// without repeats. The name is padded with a space on each side so short
/// words still yield shingles and word starts and ends count.
pub fn shingle_hashes(normalized: &str) -> Vec<u64> {
    let mut chars: Vec<u32> = Vec::with_capacity(normalized.len() + 2);
    chars.push(u32::from(' '));
    chars.extend(normalized.chars().map(u32::from));
    chars.push(u32::from(' '));
    let mut out: Vec<u64> = chars
        .windows(3)
        .map(|w| {
            let packed = (u64::from(w[0]) << 42) ^ (u64::from(w[1]) << 21) ^ u64::from(w[2]);
            splitmix(packed)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Jaccard similarity of two sorted shingle-hash sets: shared over all.
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    let (mut i, mut j, mut shared) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                shared += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - shared;
    if union == 0 {
        return 1.0;
    }
    shared as f64 / union as f64
}

/// Similarity of two normalised names: Jaccard of their 3-shingles.
pub fn name_similarity(a: &str, b: &str) -> f64 {
    jaccard(&shingle_hashes(a), &shingle_hashes(b))
}

/// Whether a name may be matched fuzzily. Names with digits are codes
/// (order numbers, SKUs) whose every character matters; short names and
/// names with little variety ("aaa", "ab ab") match too much by chance.
/// Such names only ever match exactly.
pub fn fuzzy_eligible(normalized: &str) -> bool {
    let letters: Vec<char> = normalized.chars().filter(|c| !c.is_whitespace()).collect();
    if letters.len() < 6 || letters.iter().any(|c| c.is_numeric()) {
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

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// MinHash signature of a shingle-hash set with `n` hash functions. The
/// shingle hashes are already well mixed, so each function is one
/// multiply-add with its own odd multiplier (cheap enough for ten million
/// names per run).
pub fn minhash(shingles: &[u64], n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let a = splitmix(2 * i as u64 + 1) | 1;
            let b = splitmix(2 * i as u64 + 2);
            shingles
                .iter()
                .map(|s| s.wrapping_mul(a).wrapping_add(b))
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

/// The band keys of a normalised (folded) name, or none when the name may
/// not match fuzzily.
pub fn name_band_keys(folded: &str, bands: usize, rows: usize) -> Vec<u64> {
    if !fuzzy_eligible(folded) {
        return Vec::new();
    }
    band_keys(&minhash(&shingle_hashes(folded), bands * rows), bands)
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
        let keys = |n: &str| band_keys(&minhash(&shingle_hashes(&normalize_name(n)), 64), 16);
        let shared = |a: &str, b: &str| {
            keys(a)
                .iter()
                .zip(keys(b))
                .filter(|(x, y)| **x == *y)
                .count()
        };
        assert!(shared("Brightline Systems", "Brightline System") > 0);
        assert_eq!(shared("Brightline Systems", "Quillfeather Software"), 0);
        let j = name_similarity("brightline systems", "brightline system");
        assert!(j > 0.8, "{j}");
        assert!(name_similarity("acme", "apex") < 0.3);
        assert!(
            name_band_keys("po 4471", 8, 4).is_empty(),
            "codes never match fuzzily"
        );
        assert_eq!(keys("Priya Raman"), keys("Priya Raman"), "deterministic");
    }
}

/// `[resolve]` settings. Every key is optional; the defaults are the ones
/// documented in the README.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResolveSpec {
    /// Edge types (with their subtypes) under which a source node holds at
    /// most one valid fact at a time, e.g. `EMPLOYED_BY`: a newer fact to a
    /// different target invalidates the older one without asking the LLM.
    pub functional_edge_types: Vec<String>,
    /// Trailing words dropped before names are compared ("Acme Corp" and
    /// "Acme Corporation" are both "acme"). Default:
    /// [`DEFAULT_CORPORATE_SUFFIXES`].
    pub corporate_suffixes: Vec<String>,
    /// Look for fuzzy candidates through MinHash/LSH band keys.
    pub fuzzy: bool,
    /// Name similarity (Jaccard of 3-shingles) at or above which a fuzzy
    /// candidate that is the only one merges without asking.
    pub fuzzy_merge_threshold: f64,
    /// Lower end of the grey band: fuzzy candidates scoring in
    /// `[grey_band_min, fuzzy_merge_threshold)` go to LLM adjudication (or
    /// stay separate without it).
    pub grey_band_min: f64,
    /// LSH bands; with `lsh_rows` rows each they set the similarity at
    /// which names become candidates (about (1/bands)^(1/rows)).
    pub lsh_bands: usize,
    /// Rows (MinHash functions) per LSH band.
    pub lsh_rows: usize,
    /// Band keys shared by more names than this are skipped: such a key
    /// says little (short, common syllables) and would pair everything in
    /// it with everything; true duplicates still meet in other bands.
    pub lsh_max_bucket: usize,
    /// A one-word name ("Sarah") merges into the only compatible
    /// multi-word name starting with that word ("Sarah Brown"); with two
    /// or more such names it is ambiguous.
    pub partial_names: bool,
    /// Ask the LLM about ambiguous entities (several candidates, grey-band
    /// scores). Off: they stay separate.
    pub adjudicate: bool,
    /// Ambiguous entities per adjudication call.
    pub adjudication_batch_size: usize,
    /// Candidates shown per ambiguous entity (the best scoring first).
    pub max_candidates: usize,
    /// Ask the LLM whether facts of one source and relation type (other
    /// than the functional ones) contradict each other. Off: only the
    /// functional types invalidate.
    pub judge_contradictions: bool,
    /// New facts per contradiction call.
    pub contradiction_batch_size: usize,
    /// Two facts between the same nodes with the same relation type whose
    /// texts are at least this similar (3-shingle Jaccard) are one fact.
    pub duplicate_fact_similarity: f64,
    /// Update node summaries from their new facts (batched calls, only for
    /// nodes that changed).
    pub summaries: bool,
    /// Nodes per summary call.
    pub summary_batch_size: usize,
    /// Embed node names and facts through the embeddings endpoint.
    pub embeddings: bool,
}

impl Default for ResolveSpec {
    fn default() -> Self {
        ResolveSpec {
            functional_edge_types: Vec::new(),
            corporate_suffixes: DEFAULT_CORPORATE_SUFFIXES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            fuzzy: true,
            fuzzy_merge_threshold: 0.85,
            grey_band_min: 0.6,
            lsh_bands: 10,
            lsh_rows: 6,
            lsh_max_bucket: 64,
            partial_names: true,
            adjudicate: true,
            adjudication_batch_size: 10,
            max_candidates: 4,
            judge_contradictions: true,
            contradiction_batch_size: 10,
            duplicate_fact_similarity: 0.9,
            summaries: false,
            summary_batch_size: 10,
            embeddings: false,
        }
    }
}

impl ResolveSpec {
    /// Problems with the values, as (key, message) pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let unit = |key: &str, v: f64, out: &mut Vec<(String, String)>| {
            if !(0.0..=1.0).contains(&v) {
                out.push((
                    format!("resolve.{key}"),
                    format!("must be between 0 and 1, got {v}"),
                ));
            }
        };
        unit(
            "fuzzy_merge_threshold",
            self.fuzzy_merge_threshold,
            &mut out,
        );
        unit("grey_band_min", self.grey_band_min, &mut out);
        unit(
            "duplicate_fact_similarity",
            self.duplicate_fact_similarity,
            &mut out,
        );
        if self.lsh_max_bucket < 2 {
            out.push((
                "resolve.lsh_max_bucket".into(),
                format!("must be at least 2, got {}", self.lsh_max_bucket),
            ));
        }
        if self.grey_band_min > self.fuzzy_merge_threshold {
            out.push((
                "resolve.grey_band_min".into(),
                format!(
                    "must not exceed resolve.fuzzy_merge_threshold ({} > {})",
                    self.grey_band_min, self.fuzzy_merge_threshold
                ),
            ));
        }
        for (key, v) in [
            ("lsh_bands", self.lsh_bands),
            ("lsh_rows", self.lsh_rows),
            ("adjudication_batch_size", self.adjudication_batch_size),
            ("max_candidates", self.max_candidates),
            ("contradiction_batch_size", self.contradiction_batch_size),
            ("summary_batch_size", self.summary_batch_size),
        ] {
            if v == 0 || v > 64 {
                out.push((
                    format!("resolve.{key}"),
                    format!("must be between 1 and 64, got {v}"),
                ));
            }
        }
        out
    }
}
