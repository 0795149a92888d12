//! The probabilistic (Fellegi-Sunter) score of `[[resolve.linkage]]` rules
//! with `model = "probabilistic"`.
//!
//! Each comparison is cut into levels (equal, one edit apart, …, else); a
//! pair's levels, four bits each, make its *pattern*. A level adds
//! `log2(m / u)` to the pair's match weight, where m is how often true
//! matches reach it and u how often two unrelated records do; a comparison
//! with a value missing on either side adds nothing. The match probability
//! is the logistic of the prior log-odds plus the weights.
//!
//! Both are estimated per run, from the rule's own records:
//! * **u** from random pairs of records (the run's mentions and a sample
//!   of committed nodes): nearly every random pair is a non-match.
//! * **m and the prior** by expectation maximisation over the pattern
//!   counts of the candidate pairs the blocking keys found, u held fixed.
//!   Pairs the blocking never proposed count as non-matches, so the prior
//!   is per pair of records (expected matches / all pairs that could be
//!   compared) and the posterior is `P(match | levels)` for any pair, the
//!   same rule for pairs found by one key or by six.
//!
//! EM alone fits whatever two clusters the candidates fall into, even
//! when no pair matches (a first load of a table without duplicates).
//! [`M_PSEUDO_PAIRS`] pairs at the default m are added to every update, so
//! a run with few matches stays near the defaults and one with thousands
//! is ruled by its data.

use rayon::prelude::*;

use super::compare::{date_digits, similarity};
use crate::spec::resolve::{CompareMethod, CompareSpec};
use crate::text::normalize_name;

/// A comparison that could not be made (a value missing on one side).
pub const NULL_LEVEL: u64 = 15;

/// Bits per comparison in a pattern.
const BITS: usize = 4;

/// Weight, in pairs, of the default m in every EM update.
pub const M_PSEUDO_PAIRS: f64 = 20.0;

/// EM stops after this many rounds if it has not settled.
const MAX_ROUNDS: usize = 200;

/// Levels of a comparison, `else` included.
pub fn level_count(c: &CompareSpec) -> usize {
    match &c.levels {
        Some(t) => t.len() + 1,
        None => match c.method {
            CompareMethod::Exact | CompareMethod::Folded => 2,
            CompareMethod::Number => 3,
            CompareMethod::Name
            | CompareMethod::Text
            | CompareMethod::Date
            | CompareMethod::Code => 4,
        },
    }
}

/// The level (0 best, `level_count - 1` = else) two present values reach.
///
/// With `levels` set, the first threshold the method's similarity reaches.
/// Defaults: names equal (as folded words in any order) / Jaro-Winkler ≥
/// 0.92 / ≥ 0.80; texts equal / shingle Jaccard ≥ 0.7 / ≥ 0.5; dates and
/// codes equal / one edit / two edits (optimal string alignment: a swap of
/// two neighbours is one edit); numbers equal / within 10 %; exact and
/// folded: equal or not.
pub fn level(c: &CompareSpec, a: &str, b: &str) -> u64 {
    let first = |s: f64, thresholds: &[f64]| {
        thresholds
            .iter()
            .position(|t| s >= *t)
            .unwrap_or(thresholds.len()) as u64
    };
    if let Some(t) = &c.levels {
        return first(similarity(c.method, a, b), t);
    }
    match c.method {
        CompareMethod::Exact | CompareMethod::Folded | CompareMethod::Number => {
            let t: &[f64] = if c.method == CompareMethod::Number {
                &[1.0, 0.9]
            } else {
                &[1.0]
            };
            first(similarity(c.method, a, b), t)
        }
        CompareMethod::Name => first(similarity(c.method, a, b), &[1.0, 0.92, 0.8]),
        CompareMethod::Text => first(similarity(c.method, a, b), &[1.0, 0.7, 0.5]),
        CompareMethod::Date | CompareMethod::Code => {
            let fold = |s: &str| match c.method {
                CompareMethod::Date => {
                    date_digits(s).unwrap_or_else(|| normalize_name(s).replace(' ', ""))
                }
                _ => normalize_name(s).replace(' ', ""),
            };
            let (x, y) = (fold(a), fold(b));
            if x.is_empty() || y.is_empty() {
                return 3;
            }
            strsim::osa_distance(&x, &y).min(3) as u64
        }
    }
}

