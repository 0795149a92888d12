//! Record linkage (`[[resolve.linkage]]`): mapped person records are
//! matched by blocking keys and weighted field comparisons, not by name:
//! typos and swapped names merge, two people sharing a name stay apart, a
//! later run's records link to the right committed node, and a type
//! without a linkage still resolves by name in the same run.

use std::path::Path;

use graphloom::llm::test_server::{Behavior, TestServer};
use graphloom::run::{RunOptions, RunReport};
use graphloom::spec::PipelineSpec;
use graphloom::store::GraphStore;
use serde_json::json;

use crate::run_pipeline::query;

pub(crate) const SPEC: &str = r#"
[source]
url = "SOURCE"
format = "jsonl"

[output]
graph = "GRAPH"
group_id = "people"

[llm]
base_url = "BASE_URL"
model = "none"
max_attempts = 1

[ontology]
strict = true

[[ontology.entity_types]]
name = "Person"
description = "A person."
properties = [
  { name = "given", type = "text" },
  { name = "surname", type = "text" },
  { name = "dob", type = "text" },
  { name = "ssn", type = "text" },
  { name = "postcode", type = "text" },
  { name = "street", type = "text" },
]

[[ontology.entity_types]]
name = "Company"
description = "An employer."

[[ontology.edge_types]]
name = "WORKS_FOR"
description = "A person works for a company."
source_targets = [["Person", "Company"]]

[resolve]
adjudicate = false
judge_contradictions = false

[[resolve.linkage]]
type = "Person"
blocking = ["ssn", "dob", "name"]
compare = [
  { field = "name", method = "name", weight = 2 },
  { field = "dob", method = "date", weight = 1.5 },
  { field = "ssn", method = "code", weight = 1.5 },
  { field = "postcode", method = "code", weight = 0.5 },
  { field = "street", method = "text" },
]
threshold = 0.85
grey_band_min = 0.5
min_fields = 3

[[mapping]]

[[mapping.entities]]
id = "person"
type = "Person"
name = "{given?} {surname?}"
properties = { given = "given", surname = "surname", dob = "dob", ssn = "ssn", postcode = "postcode", street = "street" }

[[mapping.entities]]
id = "employer"
type = "Company"
name = "{employer}"
optional = true

[[mapping.facts]]
relation = "WORKS_FOR"
source = "person"
target = "employer"
"#;

fn record(id: &str, fields: serde_json::Value) -> String {
    json!({"id": id, "kind": "json", "reference_time": "2025-01-01T00:00:00Z", "content": fields})
        .to_string()
}

/// p1–p3 are one person (a typo, swapped names, a transposed ssn); p4
/// shares p1's name and nothing else; p5 is someone else.
fn first_batch() -> String {
    [
        record(
            "p1",
            json!({"given": "john", "surname": "smith", "dob": "19800101", "ssn": "1234567", "postcode": "2600", "street": "high street", "employer": "Acme Corp"}),
        ),
        record(
            "p2",
            json!({"given": "jon", "surname": "smith", "dob": "19800101", "ssn": "1234567", "postcode": "2600", "street": "high street"}),
        ),
        record(
            "p3",
            json!({"given": "smith", "surname": "john", "dob": "19800101", "ssn": "1234576", "postcode": "2600", "street": "high street"}),
        ),
        record(
            "p4",
            json!({"given": "john", "surname": "smith", "dob": "19751212", "ssn": "7654321", "postcode": "3000", "street": "low road", "employer": "ACME corp."}),
        ),
        record(
            "p5",
            json!({"given": "mary", "surname": "jones", "dob": "19900505", "ssn": "5555555", "postcode": "2600", "street": "park lane"}),
        ),
    ]
    .join("\n")
}

/// p6 is p4 again, p7 is p5 with a postcode typo, p8 shares p5's name and
/// birth date but nothing else (a grey-band score: kept apart without
/// adjudication).
fn second_batch() -> String {
    [
        record(
            "p6",
            json!({"given": "john", "surname": "smith", "dob": "19751212", "ssn": "7654321", "postcode": "3000", "street": "low road"}),
        ),
        record(
            "p7",
            json!({"given": "mary", "surname": "jones", "dob": "19900505", "ssn": "5555555", "postcode": "2601", "street": "park lane"}),
        ),
        record(
            "p8",
            json!({"given": "mary", "surname": "jones", "dob": "19900505", "ssn": "9999999", "postcode": "4000", "street": "bay road"}),
        ),
    ]
    .join("\n")
}

