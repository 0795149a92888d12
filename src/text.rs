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

/// Month names, January first (dates are told apart by them, and
/// [`crate::values::stated_end`] reads them).
pub const MONTH_NAMES: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// Words that lead a descriptive reference ("the order form for …", "our
/// existing agreement with them").
const DETERMINERS: [&str; 12] = [
    "the", "a", "an", "this", "that", "these", "those", "our", "their", "its", "his", "her",
];

/// The common abbreviations of month names.
const MONTH_ABBREVIATIONS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
];

/// Whether a lower-case word is a month's name or abbreviation ("sept.").
fn is_month(word: &str) -> bool {
    let w = word.trim_end_matches('.');
    MONTH_NAMES.contains(&w) || MONTH_ABBREVIATIONS.contains(&w)
}

/// Units a span of time is written in after its number.
const DURATION_UNITS: [&str; 14] = [
    "second", "seconds", "minute", "minutes", "hour", "hours", "day", "days", "week", "weeks",
    "month", "months", "year", "years",
];

/// Words that may stand between a span's number and its unit ("30
/// business days").
const DURATION_QUALIFIERS: [&str; 3] = ["business", "calendar", "working"];

/// Words that name a state of something rather than a thing.
const STATUS_WORDS: [&str; 24] = [
    "open",
    "closed",
    "pending",
    "approved",
    "rejected",
    "cancelled",
    "canceled",
    "active",
    "inactive",
    "draft",
    "signed",
    "expired",
    "complete",
    "completed",
    "in progress",
    "on hold",
    "overdue",
    "paid",
    "unpaid",
    "shipped",
    "delivered",
    "resolved",
    "done",
    "new",
];

/// Currency signs and codes an amount is written with.
const CURRENCIES: [&str; 12] = [
    "$", "€", "£", "¥", "usd", "eur", "gbp", "jpy", "chf", "dollars", "euros", "pounds",
];

