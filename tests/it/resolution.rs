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
    let (clusters, open) = resolve_entities(&ctx, "nodes", mentions, spec, &identity)
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
