//! Entity resolution as DataFusion plans.
//!
//! A run's mentions (a registered table, [`mentions_schema`]) are matched
//! against the committed `nodes` table and against each other. Every way
//! of finding a candidate is a join, so the work grows with the number of
//! rows, not with their product:
//!
//! * **name**: same group and the same name once case, punctuation and
//!   corporate suffixes are folded (`fold_name`);
//! * **identity**: same group, same final type and an equal value of one of
//!   that type's identity properties (`identity_keys`, case and spacing
//!   ignored);
//! * **fuzzy**: same group and a shared MinHash/LSH band key of the folded
//!   name (`name_bands`), scored by 3-shingle Jaccard (`name_similarity`);
//!   names with digits, short names and low-entropy names get no band keys;
//! * **partial**: a one-word name against multi-word names starting with
//!   that word ("Sarah" → "Sarah Brown"); the committed side is counted
//!   per first word and type before the join, so a common first name
//!   costs one row, not thousands.
//!
//! Every candidate must be type compatible: one chain a prefix of the
//! other (`chains_compatible`). [`Clusters`] then applies the merge rules
//! over the candidate pairs in one linear pass: a cluster never holds two
//! committed nodes or two sibling chains, several candidates or grey-band
//! scores make a mention ambiguous (for LLM adjudication; without it the
//! mention stays separate), and under-merge is preferred to over-merge.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{Array, AsArray, Float64Array, RecordBatch};
use arrow::datatypes::DataType;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use rayon::prelude::*;

pub use super::mentions::{Kind, MentionKey, Pair, Target, mentions_batches, mentions_schema};
use super::mentions::{MENTIONS_TABLE, decode_pairs};
use super::udfs::register_udfs;
pub use super::udfs::udfs;
use super::{ResolveSpec, normalize_name};
use crate::scratch::{materialize, register_batches, run_sql};
use crate::text::MAY_CHANGE;

/// Each entity type with identity properties, by name, with its
/// properties as [`identity_names`] gives them: what resolution and the
/// stored identity keys ([`crate::text::IdentityKeys`]) read.
pub fn identity_properties(ontology: &crate::ontology::Ontology) -> BTreeMap<String, Vec<String>> {
    ontology
        .entity_types
        .values()
        .filter(|t| !t.identity_properties.is_empty())
        .map(|t| (t.name.clone(), identity_names(t)))
        .collect()
}

/// The identity properties of `t` as [`crate::text::identity_values`] reads them: a
/// `may_change` property with [`MAY_CHANGE`] in front.
pub fn identity_names(t: &crate::ontology::EntityTypeSpec) -> Vec<String> {
    t.identity_properties
        .iter()
        .map(|name| {
            let may_change = t.properties.iter().any(|p| &p.name == name && p.may_change);
            if may_change {
                format!("{MAY_CHANGE}{name}")
            } else {
                name.clone()
            }
        })
        .collect()
}

/// Candidate pairs of the run's mentions, from the joins described in
/// the module docs. `nodes` names the committed nodes table (columns of
/// `nodes`: short_id, group_id, name, name_normalized, type, labels,
/// attributes); the UDFs of [`udfs`] must be registered on `ctx`.
///
/// With `resolve.embedding_candidates`, `vectors[i]` (the name vector of
/// mention `i`, when there is one) adds the nearest neighbours of
/// [`super::embedding`].
pub async fn candidates(
    ctx: &SessionContext,
    nodes: &str,
    spec: &ResolveSpec,
    identity: &BTreeMap<String, Vec<String>>,
    mentions: &[MentionKey],
    vectors: &[Option<Arc<[f32]>>],
) -> Result<Vec<Pair>, DataFusionError> {
    let m = MENTIONS_TABLE;
    // Mentions of a type with a record-linkage rule are matched by it
    // alone (`linkage_pairs`), not by these joins.
    let unlinked = if spec.linkage.is_empty() {
        ""
    } else {
        " WHERE linkage_of(labels) IS NULL"
    };
    let probe = format!(
        "SELECT mention_id, group_id, name_normalized, fold_name(name_normalized) AS folded, type, labels, attributes \
         FROM {m}{unlinked}"
    );
    let types: Vec<String> = identity
        .keys()
        .map(|t| format!("'{}'", t.replace('\'', "''")))
        .collect();
    let types = types.join(", ");
    // The mentions' tables do not wait for the nodes' key check.
    let mention_tables = async {
        let stems = if spec.longer_names {
            name_stems_table(ctx, &probe).await?
        } else {
            0
        };
        if !identity.is_empty() {
            // The mentions' keys, once for both sides, as a table of known
            // size: the joins then hold it, not the committed nodes, in
            // their hash table.
            materialize(
                ctx,
                PK,
                &format!(
                    "SELECT mention_id, group_id, type, labels, k, {KEY_VALUE} AS v \
                     FROM (SELECT mention_id, group_id, type, labels, unnest(identity_keys(type, attributes)) AS k \
                     FROM ({probe}) WHERE type IN ({types}))"
                ),
            )
            .await?;
        }
        Ok(stems)
    };
    let (keys, stems) =
        futures::future::try_join(node_keys(ctx, nodes, spec, identity), mention_tables).await?;
    let node_side = Side {
        sql: format!(
            "SELECT short_id AS target, group_id, name, name_normalized AS normalized, {folded} AS folded, \
             {bands} AS bands, type, labels, {id_columns} FROM {nodes}",
            folded = keys.folded,
            bands = keys.bands,
            id_columns = keys.ids.columns(),
        ),
        ids: keys.ids,
        is_mention: false,
    };
    let mention_side = Side {
        sql: format!(
            "SELECT mention_id AS target, group_id, name, name_normalized AS normalized, fold_name(name_normalized) AS folded, \
             name_bands(group_id, fold_name(name_normalized)) AS bands, type, labels, {id_columns} FROM {m}",
            id_columns = Ids::Computed.columns(),
        ),
        ids: Ids::Computed,
        is_mention: true,
    };
    // The exact joins of each side and the fuzzy joins share only the
    // scratch tables built above, so they run at once: each leaves a core
    // idle while it builds a hash table or gathers partitions, and the
    // others fill it.
    let pass = SidePass {
        nodes,
        spec,
        probe: &probe,
        stems,
        identity_types: (!identity.is_empty()).then_some(types.as_str()),
    };
    let fuzzy = async {
        if !spec.fuzzy {
            return Ok(Vec::new());
        }
        probe_bands(ctx, &probe).await?;
        let (mut out, from_mentions) = futures::future::try_join(
            fuzzy_pairs(ctx, &pass, &node_side),
            fuzzy_pairs(ctx, &pass, &mention_side),
        )
        .await?;
        out.extend(from_mentions);
        Ok(out)
    };
    let (mut out, from_mentions, fuzzy) = futures::future::try_join3(
        exact_pairs(ctx, &pass, &node_side),
        exact_pairs(ctx, &pass, &mention_side),
        fuzzy,
    )
    .await?;
    out.extend(from_mentions);
    out.extend(fuzzy);
    let _ = ctx.deregister_table(PB);
    let _ = ctx.deregister_table(PBC);
    let _ = ctx.deregister_table(PK);
    let _ = ctx.deregister_table(STEMS);
    if !spec.linkage.is_empty() {
        super::linkage::linkage_pairs(ctx, nodes, &spec.linkage, mentions, &mut out).await?;
    }
    if spec.embedding_candidates {
        super::embedding::embedding_pairs(ctx, nodes, mentions, vectors, spec, &mut out).await?;
    }
    // Partitions finish in any order; the rules see one order, so a
    // re-run decides the same way.
    out.par_sort_by(|a, b| {
        (a.mention, a.kind, a.target)
            .cmp(&(b.mention, b.kind, b.target))
            .then(b.score.total_cmp(&a.score))
    });
    Ok(out)
}