/// Whether `name` is a common noun phrase rather than a name, as the
/// texts a model was shown write it: every whole-word occurrence of its
/// words there is in lower case ("hardware", "the account executive", "a
/// purchase order"), none capitalised, and the name holds no digit or
/// code punctuation (slugs and codes such as "harbour-gateway" or
/// "po-4417" are identifiers). The capital a sentence starts with does not
/// make a phrase of several words a name ("Load tests showed no gain"):
/// names capitalise their other words too. A single word capitalised only
/// where sentences start is a common noun when a text also writes it in
/// lower case as a word of its own ("Legal sent the contract" next to
/// "the contract legal forwarded"), and a name otherwise ("Acme
/// confirmed", even beside `dana@acme.com`). The texts are the episode and
/// the earlier episodes shown as its context: a model also lifts names
/// out of the context ("Computer Hardware" from the clause before). A
/// name no text writes is left to the other checks. Names styled in lower
/// case ("nginx") are caught too unless a text also writes them
/// capitalised: the price of this rule.
pub fn common_noun(name: &str, texts: &[Written<'_>]) -> bool {
    // A digit marks a code; code punctuation marks a slug, unless the name
    // is several words ("twelve-month subscription" is a phrase).
    let slug =
        !name.trim().contains(char::is_whitespace) && name.chars().any(|c| "-_.@/#".contains(c));
    if slug || name.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let wanted: Vec<String> = words(name).map(str::to_lowercase).collect();
    if wanted.is_empty() {
        return false;
    }
    let capitalised = |w: &str| w.chars().any(char::is_uppercase);
    // Seen in lower case: anywhere, and as words of their own.
    let (mut lower, mut lower_words) = (false, false);
    let mut opens_capitalised = false;
    for (t, at, window) in texts
        .iter()
        .flat_map(|t| t.occurrences_at(&wanted).map(move |(at, w)| (t, at, w)))
    {
        // One word capitalised as the last of a longer name ("since
        // Payments Engineering took it over") is that name's head noun:
        // it says nothing of the word alone (`engineering@tidewell.io`).
        if wanted.len() == 1 && t.ends_a_longer_name(at) {
            continue;
        }
        let named = window
            .iter()
            .enumerate()
            .any(|(i, w)| capitalised(w.text) && !(i == 0 && w.opens));
        if named {
            return false;
        }
        if capitalised(window[0].text) {
            opens_capitalised = true;
        } else {
            lower = true;
            lower_words |= window.iter().all(|w| w.plain);
        }
    }
    if wanted.len() == 1 && opens_capitalised {
        lower_words
    } else {
        lower || opens_capitalised
    }
}

/// Whether `text` writes `name`, one word, only as a field label: every
/// occurrence opens a sentence, is followed by a colon and has other text
/// before it on its line ("… ORDER FORM QF-0087. Customer: Northwind.
/// Subscription: Quillfeather Planner"). A name that opens its line
/// ("Nadia: …", "- Fares: Tomás") may be a speaker or a list item, one
/// inside a sentence ("Rotation update for Ledger Service: …") is the
/// sentence's subject, and a name of several words or with a digit ("SEV-
/// 11: …", a ticket code before its title) is a name: none of them count.
pub fn only_a_label(name: &str, written: &Written<'_>) -> bool {
    let wanted: Vec<String> = words(name).map(str::to_lowercase).collect();
    if wanted.len() != 1 || name.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let text = written.text;
    let mut labels = 0;
    for window in written.occurrences(&wanted) {
        let (first, last) = (&window[0], &window[window.len() - 1]);
        let end = last.at + last.text.len();
        let line = text[..first.at].rsplit('\n').next().unwrap_or_default();
        let opens_line = line
            .trim_matches(|c: char| c.is_whitespace() || "-*•>#".contains(c))
            .is_empty();
        if !text[end..].starts_with(':') || opens_line || !first.opens {
            return false;
        }
        labels += 1;
    }
    labels > 0
}

/// Whether the texts write `name`, one word, only as a term that stands
/// for a party, the way contracts and forms name their parties: defined
/// in quotes or as a field label at least once (`Northwind Outfitters
/// (the "Client")`, "Client: Northwind Outfitters") and otherwise only
/// after "the" ("The Client shall …"). The party itself is named
/// elsewhere. A word never defined so is left alone, however often "the"
/// comes before it ("the Acme account" is Acme's).
pub fn only_a_defined_term(name: &str, texts: &[Written<'_>]) -> bool {
    let mut wanted: Vec<String> = words(name).map(str::to_lowercase).collect();
    if wanted.len() == 2 && wanted[0] == "the" {
        wanted.remove(0);
    }
    if wanted.len() != 1 || name.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let quote = |c: Option<char>| c.is_some_and(|c| "\"“”'‘’".contains(c));
    let mut defined = false;
    for t in texts {
        for (i, w) in t.words.iter().enumerate() {
            if w.text.to_lowercase() != wanted[0] {
                continue;
            }
            let end = w.at + w.text.len();
            let quoted =
                quote(t.text[..w.at].chars().next_back()) && quote(t.text[end..].chars().next());
            let label = t.text[end..].starts_with(':');
            let the = i > 0 && t.words[i - 1].text.eq_ignore_ascii_case("the");
            if quoted || label {
                defined = true;
            } else if !the {
                return false;
            }
        }
    }
    defined
}

/// A text a model was shown, split once into the words [`common_noun`]
/// and [`only_a_label`] read, each of which is asked about every name
/// offered for the episode.
pub struct Written<'a> {
    text: &'a str,
    words: Vec<Word<'a>>,
}

impl<'a> Written<'a> {
    /// Splits `text` into its words ([`words_opening_sentences`]).
    pub fn new(text: &'a str) -> Self {
        Written {
            text,
            words: words_opening_sentences(text),
        }
    }

    /// The words as written ([`words`]).
    pub fn words(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.words.iter().map(|w| w.text)
    }

    /// Every run of words that spells `wanted` (words in lower case),
    /// case ignored.
    fn occurrences<'w>(&'w self, wanted: &'w [String]) -> impl Iterator<Item = &'w [Word<'a>]> {
        self.occurrences_at(wanted).map(|(_, window)| window)
    }

    /// [`Self::occurrences`], each with the index of its first word.
    fn occurrences_at<'w>(
        &'w self,
        wanted: &'w [String],
    ) -> impl Iterator<Item = (usize, &'w [Word<'a>])> {
        self.words
            .windows(wanted.len())
            .enumerate()
            .filter(move |(_, window)| {
                window
                    .iter()
                    .zip(wanted)
                    .all(|(w, want)| w.text.to_lowercase() == *want)
            })
    }

    /// Whether word `at` is capitalised and follows, with one space
    /// between, a capitalised plain word that opens no sentence: the last
    /// word of a longer name ("Payments Engineering"), not "Dear Maya".
    fn ends_a_longer_name(&self, at: usize) -> bool {
        let capitalised = |w: &Word<'_>| w.text.starts_with(char::is_uppercase);
        let (Some(prev), Some(word)) = (
            at.checked_sub(1).map(|p| &self.words[p]),
            self.words.get(at),
        ) else {
            return false;
        };
        capitalised(word)
            && capitalised(prev)
            && prev.plain
            && !prev.opens
            && self.text[prev.at + prev.text.len()..word.at] == *" "
    }
}

/// A word of a text as [`common_noun`] reads it.
struct Word<'a> {
    text: &'a str,
    /// Where it starts in the text (a byte offset).
    at: usize,
    /// It opens a sentence.
    opens: bool,
    /// It stands as a word of its own, not inside an address, a domain or
    /// a slug (`acme` in `dana@acme.com`).
    plain: bool,
}

