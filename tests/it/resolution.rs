//! Entity resolution traps, run through the real DataFusion plans: the
//! committed side is a registered `nodes` table, the run's side the
//! mentions table, exactly as `graphloom run` uses them.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::prelude::SessionContext;
use graphloom::resolve::ResolveSpec;
use graphloom::resolve::entities::{
    Ambiguity, MentionKey, Resolved, Target, mentions_batches, mentions_schema, resolve_entities,
};
use graphloom::resolve::facts::{EdgeRef, contradiction_candidates};
use graphloom::store::rows::EdgeRow;

fn key(name: &str, chain: &[&str], attributes: &str) -> MentionKey {
    MentionKey {
        group_id: "g".into(),
        name: name.into(),
        chain: chain.iter().map(|s| s.to_string()).collect(),
        attributes: attributes.into(),
    }
}

/// Resolves `mentions` against `committed` (short ids 1, 2, … in order).
async fn resolve(
    committed: &[MentionKey],
    mentions: &[MentionKey],
    spec: &ResolveSpec,
) -> (Resolved, Vec<Ambiguity>) {
    let ctx = SessionContext::new();
    let table = datafusion::datasource::MemTable::try_new(
        mentions_schema(),
        mentions_batches(committed, 2).expect("batches"),
    )
    .expect("table");
    ctx.register_table("committed_src", Arc::new(table))
        .expect("register");
    ctx.sql(
        "CREATE VIEW nodes AS SELECT mention_id + 1 AS short_id, group_id, name, name_normalized, \
         type, labels, attributes FROM committed_src",
    )
    .await
    .expect("view");
    let identity: BTreeMap<String, Vec<String>> = [
        ("Person".to_string(), vec!["email".to_string()]),
        ("PurchaseOrder".to_string(), vec!["po_number".to_string()]),
    ]
    .into();
    let (clusters, open) = resolve_entities(&ctx, "nodes", mentions, &[], spec, &identity)
        .await
        .expect("resolution runs");
    (clusters.finish(), open)
}

fn node_of(r: &Resolved, mention: usize) -> Option<i64> {
    r.committed[r.cluster_of[mention]]
}

fn together(r: &Resolved, a: usize, b: usize) -> bool {
    r.cluster_of[a] == r.cluster_of[b]
}

#[tokio::test]
async fn corporate_suffix_case_and_punctuation_variants_merge() {
    let spec = ResolveSpec::default();
    let mentions = [
        key("Acme Corp", &["Company"], "{}"),
        key("Acme Corporation", &["Company"], "{}"),
        key("ACME corp.", &["Company"], "{}"),
    ];
    let (r, open) = resolve(&[], &mentions, &spec).await;
    assert!(together(&r, 0, 1) && together(&r, 1, 2), "{r:?}");
    assert!(open.is_empty());
    // And against a committed node of that name.
    let (r, _) = resolve(&[key("Acme Inc.", &["Company"], "{}")], &mentions, &spec).await;
    assert_eq!(
        (node_of(&r, 0), node_of(&r, 1), node_of(&r, 2)),
        (Some(1), Some(1), Some(1))
    );
}

/// Resolves `mentions` under `identity` against one committed company
/// node, "Zork Industries" with no attributes, whose stored key columns
/// are `keys` (SQL select items).
async fn resolve_against_zork(
    keys: &str,
    identity: &BTreeMap<String, Vec<String>>,
    mentions: &[MentionKey],
) -> Resolved {
    let spec = ResolveSpec::default();
    let ctx = SessionContext::new();
    for f in graphloom::resolve::entities::udfs(&spec, identity) {
        ctx.register_udf(f);
    }
    ctx.sql(&format!(
        "CREATE VIEW nodes AS SELECT CAST(1 AS BIGINT) AS short_id, 'g' AS group_id, \
         'Zork Industries' AS name, 'zork industries' AS name_normalized, 'Company' AS type, \
         make_array('Entity', 'Company') AS labels, '{{}}' AS attributes, {keys}"
    ))
    .await
    .expect("view");
    let (clusters, _) = resolve_entities(&ctx, "nodes", mentions, &[], &spec, identity)
        .await
        .expect("resolution runs");
    clusters.finish()
}

