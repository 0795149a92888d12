//! Records name an entity's type (`resolve.record_types_win`).
//!
//! A model reading text may type a name differently from the record that
//! maps it: the staff directory says "Platform Reliability" is a Team, a
//! chat message makes it a Company. Entities of incompatible chains never
//! merge, so without this step the graph holds the team twice. A record
//! is the user's own statement of the type, so it wins: a text mention
//! whose folded name is, in its group, exactly the name of a record's
//! entity of an incompatible chain takes the record's chain. The record's
//! entity is a mapped mention of this run or a committed node of origin
//! `map`. Its attributes (of the other type) are dropped, and name
//! resolution then merges it as any same-named mention. A name that
//! records give two incompatible chains is left alone: the records do not
//! say which one the text means.
//!
//! The run applies it between the entity walk and the fact calls, so that
//! a fact call offers the relation types the record's type allows.
//!
//! The committed side is one DataFusion semi-join of `nodes` against the
//! run's text names, so the step grows with the run, not with the graph.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{Array, AsArray, StringArray};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use super::entities::{compatible, string_lists, strings};
use super::stage::RunMention;
use super::{ResolveSpec, fold_suffixes, normalize_name};

/// Scratch table of the run's folded text names.
const RUN_NAMES: &str = "run_text_names";

/// For each mention, the record's chain it takes, or `None` when it keeps
/// its own. `nodes` names the committed nodes table.
pub async fn record_chains(
    ctx: &SessionContext,
    nodes: &str,
    spec: &ResolveSpec,
    mentions: &[RunMention<'_>],
) -> Result<Vec<Option<Vec<String>>>, DataFusionError> {
    let folded: Vec<String> = mentions
        .iter()
        .map(|m| fold_suffixes(&normalize_name(&m.mention.name), &spec.corporate_suffixes))
        .collect();
    let text: Vec<usize> = (0..mentions.len())
        .filter(|&i| !mentions[i].mention.mapped && !folded[i].is_empty())
        .collect();
    if text.is_empty() {
        return Ok(vec![None; mentions.len()]);
    }
    // (group, folded name) → the chains records give it.
    let mut chains: HashMap<(&str, &str), BTreeSet<Vec<String>>> = HashMap::new();
    for (m, f) in mentions.iter().zip(&folded) {
        if m.mention.mapped {
            chains
                .entry((m.group_id, f.as_str()))
                .or_default()
                .insert(m.mention.chain.clone());
        }
    }
    let committed = committed_record_chains(ctx, nodes, spec, &text, &folded).await?;
    for ((group, name), chain) in &committed {
        chains
            .entry((group.as_str(), name.as_str()))
            .or_default()
            .insert(chain.clone());
    }
    let mut out = vec![None; mentions.len()];
    for i in text {
        let m = &mentions[i];
        let Some(options) = chains.get(&(m.group_id, folded[i].as_str())) else {
            continue;
        };
        // Chains that are prefixes of one another name one type, the
        // longer more precisely.
        let longest = options.iter().max_by_key(|c| c.len());
        let Some(record) = longest else { continue };
        if options.iter().any(|c| !compatible(c, record)) {
            continue;
        }
        if !compatible(&m.mention.chain, record) {
            out[i] = Some(record.clone());
        }
    }
    Ok(out)
}

/// `(group, folded name) → chain` of the committed record nodes whose
/// folded name is one of the run's text names.
async fn committed_record_chains(
    ctx: &SessionContext,
    nodes: &str,
    spec: &ResolveSpec,
    text: &[usize],
    folded: &[String],
) -> Result<Vec<((String, String), Vec<String>)>, DataFusionError> {
    // `fold_name` folds the committed names as the Rust side folded the
    // run's (entity resolution registers the full set again later).
    super::entities::register_udfs(ctx, spec, &BTreeMap::new());
    let names: BTreeSet<&str> = text.iter().map(|&i| folded[i].as_str()).collect();
    let names: Vec<&str> = names.into_iter().collect();
    crate::scratch::register_column(ctx, RUN_NAMES, "folded", Arc::new(StringArray::from(names)))
        .await?;
    let sql = format!(
        "SELECT n.group_id, n.folded, n.labels FROM \
           (SELECT group_id, fold_name(name_normalized) AS folded, labels FROM {nodes} WHERE origin = 'map') n \
         LEFT SEMI JOIN {RUN_NAMES} r ON n.folded = r.folded"
    );
    let batches = ctx.sql(&sql).await?.collect().await;
    let _ = ctx.deregister_table(RUN_NAMES);
    let mut out = Vec::new();
    for b in &batches? {
        // The reader may hand out string views: cast to plain strings.
        let (groups, names) = (strings(b.column(0))?, strings(b.column(1))?);
        let (groups, names) = (groups.as_string::<i32>(), names.as_string::<i32>());
        let labels = string_lists(b.column(2))?;
        let labels = labels.as_list::<i32>();
        for r in 0..b.num_rows() {
            let list = labels.value(r);
            let list = list.as_string::<i32>();
            // Labels are "Entity" then the chain, root first.
            let chain: Vec<String> = (1..list.len())
                .filter(|&k| list.is_valid(k))
                .map(|k| list.value(k).to_string())
                .collect();
            out.push((
                (groups.value(r).to_string(), names.value(r).to_string()),
                chain,
            ));
        }
    }
    Ok(out)
}

/// How many mentions a record retyped, per (text chain → record chain),
/// for the run log.
pub fn summary(
    mentions: &[RunMention<'_>],
    chains: &[Option<Vec<String>>],
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (m, c) in mentions.iter().zip(chains) {
        if let Some(c) = c {
            let key = format!(
                "{} -> {}",
                m.mention.type_name(),
                c.last().map_or("Entity", String::as_str)
            );
            *out.entry(key).or_default() += 1;
        }
    }
    out
}