/// What the run's mentions are matched against: the committed nodes or
/// the run's other mentions.
struct Side {
    /// Its rows: `target`, `group_id`, `name`, `folded`, `bands`, `type`,
    /// `labels` and the columns of [`Ids::columns`].
    sql: String,
    /// Where its identity keys come from.
    ids: Ids,
    /// Whether it is the run's mentions.
    is_mention: bool,
}

/// What the candidate joins of both sides ([`exact_pairs`],
/// [`fuzzy_pairs`]) read.
struct SidePass<'a> {
    /// The committed nodes table.
    nodes: &'a str,
    spec: &'a ResolveSpec,
    /// The probing mentions' query.
    probe: &'a str,
    /// Rows of [`STEMS`].
    stems: usize,
    /// The quoted entity types with identity properties, when any.
    identity_types: Option<&'a str>,
}

/// The name, longer-name, identity and partial candidate pairs of the
/// probing mentions against one side.
async fn exact_pairs(
    ctx: &SessionContext,
    pass: &SidePass<'_>,
    side: &Side,
) -> Result<Vec<Pair>, DataFusionError> {
    let (ids, is_mention) = (&side.ids, side.is_mention);
    let side = side.sql.as_str();
    let SidePass {
        nodes,
        spec,
        probe,
        stems,
        identity_types,
    } = *pass;
    let (t_ids, row_ids) = (ids.of("t."), ids.of(""));
    // Equal names and longer names (a mention's name stem equal to a
    // target's name) in one join: the stems ride in the hash table
    // beside the names, each row marked by its score (1 for a name,
    // 0 for a stem), and the targets are read once, not twice.
    let stem_rows = if stems > 0 {
        format!(
            " UNION ALL SELECT mention_id, group_id, stem AS k, labels, 0.0 AS score FROM {STEMS}"
        )
    } else {
        String::new()
    };
    // Mention pairs are symmetric: keep each once. Directed kinds
    // (partial, longer) keep both ways round, but never a mention
    // paired with itself.
    let (order, not_self, names_order) = if is_mention {
        (
            "AND p.mention_id < t.target",
            "AND p.mention_id <> t.target",
            "AND (p.score = 0.0 OR p.mention_id < t.target) \
             AND (p.score = 1.0 OR p.mention_id <> t.target)",
        )
    } else {
        ("", "", "")
    };
    let mut queries: Vec<(Kind, String)> = vec![(
        Kind::Name,
        format!(
            "WITH p AS (SELECT mention_id, group_id, folded AS k, labels, 1.0 AS score FROM ({probe}){stem_rows}), \
             t AS ({side}) \
             SELECT p.mention_id, t.target, p.score, CAST(1 AS BIGINT) AS n, t.name, t.labels, {t_ids} AS ids \
             FROM p JOIN t ON p.group_id = t.group_id AND p.k = t.folded \
             WHERE chains_compatible(p.labels, t.labels) {names_order}"
        ),
    )];
    if let Some(types) = identity_types {
        // A pair sharing several keys comes once per key; the
        // duplicates are dropped after decoding (cheaper than a
        // DISTINCT over names and chains).
        // The side's rows of a type with identity properties, one per key.
        let keyed = format!(
            "SELECT target, group_id, type, name, labels, {row_ids} AS ids, unnest({row_ids}) AS k \
             FROM ({side}) WHERE type IN ({types})"
        );
        queries.push((
            Kind::Identity,
            format!(
                "WITH t AS ({keyed}) \
                 SELECT p.mention_id, t.target, 1.0 AS score, CAST(1 AS BIGINT) AS n, t.name, t.labels, t.ids \
                 FROM {PK} p JOIN t ON p.group_id = t.group_id AND p.type = t.type AND p.k = t.k \
                 WHERE true {order}"
            ),
        ));
        // A name that is another's identity value ("pkg:cargo/quillparse"
        // for the quillparse whose record states that `package_id`) is
        // the same evidence, whichever side wrote it as a name. Between
        // mentions the first join finds each pair once.
        queries.push((
            Kind::Identity,
            format!(
                "WITH t AS (SELECT target, group_id, name, labels, ids, {KEY_VALUE} AS v FROM ({keyed})) \
                 SELECT p.mention_id, t.target, 1.0 AS score, CAST(1 AS BIGINT) AS n, t.name, t.labels, t.ids \
                 FROM ({probe}) p JOIN t ON p.group_id = t.group_id AND p.name_normalized = t.v \
                 WHERE chains_compatible(p.labels, t.labels) {not_self}"
            ),
        ));
        if !is_mention {
            queries.push((
                Kind::Identity,
                format!(
                    "WITH t AS ({side}) \
                     SELECT p.mention_id, t.target, 1.0 AS score, CAST(1 AS BIGINT) AS n, t.name, t.labels, {t_ids} AS ids \
                     FROM {PK} p JOIN t ON p.group_id = t.group_id AND p.v = t.normalized \
                     WHERE chains_compatible(p.labels, t.labels)"
                ),
            ));
        }
    }
    if spec.partial_names {
        // Mentions written as one word (at least two letters, no
        // digits) probe the first word of multi-word targets. The
        // written name decides, not the folded one: "Acme Corp" folds to
        // "acme" but is no partial name of "Acme Labs". The committed
        // side is counted per (group, first word, type) after a
        // semi-join on the probed words.
        let single = format!(
            "SELECT mention_id, group_id, folded, labels FROM ({probe}) \
             WHERE strpos(name_normalized, ' ') = 0 AND character_length(folded) >= 2 \
             AND NOT regexp_like(folded, '[0-9]')"
        );
        let targets = if is_mention {
            format!(
                "SELECT target, group_id, split_part(folded, ' ', 1) AS first, name, labels, CAST(1 AS BIGINT) AS n, \
                 {row_ids} AS ids FROM ({side}) WHERE strpos(folded, ' ') > 0"
            )
        } else {
            format!(
                "SELECT min(target) AS target, group_id, first, min(name) AS name, first_value(labels) AS labels, count(*) AS n, \
                 first_value(ids) AS ids \
                 FROM (SELECT target, group_id, split_part(folded, ' ', 1) AS first, name, type, labels, \
                   {row_ids} AS ids FROM ({side}) \
                   WHERE strpos(folded, ' ') > 0 \
                   AND split_part(folded, ' ', 1) IN (SELECT s.folded AS probe_word FROM ({single}) s)) \
                 GROUP BY group_id, first, type"
            )
        };
        queries.push((
            Kind::Partial,
            format!(
                "WITH p AS ({single}), t AS ({targets}) \
                 SELECT p.mention_id, t.target, 0.0 AS score, t.n, t.name, t.labels, t.ids \
                 FROM p JOIN t ON p.group_id = t.group_id AND p.folded = t.first \
                 WHERE chains_compatible(p.labels, t.labels) {not_self}"
            ),
        ));
    }
    let mut out = Vec::new();
    // Where the identity joins' pairs start: one pair may come from
    // several of them.
    let mut identity_from = None;
    for (kind, sql) in queries {
        let started = std::time::Instant::now();
        let before = out.len();
        if kind == Kind::Identity {
            identity_from.get_or_insert(before);
        }
        let what = || {
            let side = if is_mention {
                "the run's mentions"
            } else {
                nodes
            };
            format!("{kind:?} candidate join against {side}")
        };
        let (_, batches) = run_sql(ctx, &sql).await.map_err(|e| e.context(what()))?;
        for b in &batches {
            if kind == Kind::Name && stems > 0 {
                // The name join's rows of stems are longer names.
                let (names, longer) = split_by_score(b)?;
                decode_pairs(&names, Kind::Name, is_mention, &mut out)?;
                decode_pairs(&longer, Kind::Longer, is_mention, &mut out)?;
            } else {
                decode_pairs(b, kind, is_mention, &mut out)?;
            }
        }
        if let (Kind::Identity, Some(from)) = (kind, identity_from) {
            // The same target row behind each repeat: equal pairs.
            let mut found = out.split_off(from);
            found.sort_by_key(|p| (p.mention, p.target));
            found.dedup_by_key(|p| (p.mention, p.target));
            out.append(&mut found);
        }
        tracing::debug!(
            "{kind:?} candidates against {}: {} pairs in {:.2} s",
            if is_mention { "mentions" } else { nodes },
            out.len() - before,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(out)
}

/// The SQL expressions of a committed node's blocking keys ([`node_keys`]).
struct NodeKeys {
    /// The folded name.
    folded: String,
    /// The name's LSH band keys.
    bands: String,
    /// Where the identity keys come from.
    ids: Ids,
}

/// Where a side's identity keys (`property=value` lists) come from. The
/// keys are read after the joins ([`Ids::of`]), from the columns the side
/// carries ([`Ids::columns`]): computing them below a join would build
/// them for all ten million nodes instead of the few thousand matched.
#[derive(Debug, Clone)]
enum Ids {
    /// Every row's stored keys are current: the attributes are not read.
    Stored,
    /// Stored keys where the row's fingerprint is this one, computed from
    /// the attributes elsewhere.
    Mixed(String),
    /// Computed from the attributes (the run's mentions; a graph written
    /// before keys were stored).
    Computed,
}

impl Ids {
    /// The side's columns the keys are read from.
    fn columns(&self) -> &'static str {
        match self {
            Ids::Stored => "identity_keys AS stored_ids",
            Ids::Mixed(_) => {
                "identity_keys AS stored_ids, identity_keys_fingerprint AS ids_fingerprint, attributes"
            }
            Ids::Computed => "attributes",
        }
    }

    /// The keys of a row of the side, its columns prefixed with `t` (an
    /// alias and a dot, or nothing).
    fn of(&self, t: &str) -> String {
        match self {
            Ids::Stored => format!("{t}stored_ids"),
            // Fingerprints are hex and a version tag: nothing to escape.
            Ids::Mixed(fingerprint) => format!(
                "CASE WHEN {t}ids_fingerprint = '{fingerprint}' THEN {t}stored_ids \
                 ELSE identity_keys({t}type, {t}attributes) END"
            ),
            Ids::Computed => format!("identity_keys({t}type, {t}attributes)"),
        }
    }
}

/// The SQL expressions for the blocking keys of a row of `nodes`: the
/// stored keys where the row's fingerprint is that of the current settings
/// (name keys: `[resolve]`; identity keys: the ontology's identity
/// properties), computed otherwise (rows written before keys were stored,
/// or under other settings). A table without the key columns (a graph
/// written by an older graphloom) computes them all. When no row is stale
/// (the usual case: one scan of the two fingerprint columns tells), the
/// stored columns are read alone, and the columns the keys are computed
/// from (names, attributes) are not read at all.
async fn node_keys(
    ctx: &SessionContext,
    nodes: &str,
    spec: &ResolveSpec,
    identity: &BTreeMap<String, Vec<String>>,
) -> Result<NodeKeys, DataFusionError> {
    let computed_folded = "fold_name(name_normalized)";
    let computed_bands = "name_bands(group_id, fold_name(name_normalized))";
    let schema = ctx
        .table(nodes)
        .await
        .map_err(|e| e.context(format!("reading the schema of {nodes}")))?
        .schema()
        .clone();
    let has = |columns: &[&str]| {
        columns
            .iter()
            .all(|c| schema.has_column_with_unqualified_name(c))
    };
    let names = has(&crate::text::NAME_KEY_COLUMNS).then(|| spec.name_keys().fingerprint());
    let ids = has(&crate::text::IDENTITY_KEY_COLUMNS)
        .then(|| crate::text::IdentityKeys::new(identity.clone()).fingerprint());
    // Fingerprints are hex and a version tag: nothing to escape.
    let stale = |column: &str, fingerprint: &Option<String>| match fingerprint {
        Some(f) => format!("count(*) FILTER (WHERE {column} IS DISTINCT FROM '{f}')"),
        None => "CAST(NULL AS BIGINT)".to_string(),
    };
    let (stale_names, stale_ids) = if names.is_some() || ids.is_some() {
        let sql = format!(
            "SELECT {}, {} FROM {nodes}",
            stale("name_keys_fingerprint", &names),
            stale("identity_keys_fingerprint", &ids)
        );
        let (_, batches) = run_sql(ctx, &sql)
            .await
            .map_err(|e| e.context("counting nodes whose stored blocking keys are stale"))?;
        let count = |i: usize| -> Option<i64> {
            let b = batches.iter().find(|b| b.num_rows() > 0)?;
            let a = arrow::compute::cast(b.column(i), &DataType::Int64).ok()?;
            let a = a.as_primitive::<arrow::datatypes::Int64Type>();
            (!a.is_null(0)).then(|| a.value(0))
        };
        (count(0), count(1))
    } else {
        (None, None)
    };
    let (folded, bands) = match (&names, stale_names) {
        (Some(_), Some(0)) => ("name_folded".to_string(), "name_band_keys".to_string()),
        (Some(f), _) => {
            let current = format!("name_keys_fingerprint = '{f}'");
            (
                format!("CASE WHEN {current} THEN name_folded ELSE {computed_folded} END"),
                format!("CASE WHEN {current} THEN name_band_keys ELSE {computed_bands} END"),
            )
        }
        (None, _) => (computed_folded.into(), computed_bands.into()),
    };
    let ids = match (ids, stale_ids) {
        (Some(_), Some(0)) => Ids::Stored,
        (Some(f), _) => Ids::Mixed(f),
        (None, _) => Ids::Computed,
    };
    tracing::debug!(
        "stored blocking keys: {stale_names:?} stale names, {stale_ids:?} stale identity keys"
    );
    Ok(NodeKeys { folded, bands, ids })
}

/// Lets the candidate joins hold their run side (the mentions and what is
/// derived from them, a few rows per mention) in one shared hash table and
/// stream the committed nodes past it, instead of hash-partitioning both
/// sides: at 10M nodes that spares every node row a repartition in each
/// join. Returns the session's thresholds, for [`restore_join_thresholds`].
fn broadcast_run_side(ctx: &SessionContext, mentions: usize) -> (usize, usize) {
    let state = ctx.state_ref();
    let mut state = state.write();
    let optimizer = &mut state.config_mut().options_mut().optimizer;
    let before = (
        optimizer.hash_join_single_partition_threshold,
        optimizer.hash_join_single_partition_threshold_rows,
    );
    // Room for the mentions' band keys (ten per mention) and their
    // pairs; bytes are only known for some inputs, and then about 100
    // bytes a row.
    let rows = before.1.max(mentions.saturating_mul(12));
    optimizer.hash_join_single_partition_threshold_rows = rows;
    optimizer.hash_join_single_partition_threshold = before.0.max(rows.saturating_mul(128));
    before
}

/// Puts back the thresholds [`broadcast_run_side`] changed.
fn restore_join_thresholds(ctx: &SessionContext, (bytes, rows): (usize, usize)) {
    let state = ctx.state_ref();
    let mut state = state.write();
    let optimizer = &mut state.config_mut().options_mut().optimizer;
    optimizer.hash_join_single_partition_threshold = bytes;
    optimizer.hash_join_single_partition_threshold_rows = rows;
}

/// Fuzzy candidates against one side (as [`exact_pairs`]). The band keys
/// of the mentions are computed once, for both sides, and kept in [`PB`];
/// the target side is scanned once, keeping only keys some mention has.
/// Keys shared by more than `lsh_max_bucket` names are dropped (they come
/// from common syllables and would pair everything in them with
/// everything). Names, chains and scores are joined back only for the
/// candidate pairs.
async fn fuzzy_pairs(
    ctx: &SessionContext,
    pass: &SidePass<'_>,
    side: &Side,
) -> Result<Vec<Pair>, DataFusionError> {
    let (ids, is_mention) = (&side.ids, side.is_mention);
    let side = side.sql.as_str();
    let SidePass {
        nodes, spec, probe, ..
    } = *pass;
    let s_ids = ids.of("s.");
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    // Both sides run at once: each names its own tables.
    let which = if is_mention { "mentions" } else { "nodes" };
    let (tb, big, scored) = (
        format!("resolve_target_bands_{which}"),
        format!("resolve_big_bands_{which}"),
        format!("resolve_scored_pairs_{which}"),
    );
    let (tb, big, scored) = (tb.as_str(), big.as_str(), scored.as_str());
    let t0 = std::time::Instant::now();
    // Keys shared by more than the cap: few (well under 1% of keys), so
    // they are kept once and anti-joined, rather than semi-joining the
    // millions of small ones. Counted from the probe's counts ([`PBC`])
    // and, against the nodes, from the targets' keys that meet them (a key
    // no mention has pairs nothing).
    let cap = spec.lsh_max_bucket;
    let (targets, big_sql) = if is_mention {
        (PB, format!("SELECT band FROM {PBC} WHERE n > {cap}"))
    } else {
        materialize(
            ctx,
            tb,
            &format!(
                "SELECT x.target AS id, x.band, pb.n FROM {PBC} pb \
                 JOIN (SELECT target, unnest(bands) AS band FROM ({side})) x \
                 ON x.band = pb.band"
            ),
        )
        .await?;
        tracing::debug!(
            "fuzzy: target band keys at {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        (
            tb,
            format!("SELECT band FROM {tb} GROUP BY band HAVING count(*) + max(n) > {cap}"),
        )
    };
    materialize(ctx, big, &big_sql).await?;
    // Mention pairs are symmetric: each is kept once, before scoring.
    let keep = if is_mention { "p.id < t.id" } else { "true" };
    // Scored on the folded names alone, which keeps about one pair in
    // sixty; names, chains and identity keys are joined only to those (a
    // join carrying them for every pair cost three times as much). The
    // score is computed only where the folded names differ (equal ones are
    // the name join's).
    materialize(
        ctx,
        scored,
        &format!(
            "WITH p AS (SELECT b.id, b.band FROM {PB} b LEFT ANTI JOIN {big} g ON b.band = g.band), \
             t AS (SELECT b.id, b.band FROM {targets} b LEFT ANTI JOIN {big} g ON b.band = g.band), \
             pairs AS (SELECT DISTINCT p.id AS mention_id, t.id AS target FROM p JOIN t ON p.band = t.band \
               WHERE {keep}), \
             scored AS (SELECT pairs.mention_id, pairs.target, \
               CASE WHEN m.folded <> s.folded THEN name_similarity(m.folded, s.folded) END AS score \
               FROM pairs JOIN (SELECT mention_id, folded FROM ({probe})) m ON m.mention_id = pairs.mention_id \
               JOIN (SELECT target, folded FROM ({side})) s ON s.target = pairs.target) \
             SELECT mention_id, target, score FROM scored WHERE score >= {grey}",
            grey = spec.grey_band_min,
        ),
    )
    .await?;
    tracing::debug!("fuzzy: scored pairs at {:.2} s", t0.elapsed().as_secs_f64());
    let sql = format!(
        "SELECT k.mention_id, k.target, k.score, CAST(1 AS BIGINT) AS n, s.name, s.labels, {s_ids} AS ids \
         FROM {scored} k JOIN ({probe}) m ON m.mention_id = k.mention_id \
         JOIN ({side}) s ON s.target = k.target \
         WHERE chains_compatible(m.labels, s.labels)"
    );
    let (_, batches) = run_sql(ctx, &sql)
        .await
        .map_err(|e| e.context("joining names and chains to fuzzy candidate pairs"))?;
    tracing::debug!(
        "fuzzy: chains checked at {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    for b in &batches {
        decode_pairs(b, Kind::Fuzzy, is_mention, &mut out)?;
    }
    let _ = ctx.deregister_table(tb);
    let _ = ctx.deregister_table(big);
    let _ = ctx.deregister_table(scored);
    tracing::debug!(
        "Fuzzy candidates against {}: {} pairs in {:.2} s",
        if is_mention { "mentions" } else { nodes },
        out.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(out)
}

/// The value of an identity key `k` (`property=value`): a value is
/// folded like a name, so it holds no `=`.
const KEY_VALUE: &str = "substr(k, strpos(k, '=') + 1)";

/// Name of the scratch table of the probing mentions' identity keys
/// (`mention_id`, `group_id`, `type`, `labels`, `k` and its value `v`),
/// built once for both sides' identity joins.
const PK: &str = "resolve_probe_identity_keys";

/// Name of the scratch table of the probing mentions' band keys (`id`,
/// `band`), built once by [`probe_bands`] for both sides' fuzzy joins.
const PB: &str = "resolve_probe_bands";

/// Name of the scratch table of the probing mentions' distinct band keys
/// and how many mentions have each (`band`, `n`), built with [`PB`].
const PBC: &str = "resolve_probe_band_counts";

/// The probing mentions' name stems ([`crate::text::name_stems`]), one row
/// per stem.
const STEMS: &str = "resolve_name_stems";

/// Builds [`STEMS`] from the probing mentions; returns its rows. Each
/// mention's name without its last words probes the targets' names
/// ("lumen 27 monitors" finds "lumen 27"); only stems of two or more
/// words, since a one-word name is the partial rule's. Kept as a table of
/// known size, so that the joins hold it, not the committed nodes, in
/// their hash table (over an `unnest` the planner cannot tell which side
/// is small); most runs have few stems, and none skip the joins.
async fn name_stems_table(ctx: &SessionContext, probe: &str) -> Result<usize, DataFusionError> {
    materialize(
        ctx,
        STEMS,
        &format!(
            "SELECT mention_id, group_id, labels, unnest(name_stems(folded)) AS stem FROM ({probe})"
        ),
    )
    .await?;
    ctx.table(STEMS)
        .await?
        .count()
        .await
        .map_err(|e| e.context(format!("counting the rows of {STEMS}")))
}

/// Builds [`PB`] and [`PBC`] from the probing mentions.
async fn probe_bands(ctx: &SessionContext, probe: &str) -> Result<(), DataFusionError> {
    let t0 = std::time::Instant::now();
    materialize(
        ctx,
        PB,
        &format!(
            "SELECT mention_id AS id, unnest(name_bands(group_id, folded)) AS band FROM ({probe})"
        ),
    )
    .await?;
    materialize(
        ctx,
        PBC,
        &format!("SELECT band, count(*) AS n FROM {PB} GROUP BY band"),
    )
    .await?;
    tracing::debug!(
        "fuzzy: probe band keys in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The rows of a batch of candidate pairs (score in column 2) scored 1,
/// and the others.
fn split_by_score(b: &RecordBatch) -> Result<(RecordBatch, RecordBatch), DataFusionError> {
    let score = arrow::compute::cast(b.column(2), &DataType::Float64)?;
    let one = Float64Array::new_scalar(1.0);
    let is_one = arrow::compute::kernels::cmp::eq(&score, &one)?;
    let others = arrow::compute::not(&is_one)?;
    Ok((
        arrow::compute::filter_record_batch(b, &is_one)?,
        arrow::compute::filter_record_batch(b, &others)?,
    ))
}

/// A mention the rules could not settle: the LLM may pick one of the
/// options (or none); without it the mention stays separate.
#[derive(Debug, Clone, PartialEq)]
pub struct Ambiguity {
    /// The mention.
    pub mention: usize,
    /// What it may be, best first.
    pub options: Vec<Pair>,
    /// Why it is open ("several candidates", "grey band", …).
    pub reason: &'static str,
}

/// Counts of what the rules decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Candidate pairs by kind.
    pub pairs: BTreeMap<String, usize>,
    /// Links made (each joins two clusters).
    pub links: usize,
    /// Links refused (two committed nodes, or sibling chains).
    pub refused: usize,
    /// Mentions left open for adjudication.
    pub ambiguous: usize,
}

/// Union-find over the run's mentions and the committed nodes they touch,
/// with the merge rules as union conditions.
///
/// Its elements are distinct mentions: [`resolve_entities`] gives
/// identical mentions (same group, name, chain and attributes: everything
/// the joins and rules read) one element, so an entity written the same
/// way in ten thousand episodes is one row in the joins, not fifty
/// million candidate pairs. [`Clusters::link`], [`Clusters::could_link`]
/// and [`Clusters::finish`] take and give mention indices.
#[derive(Debug, Clone)]
pub struct Clusters {
    /// Element of each mention.
    element: Vec<usize>,
    parent: Vec<usize>,
    /// Per root: the committed node of the cluster, if any.
    committed: Vec<Option<i64>>,
    /// Per root: the longest chain in the cluster.
    chain: Vec<Vec<String>>,
    /// Per root: whether some name in the cluster has several words.
    multiword: Vec<bool>,
    /// Per root: identity values in the cluster, by property.
    identity: Vec<BTreeMap<String, String>>,
    nodes: HashMap<i64, usize>,
    /// What the rules decided.
    pub stats: ClusterStats,
}

/// `property=value` keys as a map (the first value of a property wins).
fn identity_map(keys: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for k in keys {
        if let Some((p, v)) = k.split_once('=') {
            out.entry(p.to_string()).or_insert_with(|| v.to_string());
        }
    }
    out
}

/// One chain a prefix of the other: the types of one entity (what every
/// candidate pair, and a record's type for a text mention, requires).
pub(super) fn compatible(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

impl Clusters {
    /// One singleton per mention (`chains[i]` its chain, `multiword[i]`
    /// whether its name has several words).
    pub fn new(chains: Vec<Vec<String>>, multiword: Vec<bool>, identity: Vec<Vec<String>>) -> Self {
        let n = chains.len();
        Clusters {
            element: (0..n).collect(),
            parent: (0..n).collect(),
            committed: vec![None; n],
            chain: chains,
            multiword,
            identity: (0..n)
                .map(|i| identity_map(identity.get(i).map_or(&[][..], Vec::as_slice)))
                .collect(),
            nodes: HashMap::new(),
            stats: ClusterStats::default(),
        }
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    /// Maps mentions to elements: `element[i]` is the element of mention `i` (elements are
    /// what `new` was given, one per distinct mention).
    fn with_elements(mut self, element: Vec<usize>) -> Self {
        self.element = element;
        self
    }

    /// A pair whose target is a mention index, with the target's element
    /// instead (the rules read only its target, chain and identity).
    fn to_elements(&self, to: &Pair) -> Pair {
        let mut p = to.clone();
        if let Target::Mention(m) = to.target {
            p.target = Target::Mention(self.element[m]);
        }
        p
    }

    fn entity(&mut self, target: Target, chain: &[String], identity: &[String]) -> usize {
        match target {
            Target::Mention(m) => m,
            Target::Node(id) => {
                if let Some(&e) = self.nodes.get(&id) {
                    return e;
                }
                let e = self.parent.len();
                self.parent.push(e);
                self.committed.push(Some(id));
                self.chain.push(chain.to_vec());
                self.multiword.push(true);
                self.identity.push(identity_map(identity));
                self.nodes.insert(id, e);
                e
            }
        }
    }

    /// Joins the clusters of `mention` and `to.target` (a mention index or
    /// a node) unless that would put two committed nodes, two incompatible
    /// chains or two different values of one identity property in one
    /// cluster.
    pub fn link(&mut self, mention: usize, to: &Pair) -> bool {
        let to = self.to_elements(to);
        self.join(self.element[mention], &to)
    }

    /// [`Clusters::link`] on elements.
    fn join(&mut self, mention: usize, to: &Pair) -> bool {
        let b = self.entity(to.target, &to.chain, &to.identity);
        let (ra, rb) = (self.find(mention), self.find(b));
        if ra == rb {
            return true;
        }
        if !self.joinable(ra, rb) {
            self.stats.refused += 1;
            return false;
        }
        // The committed node's entry stays the root when there is one.
        let (root, child) = if self.committed[rb].is_some() {
            (rb, ra)
        } else {
            (ra, rb)
        };
        self.parent[child] = root;
        self.committed[root] = self.committed[root].or(self.committed[child]);
        if self.chain[child].len() > self.chain[root].len() {
            self.chain[root] = std::mem::take(&mut self.chain[child]);
        }
        self.multiword[root] |= self.multiword[child];
        let moved = std::mem::take(&mut self.identity[child]);
        for (k, v) in moved {
            self.identity[root].entry(k).or_insert(v);
        }
        self.stats.links += 1;
        true
    }

    /// Whether two roots may become one cluster.
    fn joinable(&self, ra: usize, rb: usize) -> bool {
        let fuses = matches!(
            (self.committed[ra], self.committed[rb]),
            (Some(x), Some(y)) if x != y
        );
        let clash = self.identity[ra].iter().any(|(k, v)| {
            !k.starts_with(MAY_CHANGE) && self.identity[rb].get(k).is_some_and(|w| w != v)
        });
        !fuses && !clash && compatible(&self.chain[ra], &self.chain[rb])
    }

    /// Applies the rules to the candidate pairs (of elements); returns
    /// what stays open (elements too).
    ///
    /// 1. Mention → committed node: an identity match decides unless the
    ///    name points at another node; otherwise one name match, otherwise
    ///    one fuzzy match at or above `fuzzy_merge_threshold`. Several
    ///    candidates of the deciding kind, or grey-band fuzzy scores alone,
    ///    leave the mention open.
    /// 2. Mention ↔ mention: identity, name and high fuzzy matches link;
    ///    grey-band ones are open.
    /// 3. Partial names: a one-word mention whose cluster has no committed
    ///    node and no multi-word name joins the only cluster its word
    ///    starts; two or more (or one first word shared by several
    ///    committed nodes) leave it open.
    /// 4. Embedding neighbours and shorter names (a [`Kind::Longer`]
    ///    pair) never link: a mention whose cluster still has no committed
    ///    node and that is not open is left open with them as the options.
    pub fn apply(&mut self, pairs: &[Pair], spec: &ResolveSpec) -> Vec<Ambiguity> {
        self.count_pairs(pairs);
        // Each mention's pairs, in mention order and, within a mention, in
        // the order given. Candidates come sorted by mention, so the
        // stable sort only checks that (a map of a million lists cost a
        // tenth of a second and as many allocations).
        let mut sorted: Vec<&Pair> = pairs.iter().collect();
        sorted.sort_by_key(|p| p.mention);
        let by_mention: Vec<(usize, &[&Pair])> = sorted
            .chunk_by(|a, b| a.mention == b.mention)
            .map(|list| (list[0].mention, list))
            .collect();
        let mut open = self.link_to_nodes(&by_mention, spec);
        self.link_mentions(pairs, spec, &mut open);
        // A grey-band pair whose ends ended up together is settled.
        // Options that could no longer be linked (same cluster already, or
        // two committed nodes / sibling chains) are dropped, and with them
        // mentions left without options: no call is spent on them.
        for a in open.values_mut() {
            let m = a.mention;
            a.options.retain(|p| self.could_join(m, p));
        }
        open.retain(|_, a| !a.options.is_empty());
        if spec.partial_names {
            self.link_partial_names(&by_mention, &mut open);
        }
        self.propose(&by_mention, &mut open);
        self.stats.ambiguous = open.len();
        open.into_values().collect()
    }

    /// Counts the candidate pairs by kind into the stats.
    fn count_pairs(&mut self, pairs: &[Pair]) {
        let mut counts = [0usize; 8];
        for p in pairs {
            counts[p.kind as usize] += 1;
        }
        for (kind, n) in [
            Kind::Identity,
            Kind::Name,
            Kind::Fuzzy,
            Kind::Partial,
            Kind::Linked,
            Kind::LinkGrey,
            Kind::Embedding,
            Kind::Longer,
        ]
        .into_iter()
        .zip(counts)
        {
            if n > 0 {
                let name = format!("{kind:?}").to_lowercase();
                *self.stats.pairs.entry(name).or_default() += n;
            }
        }
    }

    /// Rule 1 of [`Clusters::apply`], against committed nodes: links each
    /// mention its pairs decide and returns the mentions left open.
    fn link_to_nodes(
        &mut self,
        by_mention: &[(usize, &[&Pair])],
        spec: &ResolveSpec,
    ) -> BTreeMap<usize, Ambiguity> {
        let mut open: BTreeMap<usize, Ambiguity> = BTreeMap::new();
        for &(m, list) in by_mention {
            match node_decision(list, spec) {
                Ok(Some(p)) => {
                    self.join(m, p);
                }
                Ok(None) => {}
                Err((mut options, reason)) => {
                    options.sort_by(|a, b| b.score.total_cmp(&a.score));
                    open.insert(
                        m,
                        Ambiguity {
                            mention: m,
                            options: options.into_iter().cloned().collect(),
                            reason,
                        },
                    );
                }
            }
        }
        open
    }

    /// Rule 2 of [`Clusters::apply`], between mentions, strongest kinds
    /// first. A mention waiting for adjudication against committed nodes
    /// (in `open`) is not pulled into a cluster on the side.
    fn link_mentions(
        &mut self,
        pairs: &[Pair],
        spec: &ResolveSpec,
        open: &mut BTreeMap<usize, Ambiguity>,
    ) {
        let waiting: BTreeSet<usize> = open.keys().copied().collect();
        // Record-linkage pairs join best first, so where the cluster
        // rules refuse a link (two committed nodes) the stronger one stood.
        let mut by_score: Vec<&Pair> = pairs
            .iter()
            .filter(|p| matches!(p.kind, Kind::Linked | Kind::LinkGrey))
            .collect();
        by_score.sort_by(|a, b| b.score.total_cmp(&a.score));
        for kind in [Kind::Identity, Kind::Name, Kind::Fuzzy, Kind::Linked] {
            let list: Vec<&Pair> = if kind == Kind::Linked {
                by_score.clone()
            } else {
                pairs.iter().filter(|p| p.kind == kind).collect()
            };
            for p in list {
                let Target::Mention(t) = p.target else {
                    continue;
                };
                if waiting.contains(&p.mention) || waiting.contains(&t) {
                    continue;
                }
                let sure = match p.kind {
                    Kind::Fuzzy => p.score >= spec.fuzzy_merge_threshold,
                    Kind::LinkGrey => false,
                    _ => true,
                };
                if sure {
                    self.join(p.mention, p);
                } else {
                    open.entry(p.mention)
                        .or_insert_with(|| Ambiguity {
                            mention: p.mention,
                            options: Vec::new(),
                            reason: "only grey-band candidates",
                        })
                        .options
                        .push(p.clone());
                }
            }
        }
    }

    /// Rule 3 of [`Clusters::apply`], partial names.
    fn link_partial_names(
        &mut self,
        by_mention: &[(usize, &[&Pair])],
        open: &mut BTreeMap<usize, Ambiguity>,
    ) {
        for &(m, list) in by_mention {
            let partial: Vec<&Pair> = list
                .iter()
                .copied()
                .filter(|p| p.kind == Kind::Partial)
                .collect();
            if partial.is_empty() || open.contains_key(&m) {
                continue;
            }
            let root = self.find(m);
            if self.committed[root].is_some() || self.multiword[root] {
                continue;
            }
            let mut roots = BTreeSet::new();
            let mut crowded = false;
            for p in &partial {
                if p.count > 1 {
                    crowded = true;
                    continue;
                }
                let e = self.entity(p.target, &p.chain, &p.identity);
                let r = self.find(e);
                if r != root {
                    roots.insert(r);
                }
            }
            if roots.len() == 1 && !crowded {
                let p = partial[0];
                self.join(m, p);
            } else if !roots.is_empty() || crowded {
                open.insert(
                    m,
                    Ambiguity {
                        mention: m,
                        options: partial.iter().map(|p| (*p).clone()).collect(),
                        reason: "a first name shared by several",
                    },
                );
            }
        }
    }

    /// Rule 4 of [`Clusters::apply`]: embedding neighbours and shorter
    /// names are proposals for mentions no rule placed (no committed node
    /// in their cluster, not open already); a pair of two such mentions is
    /// asked about once, and not again when an earlier rule left one open
    /// about the other ("Brightline Systems" open about the grey-band
    /// "Brightline System", which extends to it in the plural).
    fn propose(&mut self, by_mention: &[(usize, &[&Pair])], open: &mut BTreeMap<usize, Ambiguity>) {
        let mut asked: BTreeSet<(usize, usize)> = open
            .values()
            .flat_map(|a| {
                a.options.iter().filter_map(move |o| match o.target {
                    Target::Mention(t) => Some((a.mention, t)),
                    Target::Node(_) => None,
                })
            })
            .collect();
        for &(m, list) in by_mention {
            if open.contains_key(&m) {
                continue;
            }
            let root = self.find(m);
            if self.committed[root].is_some() {
                continue;
            }
            let mut options: Vec<Pair> = list
                .iter()
                .filter(|p| matches!(p.kind, Kind::Embedding | Kind::Longer))
                .filter(|p| !matches!(p.target, Target::Mention(t) if asked.contains(&(t, m))))
                .filter(|p| self.could_join(m, p))
                .map(|p| (*p).clone())
                .collect();
            if options.is_empty() {
                continue;
            }
            options.sort_by(|a, b| b.score.total_cmp(&a.score));
            for p in &options {
                if let Target::Mention(t) = p.target {
                    asked.insert((m, t));
                }
            }
            let reason = if options.iter().all(|p| p.kind == Kind::Embedding) {
                "only embedding neighbours"
            } else if options.iter().all(|p| p.kind == Kind::Longer) {
                "only shorter names it extends"
            } else {
                "only embedding neighbours and shorter names it extends"
            };
            open.insert(
                m,
                Ambiguity {
                    mention: m,
                    options,
                    reason,
                },
            );
        }
    }

    fn find_const(&self, mut x: usize) -> usize {
        while self.parent[x] != x {
            x = self.parent[x];
        }
        x
    }

    /// Whether linking a mention and a target would join two clusters
    /// without breaking a rule.
    pub fn could_link(&self, mention: usize, to: &Pair) -> bool {
        self.could_join(self.element[mention], &self.to_elements(to))
    }

    /// [`Clusters::could_link`] on elements.
    fn could_join(&self, mention: usize, to: &Pair) -> bool {
        let ra = self.find_const(mention);
        let existing = match to.target {
            Target::Mention(x) => Some(x),
            Target::Node(id) => self.nodes.get(&id).copied(),
        };
        match existing {
            Some(e) => {
                let rb = self.find_const(e);
                rb != ra && self.joinable(ra, rb)
            }
            None => {
                let fuses = self.committed[ra].is_some();
                let other = identity_map(&to.identity);
                let clash = self.identity[ra]
                    .iter()
                    .any(|(k, v)| other.get(k).is_some_and(|w| w != v));
                !fuses && !clash && compatible(&self.chain[ra], &to.chain)
            }
        }
    }

    /// The clusters of the mentions: per mention a cluster index, and per
    /// cluster its committed node (if any).
    pub fn finish(mut self) -> Resolved {
        let mut index: HashMap<usize, usize> = HashMap::new();
        let mut committed = Vec::new();
        let mut cluster_of = Vec::with_capacity(self.element.len());
        for m in 0..self.element.len() {
            let r = self.find(self.element[m]);
            let next = index.len();
            let c = *index.entry(r).or_insert(next);
            if c == committed.len() {
                committed.push(self.committed[r]);
            }
            cluster_of.push(c);
        }
        Resolved {
            cluster_of,
            committed,
            stats: self.stats,
        }
    }
}

/// What rule 1 of [`Clusters::apply`] makes of one mention's pairs against
/// committed nodes: the pair that decides (or none), or the options that
/// leave it open and why.
type NodeDecision<'p> = Result<Option<&'p Pair>, (Vec<&'p Pair>, &'static str)>;

/// Rule 1 of [`Clusters::apply`] for one mention's pairs (`list`).
fn node_decision<'p>(list: &[&'p Pair], spec: &ResolveSpec) -> NodeDecision<'p> {
    let nodes = |kind: Kind, min: f64| -> Vec<&'p Pair> {
        let mut seen = BTreeSet::new();
        list.iter()
            .copied()
            .filter(|p| matches!(p.target, Target::Node(_)))
            .filter(|p| p.kind == kind && p.score >= min)
            .filter(|p| seen.insert(p.target))
            .collect()
    };
    let mut linked = nodes(Kind::Linked, 0.0);
    let link_grey = nodes(Kind::LinkGrey, 0.0);
    if !linked.is_empty() || !link_grey.is_empty() {
        // Linked types: the best score at or above the threshold
        // wins when it beats the rest; ties and grey-band scores
        // stay open.
        linked.sort_by(|a, b| b.score.total_cmp(&a.score));
        return match linked.as_slice() {
            [best] => Ok(Some(*best)),
            [best, next, ..] if best.score > next.score => Ok(Some(*best)),
            [] => Err((link_grey, "only grey-band record scores")),
            _ => Err((linked, "several records score alike")),
        };
    }
    let identity = nodes(Kind::Identity, 0.0);
    let names = nodes(Kind::Name, 0.0);
    let high = nodes(Kind::Fuzzy, spec.fuzzy_merge_threshold);
    let grey: Vec<&Pair> = nodes(Kind::Fuzzy, 0.0)
        .into_iter()
        .filter(|p| p.score < spec.fuzzy_merge_threshold)
        .collect();
    match (identity.len(), names.len(), high.len()) {
        (1, _, _) if names.iter().all(|n| n.target == identity[0].target) => Ok(Some(identity[0])),
        (0, 1, _) => Ok(Some(names[0])),
        (0, 0, 1) => Ok(Some(high[0])),
        (0, 0, 0) if grey.is_empty() => Ok(None),
        (0, 0, 0) => Err((grey, "only grey-band candidates")),
        (0, 0, _) => Err((high, "several similar names")),
        (0, _, _) => Err((names, "several nodes with this name")),
        _ => Err((
            identity.into_iter().chain(names).collect(),
            "identity and name disagree",
        )),
    }
}

/// The outcome of entity resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Cluster index of each mention.
    pub cluster_of: Vec<usize>,
    /// Committed node (`short_id`) of each cluster, if it has one.
    pub committed: Vec<Option<i64>>,
    /// What the rules decided.
    pub stats: ClusterStats,
}

