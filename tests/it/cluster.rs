//! A Ballista cluster of graphloom processes on 127.0.0.1 (one scheduler,
//! two executors, started by the test) gives the same SQL answers as an
//! in-process session, and an executor killed mid-query costs a retry or a
//! clear error, never a wrong answer.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use graphloom::cluster::ClusterUrl;
use graphloom::query::{GraphSession, StatementResult};

use crate::common;

/// A free port on 127.0.0.1 (free when asked; the processes bind it soon
/// after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits until something listens on `port` (at most `limit`).
fn wait_for_port(port: u16, limit: Duration, what: &str, children: &mut [&mut Child]) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        for child in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{what}: a cluster process exited early with {status}");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within {limit:?}");
}

/// One scheduler and its executors, killed when dropped.
struct Cluster {
    scheduler: Child,
    executors: Vec<(Child, u16)>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts a scheduler and `executors` executors; an executor is lost
    /// after `timeout_secs` without word from it.
    fn start(executors: usize, timeout_secs: u64) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let quiet = |mut c: Command| {
            c.stdout(Stdio::null()).stderr(Stdio::null());
            c
        };
        let mut scheduler = quiet(common::graphloom(&[
            "cluster",
            "scheduler",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--executor-timeout-secs",
            &timeout_secs.to_string(),
        ]))
        .spawn()
        .expect("spawn scheduler");
        wait_for_port(
            port,
            Duration::from_secs(60),
            "the scheduler",
            &mut [&mut scheduler],
        );
        let mut started = Vec::new();
        for i in 0..executors {
            let (flight, grpc) = (free_port(), free_port());
            let work = dir.path().join(format!("executor-{i}"));
            let child = quiet(common::graphloom(&[
                "cluster",
                "executor",
                "--scheduler",
                &format!("127.0.0.1:{port}"),
                "--flight-port",
                &flight.to_string(),
                "--grpc-port",
                &grpc.to_string(),
                "--work-dir",
                work.to_str().expect("utf-8 path"),
                "--concurrent-tasks",
                "2",
            ]))
            .spawn()
            .expect("spawn executor");
            started.push((child, flight));
        }
        let mut cluster = Cluster {
            scheduler,
            executors: started,
            port,
            dir,
        };
        // An executor serves Flight only once the scheduler registered it.
        for i in 0..cluster.executors.len() {
            let flight = cluster.executors[i].1;
            let (scheduler, executors) = (&mut cluster.scheduler, &mut cluster.executors);
            let mut children: Vec<&mut Child> = vec![scheduler];
            children.extend(executors.iter_mut().map(|(c, _)| c));
            wait_for_port(
                flight,
                Duration::from_secs(60),
                "an executor",
                &mut children,
            );
        }
        cluster
    }

    /// Executor `i`'s shuffle directory.
    fn work_dir(&self, i: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("executor-{i}"))
    }

    fn url(&self) -> ClusterUrl {
        ClusterUrl::parse(&format!("df://127.0.0.1:{}", self.port)).expect("url")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (child, _) in &mut self.executors {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.scheduler.kill();
        let _ = self.scheduler.wait();
    }
}

/// Whether any file lies under `dir` (at any depth).
fn has_files(dir: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let path = e.path();
        if path.is_dir() {
            has_files(&path)
        } else {
            true
        }
    })
}

