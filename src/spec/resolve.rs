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
/// documented in the README.
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