/// Numbers equal mentions as one element: each mention's element, and the
/// first mention of each element. The keys are hashed on rayon's threads
/// first: walking a million mentions' strings one by one took 2.6 s of a
/// 1M x 10M resolution, most of it waiting on memory.
fn distinct_mentions(all: &[MentionKey]) -> (Vec<usize>, Vec<usize>) {
    use std::hash::BuildHasher;
    /// A mention by its precomputed hash; equal hashes compare the keys.
    struct Hashed<'a>(u64, &'a MentionKey);
    impl std::hash::Hash for Hashed<'_> {
        fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
            h.write_u64(self.0);
        }
    }
    impl PartialEq for Hashed<'_> {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0 && self.1 == other.1
        }
    }
    impl Eq for Hashed<'_> {}
    let state = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
    let hashes: Vec<u64> = all.par_iter().map(|m| state.hash_one(m)).collect();
    let mut element_of = Vec::with_capacity(all.len());
    let mut first: Vec<usize> = Vec::new();
    let mut index: HashMap<Hashed, usize> = HashMap::with_capacity(all.len());
    for (i, (m, h)) in all.iter().zip(hashes).enumerate() {
        let next = first.len();
        let e = *index.entry(Hashed(h, m)).or_insert(next);
        if e == next {
            first.push(i);
        }
        element_of.push(e);
    }
    (element_of, first)
}

