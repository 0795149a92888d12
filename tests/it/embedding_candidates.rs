//! Embedding candidates through the real DataFusion plans: nearest
//! neighbours by name vector become adjudication options, never links.
//! One test embeds with the real local embedding model
//! (nomic-embed-text-v1.5 on llama-server, started by `scripts/test.sh`);
//! the others use vectors written by hand, so their geometry is known.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Builder, ListBuilder, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::SessionContext;
use graphloom::resolve::ResolveSpec;
use graphloom::resolve::entities::{
    Ambiguity, Kind, MentionKey, Resolved, Target, mentions_batches, mentions_schema,
    resolve_entities,
};

fn key(name: &str, chain: &[&str]) -> MentionKey {
    MentionKey {
        group_id: "g".into(),
        name: name.into(),
        chain: chain.iter().map(|s| s.to_string()).collect(),
        attributes: "{}".into(),
    }
}

fn spec() -> ResolveSpec {
    ResolveSpec {
        embedding_candidates: true,
        ..ResolveSpec::default()
    }
}

/// Resolves `mentions` (with `vectors`) against `committed` nodes (short
/// ids 1, 2, … in order) whose `name_embedding` is `node_vectors`.
async fn resolve(
    committed: &[MentionKey],
    node_vectors: &[Vec<f32>],
    mentions: &[MentionKey],
    vectors: &[Vec<f32>],
    spec: &ResolveSpec,
) -> (Resolved, Vec<Ambiguity>) {
    let ctx = SessionContext::new();
    let base = mentions_batches(committed, 1).expect("batches")[0][0].clone();
    let mut list = ListBuilder::new(Float32Builder::new());
    for v in node_vectors {
        list.values().append_slice(v);
        list.append(true);
    }
    let mut fields: Vec<Field> = mentions_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(
        "name_embedding",
        DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
        true,
    ));
    let mut columns: Vec<ArrayRef> = base.columns().to_vec();
    columns.push(Arc::new(list.finish()));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch");
    let table = datafusion::datasource::MemTable::try_new(batch.schema(), vec![vec![batch]])
        .expect("table");
    ctx.register_table("committed_src", Arc::new(table))
        .expect("register");
    ctx.sql(
        "CREATE VIEW nodes AS SELECT mention_id + 1 AS short_id, group_id, name, name_normalized, \
         type, labels, attributes, name_embedding FROM committed_src",
    )
    .await
    .expect("view");
    let vectors: Vec<Option<Arc<[f32]>>> = vectors
        .iter()
        .map(|v| Some(Arc::from(v.as_slice())))
        .collect();
    let (clusters, open) =
        resolve_entities(&ctx, "nodes", mentions, &vectors, spec, &BTreeMap::new())
            .await
            .expect("resolution runs");
    (clusters.finish(), open)
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

/// A unit vector at cosine `c` from the unit vector `a`, turned towards
/// axis `axis` (which must be orthogonal to `a`).
fn at_cosine(a: &[f32], axis: usize, c: f32) -> Vec<f32> {
    let s = (1.0 - c * c).sqrt();
    let mut v: Vec<f32> = a.iter().map(|x| x * c).collect();
    v[axis] += s;
    unit(&v)
}

fn basis(dims: usize, i: usize) -> Vec<f32> {
    let mut v = vec![0.0; dims];
    v[i] = 1.0;
    v
}