/// The rows of a result as text, sorted (row order is not guaranteed).
fn rows_of(result: &StatementResult) -> Vec<String> {
    let mut rows = Vec::new();
    for batch in &result.batches {
        let options = arrow::util::display::FormatOptions::default().with_null("NULL");
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<_, _>>()
            .expect("formatters");
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .map(|f| f.value(row).to_string())
                .collect();
            rows.push(cells.join(" | "));
        }
    }
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_logic_tests_give_the_same_answers_on_a_scheduler_with_two_executors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    let cluster = Cluster::start(2, 30);
    let session = graphloom::cluster::open_graph(&store, &cluster.url())
        .await
        .expect("open the graph on the cluster");
    // The plans really run remotely: the scheduler's executors answer.
    let probe = session
        .run("SELECT count(*) FROM nodes WHERE has_label(labels, 'Contract')")
        .await
        .expect("a label query on the cluster");
    let local = GraphSession::open(&store).await.expect("local session");
    let expected = local
        .run("SELECT count(*) FROM nodes WHERE has_label(labels, 'Contract')")
        .await
        .expect("local");
    assert_eq!(rows_of(&probe[0]), rows_of(&expected[0]));
    assert_ne!(rows_of(&probe[0]), vec!["0".to_string()], "contracts exist");
    let failures = crate::slt::run_files(Arc::new(session), false).await;
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The command line: the same CSV with and without --cluster.
    let graph = dir.path().to_str().expect("utf-8 path");
    let query = "SELECT name, type FROM nodes WHERE has_label(labels, 'Contract') ORDER BY name";
    let local = common::ok(
        common::graphloom(&["sql", "--graph", graph, "--format", "csv", query]),
        "sql in process",
    );
    let remote = common::ok(
        common::graphloom(&[
            "sql",
            "--graph",
            graph,
            "--format",
            "csv",
            "--cluster",
            &cluster.url().to_string(),
            query,
        ]),
        "sql --cluster",
    );
    assert_eq!(local, remote);
    assert!(local.lines().count() > 2, "{local}");
}