/// Level `i` of a pattern.
pub fn level_of(pattern: u64, i: usize) -> u64 {
    (pattern >> (BITS * i)) & NULL_LEVEL
}

/// A pattern from per-comparison levels ([`NULL_LEVEL`] for none).
pub fn pack(levels: impl IntoIterator<Item = u64>) -> u64 {
    levels
        .into_iter()
        .enumerate()
        .fold(0, |p, (i, l)| p | (l << (BITS * i)))
}

/// The default m of a comparison with `k` levels: 0.95 / 0.05 for two,
/// otherwise 0.7 at the top, 0.1 for else and the rest shared.
pub fn default_m(k: usize) -> Vec<f64> {
    match k {
        0 | 1 => vec![1.0; k],
        2 => vec![0.95, 0.05],
        _ => {
            let middle = 0.2 / (k - 2) as f64;
            let mut m = vec![middle; k];
            m[0] = 0.7;
            m[k - 1] = 0.1;
            m
        }
    }
}

/// A trained probabilistic model of one rule. It serializes its numbers
/// as bit patterns, so that a model sent to another process (a cluster
/// executor) scores exactly as here.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Model {
    /// m per comparison and level.
    #[serde(with = "bits::table")]
    pub m: Vec<Vec<f64>>,
    /// u per comparison and level.
    #[serde(with = "bits::table")]
    pub u: Vec<Vec<f64>>,
    /// Probability that two records of the rule's type match.
    #[serde(with = "bits")]
    pub prior: f64,
    /// Matches EM expects among the candidate pairs.
    #[serde(with = "bits")]
    pub expected_matches: f64,
    /// EM rounds run.
    pub rounds: usize,
    /// `log2(m / u)` per comparison and level.
    #[serde(with = "bits::table")]
    weights: Vec<Vec<f64>>,
}

/// `f64`s as their bit patterns (`u64`): exact in any serde format, where
/// JSON's decimal text may come back one unit in the last place off.
mod bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        v.to_bits().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        u64::deserialize(d).map(f64::from_bits)
    }

    /// The same for a table of them.
    pub mod table {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(v: &[Vec<f64>], s: S) -> Result<S::Ok, S::Error> {
            let bits: Vec<Vec<u64>> = v
                .iter()
                .map(|row| row.iter().map(|x| x.to_bits()).collect())
                .collect();
            bits.serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<f64>>, D::Error> {
            let bits = Vec::<Vec<u64>>::deserialize(d)?;
            Ok(bits
                .into_iter()
                .map(|row| row.into_iter().map(f64::from_bits).collect())
                .collect())
        }
    }
}

impl Model {
    /// A model from m, u and the prior (the weights follow).
    pub fn new(m: Vec<Vec<f64>>, u: Vec<Vec<f64>>, prior: f64) -> Self {
        let weights = m
            .iter()
            .zip(&u)
            .map(|(m, u)| m.iter().zip(u).map(|(m, u)| (m / u).log2()).collect())
            .collect();
        Model {
            m,
            u,
            prior,
            expected_matches: 0.0,
            rounds: 0,
            weights,
        }
    }

    /// `log2` of the odds that a pair with this pattern matches.
    pub fn match_weight(&self, pattern: u64) -> f64 {
        let prior = (self.prior / (1.0 - self.prior)).log2();
        self.weights
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.get(level_of(pattern, i) as usize))
            .sum::<f64>()
            + prior
    }

    /// The match probability of a pattern.
    pub fn probability(&self, pattern: u64) -> f64 {
        1.0 / (1.0 + (-self.match_weight(pattern)).exp2())
    }
}

