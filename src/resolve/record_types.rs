//! Records and majorities name an entity's type
//! (`resolve.record_types_win`, `resolve.majority_types`).
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
//! Where no record speaks, most episodes do ([`majority_chains`]): a model
//! typed "Skylark Messaging" as a Company in three episodes and as a
//! Service in two.
//!
//! The run applies both between the entity walk and the fact calls, so
//! that a fact call offers the relation types the entity's type allows.
//!
//! The committed side is one DataFusion semi-join of `nodes` against the
//! run's text names, so the step grows with the run, not with the graph.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{Array, AsArray, StringArray};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use super::entities::compatible;
use super::mentions::{string_lists, strings};
use super::stage::RunMention;
use super::udfs::register_udfs;
use super::{ResolveSpec, fold_suffixes, normalize_name};

/// Scratch table of the run's folded text names.
const RUN_NAMES: &str = "run_text_names";

/// A committed node as the type rules read it.
struct CommittedNode {
    /// Its chain, root first.
    chain: Vec<String>,
    /// How many episodes name it.
    episodes: u64,
    /// Whether a record made it (origin `map`).
    record: bool,
}

/// `(group, folded name)` → the committed nodes of that name.
type ByName = HashMap<(String, String), Vec<CommittedNode>>;

/// The run's mentions as the type rules read them: each name folded as
/// name resolution folds it, and the committed nodes that share a text
/// mention's folded name in its group.
pub struct TypeEvidence {
    /// Per mention, its name folded (case, punctuation, corporate
    /// suffixes).
    folded: Vec<String>,
    /// The committed nodes that share a text mention's folded name.
    committed: ByName,
}

