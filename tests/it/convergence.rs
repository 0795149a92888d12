//! One archive, one graph: an archive that grows chunk by chunk gives the
//! same graph whether each chunk gets one uninterrupted `graphloom run`,
//! runs SIGKILLed at random moments and re-run, or one run over the whole
//! archive at the end; and `graphloom add` killed at random moments leaves
//! the previous graph, so re-running the adds that did not land gives the
//! uninterrupted graph.
//!
//! The archive: people at a handful of companies sign purchase orders and
//! move between companies, back to earlier ones too, with
//! `EMPLOYED_BY` functional. The test server answers every prompt from the
//! episode text, the same way every time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use graphloom::llm::test_server::{Behavior, ChatRequestView, Reply, TestServer};
use graphloom::store::GraphStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common;

const PEOPLE: [&str; 10] = [
    "Ana Lima",
    "Bruno Costa",
    "Chen Wei",
    "Dara Okafor",
    "Elif Sahin",
    "Farah Haddad",
    "Goran Petrov",
    "Hana Sato",
    "Ivan Novak",
    "Julia Berg",
];
/// Pairs of companies whose names differ in one word that is not a legal
/// suffix ("Acme Corp" folds to "acme", which must not make "Acme Labs"
/// its longer form): eight companies, never four.
const COMPANIES: [&str; 8] = [
    "Acme Corp",
    "Acme Labs",
    "Globex Corp",
    "Globex Labs",
    "Initech Corp",
    "Initech Labs",
    "Umbrella Corp",
    "Umbrella Labs",
];
const CHUNKS: usize = 6;
const PER_CHUNK: usize = 30;
/// Kills per chunk: 18 in all, of which at least 10 must land mid-run.
const KILLS_PER_CHUNK: usize = 3;

/// Chunk `c` of the archive as JSON lines: every episode a person signing
/// a purchase order at their current company, or moving to another one
/// (often one they worked for before), three hours apart.
fn archive(seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut employer: Vec<usize> = (0..PEOPLE.len()).map(|p| p % COMPANIES.len()).collect();
    let start = chrono::DateTime::parse_from_rfc3339("2025-01-06T08:00:00Z").expect("time");
    let mut chunks = Vec::new();
    for c in 0..CHUNKS {
        let mut lines = String::new();
        for k in 0..PER_CHUNK {
            let n = c * PER_CHUNK + k;
            let at = (start + chrono::Duration::hours(3 * n as i64))
                .with_timezone(&chrono::Utc)
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let p = rng.random_range(0..PEOPLE.len());
            let content = if rng.random_bool(0.2) {
                employer[p] =
                    (employer[p] + rng.random_range(1..COMPANIES.len())) % COMPANIES.len();
                format!("{} has joined {}.", PEOPLE[p], COMPANIES[employer[p]])
            } else {
                format!(
                    "{} of {} signed PO-{}.",
                    PEOPLE[p],
                    COMPANIES[employer[p]],
                    4000 + n
                )
            };
            let line = json!({"id": format!("m{n}"), "content": content, "kind": "message", "reference_time": at});
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
        chunks.push(lines);
    }
    chunks
}

/// (person, company, purchase order) read back from an episode's text.
fn parse(content: &str) -> Option<(&str, &str, Option<&str>)> {
    let content = content.trim().trim_end_matches('.');
    if let Some((p, c)) = content.split_once(" has joined ") {
        return Some((p, c, None));
    }
    let (p, rest) = content.split_once(" of ")?;
    let (c, po) = rest.split_once(" signed ")?;
    Some((p, c, Some(po)))
}

/// Answers extraction and both subtype walks from the text.
fn answer(req: &ChatRequestView) -> Reply {
    let system = req.last("system").unwrap_or_default();
    let user = req.last("user").unwrap_or_default();
    let current = user
        .split("<CURRENT EPISODE")
        .nth(1)
        .and_then(|b| b.split_once(">\n"))
        .and_then(|(_, b)| b.split_once("\n</CURRENT EPISODE>"))
        .map(|(content, _)| content);
    let at = user
        .split("REFERENCE TIME (when the current episode was written): ")
        .nth(1)
        .map(|t| t.trim().chars().take(20).collect::<String>());
    if user.contains("TASK: list the named entities") {
        let Some((p, c, po)) = current.and_then(parse) else {
            return Reply::json(&json!({"entities": []}));
        };
        let mut list = vec![
            json!({"name": p, "type": "Person", "attributes": []}),
            json!({"name": c, "type": "Company", "attributes": []}),
        ];
        if let Some(po) = po {
            list.push(json!({"name": po, "type": "Contract", "attributes": []}));
        }
        Reply::json(&json!({ "entities": list }))
    } else if user.contains("TASK: state every fact") {
        let Some((p, c, po)) = current.and_then(parse) else {
            return Reply::json(&json!({"facts": []}));
        };
        let mut list = vec![json!({
            "source": p, "target": c, "relation_type": "EMPLOYED_BY",
            "fact": format!("{p} works at {c}."), "valid_at": at, "invalid_at": null
        })];
        if let Some(po) = po {
            list.push(json!({
                "source": p, "target": po, "relation_type": "SIGNED",
                "fact": format!("{p} signed {po}."), "valid_at": at, "invalid_at": null
            }));
        }
        Reply::json(&json!({ "facts": list }))
    } else if system.contains("already classified as") {
        let facts = system.contains("is a fact");
        let mut items = Vec::new();
        for block in user.split("\n[") {
            let Some((id, text)) = block.trim_start_matches('[').split_once(']') else {
                continue;
            };
            let Ok(id) = id.parse::<u64>() else { continue };
            items.push(if facts {
                let sub = if text.contains(" works at ") {
                    "WORKS_FULL_TIME_FOR"
                } else {
                    "none"
                };
                json!({"id": id, "subtype": sub})
            } else if let Some(po) = text.split_whitespace().find(|w| w.starts_with("PO-")) {
                json!({"id": id, "subtype": "PurchaseOrder",
                       "attributes": [{"name": "po_number", "value": po}]})
            } else {
                json!({"id": id, "subtype": "none", "attributes": []})
            });
        }
        crate::common::walk_reply(items)
    } else {
        Reply::error(400, "unexpected prompt", "invalid_request_error", None)
    }
}

/// The example pipeline's ontology, reading `source` and calling `server`
/// as fast as it answers. LLM-judged contradictions are off (as in the
/// example pipeline): they are judgements over the candidates of one run,
/// not a deterministic path.
fn pipeline(dir: &Path, source: &Path, server: &TestServer) -> PathBuf {
    let toml = std::fs::read_to_string(common::repo().join("pipelines/procurement.toml"))
        .expect("example pipeline")
        .replace(
            "file://./pipelines/data/procurement/",
            &format!("{}/", source.to_str().expect("utf-8")),
        )
        .replace("http://127.0.0.1:8093/v1", &server.base_url());
    assert!(
        toml.contains("judge_contradictions = false"),
        "the example pipeline judges no contradictions"
    );
    let mut doc: toml::Table = toml::from_str(&toml).expect("example pipeline is TOML");
    let llm = doc
        .get_mut("llm")
        .and_then(|l| l.as_table_mut())
        .expect("[llm]");
    for (key, value) in [
        ("requests_per_minute", 100_000),
        ("max_concurrency", 8),
        ("timeout_secs", 30),
    ] {
        assert!(
            llm.insert(key.into(), value.into()).is_some(),
            "the example pipeline sets llm.{key}"
        );
    }
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, toml::to_string(&doc).expect("pipeline")).expect("write pipeline");
    path
}