/// Registers the UDFs and the mentions, runs the candidate joins against
/// `nodes` and applies the rules. Returns the clusters-in-progress and
/// what stays open, so the caller can adjudicate before
/// [`Clusters::finish`].
///
/// Identical mentions (equal [`MentionKey`]s: the same entity written the
/// same way with the same attributes, in several episodes) are resolved
/// once: they are one row of the mentions table, share a cluster, and an
/// ambiguous one is one open question, about its first occurrence.
/// Without this, the mention-to-mention joins grow with the square of the
/// mentions of each entity (a company named in most of an archive's
/// episodes).
///
/// `vectors` holds the name vector of each mention for embedding
/// candidates (`resolve.embedding_candidates`); it may be empty.
pub async fn resolve_entities(
    ctx: &SessionContext,
    nodes: &str,
    all_mentions: &[MentionKey],
    vectors: &[Option<Arc<[f32]>>],
    spec: &ResolveSpec,
    identity: &BTreeMap<String, Vec<String>>,
) -> Result<(Clusters, Vec<Ambiguity>), DataFusionError> {
    let (element_of, first) = distinct_mentions(all_mentions);
    let distinct: Vec<MentionKey> = first.iter().map(|&i| all_mentions[i].clone()).collect();
    let mentions = distinct.as_slice();
    register_udfs(ctx, spec, identity);
    tracing::debug!(
        "{} mentions, {} distinct",
        all_mentions.len(),
        mentions.len()
    );
    let partitions = ctx.state().config().target_partitions();
    let batches = mentions_batches(mentions, partitions)
        .map_err(|e| e.context("the run's mentions as a table"))?;
    register_batches(ctx, MENTIONS_TABLE, mentions_schema(), batches.concat())
        .await
        .map_err(|e| e.context("registering the run's mentions"))?;
    let distinct_vectors: Vec<Option<Arc<[f32]>>> = if vectors.is_empty() {
        Vec::new()
    } else {
        first
            .iter()
            .map(|&i| vectors.get(i).cloned().flatten())
            .collect()
    };
    let pairs = {
        let before = broadcast_run_side(ctx, mentions.len());
        let pairs = candidates(ctx, nodes, spec, identity, mentions, &distinct_vectors).await;
        restore_join_thresholds(ctx, before);
        pairs?
    };
    // A million mentions' names and attributes are read again here: on
    // all cores, since the rules wait for them.
    let chains = mentions.iter().map(|m| m.chain.clone()).collect();
    // Written with several words, whatever folding leaves: "Acme Corp"
    // (folded "acme") is not a first name to complete.
    let multiword = mentions
        .par_iter()
        .map(|m| normalize_name(&m.name).contains(' '))
        .collect();
    // The same keys the `identity_keys` UDF gives and nodes store.
    let identity_keys = crate::text::IdentityKeys::new(identity.clone());
    let ids = mentions
        .par_iter()
        .map(|m| {
            m.chain
                .last()
                .map(|t| identity_keys.keys(t, &m.attributes))
                .unwrap_or_default()
        })
        .collect();
    let started = std::time::Instant::now();
    let mut clusters = Clusters::new(chains, multiword, ids);
    let open = clusters.apply(&pairs, spec);
    tracing::debug!(
        "rules over {} pairs: {:.2} s",
        pairs.len(),
        started.elapsed().as_secs_f64()
    );
    let _ = ctx.deregister_table(MENTIONS_TABLE);
    // Elements back to mention indices: an element stands for its first
    // mention.
    let open = open
        .into_iter()
        .map(|mut a| {
            a.mention = first[a.mention];
            for p in &mut a.options {
                p.mention = a.mention;
                if let Target::Mention(e) = p.target {
                    p.target = Target::Mention(first[e]);
                }
            }
            a
        })
        .collect();
    Ok((clusters.with_elements(element_of), open))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    fn to(target: Target, chain: &[String], identity: &[&str]) -> Pair {
        Pair {
            mention: 0,
            target,
            kind: Kind::Name,
            score: 1.0,
            count: 1,
            name: String::new(),
            chain: chain.to_vec(),
            identity: identity.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn equal_mentions_are_one_element_numbered_by_first_appearance() {
        let m = |name: &str, attributes: &str| MentionKey {
            group_id: "g".into(),
            name: name.into(),
            chain: chain(&["Person"]),
            attributes: attributes.into(),
        };
        let all = [
            m("Dana", "{}"),
            m("Acme", "{}"),
            m("Dana", "{}"),
            m("Dana", r#"{"email":"d@x.test"}"#),
            m("Acme", "{}"),
        ];
        let (element_of, first) = distinct_mentions(&all);
        assert_eq!(element_of, [0, 1, 0, 2, 1]);
        assert_eq!(first, [0, 1, 3]);
    }

    #[test]
    fn a_link_that_would_fuse_two_committed_nodes_is_refused() {
        let person = chain(&["Person"]);
        let mut c = Clusters::new(
            vec![person.clone(), person.clone()],
            vec![true, true],
            vec![vec![], vec![]],
        );
        assert!(c.link(0, &to(Target::Node(1), &person, &[])));
        assert!(c.link(1, &to(Target::Node(2), &person, &[])));
        assert!(!c.could_link(0, &to(Target::Mention(1), &person, &[])));
        assert!(!c.link(0, &to(Target::Mention(1), &person, &[])));
        assert_eq!(c.stats.refused, 1);
        let r = c.finish();
        assert_eq!(r.committed[r.cluster_of[0]], Some(1));
        assert_eq!(r.committed[r.cluster_of[1]], Some(2));
    }

    #[test]
    fn siblings_never_meet_through_their_common_parent() {
        let parent = chain(&["Contract"]);
        let po = chain(&["Contract", "PurchaseOrder"]);
        let msa = chain(&["Contract", "MasterAgreement"]);
        let mut c = Clusters::new(
            vec![parent, po.clone(), msa.clone()],
            vec![false; 3],
            vec![],
        );
        assert!(c.link(0, &to(Target::Mention(1), &po, &[])), "prefix");
        assert!(
            !c.link(0, &to(Target::Mention(2), &msa, &[])),
            "the cluster is a PurchaseOrder now"
        );
        let r = c.finish();
        assert_eq!(r.cluster_of[0], r.cluster_of[1]);
        assert_ne!(r.cluster_of[0], r.cluster_of[2]);
    }

    #[test]
    fn two_values_of_one_identity_property_never_share_a_cluster() {
        let person = chain(&["Person"]);
        let mut c = Clusters::new(
            vec![person.clone(), person.clone()],
            vec![true, true],
            vec![vec!["email=t a".into()], vec!["email=t b".into()]],
        );
        assert!(!c.link(0, &to(Target::Mention(1), &person, &[])));
        assert!(!c.link(0, &to(Target::Node(9), &person, &["email=t c"])));
        assert!(c.link(0, &to(Target::Node(8), &person, &["email=t a"])));
        assert_eq!(c.stats.refused, 2);
    }

    #[test]
    fn different_values_of_a_property_that_may_change_do_not_keep_mentions_apart() {
        let person = chain(&["Person"]);
        let mut c = Clusters::new(
            vec![person.clone(), person.clone()],
            vec![true, true],
            vec![
                vec!["~email=d northwind".into()],
                vec!["~email=d acme".into()],
            ],
        );
        assert!(
            c.link(0, &to(Target::Mention(1), &person, &[])),
            "a name match decides"
        );
        assert!(c.link(0, &to(Target::Node(7), &person, &["~email=d globex"])));
        assert_eq!(c.stats.refused, 0);
    }

    #[test]
    fn only_identity_properties_that_may_change_carry_the_mark() {
        let t: crate::ontology::EntityTypeSpec = toml::from_str(
            r#"
            name = "Person"
            description = "A person."
            properties = [
              { name = "email", type = "text", may_change = true },
              { name = "employee_id", type = "text" },
            ]
            identity_properties = ["email", "employee_id"]
            "#,
        )
        .expect("entity type");
        assert_eq!(identity_names(&t), ["~email", "employee_id"]);
    }
}
