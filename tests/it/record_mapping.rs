//! Record mapping (`[[mapping]]`): structured records become entities and
//! facts without an LLM call and resolve together with extracted mentions;
//! a record the mapping cannot apply is a `failures` row naming the file,
//! line and field, and bad mapping rules are refused before anything runs.

use std::process::Command;

use graphloom::llm::test_server::{Behavior, ChatRequestView, Reply, TestServer};
use graphloom::mapping::Mappings;
use graphloom::run::{RunOptions, RunReport};
use graphloom::spec::PipelineSpec;
use graphloom::store::GraphStore;
use serde_json::{Value, json};

use crate::common;
use crate::run_pipeline::query;

/// ERP records: two revisions of PO-1 (the second cancels it; the first
/// lists two order lines), PO-2 with
/// an amount that is not a number, a purchase order without its number,
/// and a record kind no mapping covers.
const ERP: &str = r#"{"id": "r1", "kind": "json", "reference_time": "2025-03-01T09:00:00Z", "content": {"record_type": "purchase_order", "po_number": "PO-1", "vendor": "Acme Corp", "buyer": "Northwind", "amount": 1200.5, "status": "open", "issued_on": "2025-03-01", "approved_by": "Dana Whitcombe", "lines": [{"description": "Ridgeback 14 laptop", "qty": 3}, {"description": "USB-C dock", "qty": 3}]}}
{"id": "r2", "kind": "json", "reference_time": "2025-03-05T09:00:00Z", "content": {"record_type": "purchase_order", "po_number": "PO-1", "vendor": "Acme Corp", "buyer": "Northwind", "amount": 1200.5, "status": "cancelled", "issued_on": "2025-03-01", "approved_by": "Dana Whitcombe", "cancelled_on": "2025-03-05"}}
{"id": "r3", "kind": "json", "reference_time": "2025-03-06T09:00:00Z", "content": {"record_type": "purchase_order", "po_number": "PO-2", "vendor": "Acme Corp", "buyer": "Northwind", "amount": "lots", "status": "open", "issued_on": "2025-03-06"}}
{"id": "r4", "kind": "json", "reference_time": "2025-03-07T09:00:00Z", "content": {"record_type": "purchase_order", "vendor": "Acme Corp", "buyer": "Northwind", "status": "open", "issued_on": "2025-03-07"}}
{"id": "r5", "kind": "json", "reference_time": "2025-03-08T09:00:00Z", "content": {"record_type": "vendor_note", "vendor": "Acme Corp", "note": "Acme Corp moved its warehouse."}}
"#;

const CHAT: &str = r#"{"id": "c1", "kind": "message", "reference_time": "2025-03-02T10:00:00Z", "content": "Acme Corp confirmed PO-1 ships on Friday."}
"#;

/// The model's answers for the two episodes no mapping covers.
fn responder(req: &ChatRequestView) -> Reply {
    let user = req.last("user").unwrap_or_default();
    let system = req.last("system").unwrap_or_default();
    let current = user.split("<CURRENT EPISODE").nth(1).unwrap_or(user);
    if user.contains("TASK: list the named entities") {
        let list = if current.contains("ships on Friday") {
            json!([{"name": "Acme Corp", "type": "Company", "attributes": []},
                   {"name": "PO-1", "type": "Contract", "attributes": []}])
        } else {
            json!([{"name": "Acme Corp", "type": "Company", "attributes": []}])
        };
        Reply::json(&json!({ "entities": list }))
    } else if user.contains("TASK: state every fact") {
        let list = if current.contains("ships on Friday") {
            json!([{"source": "Acme Corp", "target": "PO-1", "relation_type": "PARTY_TO", "fact": "Acme Corp ships PO-1.", "valid_at": null, "invalid_at": null}])
        } else {
            json!([])
        };
        Reply::json(&json!({ "facts": list }))
    } else if system.contains("already classified as") {
        let items: Vec<Value> = user
            .split("\n[")
            .filter_map(|b| b.trim_start_matches('[').split_once(']'))
            .map(|(id, text)| {
                let id: u64 = id.parse().unwrap_or(0);
                if text.contains("PO-1") {
                    json!({"id": id, "subtype": "PurchaseOrder", "attributes": []})
                } else {
                    json!({"id": id, "subtype": "none", "attributes": []})
                }
            })
            .collect();
        crate::common::walk_reply(items)
    } else {
        Reply::error(400, "unexpected prompt", "invalid_request_error", None)
    }
}