/// [`resolve_against_zork`] with name keys that say `stored_folded` under
/// `fingerprint`, while the node's name folds to something else.
async fn resolve_against_stored_keys(
    stored_folded: &str,
    fingerprint: &str,
    mentions: &[MentionKey],
) -> Resolved {
    let keys = format!(
        "'{stored_folded}' AS name_folded, name_bands('g', '{stored_folded}') AS name_band_keys, \
         '{fingerprint}' AS name_keys_fingerprint"
    );
    resolve_against_zork(&keys, &BTreeMap::new(), mentions).await
}

#[tokio::test]
async fn stored_name_keys_are_read_under_the_current_settings_and_ignored_under_others() {
    let current = ResolveSpec::default().name_keys().fingerprint();
    let mentions = [key("Acme", &["Company"], "{}")];
    // The stored folded name is what the name join compares: a mention
    // named as the stored key (not as the node) finds the node.
    let r = resolve_against_stored_keys("acme", &current, &mentions).await;
    assert_eq!(node_of(&r, 0), Some(1), "{r:?}");
    // Keys stored under other settings (another suffix list, LSH shape or
    // key version) are recomputed from the name: no match.
    let r = resolve_against_stored_keys("acme", "v0-stale", &mentions).await;
    assert_eq!(node_of(&r, 0), None, "{r:?}");
    // And recomputed keys match the name itself.
    let by_name = [key("Zork Industries Inc.", &["Company"], "{}")];
    let r = resolve_against_stored_keys("acme", "v0-stale", &by_name).await;
    assert_eq!(node_of(&r, 0), Some(1), "{r:?}");
}

/// [`resolve_against_zork`] with an identity key `stored` under
/// `fingerprint`, while the node's attributes hold no identity value.
async fn resolve_against_stored_identity(
    stored: &str,
    fingerprint: &str,
    mentions: &[MentionKey],
) -> Resolved {
    let identity: BTreeMap<String, Vec<String>> =
        [("Company".to_string(), vec!["domain".to_string()])].into();
    let keys = format!(
        "make_array('{stored}') AS identity_keys, '{fingerprint}' AS identity_keys_fingerprint"
    );
    resolve_against_zork(&keys, &identity, mentions).await
}

#[tokio::test]
async fn stored_identity_keys_are_read_under_the_current_identity_properties_only() {
    let identity: BTreeMap<String, Vec<String>> =
        [("Company".to_string(), vec!["domain".to_string()])].into();
    let current = graphloom::text::IdentityKeys::new(identity).fingerprint();
    // Another name, the stored key's domain: found by identity alone.
    let mentions = [key(
        "Blorb Labs",
        &["Company"],
        r#"{"domain": "zork.example"}"#,
    )];
    let r = resolve_against_stored_identity("domain=zork example", &current, &mentions).await;
    assert_eq!(node_of(&r, 0), Some(1), "{r:?}");
    // Keys stored under other identity properties are recomputed from the
    // attributes, which hold none: no match.
    let r = resolve_against_stored_identity("domain=zork example", "i0-stale", &mentions).await;
    assert_eq!(node_of(&r, 0), None, "{r:?}");
}

#[tokio::test]
async fn stored_and_computed_name_keys_find_the_same_candidates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bench = |computed_keys: bool| graphloom::bench::resolution::ResolveBench {
        mentions: 3_000,
        nodes: 6_000,
        seed: 13,
        dir: dir.path().join("nodes"),
        existing_share: 0.5,
        repeat_share: 0.2,
        spec: ResolveSpec::default(),
        cluster: None,
        computed_keys,
    };
    let stored = graphloom::bench::resolution::run_resolve_bench(bench(false))
        .await
        .expect("with stored keys");
    let computed = graphloom::bench::resolution::run_resolve_bench(bench(true))
        .await
        .expect("with computed keys");
    // Fuzzy pairs exist, so the stored band keys were joined on.
    assert!(
        stored.pairs.get("fuzzy").copied().unwrap_or(0) > 0,
        "{stored}"
    );
    assert_eq!(stored.pairs, computed.pairs);
    assert_eq!(stored.node_merges, computed.node_merges);
    assert_eq!(stored.pair_merges, computed.pair_merges);
    assert_eq!(stored.ambiguous, computed.ambiguous);
}