#[test]
fn a_cluster_url_that_is_not_df_host_port_exits_2_before_reading_the_graph() {
    let out = common::graphloom(&[
        "sql",
        "--graph",
        "/nonexistent/graph",
        "--cluster",
        "http://127.0.0.1:50050",
        "SELECT 1",
    ])
    .output()
    .expect("run graphloom");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        common::describe("sql", &out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("df://HOST:PORT"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_scheduler_port_is_a_clear_error_not_a_hang() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    let url = ClusterUrl::parse(&format!("df://127.0.0.1:{}", free_port())).expect("url");
    let started = Instant::now();
    let err = graphloom::cluster::open_graph(&store, &url)
        .await
        .err()
        .expect("nobody listens");
    assert!(started.elapsed() < Duration::from_secs(30));
    let msg = err.to_string();
    assert!(
        msg.contains("cannot reach the scheduler") && msg.contains(&url.to_string()),
        "{msg}"
    );
    // A server that is down is not a usage error: exit code 1.
    let out = common::graphloom(&[
        "sql",
        "--graph",
        dir.path().to_str().expect("utf-8 path"),
        "--cluster",
        &url.to_string(),
        "SELECT 1",
    ])
    .output()
    .expect("run graphloom");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        common::describe("sql", &out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_executor_killed_mid_query_costs_a_retry_or_a_clear_error_never_a_wrong_answer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    // Long enough to be killed in the middle of: a four-way cross join of
    // the example nodes, grouped after a shuffle.
    let sql = "SELECT a.type, count(*) AS n FROM nodes a, nodes b, nodes c, nodes d \
               WHERE has_label(b.labels, b.type) GROUP BY a.type";
    let local = GraphSession::open(&store).await.expect("local session");
    let expected = rows_of(&local.run(sql).await.expect("local")[0]);
    let mut cluster = Cluster::start(2, 10);
    let session = graphloom::cluster::open_graph(&store, &cluster.url())
        .await
        .expect("open on the cluster");
    let query = tokio::spawn(async move { session.run(sql).await });
    // Kill the first executor that has written shuffle output for this
    // query, while the query runs: its map output is lost with it.
    let started = Instant::now();
    let victim = loop {
        assert!(
            !query.is_finished(),
            "the query ended before any executor wrote shuffle output"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no shuffle output within 2 minutes"
        );
        if let Some(i) = (0..cluster.executors.len()).find(|i| has_files(&cluster.work_dir(*i))) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (child, _) = &mut cluster.executors[victim];
    child.kill().expect("kill an executor");
    let _ = child.wait();
    assert!(
        !query.is_finished(),
        "the query must still be running when its executor dies"
    );
    let outcome = tokio::time::timeout(Duration::from_secs(240), query)
        .await
        .expect("the query ends within 4 minutes")
        .expect("the query task did not panic");
    match outcome {
        Ok(results) => {
            eprintln!("the query was retried after the kill and answered");
            assert_eq!(rows_of(&results[0]), expected, "a retried query's answer")
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty(), "an error that says something");
            eprintln!("the query failed after the kill (allowed): {msg}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn resolution_on_the_cluster_makes_the_same_merges_as_in_process() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bench = |cluster: Option<ClusterUrl>| graphloom::bench::resolution::ResolveBench {
        mentions: 1_500,
        nodes: 4_000,
        seed: 5,
        dir: dir.path().join("nodes"),
        existing_share: 0.5,
        repeat_share: 0.2,
        spec: graphloom::resolve::ResolveSpec::default(),
        cluster,
        computed_keys: false,
    };
    let local = graphloom::bench::resolution::run_resolve_bench(bench(None))
        .await
        .expect("in process");
    let cluster = Cluster::start(2, 30);
    let remote = graphloom::bench::resolution::run_resolve_bench(bench(Some(cluster.url())))
        .await
        .expect("on the cluster");
    assert!(
        (0..2).any(|i| has_files(&cluster.work_dir(i))),
        "the executors ran the plans (shuffle files)"
    );
    // Name, identity and fuzzy (MinHash band) candidates, and the merges
    // the rules make from them.
    assert!(local.pairs.len() >= 3, "{:?}", local.pairs);
    assert_eq!(remote.pairs, local.pairs);
    assert_eq!(remote.node_merges, local.node_merges);
    assert_eq!(remote.pair_merges, local.pair_merges);
    assert_eq!(remote.ambiguous, local.ambiguous);
    assert_eq!(remote.by_variant, local.by_variant);
    // The scratch tables went to files beside the nodes, and are gone.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("scratch"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The graph a store holds, as comparable rows: nodes by name and type,
/// edges by their ends' names (ids are random per run).
async fn graph_rows(
    store: &graphloom::store::GraphStore,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    use crate::run_pipeline::query;
    let nodes = query(
        store,
        "SELECT name, type, labels, attributes, cardinality(episode_ids) AS episodes, short_id \
         FROM nodes ORDER BY name, type",
    )
    .await;
    let edges = query(
        store,
        "SELECT s.name AS source, e.relation_type, t.name AS target, e.fact, e.valid_at, \
           e.invalid_at, e.expired_at IS NULL AS live \
         FROM edges e JOIN nodes s ON s.node_id = e.source_node_id \
         JOIN nodes t ON t.node_id = e.target_node_id \
         ORDER BY source, relation_type, target, fact",
    )
    .await;
    (nodes, edges)
}

/// `graphloom run` with `--cluster` (here `RunOptions::cluster`) resolves
/// on the cluster: the same committed graph as an in-process run, over a
/// first run and over a second one that resolves new mentions against the
/// committed nodes, and no scratch files left under the graph.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_resolving_on_the_cluster_commits_the_graph_an_in_process_run_commits() {
    use crate::run_pipeline::fixture;
    use graphloom::run::RunOptions;
    let cluster = Cluster::start(2, 30);
    let on = |cluster: Option<ClusterUrl>| RunOptions {
        cluster,
        ..RunOptions::default()
    };
    let local = fixture(|_| {}).await;
    let remote = fixture(|_| {}).await;
    let grow = |f: &crate::run_pipeline::Fixture| {
        let mut text = std::fs::read_to_string(&f.source_file).expect("read");
        text.push_str("{\"id\": \"e6\", \"content\": \"ACME Corp. confirmed delivery of PO-1.\", \"kind\": \"message\", \"reference_time\": \"2025-04-01T10:00:00Z\"}\n");
        std::fs::write(&f.source_file, text).expect("write");
    };
    for round in 0..2 {
        if round == 1 {
            grow(&local);
            grow(&remote);
        }
        let ontology =
            graphloom::ontology::Ontology::try_from(&local.spec.ontology).expect("ontology");
        let here = graphloom::run::run(&local.spec, &ontology, &local.store, &on(None))
            .await
            .expect("in process");
        let there = graphloom::run::run(
            &remote.spec,
            &ontology,
            &remote.store,
            &on(Some(cluster.url())),
        )
        .await
        .expect("on the cluster");
        assert_eq!(
            (there.nodes_added, there.nodes_updated, there.edges_added),
            (here.nodes_added, here.nodes_updated, here.edges_added),
            "round {round}"
        );
        let (want_nodes, want_edges) = graph_rows(&local.store).await;
        let (got_nodes, got_edges) = graph_rows(&remote.store).await;
        assert!(
            want_nodes.len() >= 5 && !want_edges.is_empty(),
            "{want_nodes:?}"
        );
        assert_eq!(got_nodes, want_nodes, "round {round}");
        assert_eq!(got_edges, want_edges, "round {round}");
    }
    assert!(
        (0..2).any(|i| has_files(&cluster.work_dir(i))),
        "the executors ran the plans (shuffle files)"
    );
    let scratch = remote.store.scratch_url();
    let scratch = scratch.to_file_path().expect("a local graph");
    assert!(
        !has_files(&scratch),
        "scratch files left in {}",
        scratch.display()
    );
}

/// A cluster that is down and a cluster URL that is not one fail the run
/// before any LLM call, each with a message that says what to change.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_the_cluster_cannot_resolve_fails_before_calling_the_model() {
    use crate::run_pipeline::fixture;
    let f = fixture(|spec| spec.resolve.cluster = Some(format!("df://127.0.0.1:{}", free_port())))
        .await;
    let ontology = graphloom::ontology::Ontology::try_from(&f.spec.ontology).expect("ontology");
    let err = graphloom::run::run(&f.spec, &ontology, &f.store, &Default::default())
        .await
        .expect_err("nothing listens there");
    let msg = err.to_string();
    assert!(
        msg.contains("cannot reach the scheduler at df://127.0.0.1:"),
        "{msg}"
    );
    assert!(f.server.requests().is_empty(), "no LLM call was made");
    let bad = fixture(|spec| spec.resolve.cluster = Some("http://x:1".into())).await;
    let err = graphloom::run::run(&bad.spec, &ontology, &bad.store, &Default::default())
        .await
        .expect_err("not a cluster URL");
    assert!(
        err.to_string()
            .starts_with("resolve.cluster: cluster URL `http://x:1`"),
        "{err}"
    );
}
/// Record linkage on the cluster: the pair-scoring functions travel with
/// the rules, the trained model and the run's records, and link what they
/// link in process, for the weighted and the probabilistic rule, over a
/// first load and a second that links to committed nodes.
#[tokio::test(flavor = "multi_thread")]
async fn record_linkage_on_the_cluster_links_the_records_it_links_in_process() {
    use crate::record_linkage::{fixture_with, people, probabilistic_spec, registry, run_with};
    use graphloom::run::RunOptions;
    let cluster = Cluster::start(2, 30);
    let on_cluster = RunOptions {
        cluster: Some(cluster.url()),
        ..RunOptions::default()
    };
    for spec in [
        crate::record_linkage::SPEC.to_string(),
        probabilistic_spec(),
    ] {
        let local = fixture_with(&spec, registry(120, 40, 10)).await;
        let remote = fixture_with(&spec, registry(120, 40, 10)).await;
        for batch in 0..2 {
            let here = &local.batches[batch];
            run_with(&local.spec, &local.store, here, &RunOptions::default()).await;
            let there = &remote.batches[batch];
            run_with(&remote.spec, &remote.store, there, &on_cluster).await;
            let want = people(&local.store).await;
            // The first load has no duplicates; the second links copies.
            assert_eq!(want.iter().any(|c| c.len() > 1), batch == 1, "{want:?}");
            assert_eq!(people(&remote.store).await, want, "batch {batch}");
        }
    }
}