fn command(args: &[&str], pipeline: &Path, graph: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(common::bin());
    cmd.args(args)
        .arg(pipeline)
        .args(["--graph", graph.to_str().expect("utf-8")])
        .env_remove("GRAPHLOOM_FAILPOINT")
        .stdin(Stdio::null());
    cmd
}

/// Runs to the end; returns how long it took.
async fn finish(mut cmd: tokio::process::Command, what: &str) -> Duration {
    let t = Instant::now();
    let out = cmd.output().await.expect("spawn graphloom");
    assert!(out.status.success(), "{}", common::describe(what, &out));
    t.elapsed()
}

/// Starts the command and SIGKILLs it after `after`; true if it was still
/// running then (the kill landed mid-run).
async fn kill_after(mut cmd: tokio::process::Command, after: Duration) -> bool {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn graphloom");
    tokio::time::sleep(after).await;
    let running = child.try_wait().expect("poll child").is_none();
    child.kill().await.expect("kill");
    running
}

fn open(graph: &Path) -> GraphStore {
    GraphStore::open(graph.to_str().expect("utf-8"), &Default::default()).expect("open graph")
}

/// Everything a user sees of the graph, without ids and run times;
/// nothing for a graph with no completed run yet (or none at all).
async fn content(graph: &Path) -> Vec<Vec<Value>> {
    // A kill can land while the first run creates the tables: a `runs`
    // directory without a log is no graph yet either.
    let store = open(graph);
    match store.require_graph().await {
        Ok(()) => {}
        Err(graphloom::store::StoreError::NoGraph { .. }) => return Vec::new(),
        Err(e) => panic!("reading {}: {e}", graph.display()),
    }
    let tables = crate::run_pipeline::content(&store).await;
    if tables.iter().all(Vec::is_empty) {
        return Vec::new();
    }
    tables
}