/// The [`words`] of `text`, each with whether it opens a sentence: it is
/// the first word, or the last mark before it (quotes, brackets, dashes
/// and spaces aside) ends a sentence or a line, or it follows a speaker
/// ("Dana Whitcombe: Legal sent …": one to four capitalised words opening
/// the line, then the line's first colon). Another colon does not: what
/// follows a label ("description": "Onsite deployment …") is written as
/// its writer styles it.
fn words_opening_sentences(text: &str) -> Vec<Word<'_>> {
    let code_mark = |c: char| "@._/-".contains(c);
    let speaker = |head: &str| {
        let words: Vec<&str> = head.split_whitespace().collect();
        (1..=4).contains(&words.len())
            && !head.contains(':')
            && words.iter().all(|w| w.starts_with(char::is_uppercase))
    };
    let mut out = Vec::new();
    let mut opens = true;
    let mut line_start = 0;
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if c.is_alphanumeric() {
            start.get_or_insert(i);
            continue;
        }
        if let Some(s) = start.take() {
            // A mark joins two words only with no space around it
            // ("acme.com"; not "acme. Then").
            let after = text[i + c.len_utf8()..].chars().next();
            let joined = code_mark(c) && after.is_some_and(char::is_alphanumeric);
            let before = text[..s].chars().next_back().is_some_and(code_mark);
            out.push(Word {
                text: &text[s..i],
                at: s,
                opens,
                plain: !before && !joined,
            });
            opens = false;
        }
        if c == '\n' {
            line_start = i + 1;
        }
        if matches!(c, '.' | '!' | '?' | '\n') {
            opens = true;
        } else if c == ':' {
            opens = speaker(&text[line_start..i]);
        } else if !(c.is_whitespace() || "\"'“”‘’()[]-–—*•".contains(c)) {
            opens = false;
        }
    }
    if let Some(s) = start {
        out.push(Word {
            text: &text[s..],
            at: s,
            opens,
            plain: !text[..s].chars().next_back().is_some_and(code_mark),
        });
    }
    out
}

/// The words of `text`: its runs of letters and digits, as written.
pub fn words(text: &str) -> impl DoubleEndedIterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

/// Whether `lower` (a name in lower case) is a severity or priority
/// level as incident and ticket tools write them: "sev-1", "sev 2",
/// "severity 3", "p1", "priority 0". Such a level is a value of a ticket,
/// not an entity.
fn is_severity_level(lower: &str) -> bool {
    let level = ["severity", "priority", "prio", "sev", "p"]
        .iter()
        .find_map(|prefix| lower.strip_prefix(prefix));
    level.is_some_and(|rest| {
        let rest = rest.trim_start_matches([' ', '-']);
        rest.len() == 1 && rest.chars().all(|c| c.is_ascii_digit())
    })
}

/// Whether `text` is one e-mail address and nothing else
/// ("engineering@tidewell.io"; not "Priya <priya@acme.com>").
fn is_email_address(text: &str) -> bool {
    let Some((local, domain)) = text.split_once('@') else {
        return false;
    };
    let local_ok = !local.is_empty()
        && local
            .chars()
            .all(|c| c.is_alphanumeric() || "._%+-".contains(c));
    let labels: Vec<&str> = domain.split('.').collect();
    local_ok
        && labels.len() >= 2
        && labels
            .iter()
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_alphanumeric() || c == '-'))
}