async fn run(spec: &PipelineSpec, store: &GraphStore, source: &Path) -> RunReport {
    run_with(spec, store, source, &RunOptions::default()).await
}

/// [`run`] with other options.
pub(crate) async fn run_with(
    spec: &PipelineSpec,
    store: &GraphStore,
    source: &Path,
    options: &RunOptions,
) -> RunReport {
    let ontology = graphloom::ontology::Ontology::try_from(&spec.ontology).expect("ontology");
    // What `graphloom run --source DIR` does.
    let mut spec = spec.clone();
    spec.source.as_mut().expect("a source").url = source.to_str().expect("utf-8").to_string();
    graphloom::run::run(&spec, &ontology, store, options)
        .await
        .expect("run completes")
}

/// A graph, the test server and the spec over it, with the first and
/// second batch of records in folders of their own; `resolve` is added to
/// the spec's `[resolve]` table.
pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    server: TestServer,
    pub(crate) spec: PipelineSpec,
    pub(crate) store: GraphStore,
    pub(crate) batches: [std::path::PathBuf; 2],
}

async fn fixture(resolve: &str) -> Fixture {
    fixture_with(
        &SPEC.replace(
            "judge_contradictions = false",
            &format!("judge_contradictions = false\n{resolve}"),
        ),
        [first_batch(), second_batch()],
    )
    .await
}

/// [`fixture`] over another spec text and other record batches.
pub(crate) async fn fixture_with(spec_text: &str, records: [String; 2]) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let batches = [dir.path().join("one"), dir.path().join("two")];
    for (d, text) in batches.iter().zip(records) {
        std::fs::create_dir_all(d).expect("mkdir");
        std::fs::write(d.join("people.jsonl"), text).expect("write records");
    }
    let server = TestServer::start(Behavior::default())
        .await
        .expect("server");
    let graph = dir.path().join("graph");
    let text = spec_text
        .replace("SOURCE", batches[0].to_str().expect("utf-8"))
        .replace("GRAPH", graph.to_str().expect("utf-8"))
        .replace("BASE_URL", &server.base_url());
    let spec = PipelineSpec::from_toml(&text, &dir.path().join("people.toml")).expect("spec");
    let store =
        GraphStore::open(graph.to_str().expect("utf-8"), &Default::default()).expect("open");
    Fixture {
        _dir: dir,
        server,
        spec,
        store,
        batches,
    }
}

/// Person nodes as sorted lists of their records' ids.
pub(crate) async fn people(store: &GraphStore) -> Vec<Vec<String>> {
    let rows = query(
        store,
        "SELECT n.node_id AS node, e.source_id AS rec \
         FROM (SELECT node_id, unnest(episode_ids) AS eid FROM nodes WHERE type = 'Person') n \
         JOIN episodes e ON e.episode_id = n.eid",
    )
    .await;
    let mut by_node: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for r in rows {
        by_node
            .entry(r["node"].as_str().expect("node").to_string())
            .or_default()
            .push(r["rec"].as_str().expect("rec").to_string());
    }
    let mut out: Vec<Vec<String>> = by_node
        .into_values()
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn person_records_merge_by_field_evidence_and_a_shared_name_alone_never_merges() {
    let f = fixture("").await;
    let (spec, store, server) = (&f.spec, &f.store, &f.server);
    let (one, two) = (&f.batches[0], &f.batches[1]);

    let first = run(spec, store, one).await;
    assert_eq!(first.episodes_mapped, 5);
    assert_eq!(first.episodes_added, 5);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        people(store).await,
        vec![s(&["p1", "p2", "p3"]), s(&["p4"]), s(&["p5"])],
        "typo and swapped names merge; the other John Smith stays apart"
    );
    // The type without a linkage resolves by name as always.
    let companies = query(store, "SELECT name FROM nodes WHERE type = 'Company'").await;
    assert_eq!(companies.len(), 1, "{companies:?}");

    // A later run links each record to the right committed node, though
    // two committed nodes share its name.
    let second = run(spec, store, two).await;
    assert_eq!(second.episodes_added, 3);
    assert_eq!(
        people(store).await,
        vec![
            s(&["p1", "p2", "p3"]),
            s(&["p4", "p6"]),
            s(&["p5", "p7"]),
            s(&["p8"]),
        ],
        "p8 shares only name and birth date with p5: a grey-band score, kept apart"
    );
    assert!(server.requests().is_empty(), "no LLM call");
}