#[tokio::test]
async fn an_identity_property_matches_under_another_name() {
    let committed = [key(
        "Priya Raman",
        &["Person"],
        r#"{"email": "priya@brightline.test"}"#,
    )];
    let mentions = [key(
        "P. Raman",
        &["Person"],
        r#"{"email": "Priya@Brightline.test "}"#,
    )];
    let (r, _) = resolve(&committed, &mentions, &ResolveSpec::default()).await;
    assert_eq!(node_of(&r, 0), Some(1));
    // The same e-mail on another type is not an identity match.
    let mentions = [key(
        "P. Raman",
        &["Company"],
        r#"{"email": "priya@brightline.test"}"#,
    )];
    let (r, _) = resolve(&committed, &mentions, &ResolveSpec::default()).await;
    assert_eq!(node_of(&r, 0), None);
}

#[tokio::test]
async fn a_name_written_as_another_entitys_identity_value_resolves_to_it() {
    let spec = ResolveSpec::default();
    let po = r#"{"po_number": "PO-4471"}"#;
    // Both ways round within one run: the name of one mention is the
    // identity value of the other, at a compatible chain.
    let mentions = [
        key("the March order", &["Contract", "PurchaseOrder"], po),
        key("PO 4471", &["Contract"], "{}"),
        key("PO-4471", &["Company"], "{}"),
    ];
    let (r, _) = resolve(&[], &mentions, &spec).await;
    assert!(together(&r, 0, 1), "{r:?}");
    assert!(!together(&r, 0, 2), "another root type never joins: {r:?}");
    // Against committed nodes: a name finds the node holding that value,
    // and a value finds the node named by it.
    let (r, _) = resolve(&mentions[..1], &mentions[1..2], &spec).await;
    assert_eq!(node_of(&r, 0), Some(1), "{r:?}");
    let (r, _) = resolve(&mentions[1..2], &mentions[..1], &spec).await;
    assert_eq!(node_of(&r, 0), Some(1), "{r:?}");
    // A value of another property is no identity of this one's.
    let other = [key(
        "the March order",
        &["Contract", "PurchaseOrder"],
        r#"{"po_number": "PO-5000"}"#,
    )];
    let (r, _) = resolve(&other, &mentions[1..2], &spec).await;
    assert_eq!(node_of(&r, 0), None, "{r:?}");
}

#[tokio::test]
async fn a_first_name_joins_the_only_full_name_and_stays_apart_when_shared() {
    let spec = ResolveSpec::default();
    let mentions = [
        key("Sarah Brown", &["Person"], "{}"),
        key("Sarah", &["Person"], "{}"),
    ];
    let (r, open) = resolve(&[], &mentions, &spec).await;
    assert!(together(&r, 0, 1), "unambiguous: {r:?}");
    assert!(open.is_empty());

    let mentions = [
        key("Sarah Brown", &["Person"], "{}"),
        key("Sarah Lee", &["Person"], "{}"),
        key("Sarah", &["Person"], "{}"),
    ];
    let (r, open) = resolve(&[], &mentions, &spec).await;
    assert!(!together(&r, 0, 1), "two people, one first name");
    assert!(!together(&r, 2, 0) && !together(&r, 2, 1), "{r:?}");
    assert_eq!(open.len(), 1, "left for adjudication: {open:?}");
    assert_eq!(open[0].mention, 2);

    // Committed side: two committed Sarahs make "Sarah" ambiguous, one
    // makes it that node.
    let committed = [
        key("Sarah Brown", &["Person"], "{}"),
        key("Sarah Lee", &["Person"], "{}"),
    ];
    let (r, open) = resolve(&committed, &[key("Sarah", &["Person"], "{}")], &spec).await;
    assert_eq!(node_of(&r, 0), None);
    assert_eq!(open.len(), 1);
    let (r, _) = resolve(&committed[..1], &[key("Sarah", &["Person"], "{}")], &spec).await;
    assert_eq!(node_of(&r, 0), Some(1));

    // Off: a first name stays on its own.
    let off = ResolveSpec {
        partial_names: false,
        ..ResolveSpec::default()
    };
    let (r, _) = resolve(&committed[..1], &[key("Sarah", &["Person"], "{}")], &off).await;
    assert_eq!(node_of(&r, 0), None);
}