/// u per comparison and level from random pairs of `pool` (each row: each
/// comparison's value, if any): every pair when there are at most `pairs`
/// of them, else `pairs` drawn with a fixed seed. Each level starts from
/// one pair (so a level no sampled pair reached is rare, not impossible).
pub fn estimate_u(
    compare: &[CompareSpec],
    pool: &[Vec<Option<String>>],
    pairs: usize,
) -> Vec<Vec<f64>> {
    let n = pool.len();
    let all = n.saturating_mul(n.saturating_sub(1)) / 2;
    let ks: Vec<usize> = compare.iter().map(level_count).collect();
    let empty = || ks.iter().map(|k| vec![0u64; *k]).collect::<Vec<_>>();
    let count = |mut acc: Vec<Vec<u64>>, (i, j): (usize, usize)| {
        for (c, spec) in compare.iter().enumerate() {
            if let (Some(a), Some(b)) = (&pool[i][c], &pool[j][c]) {
                acc[c][level(spec, a, b) as usize] += 1;
            }
        }
        acc
    };
    let merge = |mut a: Vec<Vec<u64>>, b: Vec<Vec<u64>>| {
        for (x, y) in a.iter_mut().zip(b) {
            for (x, y) in x.iter_mut().zip(y) {
                *x += y;
            }
        }
        a
    };
    let counts = if all <= pairs {
        (0..n)
            .into_par_iter()
            .flat_map_iter(|i| (i + 1..n).map(move |j| (i, j)))
            .fold(empty, count)
            .reduce(empty, merge)
    } else {
        let mut next = crate::text::splitmix_stream(0x7531_7361_6d70_6c65);
        let drawn: Vec<(usize, usize)> = std::iter::from_fn(|| {
            let i = (next() % n as u64) as usize;
            let j = (next() % n as u64) as usize;
            Some((i, j))
        })
        .filter(|(i, j)| i != j)
        .take(pairs)
        .collect();
        drawn
            .into_par_iter()
            .fold(empty, count)
            .reduce(empty, merge)
    };
    counts
        .into_iter()
        .map(|levels| {
            let total: u64 = levels.iter().sum::<u64>() + levels.len() as u64;
            levels
                .iter()
                .map(|c| (c + 1) as f64 / total as f64)
                .collect()
        })
        .collect()
}