/// `originals` people and, for the first `duplicates` of them, a copy
/// with one or two corruptions of the kinds registries see (a typo in
/// the name, swapped names, two ssn digits transposed, a birth-date digit
/// changed, the postcode dropped); `namesakes` more people share an
/// original's full name and nothing else. Ids: `o<i>`, `d<i>`, `n<i>`.
pub(crate) fn registry(originals: usize, duplicates: usize, namesakes: usize) -> [String; 2] {
    const GIVEN: [&str; 12] = [
        "olivia", "liam", "amelia", "noah", "isla", "jack", "mia", "oliver", "ava", "william",
        "grace", "thomas",
    ];
    const SURNAMES: [&str; 12] = [
        "smith", "jones", "williams", "brown", "wilson", "taylor", "nguyen", "johnson", "martin",
        "white", "anderson", "walker",
    ];
    let mut state: u64 = 0x5eed;
    let mut next = move |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let person = |next: &mut dyn FnMut(u64) -> u64| {
        json!({
            "given": GIVEN[next(12) as usize],
            "surname": SURNAMES[next(12) as usize],
            "dob": format!("19{:02}{:02}{:02}", 30 + next(70), 1 + next(12), 1 + next(28)),
            "ssn": format!("{}", 1_000_000 + next(9_000_000)),
            "postcode": format!("{}", 2000 + next(7000)),
            "street": format!("{} {} street", 1 + next(200), SURNAMES[next(12) as usize]),
        })
    };
    let people: Vec<serde_json::Value> = (0..originals).map(|_| person(&mut next)).collect();
    let mut first: Vec<String> = (0..originals)
        .map(|i| record(&format!("o{i}"), people[i].clone()))
        .collect();
    let mut second = Vec::new();
    for (i, p) in people.iter().take(duplicates).enumerate() {
        let mut d = p.as_object().expect("object").clone();
        // At most two, so one of ssn, dob and name still agrees: the
        // blocking keys find every copy.
        let kinds = 1 + next(2);
        for _ in 0..kinds {
            match next(5) {
                0 => {
                    let g = d["given"].as_str().expect("given");
                    d.insert(
                        "given".into(),
                        json!(format!("{}{}", &g[..g.len() - 1], "e")),
                    );
                }
                1 => {
                    let (g, s) = (d["given"].clone(), d["surname"].clone());
                    d.insert("given".into(), s);
                    d.insert("surname".into(), g);
                }
                2 => {
                    let mut ssn: Vec<char> = d["ssn"].as_str().expect("ssn").chars().collect();
                    ssn.swap(2, 3);
                    d.insert("ssn".into(), json!(ssn.into_iter().collect::<String>()));
                }
                3 => {
                    let mut dob: Vec<char> = d["dob"].as_str().expect("dob").chars().collect();
                    dob[7] = if dob[7] == '1' { '2' } else { '1' };
                    d.insert("dob".into(), json!(dob.into_iter().collect::<String>()));
                }
                _ => {
                    d.remove("postcode");
                }
            }
        }
        second.push(record(&format!("d{i}"), serde_json::Value::Object(d)));
    }
    for (i, namesake) in people.iter().take(namesakes).enumerate() {
        let mut other = person(&mut next);
        other["given"] = namesake["given"].clone();
        other["surname"] = namesake["surname"].clone();
        second.push(record(&format!("n{i}"), other));
    }
    first.sort();
    [first.join("\n"), second.join("\n")]
}

