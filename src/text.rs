//! Text normalisation shared by extraction and resolution: name folding
//! (case, punctuation, corporate suffixes), character 3-shingles with
//! Jaccard similarity, MinHash signatures with LSH band keys, and the gate
//! that keeps short or generic names out of fuzzy matching; the identity
//! keys read from attributes. A leaf: it imports nothing from the crate.

use std::collections::BTreeMap;

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

/// The names a folded name may have been written as before a model added
/// words to it or wrote it in the singular: its first two, three, …
/// words, up to all but the last ("lumen 27 monitors" → "lumen 27"), and
/// the plural of each of those and of the whole name when it ends in a
/// word of letters ("ridgeback 14 laptop 16gb" → "ridgeback 14 laptops";
/// "lumen 27 monitor" → "lumen 27 monitors"). Only names of two or more
/// words: one word is the partial rule's.
pub fn name_stems(folded: &str) -> Vec<String> {
    let mut ends: Vec<usize> = folded.match_indices(' ').map(|(i, _)| i).skip(1).collect();
    if folded.contains(' ') {
        ends.push(folded.len());
    }
    let mut out = Vec::with_capacity(ends.len() * 2);
    for &end in &ends {
        let stem = &folded[..end];
        if end < folded.len() {
            out.push(stem.to_string());
        }
        let last = stem.rsplit(' ').next().unwrap_or(stem);
        if last.chars().count() >= 3
            && last.chars().all(char::is_alphabetic)
            && !last.ends_with('s')
        {
            out.push(format!("{stem}s"));
        }
    }
    out
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
    // Resolution scores millions of candidate pairs of short names: their
    // shingles fit on the stack, which saves four allocations a pair.
    const STACK: usize = 64;
    let (mut x, mut y) = ([0u64; STACK], [0u64; STACK]);
    match (stack_shingles(a, &mut x), stack_shingles(b, &mut y)) {
        (Some(n), Some(m)) => jaccard(&x[..n], &y[..m]),
        _ => jaccard(&shingle_hashes(a), &shingle_hashes(b)),
    }
}

/// The 3-shingles of a normalised name as the packed values that
/// [`shingle_hashes`] hashes, written into `buf`, sorted and without
/// repeats; the count, or `None` when the name has more shingles than
/// `buf` holds.
fn stack_shingles(normalized: &str, buf: &mut [u64]) -> Option<usize> {
    let space = u64::from(' ');
    let mut chars = normalized
        .chars()
        .map(u64::from)
        .chain(std::iter::once(space));
    // The window starts at the leading pad and the first character.
    let Some(first) = chars.next() else {
        return Some(0);
    };
    let (mut w0, mut w1, mut n) = (space, first, 0usize);
    for c in chars {
        let slot = buf.get_mut(n)?;
        // Characters fit in 21 bits, so the packed shingle is already a
        // distinct value per shingle: Jaccard needs no mixing (the
        // splitmix of [`shingle_hashes`] is a bijection, so both paths
        // score alike).
        *slot = (w0 << 42) ^ (w1 << 21) ^ c;
        n += 1;
        (w0, w1) = (w1, c);
    }
    let set = &mut buf[..n];
    set.sort_unstable();
    let mut kept = 0;
    for i in 0..set.len() {
        if i == 0 || set[i] != set[kept - 1] {
            set[kept] = set[i];
            kept += 1;
        }
    }
    Some(kept)
}