struct Fixture {
    /// The source directory (files may be added between runs).
    source: std::path::PathBuf,
    _dir: tempfile::TempDir,
    server: TestServer,
    spec: PipelineSpec,
    store: GraphStore,
}

async fn fixture() -> Fixture {
    fixture_with(&[("erp.jsonl", ERP), ("chat.jsonl", CHAT)], responder).await
}

/// The example pipeline over `files` (name, content) in a fresh source
/// directory, its model answered by `answer`.
async fn fixture_with(files: &[(&str, &str)], answer: fn(&ChatRequestView) -> Reply) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("episodes");
    std::fs::create_dir_all(&source).expect("mkdir");
    for (name, content) in files {
        std::fs::write(source.join(name), content).expect("write source file");
    }
    let server = TestServer::start(Behavior::with_responder(answer))
        .await
        .expect("server");
    // The example pipeline's own mappings: this protects what ships.
    let (mut spec, _) = common::procurement();
    assert!(!spec.mapping.is_empty(), "the example maps its ERP records");
    let store = common::against_test_server(&mut spec, &source, server.base_url(), dir.path());
    Fixture {
        source,
        _dir: dir,
        server,
        spec,
        store,
    }
}

async fn run(f: &Fixture) -> RunReport {
    let ontology = graphloom::ontology::Ontology::try_from(&f.spec.ontology).expect("ontology");
    graphloom::run::run(&f.spec, &ontology, &f.store, &RunOptions::default())
        .await
        .expect("run completes")
}