/// [`SPEC`] with a probabilistic linkage rule.
pub(crate) fn probabilistic_spec() -> String {
    let spec = SPEC
        .replace(
            "compare = [\n  { field = \"name\", method = \"name\", weight = 2 },",
            "model = \"probabilistic\"\ncompare = [\n  { field = \"name\", method = \"name\" },",
        )
        .replace("grey_band_min = 0.5\n", "");
    assert!(spec.contains("model = \"probabilistic\""), "{spec}");
    spec
}

#[tokio::test(flavor = "multi_thread")]
async fn the_probabilistic_model_learns_from_the_records_which_agreements_matter() {
    let spec = probabilistic_spec();
    let f = fixture_with(&spec, registry(400, 150, 30)).await;
    let (spec, store) = (&f.spec, &f.store);

    // No duplicates in the first load: EM finds no matches among the
    // candidates (people sharing a postcode or a name), nothing merges.
    run(spec, store, &f.batches[0]).await;
    let first = people(store).await;
    assert_eq!(first.len(), 400, "no two originals merge");

    run(spec, store, &f.batches[1]).await;
    let mut want: Vec<Vec<String>> = (0..400)
        .map(|i| {
            let mut v = vec![format!("o{i}")];
            if i < 150 {
                v.push(format!("d{i}"));
            }
            v
        })
        .chain((0..30).map(|i| vec![format!("n{i}")]))
        .collect();
    for v in &mut want {
        v.sort();
    }
    want.sort();
    let got = people(store).await;
    let wrong: Vec<&Vec<String>> = got.iter().filter(|c| !want.contains(c)).collect();
    assert!(
        wrong.is_empty(),
        "every copy joins its original, namesakes stay apart; wrong clusters: {wrong:?}"
    );
    assert_eq!(got.len(), want.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn mentions_of_a_linked_type_are_not_embedded_for_embedding_candidates() {
    let f = fixture("embedding_candidates = true").await;
    let (spec, store, server, one) = (&f.spec, &f.store, &f.server, &f.batches[0]);
    let report = run(spec, store, one).await;
    assert_eq!(report.episodes_added, 5);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        people(store).await,
        vec![s(&["p1", "p2", "p3"]), s(&["p4"]), s(&["p5"])],
        "linkage decides as without embeddings"
    );
    let embedded: Vec<Vec<String>> = server
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .map(|r| {
            r.body["input"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .collect();
    // Before resolution: the companies' names only (the people are matched
    // by their linkage rule); after it, every new node keeps a vector.
    assert_eq!(
        embedded.first(),
        Some(&s(&["ACME corp.", "Acme Corp"])),
        "{embedded:?}"
    );
    assert!(
        embedded.iter().flatten().any(|n| n.contains("smith")),
        "node names are embedded after resolution: {embedded:?}"
    );
}

#[test]
fn a_linkage_rule_naming_a_field_the_type_lacks_is_refused() {
    let text = SPEC
        .replace("SOURCE", "file:///tmp/none/")
        .replace("GRAPH", "file:///tmp/none-graph/")
        .replace("BASE_URL", "http://127.0.0.1:9/v1")
        .replace(
            r#"{ field = "street", method = "text" },"#,
            r#"{ field = "phone", method = "code" },"#,
        );
    let err = PipelineSpec::from_toml(&text, Path::new("people.toml"))
        .expect_err("phone is not a property of Person")
        .to_string();
    assert!(
        err.contains("resolve.linkage[0]")
            && err.contains("`phone` is neither `name` nor a property of `Person`"),
        "{err}"
    );
    let bad_key = SPEC
        .replace("SOURCE", "file:///tmp/none/")
        .replace("GRAPH", "file:///tmp/none-graph/")
        .replace("BASE_URL", "http://127.0.0.1:9/v1")
        .replace(
            r#"blocking = ["ssn", "dob", "name"]"#,
            r#"blocking = ["ssn:0"]"#,
        );
    let err = PipelineSpec::from_toml(&bad_key, Path::new("people.toml"))
        .expect_err("a zero prefix")
        .to_string();
    assert!(err.contains("resolve.linkage[0].blocking[0]"), "{err}");
}