/// m and the prior by EM over `counts` (pattern, candidate pairs with it),
/// `u` fixed; `total_pairs` is every pair of records that could be
/// compared, `start_matches` the matches assumed at the start.
pub fn expectation_maximisation(
    compare: &[CompareSpec],
    counts: &[(u64, u64)],
    u: Vec<Vec<f64>>,
    total_pairs: f64,
    start_matches: f64,
) -> Model {
    let m0: Vec<Vec<f64>> = compare.iter().map(|c| default_m(level_count(c))).collect();
    let total_pairs = total_pairs.max(1.0);
    let mut model = Model::new(
        m0.clone(),
        u,
        (start_matches / total_pairs).clamp(1e-12, 0.5),
    );
    for round in 1..=MAX_ROUNDS {
        let mut hits: Vec<Vec<f64>> = m0.iter().map(|m| vec![0.0; m.len()]).collect();
        let mut matches = 0.0;
        for &(pattern, n) in counts {
            let w = n as f64 * model.probability(pattern);
            matches += w;
            for (c, h) in hits.iter_mut().enumerate() {
                if let Some(x) = h.get_mut(level_of(pattern, c) as usize) {
                    *x += w;
                }
            }
        }
        let m: Vec<Vec<f64>> = hits
            .iter()
            .zip(&m0)
            .map(|(h, d)| {
                let seen: f64 = h.iter().sum();
                h.iter()
                    .zip(d)
                    .map(|(h, d)| (h + M_PSEUDO_PAIRS * d) / (seen + M_PSEUDO_PAIRS))
                    .collect()
            })
            .collect();
        let prior = (matches / total_pairs).clamp(1e-12, 0.5);
        let moved = m
            .iter()
            .flatten()
            .zip(model.m.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold((prior / model.prior).ln().abs(), f64::max);
        let u = std::mem::take(&mut model.u);
        model = Model::new(m, u, prior);
        model.expected_matches = matches;
        model.rounds = round;
        if moved < 1e-6 {
            break;
        }
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(field: &str, method: CompareMethod) -> CompareSpec {
        CompareSpec {
            field: field.into(),
            method,
            weight: 1.0,
            levels: None,
        }
    }

    #[test]
    fn default_levels_count_edits_and_similarity() {
        let code = cmp("ssn", CompareMethod::Code);
        assert_eq!(level(&code, "5304218", "5304218"), 0);
        assert_eq!(level(&code, "5304218", "5304281"), 1, "a swap is one edit");
        assert_eq!(level(&code, "5304218", "5304291"), 2);
        assert_eq!(level(&code, "5304218", "1111111"), 3);
        let date = cmp("dob", CompareMethod::Date);
        assert_eq!(level(&date, "1956-04-09", "19560409"), 0);
        assert_eq!(level(&date, "19560409", "19560490"), 1);
        let name = cmp("name", CompareMethod::Name);
        assert_eq!(level(&name, "Priya Raman", "raman priya"), 0);
        assert_eq!(level(&name, "jonathan", "jonathon"), 1);
        assert_eq!(level(&name, "kate", "zoe"), 3);
        let set = CompareSpec {
            levels: Some(vec![0.9]),
            ..cmp("name", CompareMethod::Name)
        };
        assert_eq!(level_count(&set), 2);
        assert_eq!(level(&set, "jonathan", "jonathon"), 0);
    }

    #[test]
    fn patterns_keep_each_comparison_in_its_own_bits() {
        let p = pack([3, NULL_LEVEL, 0, 1]);
        assert_eq!(
            (0..4).map(|i| level_of(p, i)).collect::<Vec<_>>(),
            [3, NULL_LEVEL, 0, 1]
        );
    }

    #[test]
    fn a_missing_value_adds_no_weight() {
        let model = Model::new(
            vec![vec![0.9, 0.1], vec![0.9, 0.1]],
            vec![vec![0.01, 0.99], vec![0.5, 0.5]],
            0.01,
        );
        let one = model.match_weight(pack([0, NULL_LEVEL]));
        let prior = (0.01f64 / 0.99).log2();
        assert!((one - prior - (0.9f64 / 0.01).log2()).abs() < 1e-9);
    }

    /// Two comparisons, records of 1,000 people; 300 candidate pairs of
    /// which 100 match (agree on both, mostly) and 200 agree on one field
    /// only: EM must find the 100.
    #[test]
    fn em_finds_the_matches_among_the_candidates() {
        let compare = vec![
            cmp("a", CompareMethod::Exact),
            cmp("b", CompareMethod::Exact),
        ];
        let u = vec![vec![0.001, 0.999], vec![0.001, 0.999]];
        let counts = [
            (pack([0, 0]), 90),
            (pack([0, 1]), 5),
            (pack([1, 0]), 5),
            (pack([0, 1]), 100),
            (pack([1, 0]), 100),
        ];
        let merged: Vec<(u64, u64)> = {
            let mut m = std::collections::BTreeMap::new();
            for (p, n) in counts {
                *m.entry(p).or_insert(0) += n;
            }
            m.into_iter().collect()
        };
        let model = expectation_maximisation(&compare, &merged, u, 499_500.0, 500.0);
        assert!(
            (model.expected_matches - 90.0).abs() < 10.0,
            "{}",
            model.expected_matches
        );
        assert!(model.probability(pack([0, 0])) > 0.99);
        assert!(model.probability(pack([0, 1])) < 0.5);
        assert!(model.m[0][0] > 0.8, "{:?}", model.m);
    }

    #[test]
    fn with_no_matches_em_stays_near_the_defaults_and_merges_nothing() {
        let compare = vec![
            cmp("a", CompareMethod::Exact),
            cmp("b", CompareMethod::Exact),
            cmp("c", CompareMethod::Exact),
        ];
        let u = vec![vec![0.001, 0.999]; 3];
        // 5,000 records without duplicates: candidates agree on one field.
        let counts = [
            (pack([0, 1, 1]), 3000),
            (pack([1, 0, 1]), 3000),
            (pack([1, 1, 0]), 3000),
        ];
        let model = expectation_maximisation(&compare, &counts, u, 12_497_500.0, 2500.0);
        assert!(model.expected_matches < 1.0, "{}", model.expected_matches);
        assert!(model.probability(pack([0, 1, 1])) < 0.01);
    }

    #[test]
    fn u_from_random_pairs_is_the_rate_unrelated_records_agree() {
        let compare = vec![cmp("k", CompareMethod::Exact)];
        // 100 records, 10 values: pairs agree 10·C(10,2) / C(100,2) ≈ 0.0909.
        let pool: Vec<Vec<Option<String>>> =
            (0..100).map(|i| vec![Some((i % 10).to_string())]).collect();
        let exact = estimate_u(&compare, &pool, 1_000_000);
        // 450 agreeing pairs of 4,950, one more of each level: 451 / 4,952.
        assert!((exact[0][0] - 451.0 / 4952.0).abs() < 1e-9, "{exact:?}");
        let sampled = estimate_u(&compare, &pool, 2000);
        assert!((sampled[0][0] - 0.0909).abs() < 0.02, "{sampled:?}");
    }
}