fn entity_calls(server: &TestServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.body.to_string().contains("TASK: list the named entities"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn mapped_records_make_no_llm_call_and_resolve_with_extracted_mentions_into_one_graph() {
    let f = fixture().await;
    let report = run(&f).await;

    // Four records matched the purchase-order mapping; only the chat
    // message and the unmapped vendor note went to the model.
    assert_eq!(report.episodes_planned, 6);
    assert_eq!(report.episodes_mapped, 4);
    assert_eq!(entity_calls(&f.server), 2);
    for r in f.server.requests() {
        // Earlier records may be shown as context; none is asked about.
        let body = r.body.to_string();
        let current = body.split("<CURRENT EPISODE").nth(1).unwrap_or(&body);
        assert!(
            !current.contains("purchase_order"),
            "a mapped record was extracted by the model"
        );
    }
    // r4 failed; the other five are committed.
    assert_eq!(report.episodes_added, 5);

    // Acme Corp from three mapped records, the chat message and the
    // extracted vendor note is one node.
    let acme = query(
        &f.store,
        "SELECT name, cardinality(episode_ids) AS episodes FROM nodes WHERE name_normalized = 'acme corp'",
    )
    .await;
    assert_eq!(acme.len(), 1, "one Acme node: {acme:?}");
    assert_eq!(acme[0]["episodes"], json!(5));

    // PO-1: the mapped revisions and the extracted mention are one
    // purchase order, with the newer revision's status.
    let po = query(
        &f.store,
        "SELECT name, type, json_get_str(attributes, 'status') AS status, \
                json_get_str(attributes, 'amount') AS amount, cardinality(episode_ids) AS episodes \
         FROM nodes WHERE has_label(labels, 'Contract') ORDER BY name",
    )
    .await;
    assert_eq!(po.len(), 2, "PO-1 and PO-2: {po:?}");
    assert_eq!(po[0]["name"], "PO-1");
    assert_eq!(po[0]["type"], "PurchaseOrder");
    assert_eq!(po[0]["status"], "cancelled");
    assert_eq!(po[0]["episodes"], json!(3));
    // PO-2's amount was not a number: left out, the rest of it loaded.
    assert_eq!(po[1]["name"], "PO-2");
    assert_eq!(po[1]["amount"], Value::Null);

    // The cancelled revision restates the seller's mapped PARTY_TO fact
    // with an end: that edge, and the chat's other wording of the same
    // relationship ("ships PO-1"), end on the cancellation date.
    let ended = query(
        &f.store,
        "SELECT e.fact, e.invalid_at, cardinality(e.episode_ids) AS episodes FROM edges e \
         JOIN nodes s ON s.node_id = e.source_node_id \
         JOIN nodes t ON t.node_id = e.target_node_id \
         WHERE s.name_normalized = 'acme corp' AND t.name = 'PO-1' AND e.relation_type = 'PARTY_TO' \
         ORDER BY e.fact",
    )
    .await;
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert!(
        ended.iter().all(|e| e["invalid_at"]
            .as_str()
            .is_some_and(|t| t.starts_with("2025-03-05"))),
        "every Acme → PO-1 edge ended at the cancellation: {ended:?}"
    );
    assert_eq!(
        ended[0]["fact"], "Acme Corp is the seller on purchase order PO-1",
        "{ended:?}"
    );
    assert_eq!(ended[0]["episodes"], json!(2), "both revisions in one edge");
    // One product per order line (`each = "lines"`), ordered by PO-1.
    let lines = query(
        &f.store,
        "SELECT t.name FROM edges e JOIN nodes s ON s.node_id = e.source_node_id \
         JOIN nodes t ON t.node_id = e.target_node_id \
         WHERE e.relation_type = 'ORDERS' AND s.name = 'PO-1' AND t.type = 'Product' ORDER BY t.name",
    )
    .await;
    assert_eq!(
        lines,
        vec![
            json!({"name": "Ridgeback 14 laptop"}),
            json!({"name": "USB-C dock"})
        ]
    );
    // The approver's SIGNED fact came from the mapping alone.
    let signed = query(
        &f.store,
        "SELECT s.name FROM edges e JOIN nodes s ON s.node_id = e.source_node_id \
         WHERE e.relation_type = 'SIGNED'",
    )
    .await;
    assert_eq!(signed, vec![json!({"name": "Dana Whitcombe"})]);

    // The seed question: open purchase orders with Acme.
    let sql =
        std::fs::read_to_string(common::repo().join("sql/open_purchase_orders_with_acme.sql"))
            .expect("read sql");
    let open = query(&f.store, &sql).await;
    let names: Vec<&str> = open
        .iter()
        .filter_map(|r| r["purchase_order"].as_str())
        .collect();
    assert_eq!(names, vec!["PO-2"]);

    // Failures: the record without its number (file, line, field) and the
    // amount that is not a number.
    let failures = query(
        &f.store,
        "SELECT item, reason FROM failures WHERE stage = 'map_records' ORDER BY reason",
    )
    .await;
    assert_eq!(failures.len(), 2, "{failures:?}");
    let whole = failures
        .iter()
        .find(|r| {
            r["reason"]
                .as_str()
                .is_some_and(|t| t.contains("`po_number`"))
        })
        .expect("a row for the record without po_number");
    assert!(
        whole["item"]
            .as_str()
            .is_some_and(|t| t.ends_with("erp.jsonl#L4"))
    );
    assert!(
        failures
            .iter()
            .any(|r| r["reason"].as_str().is_some_and(|t| t.contains("`amount`")))
    );

    // A re-run makes no call; the failed record is tried again and fails
    // again (the data has to be fixed), nothing else changes.
    let calls = f.server.requests().len();
    let again = run(&f).await;
    assert_eq!(f.server.requests().len(), calls);
    assert_eq!(again.episodes_planned, 1);
    assert_eq!(again.episodes_added, 0);
    assert_eq!(again.failures_by_stage.get("map_records"), Some(&1));
}

#[test]
fn mapping_rules_the_ontology_does_not_allow_are_all_listed_and_refused_with_exit_code_2() {
    let example = std::fs::read_to_string(common::repo().join("pipelines/procurement.toml"))
        .expect("read example");
    let bad = r#"
[[mapping]]
files = "crm.jsonl"

[[mapping.entities]]
id = "who"
type = "Persn"
name = "{full_name}"

[[mapping.entities]]
id = "org"
type = "Company"
name = "{company"
properties = { revenue = "revenue" }

[[mapping.entities]]
id = "deal"
type = "PurchaseOrder"
name = "{po}"

[[mapping.facts]]
relation = "PARTY_TO"
source = "deal"
target = "org"

[[mapping.facts]]
relation = "EMPLOYED_BY"
source = "who"
target = "nobody"
"#;
    let text = format!("{example}\n{bad}");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, &text).expect("write spec");
    let spec = PipelineSpec::from_toml(&text, &path).expect("the shape parses");
    let ontology = graphloom::ontology::Ontology::try_from(&spec.ontology).expect("ontology");
    let err = Mappings::compile(&spec.mapping, &ontology)
        .expect_err("the bad mapping is refused")
        .to_string();
    let n = spec.mapping.len() - 1;
    for expected in [
        format!("mapping[{n}].entities[0].type: unknown entity type `Persn`"),
        format!("mapping[{n}].entities[1].name: `{{company`: a `{{` is not closed"),
        format!(
            "mapping[{n}].entities[1].properties.revenue: `revenue` is not a property of `Company`"
        ),
        format!(
            "mapping[{n}].facts[0].relation: `PARTY_TO` does not allow PurchaseOrder → Company"
        ),
        format!("mapping[{n}].facts[1].target: `nobody` is not the id of an entity"),
    ] {
        assert!(err.contains(&expected), "missing `{expected}` in:\n{err}");
    }

    let out = Command::new(common::bin())
        .args(["ontology", "check"])
        .arg(&path)
        .output()
        .expect("run graphloom");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid record mapping"), "{stderr}");
    assert!(stderr.contains("unknown entity type `Persn`"), "{stderr}");
}

/// A run that updates thousands of committed nodes commits: their labels
/// are merged on (node_id, label), never deleted by an IN list of every
/// updated id (delta-rs nests such a list one expression per id, and 4,868
/// ids overflowed the stack).
#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_updates_thousands_of_committed_nodes_commits() {
    const N: usize = 5_000;
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, run: usize| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).expect("mkdir");
        let lines: Vec<String> = (0..N)
            .map(|i| {
                json!({"id": format!("r{run}-{i}"), "kind": "json", "reference_time": "2025-01-01T00:00:00Z",
                       "content": {"company": format!("Company {i}"), "run": run}})
                .to_string()
            })
            .collect();
        std::fs::write(d.join("crm.jsonl"), lines.join("\n")).expect("write");
        d
    };
    let (one, two) = (write("one", 1), write("two", 2));
    let text = format!(
        r#"
[source]
url = "{}"
[output]
graph = "{}"
[llm]
base_url = "http://127.0.0.1:9/v1"
model = "none"
[[ontology.entity_types]]
name = "Company"
description = "A business."
[[mapping]]
[[mapping.entities]]
id = "company"
type = "Company"
name = "{{company}}"
"#,
        one.display(),
        dir.path().join("graph").display()
    );
    let mut spec = PipelineSpec::from_toml(&text, &dir.path().join("crm.toml")).expect("spec");
    let store = GraphStore::open(
        dir.path().join("graph").to_str().expect("utf-8"),
        &Default::default(),
    )
    .expect("open");
    let ontology = graphloom::ontology::Ontology::try_from(&spec.ontology).expect("ontology");
    let first = graphloom::run::run(&spec, &ontology, &store, &RunOptions::default())
        .await
        .expect("first run");
    assert_eq!(first.episodes_added, N);
    spec.source.as_mut().expect("source").url = two.to_str().expect("utf-8").to_string();
    let second = graphloom::run::run(&spec, &ontology, &store, &RunOptions::default())
        .await
        .expect("second run updates every node");
    assert_eq!(second.episodes_added, N);
    let counts = query(
        &store,
        "SELECT (SELECT count(*) FROM nodes) AS nodes, \
                (SELECT count(*) FROM node_labels) AS labels, \
                (SELECT min(cardinality(episode_ids)) FROM nodes) AS min_episodes",
    )
    .await;
    assert_eq!(
        counts[0],
        json!({"nodes": N, "labels": 2 * N, "min_episodes": 2}),
        "one node per company, its two labels once, both runs' records"
    );
}