/// What a name offered as an entity is instead, when it is a date, an
/// amount or a price, a span of time, a quantity, a status, an e-mail
/// address, a severity level, a numbered section heading or a clause:
/// "March 1, 2025", "Q3 2025", "$1,200", "USD 14.50 per seat", "14 Days",
/// "40 laptops", "open", "ops@acme.com", "SEV-1", "2. Scope", "Purchase
/// order that the Customer issues and the Supplier accepts".
/// Names that merely hold such words ("May Chen", "3M", "Open Systems
/// Ltd", "1 World Trade Center") are entities, and so are descriptive
/// references ("the order form for the Corvid Workspace seats"), which
/// resolution can bring to their entity.
pub fn non_entity_kind(name: &str) -> Option<&'static str> {
    let lower = name.trim().to_lowercase();
    if STATUS_WORDS.contains(&lower.as_str()) {
        return Some("a status");
    }
    // An address is contact data of an entity (a person's, a team's
    // mailbox), which the ontology's properties hold, not an entity.
    if is_email_address(&lower) {
        return Some("an e-mail address");
    }
    if is_severity_level(&lower) {
        return Some("a severity or priority level");
    }
    let words: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    let is_number = |w: &str| {
        let digits = w.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let suffix = &w[digits.len()..];
        !digits.is_empty()
            && digits
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
            && digits.chars().any(|c| c.is_ascii_digit())
            && matches!(suffix, "" | "st" | "nd" | "rd" | "th")
    };
    let is_quarter = |w: &str| {
        w.len() == 2 && w.starts_with('q') && ('1'..='4').contains(&w.chars().nth(1).unwrap_or('0'))
    };
    let has_month = words.iter().any(|w| is_month(w));
    let has_quarter = words.iter().any(|w| is_quarter(w));
    let all_date_words = words
        .iter()
        .all(|w| is_number(w) || is_month(w) || is_quarter(w));
    if (has_month || has_quarter) && all_date_words && words.iter().any(|w| is_number(w)) {
        return Some("a date");
    }
    let amount_part = |w: &str| {
        let bare = w.trim_start_matches(['$', '€', '£', '¥']);
        CURRENCIES.contains(&w) || is_number(bare) || matches!(bare, "k" | "m" | "million")
    };
    // A price is an amount per something ("USD 14.50 per seat per month").
    let amount = match words.iter().position(|w| *w == "per") {
        Some(at) if at > 0 => &words[..at],
        _ => &words[..],
    };
    let has_currency = CURRENCIES.iter().any(|c| {
        amount
            .iter()
            .any(|w| w == c || (c.len() == 1 && w.starts_with(c)))
    });
    if has_currency
        && amount.iter().all(|w| amount_part(w))
        && amount
            .iter()
            .any(|w| is_number(w.trim_start_matches(['$', '€', '£', '¥'])))
    {
        return Some("an amount");
    }
    // A line of an order or an invoice: a money amount beside other words
    // ("Corvid Workspace seats at $14.50"). A name does not carry a price;
    // the thing priced is named without it (a price in brackets at the end
    // is cut off before this check, see [`without_price`]).
    if has_price(&lower) {
        return Some("a priced line");
    }
    // A span of time: a number, then only units ("14 Days", "30 business
    // days"); a model capitalises them, so the count rule below misses them.
    if words.len() >= 2
        && is_number(words[0])
        && words[1..]
            .iter()
            .all(|w| DURATION_UNITS.contains(w) || DURATION_QUALIFIERS.contains(w))
        && words[1..].iter().any(|w| DURATION_UNITS.contains(w))
    {
        return Some("a duration");
    }
    // A count of common nouns: the original text has no capital after the
    // number ("40 laptops", not "1 World Trade Center").
    let original: Vec<&str> = name.split_whitespace().collect();
    if original.len() >= 2
        && is_number(&original[0].to_lowercase())
        && original[1..]
            .iter()
            .all(|w| w.chars().next().is_some_and(|c| !c.is_uppercase()))
    {
        return Some("a quantity");
    }
    // A numbered heading ("2. Scope", "7.1. Payment"): a section of a
    // document, not a name of one.
    let section_number = |w: &str| {
        w.len() >= 2
            && w.ends_with('.')
            && w.chars().all(|c| c.is_ascii_digit() || c == '.')
            && w.starts_with(|c: char| c.is_ascii_digit())
    };
    if original.len() >= 2 && section_number(original[0]) {
        return Some("a section heading");
    }
    // A clause: names are capitalised but for a few particles ("Draft MSA
    // between Acme Corp and Northwind"); five words in lower case make a
    // passage ("Purchase order that the Customer issues and the Supplier
    // accepts"), unless a determiner leads it: "the order form for the
    // Corvid Workspace seats" is a descriptive reference, which resolution
    // can bring to its entity.
    let lower_words = original
        .iter()
        .filter(|w| w.chars().next().is_some_and(char::is_lowercase))
        .count();
    let determiner = original
        .first()
        .is_some_and(|w| DETERMINERS.contains(&w.to_lowercase().as_str()));
    if lower_words >= 5 && !determiner {
        return Some("a clause");
    }
    // A day said relative to the text ("Imaging starts tomorrow"): names
    // write such words capitalised ("The Today Show"), sentences do not.
    if original.len() >= 2 && original.iter().any(|w| RELATIVE_DAYS.contains(w)) {
        return Some("a clause");
    }
    // Someone's group or thing, told by a possessive and common nouns
    // ("Ingrid's legal team", "Hamid's last day"); a possessive name with
    // no lower-case words after it ("McDonald's", "Moody's Investors
    // Service") is a name.
    if let Some(at) = original
        .iter()
        .position(|w| w.ends_with("'s") || w.ends_with("\u{2019}s"))
    {
        let rest = &original[at + 1..];
        if !rest.is_empty()
            && rest
                .iter()
                .all(|w| w.chars().next().is_some_and(char::is_lowercase))
        {
            return Some("a description");
        }
    }
    // A choice between names ("Owen or Felix"): not one entity.
    if original.len() >= 3
        && original.windows(3).any(|w| {
            w[1] == "or"
                && w[0].starts_with(char::is_uppercase)
                && w[2].starts_with(char::is_uppercase)
        })
    {
        return Some("a choice between names");
    }
    None
}

/// Words that place a day relative to when the text was written.
const RELATIVE_DAYS: [&str; 4] = ["today", "tonight", "tomorrow", "yesterday"];

