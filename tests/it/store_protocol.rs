//! The commit protocol: a run's writes appear together, a crash or kill at
//! any point leaves the graph at the last completed run, and two writers
//! never interleave.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use chrono::Utc;
use graphloom::store::rows::{self, NodeRow};
use graphloom::store::{GraphStore, RunStats, StoreError, Table, WriteMode};

use crate::common;

fn add_cmd(graph: &Path) -> Command {
    let mut cmd = Command::new(common::bin());
    cmd.current_dir(common::repo())
        .arg("add")
        .arg("pipelines/procurement.toml")
        .arg("pipelines/facts/procurement.jsonl")
        .arg("--graph")
        .arg(graph);
    cmd
}

fn sql(graph: &Path, query: &str) -> Output {
    Command::new(common::bin())
        .args(["sql", "--format", "csv", "--graph"])
        .arg(graph)
        .arg(query)
        .output()
        .expect("run graphloom sql")
}

/// One integer from `graphloom sql`, read as an external reader would.
fn sql_count(graph: &Path, query: &str) -> i64 {
    let out = sql(graph, query);
    assert!(
        out.status.success(),
        "sql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count in {text:?}"))
}

fn counts(graph: &Path) -> (i64, i64, i64) {
    (
        sql_count(graph, "SELECT count(*) FROM nodes"),
        sql_count(graph, "SELECT count(*) FROM edges"),
        sql_count(graph, "SELECT count(*) FROM node_labels"),
    )
}

