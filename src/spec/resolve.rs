//! `[resolve]`: how mentions become nodes and facts become edges (the
//! stage itself is [`crate::resolve`]).

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

/// `[resolve]` settings. Every key is optional; the defaults are the ones
/// docs/spec.md lists.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// A name that is another name of a compatible type with words added
    /// at the end ("Lumen 27 monitors", "Acme MSA 2024-02-01" after
    /// "Lumen 27", "Acme MSA") is proposed to the adjudicator as that
    /// entity; it never merges without a yes. Off: such names stay apart.
    pub longer_names: bool,
    /// A text mention whose name is exactly a record's entity's name (a
    /// mapped mention or a committed node of origin `map`, same group,
    /// names folded) but of an incompatible type takes the record's type,
    /// so it merges with it: a record is the user's own word on the type.
    pub record_types_win: bool,
    /// A text mention whose name most of the run's episodes and the
    /// committed nodes (same group, names folded) give another top-level
    /// type takes that type: a small model types one name differently
    /// from one episode to the next. Records still win where they speak.
    pub majority_types: bool,
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
    /// Propose the nearest neighbours by name embedding as candidates, for
    /// references no name rule finds ("our MSA" for "Master Services
    /// Agreement"). They never merge on their own: a mention that no other
    /// rule placed and that has neighbours goes to adjudication with them
    /// as options. Turns on `embeddings` (nodes keep their name vectors).
    pub embedding_candidates: bool,
    /// Cosine similarity at or above which a neighbour is proposed.
    pub embedding_min_similarity: f64,
    /// Neighbours proposed per mention, the most similar first.
    pub embedding_top_k: usize,
    /// Random-hyperplane LSH bands over the name vectors; a pair is
    /// compared when its vectors agree on every bit of at least one band.
    pub embedding_bands: usize,
    /// Bits (hyperplanes) per band: more bits, smaller buckets, fewer
    /// candidates at low similarity. Absent: chosen per run so that a
    /// bucket holds about 16 nodes of the largest root type (at least 8
    /// bits, at most 24).
    pub embedding_band_bits: Option<usize>,
    /// Buckets holding more node vectors than this are skipped (like
    /// `lsh_max_bucket`); other bands still find close pairs.
    pub embedding_max_bucket: usize,
    /// Record-linkage rules for types whose mentions carry fields to
    /// compare (records mapped from CRM or HR tables): blocking keys find
    /// candidates, weighted field comparisons score them. A type with a
    /// linkage is matched by it alone.
    pub linkage: Vec<LinkageSpec>,
    /// Run the stage's plans (candidate joins, scoring, the committed
    /// nodes and edges it reads) on the Apache DataFusion Ballista
    /// cluster whose scheduler is at `df://HOST:PORT` (`graphloom cluster
    /// scheduler`; a build with the `cluster` feature). Absent: in this
    /// process. `graphloom run --cluster` and `GRAPHLOOM_CLUSTER` override it.
    pub cluster: Option<String>,
}

/// `[[resolve.linkage]]`: how mentions of one entity type (and its
/// subtypes) are matched field by field.
///
/// Score rule, `model = "weighted"`: the weighted mean of the comparisons
/// whose field both sides have, `Σ wᵢ·sᵢ / Σ wᵢ`, each `sᵢ` in 0..=1.
/// `model = "probabilistic"`: the Fellegi-Sunter match probability, each
/// comparison cut into levels whose m and u probabilities are estimated
/// from the run's own records (docs/mapping.md, "Record linkage"). Either way a pair
/// with fewer than `min_fields` compared fields scores 0. Pairs at or
/// above `threshold` merge
/// (against committed nodes the best one, when it beats the rest), pairs in
/// `[grey_band_min, threshold)` are ambiguous (LLM adjudication, or kept
/// apart without it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkageSpec {
    /// The entity type; its subtypes are matched by the same rule.
    #[serde(rename = "type")]
    pub entity_type: String,
    /// Blocking keys: two mentions are candidates when they agree on every
    /// part of at least one key. A key is fields separated by `+`, each
    /// `field` (folded text) or `field:N` (its first N characters);
    /// `name` is the entity's name, other fields are its properties.
    pub blocking: Vec<String>,
    /// The field comparisons.
    pub compare: Vec<CompareSpec>,
    /// How the comparisons become a score.
    #[serde(default)]
    pub model: LinkageModel,
    /// Random record pairs drawn to estimate the u probabilities of the
    /// probabilistic model (how often two unrelated records agree at each
    /// level).
    #[serde(default = "default_u_sample_pairs")]
    pub u_sample_pairs: usize,
    /// Score at or above which a pair merges.
    #[serde(default = "default_link_threshold")]
    pub threshold: f64,
    /// Lower end of the grey band (ambiguous pairs); `threshold` when
    /// absent (no grey band).
    #[serde(default)]
    pub grey_band_min: Option<f64>,
    /// Fewest comparisons with a value on both sides for a score.
    #[serde(default = "default_min_fields")]
    pub min_fields: usize,
    /// Blocking keys shared by more mentions and nodes than this are
    /// skipped (a key that common says little); the other keys still
    /// find true pairs.
    #[serde(default = "default_max_block")]
    pub max_block: usize,
}

