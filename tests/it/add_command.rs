//! `graphloom add`: known nodes and facts without an LLM. Bad lines become
//! `failures` rows with their line number and reason; good lines load.

use std::process::Command;

use graphloom::query::GraphSession;
use graphloom::store::rows::{self, EdgeRow, FailureRow, NodeRow};
use graphloom::store::{GraphStore, Table};

use crate::common;

async fn rows_of<T: serde::de::DeserializeOwned>(store: &GraphStore, table: Table) -> Vec<T> {
    let snapshot = store.snapshot().await.expect("snapshot");
    rows::from_batches(table, &snapshot.read(table).await.expect("read")).expect("decode")
}

/// Each bad line and the words its failure reason must contain.
const BAD_LINES: &[(&str, &str)] = &[
    (r#"{"node": {"name": "Broken""#, "not a valid line"),
    (
        r#"{"node": {"name": "X", "type": "Invoice"}}"#,
        "unknown entity type `Invoice`",
    ),
    (
        r#"{"node": {"name": "PO-1", "type": "PurchaseOrder", "attributes": {"details": "x"}}}"#,
        "`details` is not a property of `PurchaseOrder`",
    ),
    (
        r#"{"node": {"name": "PO-2", "type": "PurchaseOrder", "attributes": {"amount": "lots"}}}"#,
        "`amount` must be a float",
    ),
    (
        r#"{"node": {"name": "MSA-1", "type": "MSA", "attributes": {"effective_date": "soon"}}}"#,
        "`effective_date` must be a date",
    ),
    (
        r#"{"node": {"name": "", "type": "Person"}}"#,
        "node name is empty",
    ),
    (
        r#"{"node": {"name": "A", "type": "Person"}, "fact": {"source": "A", "target": "B", "relation_type": "KNOWS", "fact": "x"}}"#,
        "not both",
    ),
    (r#"{"edge": {}}"#, "not a valid line"),
    (
        r#"{"fact": {"source": "Acme", "source_type": "Company", "target": "Bo", "target_type": "Person", "relation_type": "WORKS_FULL_TIME_FOR", "fact": "backwards"}}"#,
        "does not allow Company -> Person",
    ),
    (
        r#"{"fact": {"source": "Bo", "source_type": "Person", "target": "Acme", "target_type": "Company", "relation_type": "works for", "fact": "x"}}"#,
        "SCREAMING_SNAKE_CASE",
    ),
    (
        r#"{"fact": {"source": "Bo", "source_type": "Person", "target": "Acme", "target_type": "Company", "relation_type": "EMPLOYED_BY", "fact": "x", "valid_at": "last week"}}"#,
        "valid_at",
    ),
    (
        r#"{"fact": {"source": "Bo", "source_type": "Person", "target": "Acme", "target_type": "Company", "relation_type": "EMPLOYED_BY", "fact": "x", "valid_at": "2025-02-01", "invalid_at": "2025-01-01"}}"#,
        "is before valid_at",
    ),
    (
        r#"{"fact": {"source": "Bo", "source_type": "Person", "target": "Bo", "target_type": "Person", "relation_type": "KNOWS", "fact": "self"}}"#,
        "two distinct entities",
    ),
    (
        r#"{"fact": {"source": "Bo", "source_type": "Robot", "target": "Acme", "target_type": "Company", "relation_type": "EMPLOYED_BY", "fact": "x"}}"#,
        "unknown entity type `Robot`",
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn bad_lines_become_failures_and_good_lines_still_load() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut text = String::new();
    text.push_str(
        r#"{"node": {"name": "Acme", "type": "Company", "attributes": {"domain": "acme.test"}}}"#,
    );
    text.push('\n');
    for (line, _) in BAD_LINES {
        text.push_str(line);
        text.push('\n');
    }
    // A good fact after the bad ones: Bo is created for it (Person), Acme is
    // the node declared on line 1.
    text.push_str(r#"{"fact": {"source": "Bo", "source_type": "Person", "target": "ACME", "target_type": "Company", "relation_type": "CONTRACTS_FOR", "fact": "Bo contracts for Acme.", "valid_at": "2025"}}"#);
    text.push('\n');
    let mut bytes = text.into_bytes();
    bytes.extend_from_slice(b"{\"node\": {\"name\": \"Caf\xe9\", \"type\": \"Company\"}}\n");
    let file = dir.path().join("mixed.jsonl");
    std::fs::write(&file, bytes).expect("write input");

    let (spec, ontology) = common::procurement();
    let store = GraphStore::open(
        dir.path().join("graph").to_str().expect("utf-8"),
        &Default::default(),
    )
    .expect("open");
    let report = graphloom::add::add_file(
        &store,
        &ontology,
        &spec.resolve.name_keys(),
        &spec.output.group_id,
        file.to_str().expect("utf-8"),
        &Default::default(),
    )
    .await
    .expect("add completes despite bad lines");

    let failures: Vec<FailureRow> = rows_of(&store, Table::Failures).await;
    assert_eq!(failures.len(), BAD_LINES.len() + 1, "{failures:#?}");
    assert_eq!(report.failures.len(), failures.len());
    for (i, (_, reason)) in BAD_LINES.iter().enumerate() {
        let line = i as i64 + 2;
        let f = failures
            .iter()
            .find(|f| f.line == Some(line))
            .unwrap_or_else(|| panic!("no failure for line {line}"));
        assert!(
            f.reason.contains(reason),
            "line {line}: {:?} does not mention {reason:?}",
            f.reason
        );
        assert_eq!(f.item, format!("mixed.jsonl:{line}"));
        assert_eq!(f.stage, "add");
    }
    let utf8 = failures
        .iter()
        .find(|f| f.reason.contains("UTF-8"))
        .expect("invalid UTF-8 line reported");
    assert_eq!(utf8.line, Some(BAD_LINES.len() as i64 + 3));

    // The good lines loaded: Acme, and Bo created for the fact; no stray
    // node from the rejected facts.
    let nodes: Vec<NodeRow> = rows_of(&store, Table::Nodes).await;
    let mut names: Vec<(&str, &str)> = nodes
        .iter()
        .map(|n| (n.name.as_str(), n.node_type.as_str()))
        .collect();
    names.sort();
    assert_eq!(names, vec![("Acme", "Company"), ("Bo", "Person")]);
    let edges: Vec<EdgeRow> = rows_of(&store, Table::Edges).await;
    assert_eq!(edges.len(), 1);
    let acme = nodes.iter().find(|n| n.name == "Acme").expect("acme");
    assert_eq!(
        edges[0].target_node_id, acme.node_id,
        "ACME matched the declared Acme by normalised name"
    );
    assert_eq!(
        edges[0].valid_at.map(|t| t.to_rfc3339()),
        Some("2025-01-01T00:00:00+00:00".to_string()),
        "a year alone means January 1st, midnight UTC"
    );
    assert_eq!(acme.rank, 1);
    let run = store
        .head()
        .await
        .expect("head")
        .last_completed
        .expect("run");
    assert_eq!(
        (run.nodes_added, run.edges_added, run.failures),
        (2, 1, failures.len() as i64)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn added_nodes_are_not_deduplicated_across_calls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    let (spec, ontology) = common::procurement();
    graphloom::add::add_file(
        &store,
        &ontology,
        &spec.resolve.name_keys(),
        &spec.output.group_id,
        common::facts_file().to_str().expect("utf-8"),
        &Default::default(),
    )
    .await
    .expect("second add");
    let session = GraphSession::open(&store).await.expect("session");
    let count = |sql: &'static str| {
        let session = &session;
        async move {
            let r = session.run(sql).await.expect("query");
            arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(
                r[0].batches[0].column(0),
            )
            .value(0)
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM nodes WHERE name = 'Acme Corp'").await,
        2
    );
    // Each call's facts point at that call's nodes only.
    assert_eq!(
        count(
            "SELECT count(*) FROM edges e JOIN nodes s ON s.node_id = e.source_node_id \
             JOIN nodes t ON t.node_id = e.target_node_id WHERE s.run_id <> e.run_id OR t.run_id <> e.run_id"
        )
        .await,
        0
    );
    // Short ids keep growing across calls.
    assert_eq!(
        count("SELECT count(DISTINCT short_id) FROM nodes").await,
        70
    );
    assert_eq!(count("SELECT max(short_id) FROM nodes").await, 70);
    // The unchanged ontology is not rewritten by the second run.
    assert_eq!(
        count("SELECT count(DISTINCT run_id) FROM entity_types").await,
        1
    );
}

#[test]
fn exit_codes_separate_usage_errors_from_runtime_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |args: &[&str]| {
        Command::new(common::bin())
            .current_dir(common::repo())
            .args(args)
            .output()
            .expect("run graphloom")
    };
    let graph = dir.path().to_str().expect("utf-8");
    // A missing input file is the user's to fix.
    let out = run(&[
        "add",
        "pipelines/procurement.toml",
        "no/such/file.jsonl",
        "--graph",
        graph,
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/file.jsonl"));
    // So is a location that holds no graph (a mistyped path): reading it
    // is an error, not an empty graph, and nothing is created there.
    let out = run(&["sql", "--graph", graph, "SELECT 1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no graph at"));
    assert!(!dir.path().join("runs").exists());
    let added = run(&[
        "add",
        "pipelines/procurement.toml",
        "pipelines/facts/procurement.jsonl",
        "--graph",
        graph,
    ]);
    assert_eq!(added.status.code(), Some(0));
    // SQL that does not plan is the user's to fix too.
    let out = run(&["sql", "--graph", graph, "SELEC 1"]);
    assert_eq!(out.status.code(), Some(2));
    // And a bad spec path or an unknown subcommand.
    assert_eq!(
        run(&["ontology", "check", "no/such/spec.toml"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(run(&["frobnicate"]).status.code(), Some(2));
    // A successful query exits 0 and prints JSON when asked.
    let out = run(&[
        "sql",
        "--graph",
        graph,
        "--format",
        "json",
        "SELECT 1 AS one",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"[{"one":1}]"#
    );
}

#[test]
fn every_command_has_complete_help() {
    for args in [
        vec!["--help"],
        vec!["add", "--help"],
        vec!["sql", "--help"],
        vec!["status", "--help"],
        vec!["recover", "--help"],
        vec!["export", "parquet", "--help"],
        vec!["ontology", "check", "--help"],
    ] {
        let out = Command::new(common::bin())
            .args(&args)
            .output()
            .expect("run help");
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage:"), "{args:?}: {text}");
    }
    let top = Command::new(common::bin())
        .arg("--help")
        .output()
        .expect("help");
    let text = String::from_utf8_lossy(&top.stdout);
    for cmd in ["ontology", "add", "sql", "status", "recover"] {
        assert!(text.contains(cmd), "top-level help lists `{cmd}`");
    }
}