impl TypeEvidence {
    /// Folds the mentions' names and reads the committed nodes that share
    /// one with a text mention (`nodes` names the committed nodes table):
    /// one semi-join, whatever the graph's size.
    pub async fn read(
        ctx: &SessionContext,
        nodes: &str,
        spec: &ResolveSpec,
        mentions: &[RunMention<'_>],
    ) -> Result<Self, DataFusionError> {
        let folded = Self::fold(spec, mentions);
        let names: BTreeSet<&str> = (0..mentions.len())
            .filter(|&i| !mentions[i].mention.mapped && !folded[i].is_empty())
            .map(|i| folded[i].as_str())
            .collect();
        let mut committed = ByName::new();
        if !names.is_empty() {
            for (key, node) in committed_chains(ctx, nodes, spec, names).await? {
                committed.entry(key).or_default().push(node);
            }
        }
        Ok(TypeEvidence { folded, committed })
    }

    /// Each mention's name folded as name resolution folds it.
    fn fold(spec: &ResolveSpec, mentions: &[RunMention<'_>]) -> Vec<String> {
        mentions
            .iter()
            .map(|m| fold_suffixes(&normalize_name(&m.mention.name), &spec.corporate_suffixes))
            .collect()
    }

    /// The committed nodes of `group` named `folded`.
    fn committed(&self, group: &str, folded: &str) -> &[CommittedNode] {
        self.committed
            .get(&(group.to_string(), folded.to_string()))
            .map_or(&[], Vec::as_slice)
    }
}

/// For each mention, the record's chain it takes, or `None` when it keeps
/// its own (`mentions` as `evidence` read them).
pub fn record_chains(
    mentions: &[RunMention<'_>],
    evidence: &TypeEvidence,
) -> Vec<Option<Vec<String>>> {
    let folded = &evidence.folded;
    let text: Vec<usize> = (0..mentions.len())
        .filter(|&i| !mentions[i].mention.mapped && !folded[i].is_empty())
        .collect();
    // (group, folded name) → the chains records give it.
    let mut chains: HashMap<(&str, &str), BTreeSet<Vec<String>>> = HashMap::new();
    for (m, f) in mentions.iter().zip(folded) {
        if m.mention.mapped {
            chains
                .entry((m.group_id, f.as_str()))
                .or_default()
                .insert(m.mention.chain.clone());
        }
    }
    let mut out = vec![None; mentions.len()];
    for i in text {
        let m = &mentions[i];
        let mut options = chains
            .get(&(m.group_id, folded[i].as_str()))
            .cloned()
            .unwrap_or_default();
        options.extend(
            evidence
                .committed(m.group_id, &folded[i])
                .iter()
                .filter(|n| n.record)
                .map(|n| n.chain.clone()),
        );
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
    out
}

/// For each mention, the chain most episodes give its name when the
/// mention's own is of another top-level type, or `None` when it keeps
/// its own (`resolve.majority_types`; `mentions` as `evidence` read them,
/// with the types records gave already taken). Every mention of the run
/// with a type votes for its chain with its episode, and every committed
/// node of the same folded name in the group with its episodes; a
/// top-level type wins with at least two votes and more than all the
/// others together, and a text mention of another top-level type takes
/// the winner's chain that most votes gave (a longer one on a tie). Below
/// that type the subtypes vote the same way ([`below_the_root`]): a
/// mention whose chain parts from the winner's takes it when more votes
/// back the winner, and a tie leaves every mention at the part the tied
/// chains share. An untyped mention (`Entity`) neither votes nor is
/// retyped.
///
/// A small model types one name differently from one episode to the next
/// ("Skylark Messaging" a Company in three mails and documents, a Service
/// in two), and entities of incompatible types never merge; a mention so
/// mistyped also offers the fact call the wrong relation types. The vote
/// sees this run's mentions and the committed nodes: an archive split
/// into runs may vote otherwise than one run over all of it (docs/resolution.md,
/// "One archive, one graph").
pub fn majority_chains(
    mentions: &[RunMention<'_>],
    evidence: &TypeEvidence,
) -> Vec<Option<Vec<String>>> {
    let folded = &evidence.folded;
    let typed = |i: usize| !mentions[i].mention.chain.is_empty() && !folded[i].is_empty();
    // (group, folded name) → votes per chain.
    type Votes = BTreeMap<Vec<String>, u64>;
    let mut votes: HashMap<(&str, &str), Votes> = HashMap::new();
    for i in (0..mentions.len()).filter(|&i| typed(i)) {
        let key = (mentions[i].group_id, folded[i].as_str());
        let v = votes.entry(key).or_insert_with(|| {
            // The graph's votes, once per name.
            let mut v = Votes::new();
            for n in evidence.committed(key.0, key.1) {
                if !n.chain.is_empty() {
                    *v.entry(n.chain.clone()).or_default() += n.episodes;
                }
            }
            v
        });
        *v.entry(mentions[i].mention.chain.clone()).or_default() += 1;
    }
    let winner = |v: &Votes| -> Option<Vec<String>> {
        let mut roots: BTreeMap<&String, u64> = BTreeMap::new();
        for (chain, n) in v {
            if let Some(root) = chain.first() {
                *roots.entry(root).or_default() += n;
            }
        }
        let total: u64 = roots.values().sum();
        let (root, most) = roots.iter().max_by_key(|(_, n)| **n)?;
        if *most < 2 || *most <= total - most {
            return None;
        }
        v.iter()
            .filter(|(c, _)| c.first() == Some(*root))
            .max_by(|(a, x), (b, y)| x.cmp(y).then(a.len().cmp(&b.len())).then(b.cmp(a)))
            .map(|(c, _)| c.clone())
    };
    let mut out = vec![None; mentions.len()];
    for i in (0..mentions.len()).filter(|&i| typed(i) && !mentions[i].mention.mapped) {
        let key = (mentions[i].group_id, folded[i].as_str());
        let Some(v) = votes.get(&key) else { continue };
        let Some(chain) = winner(v) else { continue };
        let own = &mentions[i].mention.chain;
        if chain.first() != own.first() {
            out[i] = Some(chain);
            continue;
        }
        match below_the_root(v, &chain) {
            Some(Below::Winner) if !compatible(own, &chain) => out[i] = Some(chain),
            Some(Below::Parent(parent)) if own.len() > parent.len() => out[i] = Some(parent),
            _ => {}
        }
    }
    out
}

/// What the subtypes of a name's winning top-level type decide, when its
/// chains part below it.
enum Below {
    /// The winner's chain has more votes behind it than any chain it
    /// parts from: those take it.
    Winner,
    /// A tie: every chain below this one, the part they share, takes it.
    Parent(Vec<String>),
}

/// How a name's chains that part below the winning top-level type are
/// settled (`winner`: the chain of that type most votes gave); `None`
/// when none part, or when a parting chain has more votes behind it.
/// Votes for a chain back every chain compatible with it (one a prefix of
/// the other). A name walked to a `Company` in one episode and to a
/// `Foundation` in another is one `Organization`, not two entities that
/// can never merge.
fn below_the_root(v: &BTreeMap<Vec<String>, u64>, winner: &[String]) -> Option<Below> {
    let backing = |c: &[String]| -> u64 {
        v.iter()
            .filter(|(x, _)| compatible(x, c))
            .map(|(_, n)| *n)
            .sum()
    };
    let parting: Vec<&Vec<String>> = v
        .keys()
        .filter(|c| c.first() == winner.first() && !compatible(c, winner))
        .collect();
    let most = parting.iter().map(|c| backing(c)).max()?;
    let own = backing(winner);
    if own > most {
        return Some(Below::Winner);
    }
    if own < most {
        return None;
    }
    let mut parent = winner.to_vec();
    for c in parting.iter().filter(|c| backing(c) == most) {
        let shared = parent
            .iter()
            .zip(c.iter())
            .take_while(|(a, b)| a == b)
            .count();
        parent.truncate(shared);
    }
    Some(Below::Parent(parent))
}

/// The committed nodes whose folded name is one of `names`, with their
/// `(group, folded name)`.
async fn committed_chains(
    ctx: &SessionContext,
    nodes: &str,
    spec: &ResolveSpec,
    names: BTreeSet<&str>,
) -> Result<Vec<((String, String), CommittedNode)>, DataFusionError> {
    // `fold_name` folds the committed names as the Rust side folded the
    // run's (entity resolution registers the full set again later).
    register_udfs(ctx, spec, &BTreeMap::new());
    let names: Vec<&str> = names.into_iter().collect();
    crate::scratch::register_column(ctx, RUN_NAMES, "folded", Arc::new(StringArray::from(names)))
        .await?;
    let sql = format!(
        "SELECT n.group_id, n.folded, n.labels, n.episodes, n.origin = 'map' AS record FROM \
           (SELECT group_id, fold_name(name_normalized) AS folded, labels, origin, \
              CAST(cardinality(episode_ids) AS BIGINT) AS episodes FROM {nodes}) n \
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
        let episodes = arrow::compute::cast(b.column(3), &arrow::datatypes::DataType::Int64)?;
        let episodes = episodes.as_primitive::<arrow::datatypes::Int64Type>();
        let record = b.column(4).as_boolean();
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
                CommittedNode {
                    chain,
                    episodes: u64::try_from(episodes.value(r)).unwrap_or(0),
                    record: record.is_valid(r) && record.value(r),
                },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::Mention;

    fn mention(name: &str, chain: &[&str], mapped: bool) -> Mention {
        Mention {
            episode_id: "e".into(),
            name: name.into(),
            chain: chain.iter().map(|c| c.to_string()).collect(),
            attributes: Default::default(),
            context: String::new(),
            mapped,
        }
    }

    /// The mentions as a run of group "g" holds them.
    fn in_group_g(mentions: &[Mention]) -> Vec<RunMention<'_>> {
        mentions
            .iter()
            .map(|mention| RunMention {
                group_id: "g",
                mention,
            })
            .collect()
    }

    /// The evidence `TypeEvidence::read` would give, with `committed`
    /// nodes of group "g".
    fn evidence(mentions: &[RunMention<'_>], committed: &[(&str, &[&str], u64)]) -> TypeEvidence {
        let spec = ResolveSpec::default();
        let mut by_name = ByName::new();
        for (name, chain, episodes) in committed {
            by_name
                .entry(("g".into(), (*name).into()))
                .or_default()
                .push(CommittedNode {
                    chain: chain.iter().map(|c| c.to_string()).collect(),
                    episodes: *episodes,
                    record: false,
                });
        }
        TypeEvidence {
            folded: TypeEvidence::fold(&spec, mentions),
            committed: by_name,
        }
    }

    #[test]
    fn a_top_level_type_with_more_votes_than_all_others_retypes_the_rest() {
        let ms = [
            mention("Skylark Messaging", &["Company"], false),
            mention("Skylark Messaging Ltd", &["Company"], false),
            mention("skylark messaging", &["Service"], false),
            mention("Fare Engine", &["Service"], false),
            mention("Fare Engine", &["Company"], false),
            mention("Lumen", &["Product"], false),
            mention("Lumen", &["Ticket", "Incident"], false),
            mention("Lumen", &[], false),
        ];
        let run = in_group_g(&ms);
        let chains = majority_chains(&run, &evidence(&run, &[]));
        let company = Some(vec!["Company".to_string()]);
        assert_eq!(
            chains[..3],
            [None, None, company],
            "2 votes to 1, suffixes folded"
        );
        assert_eq!(chains[3..5], [None, None], "a tie leaves both");
        assert_eq!(
            chains[5..],
            [None, None, None],
            "1 to 1; Entity does not vote"
        );
        // The graph votes with its nodes' episodes: Lumen, an incident in
        // three committed episodes, outvotes the run's product.
        let chains = majority_chains(
            &run,
            &evidence(
                &run,
                &[
                    ("lumen", &["Ticket"], 1),
                    ("lumen", &["Ticket", "Incident"], 2),
                ],
            ),
        );
        assert_eq!(
            chains[5],
            Some(vec!["Ticket".to_string(), "Incident".to_string()]),
            "the chain most votes gave"
        );
        assert_eq!(chains[6], None, "already of the winning top-level type");
    }

    #[test]
    fn below_the_winning_top_level_type_the_subtype_most_votes_back_wins_and_a_tie_keeps_the_parent()
     {
        let org = |sub: &str| vec!["Organization".to_string(), sub.to_string()];
        let ms = [
            mention("Grünfeld Energie GmbH", &["Organization", "Utility"], false),
            mention("Grünfeld Energie", &["Organization", "Utility"], false),
            mention(
                "Grünfeld Energie GmbH",
                &["Organization", "Manufacturer"],
                false,
            ),
            mention("Brightwave Labs", &["Organization", "Company"], false),
            mention("Brightwave Labs", &["Organization", "Foundation"], false),
            mention("Corvid", &["Organization"], false),
            mention("Corvid", &["Organization", "Company"], false),
        ];
        let run = in_group_g(&ms);
        let chains = majority_chains(&run, &evidence(&run, &[]));
        assert_eq!(
            chains[..3],
            [None, None, Some(org("Utility"))],
            "2 votes to 1"
        );
        let parent = Some(vec!["Organization".to_string()]);
        assert_eq!(
            chains[3..5],
            [parent.clone(), parent],
            "1 to 1: the parent they share"
        );
        assert_eq!(chains[5..], [None, None], "a prefix is no disagreement");
    }

    #[test]
    fn a_record_mention_votes_but_keeps_its_type() {
        let ms = [
            mention("Platform Reliability", &["Company"], false),
            mention("Platform Reliability", &["Company"], false),
            mention("Platform Reliability", &["Company"], false),
            mention("Platform Reliability", &["Team"], true),
        ];
        let run = in_group_g(&ms);
        let chains = majority_chains(&run, &evidence(&run, &[]));
        assert_eq!(chains, vec![None; 4]);
    }
}