async fn latest_version(store: &GraphStore, table: Table) -> u64 {
    store
        .load_latest(table)
        .await
        .expect("load table")
        .and_then(|t| t.version())
        .expect("table exists") as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_after_any_commit_leaves_the_last_completed_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    let one_run = counts(dir.path());
    assert_eq!(one_run, (35, 50, 82));

    // The process dies right after committing each table of a second add in
    // turn; readers must keep seeing exactly one add. Each new writer first
    // rolls back what the previous one left.
    for table in ["nodes", "node_labels", "edges"] {
        let out = add_cmd(dir.path())
            .env("GRAPHLOOM_FAILPOINT", format!("after_commit:{table}=abort"))
            .output()
            .expect("run add");
        assert!(
            !out.status.success(),
            "the writer was meant to die after `{table}`"
        );
        let t = Table::from_name(table).expect("table name");
        let pinned = store.head().await.expect("head").versions[&t];
        assert!(
            latest_version(&store, t).await > pinned,
            "the crashed writer's commit to `{table}` exists but is past the pinned version"
        );
        assert_eq!(
            counts(dir.path()),
            one_run,
            "after a crash following the `{table}` commit"
        );
    }

    // Dying after the runs row means the run completed.
    let out = add_cmd(dir.path())
        .env("GRAPHLOOM_FAILPOINT", "after_commit:runs=abort")
        .output()
        .expect("run add");
    assert!(!out.status.success());
    assert_eq!(counts(dir.path()), (70, 100, 164));

    // A normal writer afterwards leaves no orphan commits anywhere.
    let out = add_cmd(dir.path()).output().expect("run add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(dir.path()), (105, 150, 246));
    let head = store.head().await.expect("head");
    for table in Table::ALL.into_iter().filter(|t| *t != Table::Runs) {
        assert_eq!(
            Some(&latest_version(&store, table).await),
            head.versions.get(&table),
            "`{table}`: latest version equals the version the last run pinned"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_killed_between_commits_is_rolled_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    let pinned = store.head().await.expect("head").versions[&Table::Nodes];
    let mut child = add_cmd(dir.path())
        .env("GRAPHLOOM_FAILPOINT", "after_commit:nodes=sleep:20000")
        .spawn()
        .expect("spawn add");
    // Wait (bounded) until the writer has committed `nodes` and is paused.
    let deadline = Instant::now() + Duration::from_secs(60);
    while latest_version(&store, Table::Nodes).await == pinned {
        assert!(Instant::now() < deadline, "writer never committed nodes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().expect("kill writer");
    child.wait().expect("reap writer");

    // Readers are pinned: the killed run's nodes are invisible.
    assert_eq!(counts(dir.path()), (35, 50, 82));
    // `recover` rolls the orphan commit back for engines that read the
    // latest version.
    let out = Command::new(common::bin())
        .args(["recover", "--graph"])
        .arg(dir.path())
        .output()
        .expect("run recover");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("rolled back `nodes`"),
        "recover output: {text}"
    );
    let latest = store
        .load_latest(Table::Nodes)
        .await
        .expect("load")
        .expect("exists");
    let ctx = datafusion::prelude::SessionContext::new();
    latest
        .update_datafusion_session(&ctx.state())
        .expect("session");
    ctx.register_table(
        "latest_nodes",
        latest.table_provider().await.expect("provider"),
    )
    .expect("register");
    let n = ctx
        .sql("SELECT count(*) FROM latest_nodes")
        .await
        .expect("plan")
        .collect()
        .await
        .expect("run");
    let n =
        arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(n[0].column(0)).value(0);
    assert_eq!(
        n, 35,
        "the latest version of nodes holds only the completed run's rows"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_writer_is_turned_away_while_the_first_holds_the_graph() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    let mut first = add_cmd(dir.path())
        .env("GRAPHLOOM_FAILPOINT", "after_commit:nodes=sleep:3000")
        .spawn()
        .expect("spawn first writer");
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.lock_holder().await.expect("read lock").is_none() {
        assert!(
            Instant::now() < deadline,
            "first writer never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = add_cmd(dir.path()).output().expect("run second writer");
    assert_eq!(
        second.status.code(),
        Some(1),
        "a runtime error, not a usage error"
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("is being written by run"),
        "stderr: {stderr}"
    );
    assert!(first.wait().expect("first writer").success());
    // Exactly the first writer's rows were added.
    assert_eq!(counts(dir.path()), (70, 100, 164));
    assert!(
        store.lock_holder().await.expect("read lock").is_none(),
        "lock released"
    );
}

fn node(run: &str, name: &str) -> NodeRow {
    let now = Utc::now();
    NodeRow {
        node_id: uuid::Uuid::now_v7().to_string(),
        short_id: 1,
        group_id: "g".into(),
        name: name.into(),
        name_normalized: name.to_lowercase(),
        node_type: "Entity".into(),
        labels: vec!["Entity".into()],
        summary: None,
        attributes: "{}".into(),
        episode_ids: vec![],
        created_at: now,
        updated_at: now,
        rank: 0,
        name_embedding: None,
        origin: "add".into(),
        run_id: run.into(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_whose_lock_was_taken_over_cannot_commit() {
    // memory:// also exercises the in-process object store.
    let url = format!("memory://protocol-{}/graph", uuid::Uuid::new_v4().simple());
    let store = GraphStore::open(&url, &Default::default()).expect("open");
    // A writer that paused longer than the stale timeout...
    let mut slow = store.begin("add", "g").await.expect("first writer begins");
    let batch = rows::to_batch(Table::Nodes, &[node(slow.run_id(), "slow")]).expect("batch");
    slow.stage(Table::Nodes, WriteMode::Append, vec![batch]);
    // ...loses its lock to a second writer, which commits first.
    let eager = store
        .clone()
        .with_lock_stale_after(Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut fast = eager
        .begin("add", "g")
        .await
        .expect("second writer takes over");
    let batch = rows::to_batch(Table::Nodes, &[node(fast.run_id(), "fast")]).expect("batch");
    fast.stage(Table::Nodes, WriteMode::Append, vec![batch]);
    fast.commit(RunStats::default())
        .await
        .expect("second writer commits");
    // The first writer's commit is refused instead of interleaving.
    let err = slow
        .commit(RunStats::default())
        .await
        .expect_err("stale writer must not commit");
    assert!(
        matches!(err, StoreError::Concurrent { table: "nodes", .. }),
        "got {err}"
    );
    let snapshot = store.snapshot().await.expect("snapshot");
    let nodes: Vec<NodeRow> = rows::from_batches(
        Table::Nodes,
        &snapshot.read(Table::Nodes).await.expect("read"),
    )
    .expect("rows");
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, vec!["fast"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_location_never_written_is_no_graph_and_reading_creates_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let graph = dir.path().join("never-written");
    for args in [
        vec!["status"],
        vec!["sql", "SELECT count(*) FROM nodes"],
        vec!["recover"],
    ] {
        let out = Command::new(common::bin())
            .args(&args)
            .arg("--graph")
            .arg(&graph)
            .output()
            .expect("run graphloom");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("no graph at file://"), "{args:?}: {stderr}");
    }
    assert!(!graph.exists(), "a reader created {}", graph.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graph_with_tables_but_no_completed_run_reads_as_empty() {
    let dir = tempfile::tempdir().expect("temp dir");
    let graph = dir.path().join("g");
    // A writer that created the tables and then stopped without a run.
    let store =
        GraphStore::open(graph.to_str().expect("utf-8"), &Default::default()).expect("open");
    store
        .begin("add", "default")
        .await
        .expect("begin")
        .abandon()
        .await
        .expect("abandon");
    assert_eq!(counts(&graph), (0, 0, 0));
    let out = Command::new(common::bin())
        .args(["status", "--graph"])
        .arg(&graph)
        .output()
        .expect("run status");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("last completed run: none"));
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_written_without_name_keys_take_keyed_merges_and_appends() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = GraphStore::open(dir.path().to_str().expect("utf-8"), &Default::default())
        .expect("open graph");
    // The nodes table as an older graphloom wrote it: no name-key columns.
    let old_node = node("old", "Acme Corp");
    let batch = rows::to_batch(Table::Nodes, std::slice::from_ref(&old_node)).expect("batch");
    let columns = batch
        .schema()
        .index_of("name_folded")
        .expect("key columns last");
    // Three name-key and two identity-key columns.
    assert_eq!(columns, batch.num_columns() - 5);
    common::write_older_table(&store, Table::Nodes, batch, columns).await;

    // One run updates the old node in place (a MERGE) and adds another.
    let (spec, ontology) = common::procurement();
    let keys = spec.resolve.name_keys();
    let mut updated = old_node.clone();
    updated.name = "ACME Corp.".into();
    updated.name_normalized = "acme corp".into();
    let mut added = node("new", "Globex Widgets Ltd");
    added.name_normalized = "globex widgets ltd".into();
    added.node_type = "Company".into();
    added.labels = vec!["Entity".into(), "Company".into()];
    added.attributes = r#"{"domain": "Globex.example", "industry": "widgets"}"#.into();
    added.short_id = 2;
    let changes = graphloom::store::Changes {
        nodes: vec![updated, added],
        updated_node_ids: vec![old_node.node_id.clone()],
        ..Default::default()
    };
    let mut tx = store.begin("test", "g").await.expect("begin");
    let ontology_hash = tx.stage_changes(&changes, &ontology, &keys).expect("stage");
    tx.commit(RunStats {
        ontology_hash,
        ..RunStats::default()
    })
    .await
    .expect("commit");

    let rows = crate::run_pipeline::query(
        &store,
        "SELECT name, name_folded, name_band_keys, name_keys_fingerprint \
         FROM nodes ORDER BY short_id",
    )
    .await;
    let stored: Vec<(String, String, Vec<i64>, String)> = rows
        .iter()
        .map(|r| {
            serde_json::from_value(serde_json::json!([
                r["name"],
                r["name_folded"],
                r["name_band_keys"],
                r["name_keys_fingerprint"]
            ]))
            .expect("a keyed row")
        })
        .collect();
    let expected: Vec<(String, String, Vec<i64>, String)> = [
        ("ACME Corp.", "acme"),
        ("Globex Widgets Ltd", "globex widgets"),
    ]
    .into_iter()
    .map(|(name, folded)| {
        (
            name.to_string(),
            folded.to_string(),
            keys.band_keys("g", folded),
            keys.fingerprint(),
        )
    })
    .collect();
    assert_eq!(stored, expected);
    // The longer name is fuzzy-eligible, so its band keys are there.
    assert_eq!(stored[1].2.len(), 10);

    // Identity keys: the company's domain, normalised like a name, under
    // the ontology's identity properties; none for an untyped entity.
    let rows = crate::run_pipeline::query(
        &store,
        "SELECT identity_keys, identity_keys_fingerprint FROM nodes ORDER BY short_id",
    )
    .await;
    let stored: Vec<(Vec<String>, String)> = rows
        .iter()
        .map(|r| {
            serde_json::from_value(serde_json::json!([
                r["identity_keys"],
                r["identity_keys_fingerprint"]
            ]))
            .expect("a row with identity keys")
        })
        .collect();
    let fingerprint = graphloom::text::IdentityKeys::new(
        graphloom::resolve::entities::identity_properties(&ontology),
    )
    .fingerprint();
    assert_eq!(
        stored,
        [
            (vec![], fingerprint.clone()),
            (vec!["domain=globex example".to_string()], fingerprint)
        ]
    );
}