/// Whether `name` is only a month name (or its abbreviation) that `text`
/// uses as a date: after a word that places a time ("in June", "the
/// first week of July", "by Sept.") or before a number ("June 3", "July
/// 2025"). A month name that `text` writes otherwise, such as a person's
/// ("June said …"), is left to the other rules.
pub fn month_as_date(name: &str, text: &str) -> bool {
    const BEFORE: [&str; 16] = [
        "in", "of", "by", "until", "till", "since", "from", "before", "after", "during", "through",
        "next", "last", "early", "late", "mid",
    ];
    let name = name.trim().trim_end_matches('.');
    if name.is_empty() || name.contains(char::is_whitespace) || !is_month(&name.to_lowercase()) {
        return false;
    }
    let written: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|w| !w.is_empty())
        .collect();
    written.iter().enumerate().any(|(i, w)| {
        let bare = w.trim_end_matches(['.', ':', ';', '!', '?']);
        if !bare.eq_ignore_ascii_case(name) {
            return false;
        }
        let before = i
            .checked_sub(1)
            .map(|j| written[j].to_lowercase())
            .is_some_and(|b| BEFORE.contains(&b.as_str()));
        let after = written
            .get(i + 1)
            .is_some_and(|a| a.starts_with(|c: char| c.is_ascii_digit()));
        before || after
    })
}

/// A name without the count a model wrote in front of it: "12 Ridgeback
/// 14 laptops" is twelve of "Ridgeback 14 laptops". Only a bare number
/// before a name that holds a capitalised word and ends in a plural
/// common noun is a count; "1 World Trade Center", "7 Days Inn", "101
/// Dalmatians" and "20th Century Fox" are names and are kept whole.
pub fn without_count(name: &str) -> &str {
    let trimmed = name.trim();
    let Some((first, rest)) = trimmed.split_once(char::is_whitespace) else {
        return trimmed;
    };
    let rest = rest.trim_start();
    let count = first.starts_with(|c: char| c.is_ascii_digit())
        && first.chars().all(|c| c.is_ascii_digit() || c == ',');
    let words: Vec<&str> = rest.split_whitespace().collect();
    let named = words.iter().any(|w| w.starts_with(char::is_uppercase));
    let plural = words.last().is_some_and(|w| {
        w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") && w.chars().all(char::is_lowercase)
    });
    if count && words.len() >= 2 && named && plural {
        rest
    } else {
        trimmed
    }
}

/// The last words of job titles: "Customer Success Manager", "Enterprise
/// Sales Lead", "Chief Revenue Officer".
const TITLE_HEADS: [&str; 16] = [
    "manager",
    "lead",
    "director",
    "officer",
    "engineer",
    "analyst",
    "specialist",
    "coordinator",
    "administrator",
    "consultant",
    "representative",
    "executive",
    "counsel",
    "controller",
    "president",
    "architect",
];

/// Whether `name` is a job title: two or more capitalised words (or a
/// title with "of"/"and"/"for" inside) that end in a title's last word
/// ([`TITLE_HEADS`]), with no digit, bracket or comma. Asked only of names
/// offered as people: a person's name does not end in "Manager", a
/// product's may ("Secrets Manager"), so the caller checks the type.
pub fn job_title(name: &str) -> bool {
    let words: Vec<&str> = name.split_whitespace().collect();
    if words.len() < 2 || name.contains(|c: char| c.is_ascii_digit() || "(),<>@".contains(c)) {
        return false;
    }
    let last = words[words.len() - 1].to_lowercase();
    TITLE_HEADS.contains(&last.as_str())
        && words
            .iter()
            .all(|w| w.starts_with(char::is_uppercase) || matches!(*w, "of" | "and" | "for" | "&"))
}

/// Whether `text` writes a money amount: a currency code or sign next to
/// a number ("USD 27,400.00", "1,200 EUR", "$14.50").
fn has_price(text: &str) -> bool {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| "()[]:;,".contains(c)))
        .filter(|w| !w.is_empty())
        .collect();
    let number = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_digit())
            && w.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
    };
    let currency = |w: &str| CURRENCIES.contains(&w);
    let signs = ['$', '€', '£', '¥'];
    words
        .windows(2)
        .any(|p| (currency(p[0]) && number(p[1])) || (number(p[0]) && currency(p[1])))
        || words
            .iter()
            .any(|w| w.starts_with(signs) && number(w.trim_start_matches(signs)))
}

/// A name without the price a model wrote after it in brackets: "20
/// Ridgeback 14 laptops (USD 27,400.00)" is "20 Ridgeback 14 laptops"
/// (whose count [`without_count`] then takes off). Brackets that hold no
/// money amount stay: "Acme (UK) Ltd".
pub fn without_price(name: &str) -> &str {
    let trimmed = name.trim();
    let Some(open) = trimmed.strip_suffix(')').and_then(|t| t.rfind('(')) else {
        return trimmed;
    };
    let (head, bracket) = trimmed.split_at(open);
    if !head.trim().is_empty() && has_price(bracket) {
        head.trim_end()
    } else {
        trimmed
    }
}