#[tokio::test]
async fn a_longer_name_is_proposed_as_its_shorter_name_and_never_merges_by_itself() {
    let spec = ResolveSpec::default();
    let lumen = [key("Lumen 27", &["Product"], "{}")];
    let longer = [key("Lumen 27 monitors", &["Product"], "{}")];
    // Against a committed node: an open question, not a merge.
    let (r, open) = resolve(&lumen, &longer, &spec).await;
    assert_eq!(node_of(&r, 0), None, "{r:?}");
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].options.len(), 1);
    assert_eq!(open[0].options[0].target, Target::Node(1));
    assert_eq!(open[0].reason, "only shorter names it extends");
    // Between the run's mentions: the longer name asks about the shorter.
    let mentions = [
        key("Acme MSA", &["Contract", "MSA"], "{}"),
        key("Acme MSA 2024-02-01", &["Contract", "MSA"], "{}"),
    ];
    let (r, open) = resolve(&[], &mentions, &spec).await;
    assert!(!together(&r, 0, 1));
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].mention, 1);
    assert_eq!(open[0].options[0].target, Target::Mention(0));
    // The shorter name in the plural, or the whole name in the singular.
    for (committed, mention) in [
        ("Ridgeback 14 laptops", "Ridgeback 14 laptop, 16GB/512GB"),
        ("Lumen 27 monitors", "Lumen 27 monitor"),
    ] {
        let (r, open) = resolve(
            &[key(committed, &["Product"], "{}")],
            &[key(mention, &["Product"], "{}")],
            &spec,
        )
        .await;
        assert_eq!(node_of(&r, 0), None, "{r:?}");
        assert_eq!(open.len(), 1, "{mention}: {open:?}");
    }
    // Another type, or a name that matches outright, asks nothing.
    let (_, open) = resolve(&[key("Lumen 27", &["Company"], "{}")], &longer, &spec).await;
    assert!(open.is_empty(), "{open:?}");
    let both = [lumen[0].clone(), longer[0].clone()];
    let (r, open) = resolve(&both, &longer, &spec).await;
    assert_eq!(node_of(&r, 0), Some(2));
    assert!(open.is_empty(), "{open:?}");
    // A stem of one word is the partial rule's, not a proposal.
    let (_, open) = resolve(
        &[key("Lumen", &["Product"], "{}")],
        &[key("Lumen 27", &["Product"], "{}")],
        &ResolveSpec {
            partial_names: false,
            ..ResolveSpec::default()
        },
    )
    .await;
    assert!(open.is_empty(), "{open:?}");
    // Off: no proposal.
    let off = ResolveSpec {
        longer_names: false,
        ..ResolveSpec::default()
    };
    let (r, open) = resolve(&lumen, &longer, &off).await;
    assert_eq!(node_of(&r, 0), None);
    assert!(open.is_empty(), "{open:?}");
}

#[tokio::test]
async fn codes_siblings_and_other_types_never_merge() {
    let spec = ResolveSpec::default();
    let committed = [
        key("PO 4471", &["Contract", "PurchaseOrder"], "{}"),
        key("Apple", &["Organization", "Company"], "{}"),
    ];
    let mentions = [
        key("PO 4417", &["Contract", "PurchaseOrder"], "{}"),
        key("Apple", &["Organization", "Agency"], "{}"),
        key("Apple", &["Product"], "{}"),
    ];
    let (r, open) = resolve(&committed, &mentions, &spec).await;
    assert_eq!(node_of(&r, 0), None, "codes differ in digits");
    assert_eq!(node_of(&r, 1), None, "sibling types");
    assert_eq!(node_of(&r, 2), None, "another top-level type");
    assert!(!together(&r, 1, 2));
    assert!(open.is_empty(), "{open:?}");
}