/// Whether a name may be matched fuzzily. Names with digits are codes
/// (order numbers, SKUs) whose every character matters; short names and
/// names with little variety ("aaa", "ab ab") match too much by chance.
/// Such names only ever match exactly.
pub fn fuzzy_eligible(normalized: &str) -> bool {
    // Called for every name a run resolves and every node it commits:
    // the distinct characters of a name are few, so they are counted in a
    // stack array rather than a map.
    const DISTINCT: usize = 64;
    let mut counts = [('\0', 0u32); DISTINCT];
    let (mut letters, mut distinct) = (0usize, 0usize);
    for c in normalized.chars() {
        if c.is_whitespace() {
            continue;
        }
        if c.is_numeric() {
            return false;
        }
        letters += 1;
        match counts[..distinct].iter_mut().find(|(x, _)| *x == c) {
            Some((_, k)) => *k += 1,
            None if distinct < DISTINCT => {
                counts[distinct] = (c, 1);
                distinct += 1;
            }
            None => return entropy_of_many(normalized),
        }
    }
    if letters < 6 {
        return false;
    }
    // Summed in character order, as a map would: the same terms in the
    // same order give the same sum for either path.
    let counts = &mut counts[..distinct];
    counts.sort_unstable_by_key(|(c, _)| *c);
    varied(counts.iter().map(|&(_, k)| k), letters)
}

/// [`fuzzy_eligible`] for a name of more distinct characters than its
/// stack array holds, with a map.
fn entropy_of_many(normalized: &str) -> bool {
    let mut counts = std::collections::BTreeMap::new();
    let mut letters = 0;
    for c in normalized.chars().filter(|c| !c.is_whitespace()) {
        if c.is_numeric() {
            return false;
        }
        *counts.entry(c).or_insert(0u32) += 1;
        letters += 1;
    }
    varied(counts.into_values(), letters)
}

/// Whether characters with these counts (of `letters` in all) have a
/// Shannon entropy of at least 2.5 bits.
fn varied(counts: impl Iterator<Item = u32>, letters: usize) -> bool {
    let n = letters as f64;
    let entropy: f64 = counts
        .map(|k| {
            let p = f64::from(k) / n;
            -p * p.log2()
        })
        .sum();
    entropy >= 2.5
}

/// splitmix64's increment (the golden ratio in 64 bits).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(GOLDEN_GAMMA);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The splitmix64 sequence from `seed`: a deterministic stream of
/// well-mixed 64-bit values, the same on every machine.
pub fn splitmix_stream(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        let v = splitmix(state);
        state = state.wrapping_add(GOLDEN_GAMMA);
        v
    }
}

/// 64-bit FNV-1a of a byte stream: a stable hash for keys that must not
/// change between runs or machines (std's hashers may).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// MinHash signature of a shingle-hash set with `n` hash functions. The
/// shingle hashes are already well mixed, so each function is one
/// multiply-add with its own odd multiplier (cheap enough for ten million
/// names per run).
pub fn minhash(shingles: &[u64], n: usize) -> Vec<u64> {
    // The functions' constants are made once per process; each shingle
    // then updates all minima in one pass, independent operations a core
    // overlaps (2.5 times faster than one function at a time).
    static COEFFICIENTS: std::sync::OnceLock<Vec<(u64, u64)>> = std::sync::OnceLock::new();
    let made = COEFFICIENTS.get_or_init(|| (0..256).map(minhash_function).collect());
    let own: Vec<(u64, u64)>;
    let functions = if n <= made.len() {
        &made[..n]
    } else {
        own = (0..n as u64).map(minhash_function).collect();
        &own
    };
    let mut mins = vec![u64::MAX; n];
    for &s in shingles {
        for (min, &(a, b)) in mins.iter_mut().zip(functions) {
            *min = (*min).min(s.wrapping_mul(a).wrapping_add(b));
        }
    }
    mins
}