/// How a [`LinkageSpec`] turns its comparisons into a score.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkageModel {
    /// The weighted mean of the similarities, weights from the spec.
    #[default]
    Weighted,
    /// Fellegi-Sunter: each comparison's level (its `levels`) adds the
    /// log-ratio of how often true matches and random pairs reach it; m
    /// estimated by EM over the candidate pairs, u from random pairs.
    Probabilistic,
}

/// Most comparisons a probabilistic rule can have (each pair's levels are
/// packed into one 64-bit key, 4 bits each).
pub const MAX_PROBABILISTIC_COMPARISONS: usize = 14;

fn default_u_sample_pairs() -> usize {
    1_000_000
}

fn default_link_threshold() -> f64 {
    0.85
}

fn default_min_fields() -> usize {
    2
}

fn default_max_block() -> usize {
    200
}

/// One field comparison of a [`LinkageSpec`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareSpec {
    /// `name` or a property of the type.
    pub field: String,
    /// How the two values are compared.
    pub method: CompareMethod,
    /// Weight in the score (default 1; weighted model only).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Probabilistic model only: similarity thresholds, highest first,
    /// that cut the comparison into levels (`[1.0, 0.92, 0.8]`: equal,
    /// ≥ 0.92, ≥ 0.8, else). Absent: the method's default levels.
    #[serde(default)]
    pub levels: Option<Vec<f64>>,
}

fn default_weight() -> f64 {
    1.0
}

/// Field comparisons, each giving a similarity in 0..=1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareMethod {
    /// 1 when the texts are equal as written, else 0.
    Exact,
    /// 1 when equal after folding case and punctuation, else 0.
    Folded,
    /// Jaro-Winkler similarity of the folded texts (names: typos, dropped
    /// letters); when the folded words are the same set in another order
    /// ("Raman Priya"), 1.
    Name,
    /// Jaccard similarity of the folded texts' 3-character shingles
    /// (addresses, descriptions: words added, dropped or moved).
    Text,
    /// Dates (`YYYY-MM-DD`, `YYYYMMDD`, RFC 3339): 1 when equal, else the
    /// Levenshtein similarity of their eight digits (one wrong digit
    /// scores 0.875), 0 when either is not a date.
    Date,
    /// Codes (ids, postcodes, phone numbers): the Levenshtein similarity
    /// of the folded texts (one mistyped character of seven scores 0.857).
    Code,
    /// Numbers: `1 - |a - b| / max(|a|, |b|)`, floored at 0.
    Number,
}

impl LinkageSpec {
    /// Problems with the values, as (key, message) pairs; `at` is the
    /// table's key (`resolve.linkage[0]`).
    pub fn problems(&self, at: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |key: &str, msg: String| out.push((format!("{at}.{key}"), msg));
        if self.blocking.is_empty() {
            bad("blocking", "needs at least one blocking key".into());
        }
        for (i, key) in self.blocking.iter().enumerate() {
            if let Err(m) = parse_block_key(key) {
                bad(&format!("blocking[{i}]"), m);
            }
        }
        if self.compare.is_empty() {
            bad("compare", "needs at least one comparison".into());
        }
        for (i, c) in self.compare.iter().enumerate() {
            if c.field.trim().is_empty() {
                bad(&format!("compare[{i}].field"), "must name a field".into());
            }
            if !(c.weight.is_finite() && c.weight > 0.0) {
                bad(
                    &format!("compare[{i}].weight"),
                    format!("must be a positive number, got {}", c.weight),
                );
            }
            if let Some(levels) = &c.levels {
                let ordered = levels.windows(2).all(|w| w[0] > w[1]);
                let in_range = levels.iter().all(|v| *v > 0.0 && *v <= 1.0);
                if levels.is_empty() || levels.len() > 14 || !ordered || !in_range {
                    bad(
                        &format!("compare[{i}].levels"),
                        format!(
                            "must be 1 to 14 similarities in (0, 1], highest first, got {levels:?}"
                        ),
                    );
                }
            }
        }
        if self.model == LinkageModel::Probabilistic {
            if self.compare.len() > MAX_PROBABILISTIC_COMPARISONS {
                bad(
                    "compare",
                    format!(
                        "a probabilistic rule takes at most {MAX_PROBABILISTIC_COMPARISONS} comparisons, got {}",
                        self.compare.len()
                    ),
                );
            }
            if self.u_sample_pairs < 1000 {
                bad(
                    "u_sample_pairs",
                    format!("must be at least 1000, got {}", self.u_sample_pairs),
                );
            }
        }
        for (key, v) in [
            ("threshold", Some(self.threshold)),
            ("grey_band_min", self.grey_band_min),
        ] {
            if let Some(v) = v
                && !(0.0..=1.0).contains(&v)
            {
                bad(key, format!("must be between 0 and 1, got {v}"));
            }
        }
        if let Some(g) = self.grey_band_min
            && g > self.threshold
        {
            bad(
                "grey_band_min",
                format!("must not exceed threshold ({g} > {})", self.threshold),
            );
        }
        if self.min_fields == 0 || self.min_fields > self.compare.len().max(1) {
            bad(
                "min_fields",
                format!(
                    "must be between 1 and the number of comparisons ({}), got {}",
                    self.compare.len(),
                    self.min_fields
                ),
            );
        }
        if self.max_block < 2 {
            bad(
                "max_block",
                format!("must be at least 2, got {}", self.max_block),
            );
        }
        out
    }