#[tokio::test]
async fn a_longer_chain_merges_with_its_prefix_and_siblings_refuse_through_it() {
    let spec = ResolveSpec::default();
    let committed = [key("PO-1", &["Contract"], "{}")];
    let mentions = [
        key("PO-1", &["Contract", "PurchaseOrder"], "{}"),
        // A sibling of the same name cannot join the same node.
        key("PO-1", &["Contract", "MasterAgreement"], "{}"),
    ];
    let (r, _) = resolve(&committed, &mentions, &spec).await;
    assert_eq!(node_of(&r, 0), Some(1), "prefix upgrade");
    assert!(!together(&r, 0, 1), "siblings never share a node: {r:?}");
}

#[tokio::test]
async fn fuzzy_names_merge_above_the_threshold_and_the_grey_band_stays_open() {
    let spec = ResolveSpec::default();
    let committed = [key("Quillfeather Software", &["Company"], "{}")];
    // A typo: similarity 0.86, the only candidate.
    let (r, open) = resolve(
        &committed,
        &[key("Quilfeather Software", &["Company"], "{}")],
        &spec,
    )
    .await;
    assert_eq!(node_of(&r, 0), Some(1));
    assert!(open.is_empty());
    // "Brightline System" vs "Brightline Systems": 0.84, grey band.
    let (r, open) = resolve(
        &[key("Brightline Systems", &["Company"], "{}")],
        &[key("Brightline System", &["Company"], "{}")],
        &spec,
    )
    .await;
    assert_eq!(node_of(&r, 0), None, "without adjudication it stays apart");
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].options[0].target, Target::Node(1));
    let score = open[0].options[0].score;
    assert!(score >= spec.grey_band_min && score < 0.85, "{score}");
    // Unrelated names are no candidates at all.
    let (_, open) = resolve(
        &[key("Brightline Systems", &["Company"], "{}")],
        &[key("Brightline Solutions", &["Company"], "{}")],
        &spec,
    )
    .await;
    assert!(open.is_empty());
    // Fuzzy off: no fuzzy candidates.
    let off = ResolveSpec {
        fuzzy: false,
        ..ResolveSpec::default()
    };
    let (r, open) = resolve(
        &committed,
        &[key("Quilfeather Software", &["Company"], "{}")],
        &off,
    )
    .await;
    assert_eq!(node_of(&r, 0), None);
    assert!(open.is_empty());
}

#[tokio::test]
async fn two_committed_nodes_with_one_name_leave_the_mention_open() {
    let committed = [
        key("Jordan Lee", &["Person"], "{}"),
        key("Jordan Lee", &["Person"], "{}"),
    ];
    let (r, open) = resolve(
        &committed,
        &[key("Jordan Lee", &["Person"], "{}")],
        &ResolveSpec::default(),
    )
    .await;
    assert_eq!(node_of(&r, 0), None);
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].options.len(), 2);
}