/// The multiplier and addend of MinHash function `i`.
fn minhash_function(i: u64) -> (u64, u64) {
    (splitmix(2 * i + 1) | 1, splitmix(2 * i + 2))
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

/// Version of the name blocking keys: raise it whenever [`fold_suffixes`],
/// [`name_band_keys`] or the group salt change what they compute, so keys
/// stored with older rows stop matching [`NameKeys::fingerprint`].
const NAME_KEYS_VERSION: u32 = 1;

/// The `nodes` columns that store a node's [`NameKeys`]: the folded name,
/// its band keys and the settings' fingerprint.
pub const NAME_KEY_COLUMNS: [&str; 3] = ["name_folded", "name_band_keys", "name_keys_fingerprint"];

/// The blocking keys resolution derives from a node's name under one set
/// of settings: the folded name (joined on for exact matches) and the LSH
/// band keys of the folded name, salted with the group (joined on for fuzzy
/// matches). Nodes store them with a [`NameKeys::fingerprint`] of the
/// settings, so a later run with the same settings reads them instead of
/// recomputing ten million names' keys.
#[derive(Debug, Clone, PartialEq)]
pub struct NameKeys {
    suffixes: Vec<String>,
    bands: usize,
    rows: usize,
}

impl NameKeys {
    /// Keys for these corporate suffixes and LSH shape (`bands` × `rows`).
    pub fn new(suffixes: Vec<String>, bands: usize, rows: usize) -> Self {
        NameKeys {
            suffixes,
            bands,
            rows,
        }
    }

    /// A short text that changes whenever the keys of some name would: the
    /// key version, the suffixes and the LSH shape.
    pub fn fingerprint(&self) -> String {
        let mut text = format!("v{NAME_KEYS_VERSION};{}x{}", self.bands, self.rows);
        for s in &self.suffixes {
            // A separator no normalised name contains keeps ["a b"] and
            // ["a", "b"] apart.
            text.push('\u{1f}');
            text.push_str(s);
        }
        format!("v{NAME_KEYS_VERSION}-{:016x}", fnv1a(text.bytes()))
    }

    /// The folded form of a normalised name (corporate suffixes dropped).
    pub fn folded(&self, normalized: &str) -> String {
        fold_suffixes(normalized, &self.suffixes)
    }

    /// The band keys of a folded name in `group`, as signed 64-bit values
    /// (the bits of the unsigned keys; tables have no unsigned type). Empty
    /// for names that never match fuzzily.
    pub fn band_keys(&self, group: &str, folded: &str) -> Vec<i64> {
        // The group is mixed into every key, so one join on the key alone
        // keeps groups apart.
        let salt = fnv1a(group.bytes());
        name_band_keys(folded, self.bands, self.rows)
            .into_iter()
            .map(|k| (k ^ salt) as i64)
            .collect()
    }
}

/// Marks an identity property whose different values do not keep two
/// mentions apart (`may_change`): its keys are `~property=value`.
pub const MAY_CHANGE: char = '~';

/// `property=value` keys of the identity properties present in a JSON
/// object, values normalised like names. Unreadable JSON has none. A
/// property named with [`MAY_CHANGE`] in front is looked up without it.
pub fn identity_values(props: &[String], attributes: &str) -> Vec<String> {
    use serde::de::DeserializeSeed;
    // Resolution reads this for every committed node of a type with
    // identity properties (millions): only the wanted values are built,
    // the rest of the object is skipped as it is parsed.
    let mut parser = serde_json::Deserializer::from_str(attributes);
    let found = match Wanted(props).deserialize(&mut parser) {
        Ok(found) if parser.end().is_ok() => found,
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for (p, value) in props.iter().zip(found) {
        let value = match value {
            Some(serde_json::Value::String(v)) => normalize_name(&v),
            Some(serde_json::Value::Null) | None => continue,
            Some(other) => normalize_name(&other.to_string()),
        };
        if !value.is_empty() {
            out.push(format!("{p}={value}"));
        }
    }
    out
}

/// Reads a JSON object keeping the values of `props` (by position; the
/// last of repeated keys wins, as in a parsed map) and skipping the rest.
struct Wanted<'p>(&'p [String]);

impl<'de> serde::de::DeserializeSeed<'de> for Wanted<'_> {
    type Value = Vec<Option<serde_json::Value>>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Wanted<'_> {
    type Value = Vec<Option<serde_json::Value>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = vec![None; self.0.len()];
        while let Some(slot) = map.next_key_seed(KeySlot(self.0))? {
            match slot {
                Some(i) => found[i] = Some(map.next_value()?),
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// A key of [`Wanted`]'s object: the position of the property it names,
/// compared without copying the key.
struct KeySlot<'p>(&'p [String]);

impl<'de> serde::de::DeserializeSeed<'de> for KeySlot<'_> {
    type Value = Option<usize>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl serde::de::Visitor<'_> for KeySlot<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a property name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self
            .0
            .iter()
            .position(|p| p.trim_start_matches(MAY_CHANGE) == key))
    }
}

