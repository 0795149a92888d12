//! Graphs on object storage, against real servers these tests start and
//! stop themselves on 127.0.0.1: moto's S3-compatible server (it honours
//! `If-None-Match: *` and `If-Match`, which Delta commits and the writer
//! lock rely on) and Azure's Azurite. Every command (`run`, `add`, `sql`,
//! `status`, `recover`, `eval`, `export parquet`) runs on an `s3://` graph;
//! the Python `deltalake` package reads the same tables.
//!
//! The servers come from `scripts/setup.sh` (`moto[server]` from PyPI,
//! `azurite` from npm). Without them these tests fail, unless
//! `GRAPHLOOM_SKIP_OBJECT_STORES=1` is set.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use graphloom::llm::test_server::{Behavior, ChatRequestView, Reply, TestServer};
use graphloom::objstore;
use graphloom::run::RunOptions;
use graphloom::spec::SourceSpec;
use graphloom::store::{GraphStore, StoreError};
use object_store::{ObjectStoreExt, PutPayload};
use serde_json::{Value, json};

use crate::common::{self, describe};

const SKIP: &str = "GRAPHLOOM_SKIP_OBJECT_STORES";
/// The well-known account of the Azure storage emulators.
const AZURITE_ACCOUNT: &str = "devstoreaccount1";

/// A server process on 127.0.0.1, killed when dropped.
struct Server {
    child: Child,
    endpoint: String,
    _data: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// `None` (after a note) when the tests may be skipped; panics otherwise.
fn skip(problem: &str) -> Option<Server> {
    if std::env::var(SKIP).as_deref() == Ok("1") {
        eprintln!("note: skipping object store test ({SKIP}=1): {problem}");
        return None;
    }
    panic!("{problem}\nrun scripts/setup.sh (CI does), or set {SKIP}=1 to skip these tests");
}

/// Starts `cmd` and waits (at most 60 s) until `port` accepts. Its output
/// goes to a file in `data` (a pipe nobody reads would fill up and stall
/// the server once it has logged enough requests).
fn spawn(what: &str, mut cmd: Command, port: u16, data: tempfile::TempDir) -> Option<Server> {
    let log_path = data.path().join("server.log");
    let log = std::fs::File::create(&log_path).expect("server log");
    let err = log.try_clone().expect("server log");
    let child = match cmd.stdout(log).stderr(err).spawn() {
        Ok(child) => child,
        Err(e) => return skip(&format!("cannot start {what}: {e}")),
    };
    let mut server = Server {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
        _data: data,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(server);
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let problem = format!("{what} exited at start ({status}): {}", tail.join(" | "));
            return skip(&problem);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within 60 s");
}

/// moto's S3 server, or `None` when the tests are skipped.
fn moto() -> Option<Server> {
    moto_with(&[])
}

/// moto with extra environment (e.g. to turn on its credential checks).
fn moto_with(env: &[(&str, &str)]) -> Option<Server> {
    let port = free_port();
    let data = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .envs(env.iter().copied());
    spawn("moto's S3 server (python3 -m moto.server)", cmd, port, data)
}

/// The Azurite blob server, or `None` when the tests are skipped.
fn azurite() -> Option<Server> {
    let bin = std::env::var("GRAPHLOOM_AZURITE_BLOB").map_or_else(
        |_| PathBuf::from("/var/cache/graphloom-tools/azurite/node_modules/.bin/azurite-blob"),
        PathBuf::from,
    );
    let port = free_port();
    let data = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(&bin);
    cmd.args(["--blobHost", "127.0.0.1", "--blobPort"])
        .arg(port.to_string())
        .arg("--location")
        .arg(data.path())
        .args(["--silent", "--skipApiVersionCheck", "--disableTelemetry"]);
    let mut server = spawn(&format!("Azurite ({})", bin.display()), cmd, port, data)?;
    server.endpoint = format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}");
    Some(server)
}

/// Creates a bucket on moto (it does not check signatures).
async fn make_bucket(server: &Server, bucket: &str) {
    let resp = reqwest::Client::new()
        .put(format!("{}/{bucket}", server.endpoint))
        .send()
        .await
        .expect("create bucket");
    assert!(
        resp.status().is_success(),
        "create bucket: {}",
        resp.status()
    );
}

/// Creates a container on Azurite (requests there must be signed, so the
/// Python SDK does it).
fn make_container(server: &Server, container: &str) {
    let out = Command::new("python3")
        .arg("tests/interop/azure_container.py")
        .arg(&server.endpoint)
        .arg(container)
        .current_dir(common::repo())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        describe("azure_container.py", &out)
    );
}