#[tokio::test]
async fn no_adjudication_is_asked_for_a_pair_that_could_not_merge() {
    // Mention 0 is node 1 (e-mail and name), mention 1 is node 2 (name);
    // the two mentions are grey-band similar, but joining them would fuse
    // two committed nodes, so nothing is left to ask.
    let committed = [
        key("Dana Whitcombe", &["Person"], r#"{"email": "dana@a.test"}"#),
        key("Dana Whitcomb", &["Person"], "{}"),
    ];
    let mentions = [
        key("Dana Whitcombe", &["Person"], r#"{"email": "dana@a.test"}"#),
        key("Dana Whitcomb", &["Person"], "{}"),
    ];
    let (r, open) = resolve(&committed, &mentions, &ResolveSpec::default()).await;
    assert_eq!(
        (node_of(&r, 0), node_of(&r, 1)),
        (Some(1), Some(2)),
        "{r:?}"
    );
    assert!(open.is_empty(), "{open:?}");
}

#[tokio::test]
async fn an_ambiguous_mention_is_not_pulled_into_a_node_through_another_mention() {
    // Mention 0: e-mail says node 1, name says node 2, so it waits for
    // adjudication; mention 1 has the same name and goes to node 2.
    let committed = [
        key("Dana Whitcombe", &["Person"], r#"{"email": "dana@a.test"}"#),
        key("D. Whitcombe", &["Person"], "{}"),
    ];
    let mentions = [
        key("D. Whitcombe", &["Person"], r#"{"email": "dana@a.test"}"#),
        key("D Whitcombe", &["Person"], "{}"),
    ];
    let (r, open) = resolve(&committed, &mentions, &ResolveSpec::default()).await;
    assert_eq!((node_of(&r, 0), node_of(&r, 1)), (None, Some(2)), "{r:?}");
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].reason, "identity and name disagree");
}

#[tokio::test]
async fn the_resolve_bench_reports_precise_merges_on_synthetic_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let report = graphloom::bench::resolution::run_resolve_bench(
        graphloom::bench::resolution::ResolveBench {
            mentions: 2_000,
            nodes: 5_000,
            seed: 11,
            dir: dir.path().join("nodes"),
            existing_share: 0.5,
            repeat_share: 0.2,
            spec: ResolveSpec::default(),
            cluster: None,
            computed_keys: false,
        },
    )
    .await
    .expect("bench runs");
    // Floors, not figures: a wrong rule (say, fuzzy merges of codes) drops
    // precision far below these.
    assert!(report.precision() >= 0.98, "{report}");
    assert!(report.recall() >= 0.7, "{report}");
    assert!(
        report.pairs.get("name").copied().unwrap_or(0) > 0,
        "{report}"
    );
    assert!(
        report.pairs.get("identity").copied().unwrap_or(0) > 0,
        "{report}"
    );
    assert!(
        report.pairs.get("fuzzy").copied().unwrap_or(0) > 0,
        "{report}"
    );
}

#[tokio::test]
async fn an_entity_written_the_same_way_in_thousands_of_episodes_costs_no_pairs() {
    // 5,000 identical mentions of one company, 5,000 of one person (with
    // the same e-mail each time) and the variants the rules must still
    // join: without grouping identical mentions these were 12.5 million
    // name pairs and as many identity pairs.
    let mut mentions = Vec::new();
    for _ in 0..5_000 {
        mentions.push(key("Acme Corp", &["Company"], "{}"));
        mentions.push(key(
            "Priya Raman",
            &["Person"],
            r#"{"email": "priya@acme.test"}"#,
        ));
    }
    mentions.push(key("ACME corp.", &["Company"], "{}"));
    mentions.push(key(
        "P. Raman",
        &["Person"],
        r#"{"email": "Priya@acme.test"}"#,
    ));
    let (r, open) = resolve(&[], &mentions, &ResolveSpec::default()).await;
    let pairs: usize = r.stats.pairs.values().sum();
    assert!(pairs <= 4, "{:?}", r.stats);
    assert!(open.is_empty(), "{open:?}");
    let n = mentions.len();
    // Even positions are the company (ACME corp. last but one), odd ones
    // the person (P. Raman last).
    assert!((0..n).all(|i| together(&r, i, i % 2)), "{:?}", r.stats);
    assert!(!together(&r, 0, 1));
}

#[tokio::test]
async fn identical_ambiguous_mentions_are_one_question_about_the_first() {
    let spec = ResolveSpec::default();
    let committed = [
        key("Sarah Brown", &["Person"], "{}"),
        key("Sarah Lee", &["Person"], "{}"),
    ];
    let mentions = [
        key("Dana Whitcombe", &["Person"], "{}"),
        key("Sarah", &["Person"], "{}"),
        key("Sarah", &["Person"], "{}"),
        key("Sarah", &["Person"], "{}"),
    ];
    let (r, open) = resolve(&committed, &mentions, &spec).await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].mention, 1);
    assert!(together(&r, 1, 2) && together(&r, 1, 3), "{r:?}");
    assert_eq!(node_of(&r, 1), None);
}