/// Version of the stored identity keys: raise it whenever
/// [`identity_values`] changes what it computes, so keys stored with older
/// rows stop matching [`IdentityKeys::fingerprint`].
const IDENTITY_KEYS_VERSION: u32 = 1;

/// The `nodes` columns that store a node's identity keys
/// ([`IdentityKeys`]) and the fingerprint of the identity properties they
/// were read under. Apart from the name keys' columns: identity keys follow
/// the ontology, name keys the `[resolve]` settings.
pub const IDENTITY_KEY_COLUMNS: [&str; 2] = ["identity_keys", "identity_keys_fingerprint"];

/// The identity keys of nodes (`property=value`, [`identity_values`]) under
/// one ontology's identity properties: type name → its properties, a
/// `may_change` one marked with [`MAY_CHANGE`]. Nodes store them with a
/// [`IdentityKeys::fingerprint`], so resolution reads them instead of
/// parsing millions of nodes' attributes again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdentityKeys {
    properties: BTreeMap<String, Vec<String>>,
}

impl IdentityKeys {
    /// Keys under these identity properties, by type name.
    pub fn new(properties: BTreeMap<String, Vec<String>>) -> Self {
        IdentityKeys { properties }
    }

    /// The identity properties, by type name.
    pub fn properties(&self) -> &BTreeMap<String, Vec<String>> {
        &self.properties
    }

    /// A short text that changes whenever the keys of some node would: the
    /// key version and every type's identity properties, in order.
    pub fn fingerprint(&self) -> String {
        let mut text = format!("i{IDENTITY_KEYS_VERSION}");
        for (t, props) in &self.properties {
            // Separators no type or property name contains.
            text.push('\u{1e}');
            text.push_str(t);
            for p in props {
                text.push('\u{1f}');
                text.push_str(p);
            }
        }
        format!("i{IDENTITY_KEYS_VERSION}-{:016x}", fnv1a(text.bytes()))
    }

    /// The identity keys of a node of final type `entity_type` with these
    /// attributes (a JSON object); none for a type without identity
    /// properties.
    pub fn keys(&self, entity_type: &str, attributes: &str) -> Vec<String> {
        match self.properties.get(entity_type) {
            Some(props) => identity_values(props, attributes),
            None => Vec::new(),
        }
    }
}

/// The words of `text`: its runs of letters and digits, as written.
pub fn words(text: &str) -> impl DoubleEndedIterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

/// Text as attribute grounding compares it: lower case, letters and
/// digits kept, every other run of characters one space, with a space at
/// each end so that a value matches whole words only ("acme com" is in
/// " dana acme com ", "cme" is not).
pub fn grounding_form(text: &str) -> String {
    let mut out = String::from(" ");
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            out.push(c);
        } else if !out.ends_with(' ') {
            out.push(' ');
        }
    }
    if !out.ends_with(' ') {
        out.push(' ');
    }
    out
}

/// The numbers written in `text`: runs of digits with `.` or `,` inside
/// (thousands separators are dropped: "1,250.50" is 1250.5).
pub fn numbers_in(text: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let mut run = String::new();
    let mut flush = |run: &mut String| {
        let cleaned: String = run
            .trim_end_matches(['.', ','])
            .chars()
            .filter(|c| *c != ',')
            .collect();
        if let Ok(x) = cleaned.parse::<f64>() {
            out.push(x);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() || (!run.is_empty() && (c == '.' || c == ',')) {
            run.push(c);
        } else {
            flush(&mut run);
        }
    }
    flush(&mut run);
    out
}

/// Whether a word is code-like: three or more characters of letters and
/// digits, with both, joined by nothing but `-`, `/` or `_` (`OF-601`,
/// `PO4471`, `AOF-2024-031`; not `2024` or `Q3`).
pub fn is_code(word: &str) -> bool {
    word.chars().count() >= 3
        && word.chars().any(|c| c.is_ascii_digit())
        && word.chars().any(char::is_alphabetic)
        && word
            .chars()
            .all(|c| c.is_alphanumeric() || c == '-' || c == '/' || c == '_')
}

/// Where `text` writes `word` (as written) standing alone, not joined to a
/// letter or digit on either side (`OF-601` in "order form OF-601.", not
/// in "OF-6012"): the byte offset of each such place.
pub fn standing_alone<'t>(text: &'t str, word: &'t str) -> impl Iterator<Item = usize> + 't {
    text.match_indices(word).filter_map(move |(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        (!before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric))
            .then_some(i)
    })
}

