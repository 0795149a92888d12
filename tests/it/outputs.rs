//! Outputs people load elsewhere or look at: `graphloom export graphrag`
//! read back by the `graphrag` package's own readers and context builders,
//! and the `graphloom view` / `graphloom report` pages opened in headless
//! Chromium (tests/browser/check_page.mjs), their drawn counts checked
//! against `graphloom sql`.
//!
//! GraphRAG runs from its own virtualenv (scripts/setup.sh:
//! /var/cache/graphloom-tools/graphrag-venv, or GRAPHLOOM_GRAPHRAG_PYTHON);
//! the browser tests need Debian's chromium and playwright-core
//! (/var/cache/graphloom-tools/playwright). Without them these tests fail,
//! unless GRAPHLOOM_SKIP_INTEROP=1 (GraphRAG) or GRAPHLOOM_SKIP_BROWSER=1.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

use graphloom::run::RunOptions;
use serde_json::Value;

use crate::common::{self, describe, repo};
use crate::run_pipeline::{Fixture, query};

const PLAYWRIGHT: &str = "/var/cache/graphloom-tools/playwright/node_modules";
const GRAPHRAG_PYTHON: &str = "/var/cache/graphloom-tools/graphrag-venv/bin/python";

/// The batch-mode corpus (summaries, embeddings, an employment change the
/// contradiction judge ends) run twice: the first run loses one episode to
/// a failing server (a `failures` row), the second adds it.
async fn graph() -> Fixture {
    let f = crate::batch_mode::corpus(|_| {}).await;
    let ontology = graphloom::ontology::Ontology::try_from(&f.spec.ontology).expect("ontology");
    f.fail_entities.store(true, Ordering::SeqCst);
    graphloom::run::run(&f.spec, &ontology, &f.store, &RunOptions::default())
        .await
        .expect("first run");
    f.fail_entities.store(false, Ordering::SeqCst);
    graphloom::run::run(&f.spec, &ontology, &f.store, &RunOptions::default())
        .await
        .expect("second run");
    f
}

fn graph_url(f: &Fixture) -> String {
    f.store.display_url()
}