/// A name without the affiliation a writer put after it: "Oskar from
/// Pellucid" is Oskar, who is with Pellucid. Only capitalised words on both
/// sides of a lower-case "from" make one, so "Sales from Q3" or "data from
/// the ledger" stay whole (the other checks judge them); a title built
/// this way ("Letters From Home") writes "From" capitalised and is kept.
pub fn without_affiliation(name: &str) -> &str {
    let trimmed = name.trim();
    let Some((person, affiliation)) = trimmed.split_once(" from ") else {
        return trimmed;
    };
    let capitalised = |part: &str| {
        let mut words = part.split_whitespace().peekable();
        words.peek().is_some() && words.all(|w| w.starts_with(char::is_uppercase))
    };
    if capitalised(person) && capitalised(affiliation) {
        person.trim()
    } else {
        trimmed
    }
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

/// Phrases with which a sentence says a relationship has ended.
const END_PHRASES: [&str; 16] = [
    "no longer",
    "has left",
    "have left",
    "had left",
    "left",
    "former",
    "formerly",
    "used to",
    "ended",
    "ceased",
    "stopped",
    "terminated",
    "cancelled",
    "canceled",
    "resigned",
    "quit",
];

/// Whether a fact sentence says its relationship has ended ("is no longer
/// employed by", "has left", "the contract was cancelled"), by whole
/// words. A future end ("until next year") is not an end yet.
pub fn states_an_end(fact: &str) -> bool {
    let words: Vec<String> = words(fact).map(str::to_lowercase).collect();
    END_PHRASES.iter().any(|p| {
        let phrase: Vec<&str> = p.split(' ').collect();
        words
            .windows(phrase.len())
            .any(|w| w.iter().zip(&phrase).all(|(a, b)| a == b))
    })
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
    fn ended_relationships_are_told_by_whole_words() {
        for f in [
            "Dana Whitcombe is no longer employed by Acme Corp",
            "Priya Raman has left Brightline",
            "Sam left Acme in March",
            "The MSA between Acme and Brightline was cancelled",
            "Lee is a former employee of Globex",
        ] {
            assert!(states_an_end(f), "{f}");
        }
        for f in [
            "Dana works for Acme Corp",
            "Acme's leftover stock ships to Brightline",
            "Brightline endorsed the order",
            "Lee works at Globex until next year",
        ] {
            assert!(!states_an_end(f), "{f}");
        }
    }

    #[test]
    fn dates_amounts_quantities_and_statuses_are_told_from_names() {
        for (name, kind) in [
            ("March 1, 2025", "a date"),
            ("1 March 2025", "a date"),
            ("Sept. 3rd", "a date"),
            ("Q3 2025", "a date"),
            ("$1,200", "an amount"),
            ("300 EUR", "an amount"),
            ("USD 5 million", "an amount"),
            ("USD 14.50 per seat per month", "an amount"),
            ("Corvid Workspace seats at $14.50", "a priced line"),
            ("Support renewal: 1,200 EUR", "a priced line"),
            ("14 Days", "a duration"),
            ("30 Business Days", "a duration"),
            ("36 months", "a duration"),
            ("40 laptops", "a quantity"),
            ("3 units of stock", "a quantity"),
            ("open", "a status"),
            ("In progress", "a status"),
            ("2. Scope", "a section heading"),
            ("7.1. Payment Terms", "a section heading"),
            (
                "Purchase order that the Customer issues and the Supplier accepts",
                "a clause",
            ),
            (
                "Quoted unit price for at least thirty (30) days from the date of the quote",
                "a clause",
            ),
            ("Imaging starts tomorrow", "a clause"),
            ("Ingrid's legal team", "a description"),
            ("Hamid\u{2019}s last day", "a description"),
            ("Owen or Felix or Owen or Felix", "a choice between names"),
            ("engineering@tidewell.io", "an e-mail address"),
            ("Priya.Raman+po@acme-corp.co.uk", "an e-mail address"),
            ("SEV-1", "a severity or priority level"),
            ("Sev 2", "a severity or priority level"),
            ("P1", "a severity or priority level"),
            ("Priority 0", "a severity or priority level"),
        ] {
            assert_eq!(non_entity_kind(name), Some(kind), "{name}");
        }
        for name in [
            "May Chen",
            "March Networks",
            "3M",
            "7-Eleven",
            "Open Systems Ltd",
            "1 World Trade Center",
            "PO-4471",
            "Order form OF-601",
            "Acme Corp",
            "20th Century Fox",
            "7 Days Inn",
            "Per Larsen",
            "2.0 Release Train",
            "Draft MSA between Acme Corp and Northwind Outfitters",
            "the order form for the Corvid Workspace seats",
            "the master services agreement effective 15 April 2024",
            "our existing agreement with them",
            "International Brotherhood of Electrical Workers Local Union No. 1245",
            "The Today Show",
            "McDonald's",
            "Moody's Investors Service",
            "Procter and Gamble",
            "Priya Raman <priya@acme.com>",
            "Booking.com",
            "@tidewell",
            "P10 Industries",
            "PS5",
            "Sevco 1",
            "USD Partners LP",
            "$ave-More Stores",
            "Euro 2024 Committee",
        ] {
            assert_eq!(non_entity_kind(name), None, "{name}");
        }
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
    fn a_month_name_the_text_uses_as_a_date_is_a_date_and_a_given_name_is_not() {
        let text = "Delivery is planned for the first week of July. Renewal is due in June; \
                    Sept. 3 at the latest. June said she would check.";
        for name in ["July", "June", "Sept", "Sept."] {
            assert!(month_as_date(name, text), "{name}");
        }
        assert!(!month_as_date("June", "June said she would check."));
        assert!(!month_as_date("August", text), "not in the text");
        assert!(!month_as_date("June Carter", text), "a month and more");
        assert!(!month_as_date("Acme", "in Acme"));
    }

    #[test]
    fn a_count_in_front_of_a_named_product_is_dropped_and_names_led_by_a_number_are_kept() {
        assert_eq!(
            without_count("12 Ridgeback 14 laptops"),
            "Ridgeback 14 laptops"
        );
        assert_eq!(without_count("40 Lumen 27 monitors"), "Lumen 27 monitors");
        assert_eq!(
            without_count(without_price("20 Ridgeback 14 laptops (USD 27,400.00)")),
            "Ridgeback 14 laptops"
        );
        assert_eq!(
            without_price("Planner seats ($1,200 per month)"),
            "Planner seats"
        );
        for name in ["Acme (UK) Ltd", "(USD 5)", "Lumen 27 (2024 model)"] {
            assert_eq!(without_price(name), name, "{name}");
        }
        assert_eq!(
            without_count(" 1,200 Corvid Workspace seats"),
            "Corvid Workspace seats"
        );
        for name in [
            "1 World Trade Center",
            "7 Days Inn",
            "101 Dalmatians",
            "20th Century Fox",
            "40 laptops",
            "3M",
            "24/7 remote help desk",
            "2 Broadway Partners",
        ] {
            assert_eq!(without_count(name), name, "{name}");
        }
    }

    #[test]
    fn an_affiliation_written_after_a_name_is_not_part_of_it() {
        assert_eq!(without_affiliation("Oskar from Pellucid"), "Oskar");
        assert_eq!(
            without_affiliation("Priya Raman from Acme Corp"),
            "Priya Raman"
        );
        for name in [
            "Letters From Home",
            "Sales from Q3 2025",
            "Oskar from the vendor",
            "Oskar",
        ] {
            assert_eq!(without_affiliation(name), name, "{name}");
        }
    }

    /// [`common_noun`] over texts given as strings.
    fn noun(name: &str, texts: &[&str]) -> bool {
        let written: Vec<Written> = texts.iter().map(|t| Written::new(t)).collect();
        common_noun(name, &written)
    }

    /// [`only_a_label`] over a text given as a string.
    fn label(name: &str, text: &str) -> bool {
        only_a_label(name, &Written::new(text))
    }

    #[test]
    fn a_title_without_a_name_is_a_job_title() {
        for title in [
            "Customer Success Manager",
            "Enterprise Sales Lead",
            "Chief Revenue Officer",
            "VP of Engineering and Operations Director",
            "Site Reliability Engineer",
        ] {
            assert!(job_title(title), "{title}");
        }
        for name in [
            "Priya Raman",
            "Manager",
            "Priya Raman, Procurement Manager",
            "Dana Whitcombe (Sales Lead)",
            "Lead",
            "the procurement manager",
            "Grace Adeyemi",
        ] {
            assert!(!job_title(name), "{name}");
        }
    }

    #[test]
    fn a_party_written_only_as_the_party_or_a_label_is_a_defined_term() {
        let term = |name: &str, texts: &[&str]| {
            let written: Vec<Written> = texts.iter().map(|t| Written::new(t)).collect();
            only_a_defined_term(name, &written)
        };
        let contract = "Halvorsen IT Services (\"Provider\") and Northwind Outfitters \
                        (the \"Client\"). The Client shall give notice.";
        let form = "Provider: Halvorsen IT Services. Client: Northwind Outfitters.";
        assert!(term("Client", &[contract, form]));
        assert!(term("The Client", &[contract]));
        assert!(term("Client", &[form, "The Client may add devices."]));
        // Once without "the" or a definition: a name (or not provably a term).
        assert!(!term("Provider", &[contract, "Provider invoices monthly."]));
        assert!(!term("Ledger", &["The Ledger: paged. Ledger is down."]));
        // Never defined: "the" before a name does not make it a term.
        assert!(!term(
            "Acme",
            &["We renewed the Acme MSA. The Acme account grew."]
        ));
        // Several words, or a code: names.
        assert!(!term("Ledger Service", &["the Ledger Service paged"]));
        assert!(!term("OF-12", &["the OF-12 order form"]));
    }

    #[test]
    fn a_name_the_text_writes_only_in_lower_case_is_a_noun() {
        let text = &[
            "Acme resells computer hardware and software. The account executive \
             raised a purchase order; see harbour-gateway. Order more? Priya said so.",
        ][..];
        assert!(noun("Hardware", text));
        assert!(noun("Account executive", text));
        assert!(noun("purchase order", text));
        // Capitalised only where a sentence starts, and written in lower
        // case as a word elsewhere.
        assert!(noun("Order", text));
        // Written capitalised mid-sentence: a name (or at least not
        // provably a common noun).
        assert!(!noun("Priya", text));
        assert!(!noun("Acme", text));
        // Identifiers and names the text does not write are left alone.
        assert!(!noun("harbour-gateway", text));
        assert!(!noun("PO-4417", text));
        assert!(noun(
            "Twelve-Month Subscription",
            &["a twelve-month subscription"]
        ));
        assert!(!noun("Northwind", text));
        // Capitalised only as the last word of a longer name, and written
        // in lower case in an address: the longer name's head noun. After
        // a word that opens the line it is a name.
        let mail = &["To: engineering@tidewell.io\n\nSince Payments Engineering took it over."][..];
        assert!(noun("engineering", mail));
        assert!(!noun(
            "Engineering",
            &["Since Payments Engineering took it over."]
        ));
        assert!(!noun(
            "Maya",
            &["To: maya@tidewell.io\n\nDear Maya, thanks."]
        ));
    }

    #[test]
    fn a_phrase_capitalised_only_where_a_sentence_starts_is_a_noun() {
        let text = &[
            "We moved to the new cache cluster on 9 September. Load tests showed \
             no gain.\n- Cache warmers ran twice. Relaywave confirmed; \"Skylark routing\" \
             is new. Line items: {\"description\": \"Onsite deployment engineer\"}",
        ][..];
        assert!(noun("load tests", text));
        assert!(noun("Load Tests", text));
        // A line opens a sentence too (a list item).
        assert!(noun("cache warmers", text));
        // One word that no text writes in lower case keeps its capital
        // wherever it stands.
        assert!(!noun("Relaywave", text));
        // Capitalised after a semicolon and an opening quote: mid-sentence.
        assert!(!noun("Skylark routing", text));
        // A value after a label is styled by its writer.
        assert!(!noun("Onsite deployment engineer", text));
    }

    #[test]
    fn a_name_written_only_before_a_colon_mid_line_is_a_field_label() {
        let form = "ORDER FORM QF-0087. Customer: Northwind Outfitters. Subscription: \
                    Quillfeather Planner, Team edition.\nOwner: Maya\n- Harbour Gateway: Tomás";
        assert!(label("Subscription", form));
        assert!(label("customer", form));
        // Opening a line: a speaker, a heading or a list item.
        assert!(!label("Owner", form));
        assert!(!label("Harbour Gateway", form));
        assert!(!label(
            "Ledger",
            "Maya: Rotation update for Ledger: Sofia is off it."
        ));
        // Written without a colon, or not written at all.
        assert!(!label("Quillfeather Planner", form));
        assert!(!label("Relaywave", form));
        let chat = "Nadia Fairweather: INC-2077: SMS confirmations are late. Status: open.";
        assert!(!label("INC-2077", chat), "a code before its title");
        assert!(label("Status", chat));
    }

    #[test]
    fn one_word_capitalised_only_where_sentences_start_is_a_common_noun_when_also_written_in_lower_case()
     {
        let episode = "Dana Whitcombe: Legal sent over the new contract. Acme confirmed.";
        let context = "Ingrid says their legal team will tell us. Mail dana@acme.com or acme-ops.";
        assert!(noun("Legal", &[episode, context]));
        // Lower case only inside an address or a slug is no evidence.
        assert!(!noun("Acme", &[episode, context]));
        // With no lower-case word at all, a sentence's first word stays a name.
        assert!(!noun("Legal", &[episode]));
    }

    #[test]
    fn a_name_lifted_from_the_context_in_lower_case_is_a_common_noun_and_one_capitalised_anywhere_is_not()
     {
        let episode = "It may return unopened hardware within 14 days.";
        let context = "The Supplier resells computer hardware and support services.";
        let titled = "Support Services are billed monthly.";
        // Only the context writes it, in lower case.
        assert!(noun("Computer Hardware", &[episode, context]));
        // Without the context it is a name no text writes: left alone.
        assert!(!noun("Computer Hardware", &[episode]));
        // Capitalised in one text, lower case in another: not provably a noun.
        assert!(!noun("Support Services", &[context, titled]));
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