/// The name as the text writes it, for a name that carries a code: when
/// `text` does not hold `name` (ignoring case) but holds exactly one of its
/// code-like words (letters and digits, such as `OF-601` or `PO4471`) as
/// written, that word is the name ("Order form OF-601" → "OF-601"). Any
/// other name is kept.
pub fn as_written(name: &str, text: &str) -> String {
    let codes: Vec<&str> = name
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .filter(|w| is_code(w))
        .filter(|w| standing_alone(text, w).next().is_some())
        .collect();
    // Most names hold no code: the text is only lowercased for the rest.
    match codes.as_slice() {
        [one] if !text.to_lowercase().contains(&name.to_lowercase()) => one.to_string(),
        _ => name.to_string(),
    }
}

/// A property's pattern (see `PropertySpec::pattern`), compiled once per
/// process: values are checked against it for every mention.
pub struct Pattern;

impl Pattern {
    /// Compiles `pattern` as the value check reads it.
    pub fn compile(pattern: &str) -> Result<regex::Regex, regex::Error> {
        regex::Regex::new(pattern)
    }

    /// Whether `pattern` repeats anything without an upper bound.
    pub fn unbounded(pattern: &str) -> bool {
        fn open(h: &regex_syntax::hir::Hir) -> bool {
            use regex_syntax::hir::HirKind;
            match h.kind() {
                HirKind::Repetition(r) => r.max.is_none() || open(&r.sub),
                HirKind::Capture(c) => open(&c.sub),
                HirKind::Concat(hs) | HirKind::Alternation(hs) => hs.iter().any(open),
                _ => false,
            }
        }
        regex_syntax::parse(pattern).is_ok_and(|h| open(&h))
    }