async fn count(f: &Fixture, sql: &str) -> u64 {
    query(&f.store, sql).await[0]["n"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count for {sql}"))
}

/// Runs the graphloom binary; panics with its output unless it succeeds.
fn run_ok(args: &[&str]) -> String {
    common::ok(common::graphloom(args), &format!("graphloom {args:?}"))
}

fn skip(var: &str, problem: &str) -> bool {
    if std::env::var(var).as_deref() == Ok("1") {
        eprintln!("note: skipping ({var}=1): {problem}");
        return true;
    }
    panic!("{problem}\nscripts/setup.sh installs it; or set {var}=1 to skip this test");
}

/// `graphrag_load.py`'s JSON for an export directory, or `None` if GraphRAG
/// is missing and skipping is allowed.
fn load_with_graphrag(dir: &Path) -> Option<Value> {
    let python = std::env::var("GRAPHLOOM_GRAPHRAG_PYTHON").unwrap_or(GRAPHRAG_PYTHON.into());
    if !Path::new(&python).exists() {
        skip(
            "GRAPHLOOM_SKIP_INTEROP",
            &format!("no GraphRAG python at {python}"),
        )
        .then_some(())?;
    }
    let out = Command::new(&python)
        .arg("tests/interop/graphrag_load.py")
        .arg(dir)
        .current_dir(repo())
        .output()
        .expect("run graphrag_load.py");
    assert!(
        out.status.success(),
        "{}",
        describe("graphrag_load.py", &out)
    );
    Some(serde_json::from_slice(&out.stdout).expect("graphrag_load.py prints JSON"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphrag_export_loads_in_graphrag_and_matches_the_graph() {
    let f = graph().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let all = dir.path().join("all");
    let current = dir.path().join("current");
    let url = graph_url(&f);
    run_ok(&[
        "export",
        "graphrag",
        "--graph",
        &url,
        "--to",
        all.to_str().unwrap(),
    ]);
    run_ok(&[
        "export",
        "graphrag",
        "--graph",
        &url,
        "--to",
        current.to_str().unwrap(),
        "--current-only",
    ]);
    let Some(got) = load_with_graphrag(&all) else {
        return;
    };

    let nodes = count(&f, "SELECT count(*) AS n FROM nodes").await;
    let edges = count(&f, "SELECT count(*) AS n FROM edges").await;
    let episodes = count(&f, "SELECT count(*) AS n FROM episodes").await;
    let documents = count(
        &f,
        "SELECT count(DISTINCT coalesce(document_id, source_uri)) AS n FROM episodes",
    )
    .await;
    assert!(
        nodes > 3 && edges > 3 && episodes > 3,
        "a real graph: {got}"
    );
    assert_eq!(got["rows"]["entities"], nodes, "{got}");
    assert_eq!(got["rows"]["relationships"], edges, "{got}");
    assert_eq!(got["rows"]["text_units"], episodes, "{got}");
    assert_eq!(got["rows"]["documents"], documents, "{got}");
    // Through GraphRAG's data model, not only its DataFrames.
    assert_eq!(got["entities"], nodes);
    assert_eq!(got["relationships"], edges);
    for (table, ok) in got["final_columns_first"].as_object().expect("object") {
        assert_eq!(ok, true, "{table} must lead with GraphRAG's columns: {got}");
    }
    assert_eq!(got["titles_unique"], true);
    assert_eq!(got["relationship_endpoints_known"], true);
    // Summaries are on in this corpus: they are the entities' descriptions.
    let summarised = count(
        &f,
        "SELECT count(*) AS n FROM nodes WHERE summary IS NOT NULL",
    )
    .await;
    assert!(summarised > 0);
    assert_eq!(got["described_entities"], summarised);
    // The local search context of the best-connected entity has its
    // relationships and the episodes that mention it.
    let local = &got["local_context"];
    assert!(
        local["relationship_rows"].as_u64().unwrap_or(0) > 0,
        "{local}"
    );
    assert!(local["source_units"].as_u64().unwrap_or(0) > 0, "{local}");

    // Facts that no longer hold: in the full export with their end in the
    // description; left out with --current-only.
    let ended = count(
        &f,
        "SELECT count(*) AS n FROM edges WHERE expired_at IS NOT NULL OR invalid_at <= now()",
    )
    .await;
    assert!(ended > 0, "the corpus ends an employment");
    let described = got["ended_relationships"].as_array().expect("list");
    assert_eq!(described.len() as u64, ended, "{described:?}");
    let Some(cur) = load_with_graphrag(&current) else {
        return;
    };
    assert_eq!(cur["rows"]["relationships"], edges - ended);
    assert_eq!(cur["ended_relationships"].as_array().map(Vec::len), Some(0));
    assert_eq!(cur["rows"]["entities"], nodes);
}

/// What check_page.mjs printed for a page, or `None` when the browser is
/// missing and skipping is allowed.
fn check_page(page: &Path, sets: &[&str], screenshot: Option<&Path>) -> Option<Value> {
    if !Path::new("/usr/bin/chromium").exists() || !Path::new(PLAYWRIGHT).exists() {
        skip(
            "GRAPHLOOM_SKIP_BROWSER",
            &format!("needs /usr/bin/chromium and playwright-core in {PLAYWRIGHT}"),
        )
        .then_some(())?;
    }
    let mut cmd = Command::new("node");
    cmd.arg("tests/browser/check_page.mjs")
        .arg(page)
        .env("NODE_PATH", PLAYWRIGHT)
        .current_dir(repo());
    for s in sets {
        cmd.args(["--set", s]);
    }
    if let Some(shot) = screenshot {
        cmd.arg("--screenshot").arg(shot);
    }
    let out = cmd.output().expect("run node");
    assert!(out.status.success(), "{}", describe("check_page.mjs", &out));
    let got: Value = serde_json::from_slice(&out.stdout).expect("check_page prints JSON");
    assert_eq!(
        got["errors"],
        serde_json::json!([]),
        "the page must load cleanly: {got}"
    );
    Some(got)
}

/// A count the page exposes (`data-*` of its counts element).
fn drawn(counts: &Value, key: &str) -> u64 {
    counts[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no `{key}` count in {counts}"))
}

/// Where the screenshots go: kept beside the build (CI keeps the target
/// directory), and into docs/images for the guides when
/// GRAPHLOOM_UPDATE_SCREENSHOTS=1.
fn artifact(name: &str) -> PathBuf {
    let dir = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join("target"))
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("artifact dir");
    dir.join(name)
}

fn keep_for_readme(shot: &Path, name: &str) {
    if std::env::var("GRAPHLOOM_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        let to = repo().join("docs/images").join(name);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("docs/images");
        std::fs::copy(shot, &to).expect("copy screenshot");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_draws_the_graph_and_its_label_and_time_filters_match_sql() {
    let f = graph().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let page = dir.path().join("graph.html");
    let url = graph_url(&f);
    run_ok(&["view", "--graph", &url, "--out", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).expect("page");
    assert!(
        html.contains("Copyright"),
        "the bundled library's license travels with it"
    );

    let as_of = "2025-03-15T00:00:00Z";
    let shot = artifact("view.png");
    let Some(got) = check_page(
        &page,
        &[
            "#label-filter=Contract",
            "#label-filter=",
            &format!("#as-of-text={as_of}"),
        ],
        Some(&shot),
    ) else {
        return;
    };
    keep_for_readme(&shot, "view.png");
    let nodes = count(&f, "SELECT count(*) AS n FROM nodes").await;
    let edges = count(&f, "SELECT count(*) AS n FROM edges").await;
    assert_eq!(drawn(&got["counts"], "nodes"), nodes, "{got}");
    assert_eq!(drawn(&got["counts"], "edges"), edges, "{got}");

    // A parent label keeps its subtypes' nodes (PO-1 is a PurchaseOrder).
    let contract = count(
        &f,
        "SELECT count(*) AS n FROM nodes WHERE has_label(labels, 'Contract')",
    )
    .await;
    let contract_edges = count(
        &f,
        "SELECT count(*) AS n FROM edges e \
         JOIN nodes s ON s.node_id = e.source_node_id JOIN nodes t ON t.node_id = e.target_node_id \
         WHERE has_label(s.labels, 'Contract') AND has_label(t.labels, 'Contract')",
    )
    .await;
    let leaf = count(&f, "SELECT count(*) AS n FROM nodes WHERE type <> 'Contract' AND has_label(labels, 'Contract')").await;
    assert!(leaf > 0, "the corpus has a Contract subtype node");
    let steps = got["steps"].as_array().expect("steps");
    assert_eq!(drawn(&steps[0]["counts"], "nodes"), contract, "{got}");
    assert_eq!(drawn(&steps[0]["counts"], "edges"), contract_edges, "{got}");
    assert_eq!(drawn(&steps[1]["counts"], "nodes"), nodes, "{got}");

    // As of a time: the edges valid then.
    let valid_then = count(
        &f,
        &format!(
            "SELECT count(*) AS n FROM edges WHERE (valid_at IS NULL OR valid_at <= TIMESTAMP '{as_of}') \
             AND (invalid_at IS NULL OR invalid_at > TIMESTAMP '{as_of}') \
             AND (expired_at IS NULL OR expired_at > TIMESTAMP '{as_of}')"
        ),
    )
    .await;
    assert!(
        valid_then < edges,
        "the time filter must hide something here"
    );
    assert_eq!(drawn(&steps[2]["counts"], "edges"), valid_then, "{got}");
    assert!(
        std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0) > 10_000,
        "a screenshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_of_a_query_is_capped_and_says_so() {
    let f = graph().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let page = dir.path().join("people.html");
    let url = graph_url(&f);
    let people = count(
        &f,
        "SELECT count(*) AS n FROM nodes WHERE has_label(labels, 'Person')",
    )
    .await;
    assert!(people >= 2);
    let printed = run_ok(&[
        "view",
        "--graph",
        &url,
        "--out",
        page.to_str().unwrap(),
        "--query",
        "SELECT node_id FROM nodes WHERE has_label(labels, 'Person')",
        "--max-nodes",
        "1",
    ]);
    assert!(
        printed.contains(&format!("capped: {people} matched")),
        "{printed}"
    );
    let html = std::fs::read_to_string(&page).expect("page");
    assert!(
        html.contains("LIMIT 1"),
        "the page carries the SQL that chose the nodes"
    );
    let Some(got) = check_page(&page, &[], None) else {
        return;
    };
    assert_eq!(drawn(&got["counts"], "nodes"), 1, "{got}");

    // A query without node_id is refused before anything is written.
    let bad = dir.path().join("bad.html");
    let out = common::graphloom(&[
        "view",
        "--graph",
        &url,
        "--out",
        bad.to_str().unwrap(),
        "--query",
        "SELECT name FROM nodes",
    ])
    .output()
    .expect("run");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        describe("view --query", &out)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("node_id"));
    assert!(!dir.path().join("bad.html").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_totals_match_the_graph_per_run_and_overall() {
    let f = graph().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let page = dir.path().join("report.html");
    let url = graph_url(&f);
    let gold = repo().join("pipelines/gold/procurement.json");
    let printed = run_ok(&[
        "report",
        "--graph",
        &url,
        "--gold",
        gold.to_str().unwrap(),
        "--out",
        page.to_str().unwrap(),
    ]);
    assert!(printed.contains("eval scores"), "{printed}");
    let runs = query(&f.store, "SELECT run_id FROM runs ORDER BY run_seq").await;
    assert_eq!(runs.len(), 2);
    let first = runs[0]["run_id"].as_str().expect("run id").to_string();
    let shot = artifact("report.png");
    let Some(got) = check_page(&page, &[&format!("#run-filter={first}")], Some(&shot)) else {
        return;
    };
    keep_for_readme(&shot, "report.png");
    let calls = count(&f, "SELECT count(*) AS n FROM llm_calls").await;
    let failures = count(&f, "SELECT count(*) AS n FROM failures").await;
    assert!(failures > 0, "the first run lost an episode");
    let c = &got["counts"];
    assert_eq!(drawn(c, "runs"), 2, "{got}");
    assert_eq!(drawn(c, "calls"), calls, "{got}");
    assert_eq!(drawn(c, "failures"), failures, "{got}");
    assert_eq!(drawn(c, "eval"), 1, "{got}");
    assert!(
        drawn(c, "charts") >= 3,
        "calls/tokens, latency, failures, waiting: {got}"
    );
    let stages = count(
        &f,
        "SELECT count(*) AS n FROM (SELECT DISTINCT run_id, stage FROM llm_calls) s",
    )
    .await;
    assert!(stages > 0);

    // One run selected: its own calls and failures.
    let s = &got["steps"][0]["counts"];
    let first_calls = count(
        &f,
        &format!("SELECT count(*) AS n FROM llm_calls WHERE run_id = '{first}'"),
    )
    .await;
    let first_failures = count(
        &f,
        &format!("SELECT count(*) AS n FROM failures WHERE run_id = '{first}'"),
    )
    .await;
    assert_eq!(drawn(s, "runs"), 1, "{got}");
    assert_eq!(drawn(s, "calls"), first_calls, "{got}");
    assert_eq!(drawn(s, "failures"), first_failures, "{got}");
    assert!(first_calls < calls);
}

/// Every (level, community, node) row of the graph's communities, sorted.
async fn memberships(f: &Fixture) -> Vec<Value> {
    query(
        &f.store,
        "SELECT level, community_id, node_id FROM community_members ORDER BY level, community_id, node_id",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn communities_are_seeded_cover_linked_nodes_and_export_to_graphrag() {
    let f = graph().await;
    let url = graph_url(&f);
    let printed = run_ok(&["communities", "--graph", &url, "--seed", "7"]);
    assert!(printed.contains("level 0:"), "{printed}");
    let first = memberships(&f).await;
    assert!(!first.is_empty());
    run_ok(&["communities", "--graph", &url, "--seed", "7"]);
    assert_eq!(
        memberships(&f).await,
        first,
        "same graph and seed, same communities"
    );

    // Every node with a current fact is in exactly one level-0 community;
    // nodes without one are in none.
    let linked = count(
        &f,
        &format!(
            "SELECT count(DISTINCT node_id) AS n FROM (\
               SELECT source_node_id AS node_id FROM edges WHERE {c} \
               UNION ALL SELECT target_node_id AS node_id FROM edges WHERE {c}) x",
            c = graphloom::communities::CURRENT_EDGES
        ),
    )
    .await;
    let at_level_0 = count(
        &f,
        "SELECT count(*) AS n FROM community_members WHERE level = 0",
    )
    .await;
    let distinct_0 = count(
        &f,
        "SELECT count(DISTINCT node_id) AS n FROM community_members WHERE level = 0",
    )
    .await;
    assert_eq!(at_level_0, linked);
    assert_eq!(distinct_0, linked);
    // Sizes and children agree with the members table.
    let bad = count(
        &f,
        "SELECT count(*) AS n FROM communities c LEFT JOIN \
           (SELECT community_id, count(*) AS k FROM community_members GROUP BY community_id) m \
           ON m.community_id = c.community_id WHERE coalesce(m.k, 0) <> c.size",
    )
    .await;
    assert_eq!(bad, 0, "size = members");

    let communities = count(&f, "SELECT count(*) AS n FROM communities").await;
    let dir = tempfile::tempdir().expect("temp dir");
    run_ok(&[
        "export",
        "graphrag",
        "--graph",
        &url,
        "--to",
        dir.path().to_str().unwrap(),
    ]);
    let Some(got) = load_with_graphrag(dir.path()) else {
        return;
    };
    assert_eq!(got["rows"]["communities"], communities, "{got}");
    assert_eq!(got["rows"]["community_reports"], communities, "{got}");
    assert_eq!(
        got["communities"], communities,
        "through graphrag's Community model"
    );
    assert_eq!(got["final_columns_first"]["communities"], true, "{got}");
    assert_eq!(
        got["final_columns_first"]["community_reports"], true,
        "{got}"
    );
    assert!(
        got["global_context_chars"].as_u64().unwrap_or(0) > 0,
        "{got}"
    );
}