fn options_of(open: &[Ambiguity], mention: usize) -> Vec<(Target, Kind)> {
    open.iter()
        .find(|a| a.mention == mention)
        .map(|a| a.options.iter().map(|p| (p.target, p.kind)).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_near_neighbour_is_an_option_for_adjudication_and_never_merges_alone() {
    let dims = 64;
    let msa = basis(dims, 0);
    let committed = [
        key(
            "Master Services Agreement",
            &["Contract", "MasterAgreement"],
        ),
        key("Acme Corporation", &["Company"]),
    ];
    let node_vectors = [msa.clone(), basis(dims, 1)];
    let mentions = [
        // Close to the agreement, and of its type.
        key("our MSA", &["Contract", "MasterAgreement"]),
        // Just as close, but a Company: types keep it away.
        key("MSA Holdings", &["Company"]),
        // Far from everything.
        key("the docks", &["Contract"]),
        // Found by name: embeddings are not asked about it.
        key("Acme Corporation", &["Company"]),
    ];
    let vectors = [
        at_cosine(&msa, 5, 0.9),
        at_cosine(&msa, 6, 0.9),
        basis(dims, 7),
        basis(dims, 1),
    ];
    let (r, open) = resolve(&committed, &node_vectors, &mentions, &vectors, &spec()).await;
    assert_eq!(
        options_of(&open, 0),
        [(Target::Node(1), Kind::Embedding)],
        "{open:?}"
    );
    assert_eq!(open[0].reason, "only embedding neighbours");
    assert!(
        open[0].options[0].score > 0.7,
        "similarity estimated from signatures: {}",
        open[0].options[0].score
    );
    assert!(
        options_of(&open, 1).is_empty(),
        "another root type: {open:?}"
    );
    assert!(options_of(&open, 2).is_empty(), "nothing near: {open:?}");
    assert_eq!(r.committed[r.cluster_of[0]], None, "never merged alone");
    assert_eq!(
        r.committed[r.cluster_of[3]],
        Some(2),
        "the name rule decides"
    );
    assert_eq!(open.len(), 1);

    // Off: the same run has no embedding options.
    let (_, open) = resolve(
        &committed,
        &node_vectors,
        &mentions,
        &vectors,
        &ResolveSpec::default(),
    )
    .await;
    assert!(open.is_empty(), "{open:?}");
}

#[tokio::test]
async fn two_new_mentions_near_each_other_are_asked_about_once_and_the_threshold_holds() {
    let dims = 32;
    let a = basis(dims, 0);
    let mentions = [
        key("the master agreement", &["Contract"]),
        key("our MSA", &["Contract"]),
        key("the framework deal", &["Contract"]),
    ];
    // 0 and 1 at cosine 0.95; 2 at cosine 0.3 from 0.
    let vectors = [a.clone(), at_cosine(&a, 3, 0.95), at_cosine(&a, 4, 0.3)];
    let (_, open) = resolve(&[], &[], &mentions, &vectors, &spec()).await;
    let asked: Vec<(usize, Vec<(Target, Kind)>)> = open
        .iter()
        .map(|o| (o.mention, options_of(&open, o.mention)))
        .collect();
    assert_eq!(
        asked,
        [(0, vec![(Target::Mention(1), Kind::Embedding)])],
        "one question for the pair; 0.3 is under the 0.5 default"
    );
    let strict = ResolveSpec {
        embedding_min_similarity: 0.99,
        ..spec()
    };
    let (_, open) = resolve(&[], &[], &mentions, &vectors, &strict).await;
    assert!(open.is_empty(), "{open:?}");
}

#[tokio::test]
async fn a_crowded_bucket_is_skipped_and_top_k_bounds_the_options() {
    let dims = 48;
    let target = basis(dims, 0);
    // Twelve committed contracts near the mention (cosine 0.99 to 0.66).
    let committed: Vec<MentionKey> = (0..12)
        .map(|i| key(&format!("Agreement {i}"), &["Contract"]))
        .collect();
    let node_vectors: Vec<Vec<f32>> = (0..12)
        .map(|i| at_cosine(&target, 1 + i, 0.99 - i as f32 * 0.03))
        .collect();
    let mentions = [key("the agreement", &["Contract"])];
    let vectors = [target.clone()];
    let (_, open) = resolve(&committed, &node_vectors, &mentions, &vectors, &spec()).await;
    let got = options_of(&open, 0);
    assert_eq!(got.len(), 3, "top_k = 3: {got:?}");
    assert_eq!(got[0].0, Target::Node(1), "the closest first: {got:?}");
    // Twelve nodes in the mention's very direction share every bucket
    // with it: with buckets capped at 4, all are skipped.
    let same: Vec<Vec<f32>> = vec![target.clone(); 12];
    let capped = ResolveSpec {
        embedding_max_bucket: 4,
        ..spec()
    };
    let (_, open) = resolve(&committed, &same, &mentions, &vectors, &capped).await;
    assert!(open.is_empty(), "{open:?}");
    let roomy = ResolveSpec {
        embedding_max_bucket: 12,
        ..spec()
    };
    let (_, open) = resolve(&committed, &same, &mentions, &vectors, &roomy).await;
    assert_eq!(options_of(&open, 0).len(), 3, "{open:?}");
}

/// Embeds `texts` with the local embedding server, or `None` when local
/// model tests are skipped on purpose.
async fn local_embeddings(texts: &[&str]) -> Option<Vec<Vec<f32>>> {
    let base_url = match std::env::var("GRAPHLOOM_EMBED_BASE_URL") {
        Ok(url) => url,
        Err(_) if std::env::var("GRAPHLOOM_SKIP_LOCAL_LLM").is_ok_and(|v| v == "1") => {
            eprintln!("note: local embedding model test skipped (GRAPHLOOM_SKIP_LOCAL_LLM=1)");
            return None;
        }
        Err(_) => panic!(
            "GRAPHLOOM_EMBED_BASE_URL is not set: run `scripts/local-llm.sh setup --model nomic-embed && \
             scripts/local-llm.sh start --model nomic-embed` and `eval \"$(scripts/local-llm.sh env)\"` \
             (scripts/test.sh does all three), or set GRAPHLOOM_SKIP_LOCAL_LLM=1"
        ),
    };
    let spec = graphloom::spec::LlmSpec {
        base_url,
        embedding_model: Some("nomic-embed".into()),
        ..graphloom::spec::LlmSpec::default()
    };
    let client =
        graphloom::llm::LlmClient::with_key(&spec, None, None, "embed-test").expect("client");
    let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
    let vectors = client
        .embed(graphloom::stage::Stage::EmbedNames, &texts)
        .await
        .expect("the local embedding server answers");
    assert!(
        vectors.iter().all(|v| v.len() == 768),
        "nomic-embed-text-v1.5 has 768 dimensions"
    );
    Some(vectors)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_local_embedding_model_proposes_the_agreement_and_the_dock_no_name_rule_finds() {
    let committed = [
        key(
            "Master Services Agreement",
            &["Contract", "MasterAgreement"],
        ),
        key("PO-4417", &["Contract", "PurchaseOrder"]),
        key("Loading Dock B", &["Facility"]),
        key("Northwind Supply", &["Company"]),
        key("Acme Corporation", &["Company"]),
    ];
    let mentions = [
        key("the master agreement", &["Contract", "MasterAgreement"]),
        key("docks", &["Facility"]),
        key("Globex", &["Company"]),
    ];
    let names: Vec<&str> = committed
        .iter()
        .chain(&mentions)
        .map(|k| k.name.as_str())
        .collect();
    let Some(vectors) = local_embeddings(&names).await else {
        return;
    };
    let (node_vectors, mention_vectors) = vectors.split_at(committed.len());
    let (r, open) = resolve(
        &committed,
        node_vectors,
        &mentions,
        mention_vectors,
        &spec(),
    )
    .await;
    let first = |m: usize| options_of(&open, m).first().map(|o| o.0);
    assert_eq!(first(0), Some(Target::Node(1)), "{open:?}");
    assert_eq!(first(1), Some(Target::Node(3)), "{open:?}");
    for (m, mention) in mentions.iter().enumerate() {
        assert_eq!(r.committed[r.cluster_of[m]], None, "proposals only");
        for (target, kind) in options_of(&open, m) {
            assert_eq!(kind, Kind::Embedding);
            // Never across root types: a Company is no Contract's option.
            if let Target::Node(n) = target {
                assert_eq!(
                    committed[n as usize - 1].chain[0],
                    mention.chain[0],
                    "{open:?}"
                );
            }
        }
    }
}