/// The contradiction candidates as first written (every new edge scanned
/// every peer of its source and family), kept to check the linear version
/// against.
fn candidates_by_scan(
    new_edges: &[EdgeRow],
    committed: &[EdgeRow],
    functional: &[String],
    family: &dyn Fn(&str) -> String,
    replaceable: &dyn Fn(&EdgeRow, &EdgeRow) -> bool,
    max: usize,
) -> Vec<(usize, Vec<EdgeRef>)> {
    use std::collections::HashMap;
    let live = |e: &EdgeRow| e.expired_at.is_none() && e.invalid_at.is_none();
    let mut by_source: HashMap<(&str, String), Vec<EdgeRef>> = HashMap::new();
    for (i, e) in committed.iter().enumerate().filter(|(_, e)| live(e)) {
        by_source
            .entry((e.source_node_id.as_str(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::Committed(i));
    }
    for (i, e) in new_edges.iter().enumerate().filter(|(_, e)| live(e)) {
        by_source
            .entry((e.source_node_id.as_str(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::New(i));
    }
    let get = |r: EdgeRef| match r {
        EdgeRef::Committed(i) => &committed[i],
        EdgeRef::New(i) => &new_edges[i],
    };
    let mut out = Vec::new();
    for (i, e) in new_edges.iter().enumerate().filter(|(_, e)| live(e)) {
        let f = family(&e.relation_type);
        if functional.contains(&f) {
            continue;
        }
        let Some(peers) = by_source.get(&(e.source_node_id.as_str(), f)) else {
            continue;
        };
        let mut others: Vec<EdgeRef> = peers
            .iter()
            .copied()
            .filter(|r| *r != EdgeRef::New(i))
            .filter(|r| !matches!(r, EdgeRef::New(j) if *j > i))
            .filter(|r| {
                let o = get(*r);
                o.target_node_id != e.target_node_id && replaceable(e, o)
            })
            .collect();
        if others.is_empty() {
            continue;
        }
        others.sort_by_key(|r| std::cmp::Reverse(get(*r).valid_at));
        others.truncate(max.max(1));
        out.push((i, others));
    }
    out
}

#[test]
fn contradiction_candidates_are_those_of_a_scan_over_every_peer() {
    use chrono::TimeZone;
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let family = |r: &str| -> String {
        if r.starts_with("EMPLOYED") || r == "WORKS_FULL_TIME_FOR" {
            "EMPLOYED_BY".into()
        } else {
            r.to_string()
        }
    };
    let functional = vec!["EMPLOYED_BY".to_string()];
    let edge = |rng: &mut rand::rngs::StdRng, k: usize| {
        let relation = [
            "PARTY_TO",
            "SIGNED",
            "EMPLOYED_BY",
            "WORKS_FULL_TIME_FOR",
            "ORDERS",
        ][rng.random_range(0..5)];
        let target = format!("t{}", rng.random_range(0..6));
        let valid_at = (rng.random_range(0..4) > 0).then(|| {
            chrono::Utc
                .with_ymd_and_hms(2024, 1, rng.random_range(1..6), 0, 0, 0)
                .unwrap()
        });
        EdgeRow {
            edge_id: format!("e{k}"),
            group_id: "g".into(),
            source_node_id: format!("s{}", rng.random_range(0..3)),
            target_node_id: target.clone(),
            relation_type: relation.into(),
            fact: format!("fact {} about {target}", rng.random_range(0..3)),
            attributes: "{}".into(),
            episode_ids: vec![format!("ep{}", rng.random_range(0..4))],
            valid_at,
            invalid_at: None,
            created_at: chrono::Utc::now(),
            expired_at: (rng.random_range(0..10) == 0).then(chrono::Utc::now),
            fact_embedding: None,
            origin: "extract".into(),
            run_id: "r".into(),
        }
    };
    for round in 0..200 {
        // Which episode names which target node, at random.
        let names: std::collections::HashSet<(String, String)> = (0..4)
            .flat_map(|ep| (0..6).map(move |t| (format!("ep{ep}"), format!("t{t}"))))
            .filter(|_| rng.random_range(0..3) > 0)
            .collect();
        let named = |e: &EdgeRow, older: &EdgeRow| {
            e.episode_ids
                .iter()
                .any(|ep| names.contains(&(ep.clone(), older.target_node_id.clone())))
        };
        let committed: Vec<EdgeRow> = (0..rng.random_range(0..30))
            .map(|k| edge(&mut rng, k))
            .collect();
        let new: Vec<EdgeRow> = (0..rng.random_range(0..60))
            .map(|k| edge(&mut rng, 100 + k))
            .collect();
        let max = rng.random_range(0..6);
        assert_eq!(
            contradiction_candidates(&new, &committed, &functional, &family, &named, max),
            candidates_by_scan(&new, &committed, &functional, &family, &named, max),
            "round {round}"
        );
    }
}

/// The entities a summary batch asks about, in their order in the prompt.
fn summary_batch(user: &str) -> Vec<String> {
    user.lines()
        .filter_map(|l| l.strip_prefix("Entity "))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_summary_batch_with_a_runaway_and_an_invalid_item_keeps_every_other_answer() {
    use graphloom::llm::test_server::{Behavior, ChatRequestView, Reply, TestServer};
    use graphloom::resolve::judge::{SummaryCase, summaries};
    // "Runaway"'s summary runs on until the reply is cut at max_tokens
    // (the items written before it are kept, those after it are asked
    // again); "Verbose" gets a 2,000-character summary, past the schema's
    // bound, which the client refuses even though the server ignored it.
    let server = TestServer::start(Behavior::with_responder(|req: &ChatRequestView| {
        let names = summary_batch(req.last("user").unwrap_or_default());
        let mut items: Vec<String> = Vec::new();
        for (k, name) in names.iter().enumerate() {
            if name == "Runaway" {
                let cut = format!(
                    r#"{{"items": [{}{}{{"id": {}, "summary": "Runaway runs on and on and on"#,
                    items.join(", "),
                    if items.is_empty() { "" } else { ", " },
                    k + 1
                );
                return Reply::Length(cut);
            }
            let text = if name == "Verbose" {
                "x".repeat(2000)
            } else {
                format!("{name} is a supplier.")
            };
            items.push(format!(r#"{{"id": {}, "summary": "{text}"}}"#, k + 1));
        }
        let body = format!(r#"{{"items": [{}]}}"#, items.join(", "));
        Reply::Content(body)
    }))
    .await
    .expect("start test server");
    let spec = graphloom::spec::LlmSpec {
        base_url: server.base_url(),
        backoff_initial_ms: 10,
        backoff_max_ms: 50,
        max_attempts: 2,
        timeout_secs: 5,
        ..graphloom::spec::LlmSpec::default()
    };
    let client = graphloom::llm::LlmClient::new(&spec, None, "run-1").expect("client");
    let names = ["Acme", "Runaway", "Beta", "Verbose", "Gamma"];
    let cases: Vec<SummaryCase> = names
        .iter()
        .map(|n| SummaryCase {
            name: n.to_string(),
            chain: vec!["Company".into()],
            summary: None,
            facts: vec![format!("{n} supplies laptops.")],
        })
        .collect();
    let (answers, failures) = summaries(&client, 8, 2, &cases).await;
    let mut answered: Vec<&str> = answers.keys().map(|&i| names[i]).collect();
    answered.sort_unstable();
    assert_eq!(answered, vec!["Acme", "Beta", "Gamma"], "{failures:?}");
    assert_eq!(answers[&0], "Acme is a supplier.");
    let mut failed: Vec<&str> = failures.iter().map(|f| f.item.as_str()).collect();
    failed.sort_unstable();
    assert_eq!(failed, vec!["Runaway", "Verbose"], "{failures:?}");
    assert!(
        failures.iter().all(|f| f.reason.contains("asked alone")),
        "{failures:?}"
    );
    let verbose = failures
        .iter()
        .find(|f| f.item == "Verbose")
        .expect("Verbose");
    assert!(
        verbose.reason.contains("more than 400 allowed"),
        "{verbose:?}"
    );
    // Batch sizes: 5 first, then smaller ones for what was left open,
    // down to singles; never more calls than halving needs.
    let mut sizes: Vec<usize> = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("chat/completions"))
        .map(|r| {
            let user = r.body["messages"][1]["content"]
                .as_str()
                .unwrap_or_default();
            summary_batch(user).len()
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    assert_eq!(sizes.first(), Some(&1), "batches asked: {sizes:?}");
    assert_eq!(sizes.last(), Some(&5), "batches asked: {sizes:?}");
    let singles = server
        .requests()
        .iter()
        .filter(|r| {
            let user = r.body["messages"][1]["content"]
                .as_str()
                .unwrap_or_default();
            summary_batch(user).len() == 1
        })
        .count();
    assert!(singles <= 2 * 4, "{singles} single-item calls");
}