/// The first rows that differ, table by table, for failure messages.
fn diff(a: &[Vec<Value>], b: &[Vec<Value>]) -> String {
    let mut out = String::new();
    for (t, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            let first = x.iter().zip(y).position(|(r, s)| r != s);
            out.push_str(&format!(
                "\ntable {t}: {} vs {} rows; first difference: {:?}",
                x.len(),
                y.len(),
                first.map(|i| (&x[i], &y[i]))
            ));
        }
    }
    if a.len() != b.len() {
        out.push_str(&format!("\n{} vs {} tables", a.len(), b.len()));
    }
    out
}

/// A delay in the middle 90% of a run that took `took`.
fn somewhere_in(rng: &mut StdRng, took: Duration) -> Duration {
    took.mul_f64(rng.random_range(0.05..0.95))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_growing_archive_gives_one_graph_in_chunks_with_random_kills_and_in_one_run() {
    let server = TestServer::start(Behavior::with_responder(answer))
        .await
        .expect("test server");
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("archive");
    std::fs::create_dir_all(&source).expect("mkdir");
    let pipeline = pipeline(dir.path(), &source, &server);
    let (chunked, killed, whole) = (
        dir.path().join("chunked"),
        dir.path().join("killed"),
        dir.path().join("whole"),
    );
    let mut rng = StdRng::seed_from_u64(10);
    let (mut landed, mut attempts) = (0, 0);
    let mut before = Vec::new();
    for (c, chunk) in archive(7).iter().enumerate() {
        std::fs::write(source.join(format!("chunk-{c:02}.jsonl")), chunk).expect("write chunk");
        let took = finish(command(&["run"], &pipeline, &chunked), "chunked run").await;
        let next = content(&chunked).await;
        // Kills at random moments of a run as long as the uninterrupted
        // one; whatever a kill left must read as the graph before that
        // run or as the finished run, never in between.
        for _ in 0..KILLS_PER_CHUNK {
            attempts += 1;
            let mid = kill_after(
                command(&["run"], &pipeline, &killed),
                somewhere_in(&mut rng, took),
            )
            .await;
            landed += usize::from(mid);
            let now = content(&killed).await;
            assert!(
                now == before || now == next,
                "chunk {c}: a killed run left a graph that is neither the last nor the next one: {}",
                diff(&now, &next)
            );
        }
        finish(command(&["run"], &pipeline, &killed), "re-run after kills").await;
        let got = content(&killed).await;
        assert!(
            got == next,
            "chunk {c}: killed and re-run vs uninterrupted: {}",
            diff(&got, &next)
        );
        before = next;
    }
    eprintln!("{landed} of {attempts} kills landed mid-run");
    assert!(
        landed >= 10,
        "only {landed} of {attempts} kills landed mid-run"
    );
    finish(command(&["run"], &pipeline, &whole), "one run").await;
    let expected = before;
    let got = content(&whole).await;
    assert!(
        got == expected,
        "one run over the archive vs one run per chunk: {}",
        diff(&got, &expected)
    );

    // Not a trivial graph: someone went back to an earlier employer, and
    // that return is an interval of its own.
    let returns = crate::run_pipeline::query(
        &open(&chunked),
        "SELECT s.name, t.name AS company, count(*) AS n FROM edges e \
         JOIN nodes s ON s.node_id = e.source_node_id JOIN nodes t ON t.node_id = e.target_node_id \
         WHERE edge_type_matches(e.relation_type, 'EMPLOYED_BY') GROUP BY 1, 2 HAVING count(*) > 1",
    )
    .await;
    assert!(!returns.is_empty(), "no return to an earlier employer");
    let current = crate::run_pipeline::query(
        &open(&chunked),
        "SELECT s.name, count(*) AS n FROM edges e JOIN nodes s ON s.node_id = e.source_node_id \
         WHERE edge_type_matches(e.relation_type, 'EMPLOYED_BY') AND e.expired_at IS NULL \
         GROUP BY 1 HAVING count(*) <> 1",
    )
    .await;
    assert!(
        current.is_empty(),
        "everyone has one current employer: {current:?}"
    );
    assert_eq!(
        company_names(&chunked).await,
        COMPANIES,
        "one node per company, Corp and Labs apart"
    );
}

/// The names of the graph's company nodes, sorted.
async fn company_names(graph: &Path) -> Vec<String> {
    crate::run_pipeline::query(
        &open(graph),
        "SELECT name FROM nodes WHERE has_label(labels, 'Company') ORDER BY name",
    )
    .await
    .iter()
    .map(|r| r["name"].as_str().expect("name").to_string())
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_slice_through_source_then_the_whole_archive_gives_the_graph_of_one_run() {
    let server = TestServer::start(Behavior::with_responder(answer))
        .await
        .expect("test server");
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("archive");
    std::fs::create_dir_all(&source).expect("mkdir");
    for (c, chunk) in archive(11).iter().take(3).enumerate() {
        std::fs::write(source.join(format!("chunk-{c:02}.jsonl")), chunk).expect("write chunk");
    }
    let pipeline = pipeline(dir.path(), &source, &server);
    let (sliced, whole) = (dir.path().join("sliced"), dir.path().join("whole"));
    // The oldest file, as a first slice of an archive usually is.
    let slice = source.join("chunk-00.jsonl");
    let mut first = command(&["run"], &pipeline, &sliced);
    first.args(["--source", slice.to_str().expect("utf-8")]);
    finish(first, "run over the slice").await;
    let report = crate::run_pipeline::query(
        &open(&sliced),
        "SELECT episodes_added AS n FROM runs WHERE status = 'completed'",
    )
    .await;
    assert_eq!(report.len(), 1);
    assert_eq!(
        report[0]["n"].as_u64(),
        Some(PER_CHUNK as u64),
        "only the slice's file was read"
    );
    finish(
        command(&["run"], &pipeline, &sliced),
        "run over the archive",
    )
    .await;
    let rest = crate::run_pipeline::query(
        &open(&sliced),
        "SELECT episodes_skipped AS skipped, episodes_added AS added FROM runs ORDER BY run_seq",
    )
    .await;
    assert_eq!(
        (rest[1]["skipped"].as_u64(), rest[1]["added"].as_u64()),
        (Some(PER_CHUNK as u64), Some(2 * PER_CHUNK as u64)),
        "the archive run skips what the slice committed: {rest:?}"
    );
    finish(command(&["run"], &pipeline, &whole), "one run").await;
    let (got, expected) = (content(&sliced).await, content(&whole).await);
    assert!(
        got == expected,
        "slice then archive vs one run: {}",
        diff(&got, &expected)
    );
}

/// Lines for `graphloom add`: chunk `c` holds people, companies and
/// purchase orders, and who signed which.
fn add_chunks() -> Vec<String> {
    (0..4)
        .map(|c| {
            let mut out = String::new();
            for k in 0..30 {
                let n = c * 30 + k;
                let lines = [
                    json!({"node": {"name": format!("Buyer {n}"), "type": "Person"}}),
                    json!({"node": {"name": format!("PO-{}", 9000 + n), "type": "PurchaseOrder",
                                    "attributes": {"po_number": format!("PO-{}", 9000 + n)}}}),
                    json!({"fact": {"source": format!("Buyer {n}"), "target": format!("PO-{}", 9000 + n),
                                    "relation_type": "SIGNED", "fact": format!("Buyer {n} signed PO-{}.", 9000 + n),
                                    "valid_at": "2025-02-01"}}),
                ];
                for l in lines {
                    out.push_str(&l.to_string());
                    out.push('\n');
                }
            }
            out
        })
        .collect()
}

async fn completed_adds(graph: &Path) -> Value {
    if !graph.join("runs").exists() {
        return json!(0);
    }
    crate::run_pipeline::query(
        &open(graph),
        "SELECT count(*) AS n FROM runs WHERE command = 'add' AND status = 'completed'",
    )
    .await
    .first()
    .map_or(Value::Null, |r| r["n"].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_add_leaves_the_previous_graph_and_adding_again_what_did_not_land_converges() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pipeline = common::repo().join("pipelines/procurement.toml");
    let (clean, killed) = (dir.path().join("clean"), dir.path().join("killed"));
    let mut rng = StdRng::seed_from_u64(11);
    let mut landed = 0;
    for (c, chunk) in add_chunks().iter().enumerate() {
        let file = dir.path().join(format!("add-{c}.jsonl"));
        std::fs::write(&file, chunk).expect("write");
        let file = file.to_str().expect("utf-8");
        let mut cmd = command(&["add"], &pipeline, &clean);
        cmd.arg(file);
        let took = finish(cmd, "add").await;
        let before = (content(&killed).await, completed_adds(&killed).await);
        let mut cmd = command(&["add"], &pipeline, &killed);
        cmd.arg(file);
        landed += usize::from(kill_after(cmd, somewhere_in(&mut rng, took)).await);
        let after = (content(&killed).await, completed_adds(&killed).await);
        if after.1 == before.1 {
            assert!(
                after.0 == before.0,
                "chunk {c}: a killed add changed the graph: {}",
                diff(&after.0, &before.0)
            );
            // Documented: an add that did not land is run again.
            let mut cmd = command(&["add"], &pipeline, &killed);
            cmd.arg(file);
            finish(cmd, "add again").await;
        }
        let (got, want) = (content(&killed).await, content(&clean).await);
        assert!(
            got == want,
            "chunk {c}: killed add (re-run if it did not land) vs uninterrupted: {}",
            diff(&got, &want)
        );
    }
    eprintln!("{landed} of 4 kills landed mid-add");
    assert!(landed >= 2, "only {landed} of 4 kills landed mid-add");
}