/// Rows of the Parquet file at `path` in `store`.
async fn parquet_rows(store: &dyn object_store::ObjectStore, path: &str) -> i64 {
    use object_store::ObjectStoreExt as _;
    let bytes = store
        .get(&object_store::path::Path::from(path))
        .await
        .unwrap_or_else(|e| panic!("{path} exists: {e}"))
        .bytes()
        .await
        .expect("read");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .expect("a Parquet file")
        .build()
        .expect("reader");
    reader.map(|b| b.expect("batch").num_rows() as i64).sum()
}

/// The settings a process needs for the S3 server, as environment variables.
fn s3_env(server: &Server) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", server.endpoint.clone()),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "graphloom-test-key-id".into()),
        ("AWS_SECRET_ACCESS_KEY", "graphloom-test-secret".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

/// The same settings as storage options (what a spec would hold).
fn s3_options(server: &Server) -> BTreeMap<String, String> {
    s3_env(server)
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

/// Azurite in object_store's emulator mode (well-known account and key,
/// HTTP allowed). Its port comes from `AZURITE_BLOB_STORAGE_URL` (see
/// [`azure_env`]). Emulator mode is needed for writes: with a plain
/// endpoint, object_store lists with `startFrom`, which Azurite 3.35
/// ignores, and the third Delta commit of a table fails.
fn azure_options() -> BTreeMap<String, String> {
    [("azure_storage_use_emulator", "true")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn azure_env(server: &Server) -> Vec<(&'static str, String)> {
    let root = server
        .endpoint
        .trim_end_matches(&format!("/{AZURITE_ACCOUNT}"))
        .to_string();
    vec![("AZURITE_BLOB_STORAGE_URL", root)]
}

/// `graphloom ARGS` with the given environment and no other cloud settings.
fn graphloom(args: &[&str], env: &[(&'static str, String)]) -> Output {
    let mut cmd = Command::new(common::bin());
    cmd.current_dir(common::repo()).args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") || k.starts_with("AZURE_") || k.starts_with("GOOGLE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("GRAPHLOOM_FAILPOINT").env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run graphloom")
}

fn ok(what: &str, out: Output) -> String {
    assert!(out.status.success(), "{}", describe(what, &out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One count through `graphloom sql --format csv --graph URL`.
fn count(graph: &str, env: &[(&'static str, String)], query: &str) -> i64 {
    count_in(&["--graph", graph], env, query)
}

/// One count through `graphloom sql`, the graph named by `target`
/// (`--graph URL` or `--pipeline P`).
fn count_in(target: &[&str], env: &[(&'static str, String)], query: &str) -> i64 {
    let mut args = vec!["sql", "--format", "csv"];
    args.extend_from_slice(target);
    args.push(query);
    let text = ok(query, graphloom(&args, env));
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count in {text:?}"))
}

/// The row count `graphloom status` prints for `table`.
fn status_rows(status: &str, table: &str) -> u64 {
    status
        .lines()
        .find(|l| l.split_whitespace().next() == Some(table))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no row count of `{table}` in {status}"))
}

fn graph_counts(graph: &str, env: &[(&'static str, String)]) -> (i64, i64, i64) {
    (
        count(graph, env, "SELECT count(*) FROM nodes"),
        count(graph, env, "SELECT count(*) FROM edges"),
        count(graph, env, "SELECT count(*) FROM node_labels"),
    )
}

fn add_args(graph: &str) -> Vec<&str> {
    vec![
        "add",
        "pipelines/procurement.toml",
        "pipelines/facts/procurement.jsonl",
        "--graph",
        graph,
    ]
}

/// A pipeline spec whose graph is `graph` with `options` as
/// `output.storage_options`, written under `dir`.
fn spec_file(dir: &Path, graph: &str, options: &BTreeMap<String, String>) -> PathBuf {
    let example = std::fs::read_to_string(common::repo().join("pipelines/procurement.toml"))
        .expect("example spec");
    let mut doc: toml::Table = toml::from_str(&example).expect("example spec is TOML");
    let output = doc
        .get_mut("output")
        .and_then(|o| o.as_table_mut())
        .expect("[output]");
    output.insert("graph".into(), graph.into());
    let opts: toml::Table = options
        .iter()
        .map(|(k, v)| (k.clone(), toml::Value::from(v.as_str())))
        .collect();
    output.insert("storage_options".into(), toml::Value::Table(opts));
    // Relative paths of the example (source, gold) stay valid from the repo.
    if let Some(source) = doc.get_mut("source").and_then(|s| s.as_table_mut()) {
        let url = source["url"].as_str().unwrap_or_default().to_string();
        if !url.contains("://") && !url.starts_with('/') {
            let abs = common::repo().join("pipelines").join(url);
            source.insert("url".into(), abs.to_string_lossy().into_owned().into());
        }
    }
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, toml::to_string(&doc).expect("spec")).expect("write spec");
    path
}

/// Table counts as the Python `deltalake` package reads them.
fn python_counts(graph: &str, options: &BTreeMap<String, String>) -> BTreeMap<String, u64> {
    let out = Command::new("python3")
        .arg("tests/interop/read_graph.py")
        .arg(graph)
        .arg("--storage-options")
        .arg(serde_json::to_string(options).expect("json"))
        .current_dir(common::repo())
        .output()
        .expect("run python3");
    assert!(out.status.success(), "{}", describe("read_graph.py", &out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("read_graph.py prints JSON");
    json["deltalake"]
        .as_object()
        .unwrap_or_else(|| panic!("no deltalake counts in {json}"))
        .iter()
        .map(|(t, n)| (t.clone(), n.as_u64().expect("count")))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn add_twice_then_sql_status_and_python_deltalake_on_s3() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "graphs").await;
    let env = s3_env(&s3);
    let graph = "s3://graphs/procurement";

    ok("first add", graphloom(&add_args(graph), &env));
    assert_eq!(graph_counts(graph, &env), (35, 50, 82));
    // `add` never deduplicates (directly added nodes are taken as given).
    ok("second add", graphloom(&add_args(graph), &env));
    assert_eq!(graph_counts(graph, &env), (70, 100, 164));

    let status = ok("status", graphloom(&["status", "--graph", graph], &env));
    assert!(
        status.contains("graph: s3://graphs/procurement/"),
        "{status}"
    );
    assert!(status.contains("last completed run:"), "{status}");
    assert_eq!(status_rows(&status, "nodes"), 70);

    // The warehouse path: another Delta reader sees the same graph.
    let python = python_counts(graph, &s3_options(&s3));
    for (table, expected) in [("nodes", 70), ("edges", 100), ("node_labels", 164)] {
        assert_eq!(python.get(table), Some(&expected), "{table}: {python:?}");
    }
    let runs = count(graph, &env, "SELECT count(*) FROM runs");
    assert_eq!(python.get("runs"), Some(&(runs as u64)));
}

#[tokio::test(flavor = "multi_thread")]
async fn spec_storage_options_reach_every_command_and_no_environment_is_needed() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "specs").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = spec_file(dir.path(), "s3://specs/graph", &s3_options(&s3));
    let spec = spec.to_str().expect("utf-8");
    // Nothing in the environment: the spec alone says where the server is.
    let none: &[(&'static str, String)] = &[];
    ok(
        "ontology check",
        graphloom(&["ontology", "check", spec], none),
    );
    ok(
        "add",
        graphloom(&["add", spec, "pipelines/facts/procurement.jsonl"], none),
    );
    let nodes = count_in(&["--pipeline", spec], none, "SELECT count(*) FROM nodes");
    assert_eq!(nodes, 35);
    let status = ok("status", graphloom(&["status", "--pipeline", spec], none));
    assert!(status.contains("s3://specs/graph/"), "{status}");
    let recover = ok("recover", graphloom(&["recover", "--pipeline", spec], none));
    assert!(recover.contains("nothing to recover"), "{recover}");
    let eval = ok(
        "eval",
        graphloom(
            &[
                "eval",
                "--pipeline",
                spec,
                "--gold",
                "pipelines/gold/procurement.json",
            ],
            none,
        ),
    );
    assert!(eval.contains("entities: precision"), "{eval}");

    // A storage option no store knows is refused before anything runs.
    let mut bad = s3_options(&s3);
    bad.insert("aws_endpiont".into(), s3.endpoint.clone());
    let bad_dir = tempfile::tempdir().expect("temp dir");
    let bad_spec = spec_file(bad_dir.path(), "s3://specs/graph", &bad);
    let out = graphloom(
        &["ontology", "check", bad_spec.to_str().expect("utf-8")],
        none,
    );
    assert_eq!(out.status.code(), Some(2), "{}", describe("check", &out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown storage option `aws_endpiont`"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_killed_mid_run_on_s3_is_rolled_back_by_recover() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "crash").await;
    let env = s3_env(&s3);
    let graph = "s3://crash/g";
    ok("add", graphloom(&add_args(graph), &env));
    let one = graph_counts(graph, &env);

    // The process dies right after its `edges` commit: nodes, node_labels
    // and edges hold commits that no completed run pinned.
    let mut crash_env = env.clone();
    crash_env.push(("GRAPHLOOM_FAILPOINT", "after_commit:edges=abort".into()));
    let out = graphloom(&add_args(graph), &crash_env);
    assert!(!out.status.success(), "the writer was meant to die");
    assert_eq!(
        graph_counts(graph, &env),
        one,
        "readers see the last completed run"
    );

    let recover = ok("recover", graphloom(&["recover", "--graph", graph], &env));
    for table in ["nodes", "node_labels", "edges"] {
        assert!(
            recover.contains(&format!("rolled back `{table}`")),
            "{table}: {recover}"
        );
    }
    assert_eq!(graph_counts(graph, &env), one);
    let again = ok("recover", graphloom(&["recover", "--graph", graph], &env));
    assert!(again.contains("nothing to recover"), "{again}");

    // Readers without Delta see every file; the export holds the graph.
    let export_dir = "s3://crash/export";
    let exported = ok(
        "export",
        graphloom(
            &["export", "parquet", "--graph", graph, "--to", export_dir],
            &env,
        ),
    );
    assert!(
        exported.contains(&format!(
            "exported {} tables",
            graphloom::store::Table::ALL.len()
        )),
        "{exported}"
    );
    let store = objstore::store_for(
        &objstore::parse_dir_url(export_dir).expect("url"),
        &s3_options(&s3),
    )
    .expect("store");
    assert_eq!(parquet_rows(&*store, "export/nodes.parquet").await, one.0);

    // The GraphRAG export writes through the same destination code.
    let exported = ok(
        "export graphrag",
        graphloom(
            &[
                "export",
                "graphrag",
                "--graph",
                graph,
                "--to",
                "s3://crash/graphrag",
            ],
            &env,
        ),
    );
    assert!(
        exported.contains("exported 4 GraphRAG tables"),
        "{exported}"
    );
    assert_eq!(
        parquet_rows(&*store, "graphrag/entities.parquet").await,
        one.0,
        "one entity per node"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_writer_on_s3_is_turned_away_naming_the_holder() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "busy").await;
    let env = s3_env(&s3);
    let graph = "s3://busy/g";
    ok("add", graphloom(&add_args(graph), &env));

    // The first writer holds the lock while it sleeps after a commit.
    let mut slow = Command::new(common::bin());
    slow.current_dir(common::repo()).args(add_args(graph));
    for (k, v) in &env {
        slow.env(k, v);
    }
    let first = slow
        .env("GRAPHLOOM_FAILPOINT", "after_commit:nodes=sleep:4000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the first writer");
    // Wait (bounded) until its lock object exists.
    let lock_store = objstore::store_for(
        &objstore::parse_dir_url(graph).expect("url"),
        &s3_options(&s3),
    )
    .expect("store");
    let lock = object_store::path::Path::from("g/_graphloom/writer.lock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock_store.head(&lock).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the first writer never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = graphloom(&add_args(graph), &env);
    assert_eq!(
        second.status.code(),
        Some(1),
        "{}",
        describe("second", &second)
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("the graph is being written by run"),
        "{stderr}"
    );
    assert!(stderr.contains("`add`, pid"), "{stderr}");

    let first = first.wait_with_output().expect("first writer");
    assert!(first.status.success(), "{}", describe("first", &first));
    assert_eq!(graph_counts(graph, &env).0, 70, "exactly two adds landed");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abandoned_lock_on_s3_goes_to_exactly_one_of_many_writers() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "race").await;
    let options = s3_options(&s3);
    let store = GraphStore::open("s3://race/g", &options).expect("open");
    // An unreadable lock, as a writer killed mid-put could leave it.
    let raw = objstore::store_for(
        &objstore::parse_dir_url("s3://race/").expect("url"),
        &options,
    )
    .expect("store");
    let lock = object_store::path::Path::from("g/_graphloom/writer.lock");
    for round in 0..3 {
        raw.put(&lock, PutPayload::from_static(b"{\"run_id\": \"torn"))
            .await
            .expect("write a torn lock");
        // Eight writers see the same abandoned lock at once. A takeover is
        // a conditional overwrite of the object they read, so one wins and
        // the others find its fresh lock. (Delete-then-create would let a
        // slow writer delete the winner's lock and win as well.)
        let attempts = (0..8).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.begin("add", "default").await })
        });
        let results = futures::future::join_all(attempts).await;
        let mut won = Vec::new();
        for r in results {
            match r.expect("task") {
                Ok(tx) => won.push(tx),
                Err(StoreError::Locked { .. }) => {}
                Err(e) => panic!("round {round}: unexpected error {e}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: one writer holds the lock");
        let holder = store
            .lock_holder()
            .await
            .expect("read lock")
            .expect("a lock");
        assert_eq!(holder.run_id, won[0].run_id(), "round {round}");
        for tx in won {
            tx.abandon().await.expect("release");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn setup_mistakes_on_s3_are_one_line_errors_that_say_what_to_do() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "present").await;
    let env = s3_env(&s3);
    ok("add", graphloom(&add_args("s3://present/g"), &env));
    let first_line_only = |out: &Output| {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(!stderr.contains("<?xml"), "{stderr}");
        stderr
    };

    // A bucket that does not exist.
    let out = graphloom(&["sql", "--graph", "s3://absent/g", "SELECT 1"], &env);
    assert_eq!(out.status.code(), Some(2), "{}", describe("sql", &out));
    let msg = first_line_only(&out);
    assert!(
        msg.contains("`absent`") && msg.contains("does not exist"),
        "{msg}"
    );
    let out = graphloom(&add_args("s3://absent/g"), &env);
    assert_eq!(out.status.code(), Some(2), "{}", describe("add", &out));
    first_line_only(&out);

    // A path in a real bucket that holds no graph.
    for cmd in [
        vec!["sql", "--graph", "s3://present/typo", "SELECT 1"],
        vec!["status", "--graph", "s3://present/typo"],
        vec!["recover", "--graph", "s3://present/typo"],
        vec![
            "eval",
            "--graph",
            "s3://present/typo",
            "--gold",
            "pipelines/gold/procurement.json",
        ],
    ] {
        let out = graphloom(&cmd, &env);
        assert_eq!(out.status.code(), Some(2), "{}", describe(cmd[0], &out));
        let msg = first_line_only(&out);
        assert!(msg.contains("no graph at s3://present/typo/"), "{msg}");
    }

    // A plain-HTTP endpoint without allow_http.
    let no_http: Vec<_> = env
        .iter()
        .filter(|(k, _)| *k != "AWS_ALLOW_HTTP")
        .cloned()
        .collect();
    let out = graphloom(&["status", "--graph", "s3://present/g"], &no_http);
    assert_eq!(out.status.code(), Some(2), "{}", describe("status", &out));
    let msg = first_line_only(&out);
    assert!(
        msg.contains("plain HTTP") && msg.contains("allow_http"),
        "{msg}"
    );

    // Nothing listening at the endpoint: a runtime error (exit 1).
    let mut nowhere = env.clone();
    nowhere[0].1 = format!("http://127.0.0.1:{}", free_port());
    let out = graphloom(&["status", "--graph", "s3://present/g"], &nowhere);
    assert_eq!(out.status.code(), Some(1), "{}", describe("status", &out));
    let msg = first_line_only(&out);
    assert!(msg.contains("cannot reach the object store"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_credentials_on_s3_are_one_line() {
    // moto checks keys against its IAM once this many requests were let
    // through unchecked: the first one creates the bucket.
    let Some(s3) = moto_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "1")]) else {
        return;
    };
    make_bucket(&s3, "locked").await;
    let out = graphloom(&add_args("s3://locked/g"), &s3_env(&s3));
    assert_eq!(out.status.code(), Some(2), "{}", describe("add", &out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("refused the credentials"), "{stderr}");
    assert!(!stderr.contains("graphloom-test-key-id"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_credential_reaches_graphloom_logs_at_any_level() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "quiet").await;
    let mut env = s3_env(&s3);
    let key_id = "AKIAGRAPHLOOMKEYID77";
    let secret = "graphloom/secret/value/never/printed";
    env[2].1 = key_id.into();
    env[3].1 = secret.into();
    let graph = "s3://quiet/g";
    let mut outputs = Vec::new();
    for level in ["trace", "debug"] {
        let mut args = vec!["--log-level", level];
        args.extend(add_args(graph));
        outputs.push(graphloom(&args, &env));
        outputs.push(graphloom(
            &["--log-level", level, "status", "--graph", graph],
            &env,
        ));
    }
    // Dependency logs too: deltalake logs the object store it is handed.
    let mut everything = env.clone();
    everything.push(("RUST_LOG", "debug".into()));
    let mut cmd = Command::new(common::bin());
    cmd.current_dir(common::repo())
        .args(["sql", "--graph", graph, "SELECT count(*) FROM nodes"]);
    for (k, v) in &everything {
        cmd.env(k, v);
    }
    outputs.push(cmd.output().expect("run graphloom"));
    for out in &outputs {
        assert!(out.status.success(), "{}", describe("command", out));
        for stream in [&out.stdout, &out.stderr] {
            let text = String::from_utf8_lossy(stream);
            assert!(!text.contains(key_id), "key id printed:\n{text}");
            assert!(!text.contains(secret), "secret printed:\n{text}");
        }
    }
    // The debug run did log (so the check above looked at something).
    let debug = String::from_utf8_lossy(&outputs.last().expect("output").stderr).into_owned();
    assert!(
        debug.contains("DEBUG"),
        "RUST_LOG=debug printed no debug lines"
    );
}

/// Entities and facts the scripted model finds, by the words of the text.
fn scripted(req: &ChatRequestView) -> Reply {
    let system = req.last("system").unwrap_or_default();
    let user = req.last("user").unwrap_or_default();
    let current = user.split("<CURRENT EPISODE").nth(1).unwrap_or(user);
    if user.contains("TASK: list the named entities") {
        let mut entities = Vec::new();
        for (name, ty) in [
            ("Priya Raman", "Person"),
            ("Acme Corp", "Company"),
            ("Brightline Systems", "Company"),
        ] {
            if current.contains(name) {
                entities.push(json!({"name": name, "type": ty, "attributes": []}));
            }
        }
        Reply::json(&json!({ "entities": entities }))
    } else if user.contains("TASK: state every fact") {
        let facts = if current.contains("joined Brightline Systems") {
            json!([{"source": "Priya Raman", "target": "Brightline Systems", "relation_type": "EMPLOYED_BY", "fact": "Priya Raman works for Brightline Systems.", "valid_at": "2025-03-10", "invalid_at": null}])
        } else {
            json!([])
        };
        Reply::json(&json!({ "facts": facts }))
    } else if system.contains("already classified as") {
        let n = user.matches("\n[").count() + usize::from(user.starts_with('['));
        let items: Vec<Value> = (1..=n.max(1))
            .map(|id| json!({"id": id, "subtype": "none", "attributes": []}))
            .collect();
        crate::common::walk_reply(items)
    } else {
        Reply::error(400, "unexpected prompt", "invalid_request_error", None)
    }
}

const EPISODES: &str = r#"{"id": "m1", "content": "Priya Raman works at Acme Corp.", "kind": "message", "reference_time": "2025-01-05T09:00:00Z"}
{"id": "m2", "content": "Priya Raman joined Brightline Systems on 10 March.", "kind": "message", "reference_time": "2025-03-12T09:00:00Z"}
{"id": "m3", "content": "Acme Corp and Brightline Systems met.", "kind": "message", "reference_time": "2025-04-01T09:00:00Z"}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn run_reads_its_source_and_writes_graph_and_cache_on_s3() {
    let Some(s3) = moto() else { return };
    make_bucket(&s3, "archive").await;
    let options = s3_options(&s3);
    let bucket = objstore::store_for(
        &objstore::parse_dir_url("s3://archive/").expect("url"),
        &options,
    )
    .expect("store");
    bucket
        .put(
            &object_store::path::Path::from("episodes/chat.jsonl"),
            PutPayload::from_static(EPISODES.as_bytes()),
        )
        .await
        .expect("upload episodes");

    let llm = TestServer::start(Behavior::with_responder(scripted))
        .await
        .expect("test LLM server");
    let (mut spec, ontology) = common::procurement();
    spec.source = Some(SourceSpec {
        url: "s3://archive/episodes/".into(),
        ..spec.source.clone().expect("example has a source")
    });
    spec.output.graph = "s3://archive/graph".into();
    spec.output.storage_options = options.clone();
    spec.llm.base_url = llm.base_url();
    spec.llm.extra_body = Default::default();
    spec.llm.max_attempts = 2;
    let store = GraphStore::open(&spec.output.graph, &options).expect("open");
    let report = graphloom::run::run(&spec, &ontology, &store, &RunOptions::default())
        .await
        .expect("run on S3");
    assert_eq!((report.episodes_seen, report.episodes_added), (3, 3));
    assert_eq!(report.nodes_added, 3, "{report:?}");
    assert_eq!(report.edges_added, 1, "{report:?}");
    let first_calls = llm.requests().len();
    assert!(
        first_calls >= 6,
        "entity and fact calls per episode: {first_calls}"
    );

    // The response cache lives under the graph on S3.
    let cached = futures::TryStreamExt::try_collect::<Vec<_>>(
        bucket.list(Some(&object_store::path::Path::from("graph/_cache/llm"))),
    )
    .await
    .expect("list cache");
    assert!(cached.len() >= 6, "cache entries on S3: {}", cached.len());

    // Into a fresh graph with the same cache: every call is a hit.
    let mut replay = spec.clone();
    replay.output.graph = "s3://archive/graph-replay".into();
    replay.llm.cache_url = Some("s3://archive/graph/_cache/llm/".into());
    let replay_store = GraphStore::open(&replay.output.graph, &options).expect("open");
    let again = graphloom::run::run(&replay, &ontology, &replay_store, &RunOptions::default())
        .await
        .expect("replay");
    assert_eq!(
        llm.requests().len(),
        first_calls,
        "no call reached the server"
    );
    // The warm-up call (llm.warm_prefix) is not cached.
    let warm_ups = common::warm_ups(&llm.requests());
    assert_eq!(warm_ups, 1);
    assert_eq!(again.cache_hits as usize, first_calls - warm_ups);
    assert_eq!((again.nodes_added, again.edges_added), (3, 1));

    // And the first graph, re-run: nothing new to do.
    let rerun = graphloom::run::run(&spec, &ontology, &store, &RunOptions::default())
        .await
        .expect("re-run");
    assert_eq!((rerun.episodes_skipped, rerun.episodes_added), (3, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn add_sql_status_recover_and_export_on_azurite() {
    let Some(az) = azurite() else { return };
    make_container(&az, "graphs");
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = spec_file(dir.path(), "az://graphs/procurement", &azure_options());
    let spec = spec.to_str().expect("utf-8");
    let env = azure_env(&az);
    let none = env.as_slice();
    ok(
        "add",
        graphloom(&["add", spec, "pipelines/facts/procurement.jsonl"], none),
    );
    let contracts = || {
        count_in(
            &["--pipeline", spec],
            none,
            "SELECT count(*) FROM nodes WHERE has_label(labels, 'Contract')",
        )
    };
    // Contract and its subtypes: 2 MSAs, 3 order forms, 7 POs, 1 contract.
    assert_eq!(contracts(), 13);
    let mut crash = env.clone();
    crash.push(("GRAPHLOOM_FAILPOINT", "after_commit:nodes=abort".into()));
    let out = graphloom(&["add", spec, "pipelines/facts/procurement.jsonl"], &crash);
    assert!(!out.status.success(), "the writer was meant to die");
    assert_eq!(contracts(), 13, "the crashed add is invisible");
    let recover = ok("recover", graphloom(&["recover", "--pipeline", spec], none));
    assert!(recover.contains("rolled back `nodes`"), "{recover}");
    ok(
        "add",
        graphloom(&["add", spec, "pipelines/facts/procurement.jsonl"], none),
    );
    let status = ok("status", graphloom(&["status", "--pipeline", spec], none));
    assert_eq!(status_rows(&status, "nodes"), 70);
    let export = tempfile::tempdir().expect("temp dir");
    let exported = ok(
        "export",
        graphloom(
            &[
                "export",
                "parquet",
                "--pipeline",
                spec,
                "--to",
                export.path().to_str().expect("utf-8"),
            ],
            none,
        ),
    );
    assert!(
        exported.contains(&format!(
            "exported {} tables",
            graphloom::store::Table::ALL.len()
        )),
        "{exported}"
    );
    assert!(export.path().join("nodes.parquet").is_file());
}

#[test]
fn cloud_schemes_have_delta_log_stores() {
    // Building a table handle needs deltalake's log store for the scheme
    // (registered by its s3/azure/gcs features); no request is made. GCS
    // has no local server here, so this is what is tested of `gs://`.
    let azure: BTreeMap<String, String> = [(
        "azure_storage_account_name".to_string(),
        "account".to_string(),
    )]
    .into();
    for (url, options) in [
        ("s3://b/g", BTreeMap::new()),
        ("az://c/g", azure.clone()),
        ("abfss://c@account.dfs.core.windows.net/g", azure),
        ("gs://b/g", BTreeMap::new()),
    ] {
        let store = GraphStore::open(url, &options).unwrap_or_else(|e| panic!("{url}: {e}"));
        let table = store.table_url(graphloom::store::Table::Nodes);
        let builder = deltalake::DeltaTableBuilder::from_url(table.clone())
            .expect("builder")
            .with_storage_backend(
                std::sync::Arc::new(object_store::memory::InMemory::new()),
                table,
            );
        assert!(builder.build().is_ok(), "{url}: no Delta log store");
    }
}