/// The model's answers where it types record entities otherwise: Acme
/// Corp (a mapped Company) as a Person that signed PO-1, and Northwind (a
/// mapped Company, committed by an earlier run) as a Person.
fn mistyping_responder(req: &ChatRequestView) -> Reply {
    let user = req.last("user").unwrap_or_default();
    let system = req.last("system").unwrap_or_default();
    let current = user.split("<CURRENT EPISODE").nth(1).unwrap_or(user);
    if user.contains("TASK: list the named entities") {
        let list = if current.contains("signed PO-1") {
            json!([{"name": "Acme Corp", "type": "Person", "attributes": []},
                   {"name": "PO-1", "type": "Contract", "attributes": []}])
        } else {
            json!([{"name": "Northwind", "type": "Person", "attributes": []}])
        };
        Reply::json(&json!({ "entities": list }))
    } else if user.contains("TASK: state every fact") {
        Reply::json(&json!({ "facts": [{"source": "Acme Corp", "target": "PO-1",
            "relation_type": "SIGNED", "fact": "Acme Corp signed PO-1.", "valid_at": null, "invalid_at": null}] }))
    } else if system.contains("already classified as") {
        no_subtype_for_any(user)
    } else {
        Reply::error(400, "unexpected prompt", "invalid_request_error", None)
    }
}