    /// Whether `value` matches `pattern`; a pattern that does not compile
    /// (the ontology check refuses those) matches nothing.
    pub fn matches(pattern: &str, value: &str) -> bool {
        use std::collections::HashMap;
        use std::sync::{LazyLock, RwLock};
        static COMPILED: LazyLock<RwLock<HashMap<String, Option<regex::Regex>>>> =
            LazyLock::new(RwLock::default);
        if let Ok(map) = COMPILED.read()
            && let Some(compiled) = map.get(pattern)
        {
            return compiled.as_ref().is_some_and(|r| r.is_match(value));
        }
        let compiled = Pattern::compile(pattern).ok();
        let found = compiled.as_ref().is_some_and(|r| r.is_match(value));
        if let Ok(mut map) = COMPILED.write() {
            map.insert(pattern.to_string(), compiled);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_property_that_may_change_is_read_without_its_mark() {
        let props = vec!["~email".to_string(), "po_number".to_string()];
        let got = identity_values(&props, r#"{"email": "D@Acme.test", "po_number": "PO-1"}"#);
        assert_eq!(got, ["~email=d acme test", "po_number=po 1"]);
    }

    #[test]
    fn identity_values_skip_other_attributes_and_read_as_a_parsed_object_would() {
        let props = vec!["email".to_string(), "code".to_string()];
        let read = |json: &str| identity_values(&props, json);
        // Other keys (nested, escaped) are skipped; the wanted ones come in
        // the properties' order whatever the object's.
        assert_eq!(
            read(r#"{"code": 42, "note": {"a": [1, "x"]}, "t\u00e9": "y", "email": "A@B.test"}"#),
            ["email=a b test", "code=42"]
        );
        // The last of a repeated key wins; null and empty values give none.
        assert_eq!(
            read(r#"{"email": "a@x.test", "email": "b@x.test"}"#),
            ["email=b x test"]
        );
        assert!(read(r#"{"email": null, "code": ""}"#).is_empty());
        // An escaped key is still the property it spells.
        assert_eq!(read(r#"{"em\u0061il": "c@x.test"}"#), ["email=c x test"]);
        // Not an object, or not JSON (trailing text included): none.
        for bad in [r#"["email"]"#, r#""email""#, "{", r#"{"email": "a"} x"#, ""] {
            assert!(read(bad).is_empty(), "{bad}");
        }
        // A non-string value is its JSON text, folded.
        assert_eq!(read(r#"{"code": {"b": 1, "a": 2}}"#), ["code=b 1 a 2"]);
    }

    #[test]
    fn the_allocation_free_similarity_scores_as_the_shingle_sets_do() {
        let long = "international business machines corporation of the americas ".repeat(2);
        let names = [
            "",
            "a",
            "ab",
            "acme",
            "acme widgets",
            "acme widget",
            "aaa aaa",
            "müller straße",
            "東京 電力",
            long.as_str(),
            long.trim(),
        ];
        for a in names {
            for b in names {
                let heap = jaccard(&shingle_hashes(a), &shingle_hashes(b));
                assert_eq!(name_similarity(a, b), heap, "{a:?} vs {b:?}");
            }
        }
        // The long names overflow the stack buffer and take the other path.
        assert!(stack_shingles(&long, &mut [0u64; 64]).is_none());
        // " acme ": " ac", "acm", "cme", "me ".
        assert_eq!(stack_shingles("acme", &mut [0u64; 64]), Some(4));
    }

    #[test]
    fn minhash_and_eligibility_match_their_definitions_so_stored_keys_stay_valid() {
        // Nodes store band keys; a faster computation must give the same
        // keys, or every stored key silently stops matching.
        let reference_minhash = |shingles: &[u64], n: usize| -> Vec<u64> {
            (0..n as u64)
                .map(|i| {
                    let (a, b) = (splitmix(2 * i + 1) | 1, splitmix(2 * i + 2));
                    shingles
                        .iter()
                        .map(|s| s.wrapping_mul(a).wrapping_add(b))
                        .min()
                        .unwrap_or(u64::MAX)
                })
                .collect()
        };
        let reference_eligible = |name: &str| -> bool {
            let letters: Vec<char> = name.chars().filter(|c| !c.is_whitespace()).collect();
            if letters.len() < 6 || letters.iter().any(|c| c.is_numeric()) {
                return false;
            }
            let mut counts = std::collections::BTreeMap::new();
            for c in &letters {
                *counts.entry(*c).or_insert(0u32) += 1;
            }
            let n = letters.len() as f64;
            let h: f64 = counts
                .values()
                .map(|&k| -(f64::from(k) / n) * (f64::from(k) / n).log2())
                .sum();
            h >= 2.5
        };
        // Every letter a to z and A to Z plus more: over the 64 distinct
        // characters the stack array counts.
        let many: String = ('a'..='z').chain('A'..='Z').chain('α'..='ω').collect();
        let names = [
            "acme widgets",
            "northwind traders",
            "aaaaaa aaa",
            "ab ab ab ab",
            "müller straße",
            "東京 電力 株式会社",
            "order 4411",
            "short",
            many.as_str(),
            &format!("{many}7"),
        ];
        for name in names {
            assert_eq!(fuzzy_eligible(name), reference_eligible(name), "{name:?}");
            let shingles = shingle_hashes(name);
            for n in [1, 60, 300] {
                assert_eq!(
                    minhash(&shingles, n),
                    reference_minhash(&shingles, n),
                    "{name:?} × {n}"
                );
            }
        }
        assert!(many.chars().count() > 64 && fuzzy_eligible(&many));
    }

    #[test]
    fn stored_name_keys_change_with_the_settings_that_make_them() {
        let keys = NameKeys::new(vec!["inc".into()], 10, 6);
        assert_eq!(keys.folded("acme inc"), "acme");
        let bands = keys.band_keys("g", "acme widgets");
        assert_eq!(bands.len(), 10);
        // Another group salts every key.
        let other = keys.band_keys("h", "acme widgets");
        assert!(bands.iter().zip(&other).all(|(a, b)| a != b));
        // Codes get no band keys.
        assert!(keys.band_keys("g", "po 4471").is_empty());
        let fp = keys.fingerprint();
        assert_eq!(fp, NameKeys::new(vec!["inc".into()], 10, 6).fingerprint());
        for changed in [
            NameKeys::new(vec!["inc".into(), "ltd".into()], 10, 6),
            NameKeys::new(vec!["in".into(), "c".into()], 10, 6),
            NameKeys::new(vec!["inc".into()], 12, 6),
            NameKeys::new(vec!["inc".into()], 10, 5),
        ] {
            assert_ne!(changed.fingerprint(), fp);
        }
    }

    #[test]
    fn a_pattern_must_bound_its_repetitions() {
        assert!(Pattern::unbounded("^[a-z]+$"));
        assert!(Pattern::unbounded("^a(b[0-9]*)?$"));
        assert!(Pattern::unbounded("^[a-z]{2,}$"));
        assert!(!Pattern::unbounded("^[a-z]{1,63}(\\.[a-z]{1,63}){1,4}$"));
        assert!(!Pattern::unbounded("^(open|closed)?$"));
    }

    #[test]
    fn a_code_bearing_name_is_the_code_as_the_text_writes_it() {
        let text = "Please countersign OF-601 by Friday; PO-4471 is still open.";
        assert_eq!(as_written("Order form OF-601", text), "OF-601");
        assert_eq!(as_written("Purchase order PO-4471", text), "PO-4471");
        // Written as the text writes it: kept.
        let text2 = "The Order form OF-601 was signed.";
        assert_eq!(as_written("Order form OF-601", text2), "Order form OF-601");
        // No code in the text, two codes, or no code at all: kept.
        assert_eq!(as_written("Order form OF-602", text), "Order form OF-602");
        assert_eq!(
            as_written("OF-601 and PO-4471", "OF-601, PO-4471"),
            "OF-601 and PO-4471"
        );
        assert_eq!(as_written("Acme Corporation", text), "Acme Corporation");
        // A code inside a longer word of the text does not count.
        assert_eq!(as_written("Order OF-60", text), "Order OF-60");
    }

    #[test]
    fn a_name_offers_its_leading_words_and_plurals_as_stems() {
        assert_eq!(
            name_stems("acme msa 2024 02 01"),
            ["acme msa", "acme msas", "acme msa 2024", "acme msa 2024 02"]
        );
        assert_eq!(name_stems("lumen 27 monitors"), ["lumen 27"]);
        assert_eq!(
            name_stems("lumen 27 monitor"),
            ["lumen 27", "lumen 27 monitors"]
        );
        assert_eq!(
            name_stems("ridgeback 14 laptop 16gb"),
            [
                "ridgeback 14",
                "ridgeback 14 laptop",
                "ridgeback 14 laptops"
            ]
        );
        assert!(name_stems("lumen 27").is_empty());
        assert!(name_stems("acme").is_empty());
        assert!(name_stems("").is_empty());
    }

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
        let fold = |n: &str| {
            fold_suffixes(
                &normalize_name(n),
                crate::spec::resolve::DEFAULT_CORPORATE_SUFFIXES,
            )
        };
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

    #[test]
    fn grounding_form_keeps_words_and_numbers_as_whole_tokens() {
        assert_eq!(
            grounding_form("Dana@Acme.test, Inc."),
            " dana acme test inc "
        );
        assert_eq!(grounding_form(""), " ");
        assert_eq!(
            numbers_in("USD 1,250.50 for 40 units, ref 7."),
            [1250.5, 40.0, 7.0]
        );
        assert!(numbers_in("no digits").is_empty());
    }
}