    /// The fields the rule reads (blocking keys and comparisons), `name`
    /// included.
    pub fn fields(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .blocking
            .iter()
            .filter_map(|k| parse_block_key(k).ok())
            .flatten()
            .map(|(f, _)| f)
            .chain(self.compare.iter().map(|c| c.field.clone()))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// A blocking key's parts: `(field, prefix length)`.
pub fn parse_block_key(key: &str) -> Result<Vec<(String, Option<usize>)>, String> {
    let mut parts = Vec::new();
    for part in key.split('+') {
        let part = part.trim();
        let (field, prefix) = match part.split_once(':') {
            Some((f, n)) => match n.trim().parse::<usize>() {
                Ok(n) if n > 0 => (f.trim(), Some(n)),
                _ => {
                    return Err(format!(
                        "`{key}`: `{part}` needs a positive prefix length after `:`"
                    ));
                }
            },
            None => (part, None),
        };
        if field.is_empty() {
            return Err(format!(
                "`{key}`: a key is fields joined by `+`, e.g. `surname:3+postcode`"
            ));
        }
        parts.push((field.to_string(), prefix));
    }
    Ok(parts)
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
            longer_names: true,
            record_types_win: true,
            majority_types: true,
            adjudicate: true,
            adjudication_batch_size: 10,
            max_candidates: 4,
            judge_contradictions: true,
            contradiction_batch_size: 10,
            duplicate_fact_similarity: 0.9,
            summaries: false,
            summary_batch_size: 10,
            embeddings: false,
            embedding_candidates: false,
            embedding_min_similarity: 0.5,
            embedding_top_k: 3,
            embedding_bands: 32,
            embedding_band_bits: None,
            embedding_max_bucket: 2000,
            linkage: Vec::new(),
            cluster: None,
        }
    }
}

impl ResolveSpec {
    /// Whether a type chain falls under a `[[resolve.linkage]]` rule (its
    /// type or an ancestor is a rule's type): such mentions are matched by
    /// that rule alone.
    pub fn is_linked(&self, chain: &[String]) -> bool {
        self.linkage.iter().any(|l| chain.contains(&l.entity_type))
    }

    /// The name blocking keys these settings give (suffix folding and the
    /// LSH shape), as nodes store them.
    pub fn name_keys(&self) -> crate::text::NameKeys {
        crate::text::NameKeys::new(
            self.corporate_suffixes.clone(),
            self.lsh_bands,
            self.lsh_rows,
        )
    }

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
        if !(-1.0..=1.0).contains(&self.embedding_min_similarity) {
            out.push((
                "resolve.embedding_min_similarity".into(),
                format!(
                    "is a cosine similarity, between -1 and 1; got {}",
                    self.embedding_min_similarity
                ),
            ));
        }
        if let Some(bits) = self.embedding_band_bits
            && !(1..=32).contains(&bits)
        {
            out.push((
                "resolve.embedding_band_bits".into(),
                format!("must be between 1 and 32, got {bits}"),
            ));
        }
        if self.embedding_max_bucket < 2 {
            out.push((
                "resolve.embedding_max_bucket".into(),
                format!("must be at least 2, got {}", self.embedding_max_bucket),
            ));
        }
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
        for (i, l) in self.linkage.iter().enumerate() {
            out.extend(l.problems(&format!("resolve.linkage[{i}]")));
        }
        for (key, v) in [
            ("lsh_bands", self.lsh_bands),
            ("lsh_rows", self.lsh_rows),
            ("adjudication_batch_size", self.adjudication_batch_size),
            ("max_candidates", self.max_candidates),
            ("contradiction_batch_size", self.contradiction_batch_size),
            ("summary_batch_size", self.summary_batch_size),
            ("embedding_top_k", self.embedding_top_k),
            ("embedding_bands", self.embedding_bands),
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