/// Runs the example pipeline over one ERP record and a chat message, then
/// over a second chat message; returns the nodes named Acme Corp and
/// Northwind (name, type, origin), the relation types of the edges from
/// Acme Corp to PO-1 (or, when there is none, the reason the fact was
/// dropped), and how the fact call listed Acme Corp.
async fn mistyped_names(records_win: bool) -> (Vec<Value>, Vec<Value>, Vec<String>) {
    let chat = r#"{"id": "c1", "kind": "message", "reference_time": "2025-03-02T10:00:00Z", "content": "Acme Corp signed PO-1 yesterday."}"#;
    let erp = ERP.lines().next().expect("r1");
    let mut f = fixture_with(
        &[("erp.jsonl", erp), ("chat.jsonl", chat)],
        mistyping_responder,
    )
    .await;
    f.spec.resolve.record_types_win = records_win;
    let report = run(&f).await;
    assert_eq!(report.episodes_added, 2);
    assert_eq!(report.retyped_mentions, usize::from(records_win));
    let listed: Vec<String> = f
        .server
        .requests()
        .iter()
        .filter_map(|r| r.body["messages"][1]["content"].as_str())
        .filter(|user| user.contains("TASK: state every fact"))
        .flat_map(|user| user.lines().filter(|l| l.starts_with("- Acme Corp (")))
        .map(str::to_string)
        .collect();
    // A later run: Northwind is now a committed node a record made.
    std::fs::write(
        f.source.join("chat2.jsonl"),
        r#"{"id": "c2", "kind": "message", "reference_time": "2025-03-03T10:00:00Z", "content": "Northwind approved the delivery date."}"#,
    )
    .expect("chat2");
    assert_eq!(run(&f).await.episodes_added, 1);
    let nodes = query(
        &f.store,
        "SELECT name, type, origin FROM nodes \
         WHERE name_normalized IN ('acme corp', 'northwind') ORDER BY name, type",
    )
    .await;
    let edges = query(
        &f.store,
        "SELECT e.relation_type FROM edges e JOIN nodes s ON s.node_id = e.source_node_id \
         JOIN nodes t ON t.node_id = e.target_node_id \
         WHERE s.name = 'Acme Corp' AND t.name = 'PO-1' AND e.origin = 'extract'",
    )
    .await;
    let edges = if edges.is_empty() {
        query(
            &f.store,
            "SELECT reason FROM failures WHERE stage = 'extract_facts'",
        )
        .await
    } else {
        edges
    };
    (nodes, edges, listed)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_text_mention_typed_otherwise_takes_its_records_type_before_the_fact_call_and_merges_with_it()
 {
    let (nodes, edges, listed) = mistyped_names(true).await;
    // The fact call already saw the record's type, so a schema-bound
    // model could only choose a relation type a Company can start.
    assert_eq!(listed, vec!["- Acme Corp (Company)".to_string()]);
    // Acme Corp (mapped in the same run) and Northwind (committed by the
    // first run) stay one Company node each, marked as made by a record.
    assert_eq!(
        nodes,
        vec![
            json!({"name": "Acme Corp", "type": "Company", "origin": "map"}),
            json!({"name": "Northwind", "type": "Company", "origin": "map"}),
        ]
    );
    // SIGNED needs a Person, and no parent type holds a Company → Contract
    // pair: extraction drops the fact as a misapplied type (a model bound
    // by the schema could not have written it; this test server ignores
    // the schema).
    assert_eq!(edges.len(), 1, "{edges:?}");
    let reason = edges[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("`SIGNED` (written `SIGNED`) does not allow Company → Contract"),
        "{reason}"
    );

    // Off, the model's Person stands beside the record's Company.
    let (nodes, edges, listed) = mistyped_names(false).await;
    assert_eq!(listed, vec!["- Acme Corp (Person)".to_string()]);
    let types: Vec<&str> = nodes.iter().filter_map(|n| n["type"].as_str()).collect();
    assert_eq!(
        types,
        vec!["Company", "Person", "Company", "Person"],
        "{nodes:?}"
    );
    assert_eq!(edges, vec![json!({"relation_type": "SIGNED"})]);
}

/// A walk's answer that refines none of the items it is asked about.
fn no_subtype_for_any(user: &str) -> Reply {
    let items: Vec<Value> = user
        .split("\n[")
        .filter_map(|b| b.trim_start_matches('[').split_once(']'))
        .map(|(id, _)| json!({"id": id.parse::<u64>().unwrap_or(0), "subtype": "none", "attributes": []}))
        .collect();
    crate::common::walk_reply(items)
}

/// The model's answers for the leaver test's chat lines: who is named,
/// and who works for whom.
fn employment_responder(req: &ChatRequestView) -> Reply {
    let user = req.last("user").unwrap_or_default();
    let system = req.last("system").unwrap_or_default();
    let current = user.split("<CURRENT EPISODE").nth(1).unwrap_or(user);
    let employs = |person: &str, company: &str| {
        json!({"source": person, "target": company, "relation_type": "EMPLOYED_BY",
               "fact": format!("{person} works for {company}."), "valid_at": null, "invalid_at": null})
    };
    if user.contains("TASK: list the named entities") {
        let list: Vec<Value> = [
            ("Dana Whitcombe", "Person"),
            ("Priya Raman", "Person"),
            ("Acme Corp", "Company"),
            ("Brightline Systems", "Company"),
            ("Northwind", "Company"),
        ]
        .into_iter()
        .filter(|(name, _)| current.contains(name))
        .map(|(name, t)| json!({"name": name, "type": t, "attributes": []}))
        .collect();
        Reply::json(&json!({ "entities": list }))
    } else if user.contains("TASK: state every fact") {
        let list = if current.contains("both work for Acme Corp") {
            json!([
                employs("Dana Whitcombe", "Acme Corp"),
                employs("Priya Raman", "Acme Corp")
            ])
        } else if current.contains("consults for Northwind") {
            json!([employs("Dana Whitcombe", "Northwind")])
        } else if current.contains("joined Brightline Systems") {
            json!([employs("Dana Whitcombe", "Brightline Systems")])
        } else {
            json!([])
        };
        Reply::json(&json!({ "facts": list }))
    } else if system.contains("already classified as") {
        no_subtype_for_any(user)
    } else {
        Reply::error(400, "unexpected prompt", "invalid_request_error", None)
    }
}

/// A leaver record (`[[mapping.ends]]`, every EMPLOYED_BY of the person
/// ends on the last day) ends what chat stated: the employment committed
/// by an earlier run and one stated in the same run before the last day.
/// A job stated after it (no start given: it held when its chat line was
/// written), and a colleague's, stay live.
#[tokio::test(flavor = "multi_thread")]
async fn a_records_end_for_every_relationship_of_a_type_ends_the_ones_chat_stated_before_it() {
    let first = r#"{"id": "c1", "kind": "message", "reference_time": "2025-03-01T10:00:00Z", "content": "Dana Whitcombe and Priya Raman both work for Acme Corp."}
"#;
    let mut f = fixture_with(&[("chat.jsonl", first)], employment_responder).await;
    // Only the record ends anything: no functional type.
    f.spec.resolve.functional_edge_types.clear();
    let leavers: graphloom::spec::MappingSpec = toml::from_str(
        r#"
        files = "hr.jsonl"
        when = { record_type = "leaver" }
        [[entities]]
        id = "person"
        type = "Person"
        name = "{name}"
        [[ends]]
        entity = "person"
        relation = "EMPLOYED_BY"
        at = "last_day"
        "#,
    )
    .expect("mapping");
    f.spec.mapping.push(leavers);
    run(&f).await;

    std::fs::write(
        f.source.join("hr.jsonl"),
        r#"{"id": "h1", "kind": "json", "reference_time": "2025-03-10T18:00:00Z", "content": {"record_type": "leaver", "name": "Dana Whitcombe", "last_day": "2025-03-10"}}
"#,
    )
    .expect("write");
    std::fs::write(
        f.source.join("more-chat.jsonl"),
        r#"{"id": "c2", "kind": "message", "reference_time": "2025-03-05T10:00:00Z", "content": "Dana Whitcombe also consults for Northwind."}
{"id": "c3", "kind": "message", "reference_time": "2025-03-20T10:00:00Z", "content": "Dana Whitcombe joined Brightline Systems."}
"#,
    )
    .expect("write");
    let report = run(&f).await;
    let rows = query(
        &f.store,
        "SELECT s.name AS person, t.name AS company, CAST(e.invalid_at AS VARCHAR) AS ended \
         FROM edges e JOIN nodes s ON e.source_node_id = s.node_id \
         JOIN nodes t ON e.target_node_id = t.node_id ORDER BY person, company",
    )
    .await;
    let got: Vec<(String, String, Value)> = rows
        .iter()
        .map(|r| {
            (
                r["person"].as_str().unwrap_or_default().to_string(),
                r["company"].as_str().unwrap_or_default().to_string(),
                r["ended"].clone(),
            )
        })
        .collect();
    let ended = json!("2025-03-10T00:00:00Z");
    assert_eq!(
        got,
        vec![
            ("Dana Whitcombe".into(), "Acme Corp".into(), ended.clone()),
            (
                "Dana Whitcombe".into(),
                "Brightline Systems".into(),
                Value::Null
            ),
            ("Dana Whitcombe".into(), "Northwind".into(), ended),
            ("Priya Raman".into(), "Acme Corp".into(), Value::Null),
        ]
    );
    assert_eq!(report.invalidated_facts, 2, "{report:?}");
}
