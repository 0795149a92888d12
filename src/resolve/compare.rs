//! How two field values compare under a `[[resolve.linkage]]` method: what
//! the weighted scores of [`super::linkage`] and the agreement levels of
//! [`super::probabilistic`] both read.

use crate::spec::resolve::CompareMethod;
use crate::text::{name_similarity, normalize_name};

/// The similarity of two values under `method`, in 0..=1 (docs/mapping.md's
/// "Record linkage" table says what each does).
pub fn similarity(method: CompareMethod, a: &str, b: &str) -> f64 {
    let hit = |same: bool| if same { 1.0 } else { 0.0 };
    match method {
        CompareMethod::Exact => hit(a.trim() == b.trim()),
        CompareMethod::Folded => hit(normalize_name(a) == normalize_name(b)),
        CompareMethod::Name => {
            let (x, y) = (normalize_name(a), normalize_name(b));
            if x == y {
                return 1.0;
            }
            let words = |s: &str| {
                let mut w: Vec<String> = s.split(' ').map(str::to_string).collect();
                w.sort();
                w
            };
            if words(&x) == words(&y) {
                return 1.0;
            }
            strsim::jaro_winkler(&x, &y)
        }
        CompareMethod::Text => name_similarity(&normalize_name(a), &normalize_name(b)),
        CompareMethod::Date => match (date_digits(a), date_digits(b)) {
            (Some(x), Some(y)) if x == y => 1.0,
            (Some(x), Some(y)) => strsim::normalized_levenshtein(&x, &y),
            _ => 0.0,
        },
        CompareMethod::Code => {
            strsim::normalized_levenshtein(&normalize_name(a), &normalize_name(b))
        }
        CompareMethod::Number => match (a.trim().parse::<f64>(), b.trim().parse::<f64>()) {
            (Ok(x), Ok(y)) if x == y => 1.0,
            (Ok(x), Ok(y)) if x.is_finite() && y.is_finite() => {
                (1.0 - (x - y).abs() / x.abs().max(y.abs())).max(0.0)
            }
            _ => 0.0,
        },
    }
}

/// The eight digits `YYYYMMDD` of a date written `YYYY-MM-DD`, `YYYYMMDD`
/// or as an RFC 3339 time.
pub(super) fn date_digits(s: &str) -> Option<String> {
    let s = s.trim();
    let head = if s.len() >= 10 && s.as_bytes()[4] == b'-' {
        s.get(..10)?.replace('-', "")
    } else {
        s.to_string()
    };
    (head.len() == 8 && head.bytes().all(|b| b.is_ascii_digit())).then_some(head)
}
