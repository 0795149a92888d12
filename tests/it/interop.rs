//! External readers: the Python `deltalake` package and DuckDB (over the
//! Parquet files of the pinned versions) read a graph through
//! `tests/interop/read_graph.py`, and must see what `graphloom sql` sees,
//! including after a writer died half way through a run.
//!
//! These tests need `python3` with the packages of
//! `tests/interop/requirements.txt`; without them they fail, unless
//! `GRAPHLOOM_SKIP_INTEROP=1` is set.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use graphloom::store::Table;
use serde_json::Value;

use crate::common::{bin, describe, facts_file, procurement_graph, repo};

const SCRIPT: &str = "tests/interop/read_graph.py";
const REQUIREMENTS: &str = "tests/interop/requirements.txt";

/// Whether the Python side can run: `true` if it can, `false` (after a note)
/// if it cannot and `GRAPHLOOM_SKIP_INTEROP=1`; panics otherwise.
pub(crate) fn python_ready() -> bool {
    let probe = Command::new("python3")
        .args(["-c", "import os, deltalake, duckdb, pyarrow; os._exit(0)"])
        .current_dir(repo())
        .output();
    let problem = match probe {
        Ok(out) if out.status.success() => return true,
        Ok(out) => {
            // The last line of the traceback, e.g. "ModuleNotFoundError: ...".
            let stderr = String::from_utf8_lossy(&out.stderr);
            let cause = stderr.lines().rev().find(|l| !l.trim().is_empty());
            format!(
                "python3 cannot import deltalake, duckdb and pyarrow ({}): {}",
                out.status,
                cause.unwrap_or("no message").trim()
            )
        }
        Err(e) => format!("cannot run python3: {e}"),
    };
    if std::env::var("GRAPHLOOM_SKIP_INTEROP").as_deref() == Ok("1") {
        eprintln!("note: skipping interop test (GRAPHLOOM_SKIP_INTEROP=1): {problem}");
        return false;
    }
    panic!(
        "{problem}\ninstall the interop test dependencies with `pip install -r {REQUIREMENTS}` \
         (CI installs them), or set GRAPHLOOM_SKIP_INTEROP=1 to skip these tests"
    );
}

/// What `read_graph.py` printed.
#[derive(Debug)]
struct PythonView {
    deltalake: BTreeMap<String, u64>,
    duckdb: BTreeMap<String, u64>,
    contract_nodes: u64,
    employment_edges: u64,
}

fn counts(json: &Value, key: &str) -> BTreeMap<String, u64> {
    let obj = json[key]
        .as_object()
        .unwrap_or_else(|| panic!("`{key}` is not an object in {json}"));
    obj.iter()
        .map(|(table, n)| {
            let n = n
                .as_u64()
                .unwrap_or_else(|| panic!("`{key}.{table}` is not a count in {json}"));
            (table.clone(), n)
        })
        .collect()
}

fn read_with_python(dir: &Path) -> PythonView {
    let out = Command::new("python3")
        .arg(SCRIPT)
        .arg(dir)
        .current_dir(repo())
        .env_remove("GRAPHLOOM_FAILPOINT")
        .output()
        .expect("run python3");
    assert!(out.status.success(), "{}", describe(SCRIPT, &out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{SCRIPT} printed invalid JSON ({e}): {}",
            describe(SCRIPT, &out)
        )
    });
    let scalar = |key: &str| {
        json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("`{key}` is not a count in {json}"))
    };
    PythonView {
        deltalake: counts(&json, "deltalake"),
        duckdb: counts(&json, "duckdb"),
        contract_nodes: scalar("duckdb_contract_nodes"),
        employment_edges: scalar("duckdb_employment_edges"),
    }
}

/// `SELECT count(*) AS n ...` through `graphloom sql --format json`.
fn sql_count(dir: &Path, query: &str) -> u64 {
    let out = Command::new(bin())
        .args(["sql", "--graph"])
        .arg(dir)
        .args([query, "--format", "json"])
        .current_dir(repo())
        .env_remove("GRAPHLOOM_FAILPOINT")
        .output()
        .expect("run graphloom sql");
    let what = format!("graphloom sql {query:?}");
    assert!(out.status.success(), "{}", describe(&what, &out));
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("invalid JSON ({e}) from {}", describe(&what, &out)));
    let rows = json
        .as_array()
        .unwrap_or_else(|| panic!("{what} did not print one JSON array: {json}"));
    assert_eq!(rows.len(), 1, "{what} returned {json}");
    rows[0]["n"]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: no count `n` in {json}"))
}

/// Counts of every table per `graphloom sql`.
fn sql_counts(dir: &Path) -> BTreeMap<String, u64> {
    Table::ALL
        .iter()
        .map(|t| {
            let name = t.name().to_string();
            let n = sql_count(dir, &format!("SELECT count(*) AS n FROM {name}"));
            (name, n)
        })
        .collect()
}

/// Python's two readers and `graphloom sql` agree on every table and on the
/// two label/type queries; returns the per-table counts.
fn assert_readers_agree(dir: &Path) -> BTreeMap<String, u64> {
    let py = read_with_python(dir);
    let sql = sql_counts(dir);
    assert_eq!(
        py.deltalake, sql,
        "deltalake counts (left) differ from graphloom sql (right)"
    );
    assert_eq!(
        py.duckdb, sql,
        "DuckDB counts over the pinned files (left) differ from graphloom sql (right)"
    );
    let contract = sql_count(
        dir,
        "SELECT count(*) AS n FROM nodes WHERE has_label(labels, 'Contract')",
    );
    assert_eq!(
        py.contract_nodes, contract,
        "Contract nodes: DuckDB list_contains (left) vs graphloom has_label (right)"
    );
    let employment = sql_count(
        dir,
        "SELECT count(*) AS n FROM edges WHERE edge_type_matches(relation_type, 'EMPLOYED_BY')",
    );
    assert_eq!(
        py.employment_edges, employment,
        "EMPLOYED_BY edges: DuckDB join over edge_type_closure (left) vs graphloom edge_type_matches (right)"
    );
    assert!(
        sql["nodes"] > 0 && sql["edges"] > 0,
        "the example graph is empty: {sql:?}"
    );
    assert!(contract > 0, "no Contract nodes in the example graph");
    assert!(employment > 0, "no EMPLOYED_BY edges in the example graph");
    sql
}

/// Rows of a table at its latest Delta version, per the Python `deltalake`
/// package (what a reader ignoring `runs` would see).
fn latest_rows_with_python(table_dir: &Path) -> u64 {
    let out = Command::new("python3")
        .args([
            "-c",
            // os._exit: see `finish` in read_graph.py (pyarrow/deltalake
            // threads can abort the process at interpreter teardown).
            "import os, sys; from deltalake import DeltaTable; \
             print(DeltaTable(sys.argv[1]).to_pyarrow_table().num_rows, flush=True); \
             os._exit(0)",
        ])
        .arg(table_dir)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        describe("latest version read", &out)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| {
            panic!(
                "not a count ({e}): {}",
                describe("latest version read", &out)
            )
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn python_deltalake_and_duckdb_match_graphloom_sql() {
    if !python_ready() {
        return;
    }
    let dir = tempfile::TempDir::new().expect("temp dir");
    procurement_graph(dir.path()).await;
    // Every table, `runs` included, since the comparison is against a map
    // built from `Table::ALL`.
    assert_readers_agree(dir.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn python_readers_stay_pinned_after_crashed_writer() {
    if !python_ready() {
        return;
    }
    let dir = tempfile::TempDir::new().expect("temp dir");
    procurement_graph(dir.path()).await;
    let before = assert_readers_agree(dir.path());

    // A second add of the same facts that dies after committing nodes,
    // node_labels and edges, before its runs row. Run from the temp dir so
    // a core dump, if any, lands there.
    let out = Command::new(bin())
        .arg("add")
        .arg(repo().join("pipelines/procurement.toml"))
        .arg(facts_file())
        .arg("--graph")
        .arg(dir.path())
        .current_dir(dir.path())
        .env("GRAPHLOOM_FAILPOINT", "after_commit:edges=abort")
        .output()
        .expect("run graphloom add");
    assert!(
        !out.status.success(),
        "{}",
        describe("the add with an abort failpoint succeeded", &out)
    );

    // The crash left commits past the pinned versions: a reader of the
    // latest version would see the second copy of the nodes.
    let latest_nodes = latest_rows_with_python(&dir.path().join("nodes"));
    assert!(
        latest_nodes > before["nodes"],
        "the crashed run committed no nodes (latest {latest_nodes}, pinned {}): the test proves nothing",
        before["nodes"]
    );

    // Pinned readers, in Python as in graphloom, still see the last
    // completed run, unchanged.
    let after = assert_readers_agree(dir.path());
    assert_eq!(
        after, before,
        "counts after the crash (left) differ from before it (right)"
    );

    // After `recover`, a reader that globs a table directory's Parquet
    // files still finds the rolled-back ones; the snapshot export holds
    // exactly the graph.
    let recover = Command::new(bin())
        .args(["recover", "--graph"])
        .arg(dir.path())
        .output()
        .expect("run graphloom recover");
    assert!(
        recover.status.success(),
        "{}",
        describe("recover", &recover)
    );
    let export = dir.path().join("export");
    let out = Command::new(bin())
        .args(["export", "parquet", "--graph"])
        .arg(dir.path())
        .arg("--to")
        .arg(&export)
        .output()
        .expect("run graphloom export parquet");
    assert!(out.status.success(), "{}", describe("export", &out));
    let duckdb_rows = |glob: &Path| -> u64 {
        let out = Command::new("python3")
            .args([
                "-c",
                "import os, sys, duckdb; \
                 print(duckdb.sql(f\"SELECT count(*) FROM read_parquet('{sys.argv[1]}')\").fetchall()[0][0], flush=True); \
                 os._exit(0)",
            ])
            .arg(glob)
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "{}",
            describe("duckdb read_parquet", &out)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a count")
    };
    let globbed = duckdb_rows(&dir.path().join("nodes").join("*.parquet"));
    assert!(
        globbed > before["nodes"],
        "globbing the nodes directory sees {globbed} rows: the rolled-back files are gone, so this proves nothing"
    );
    for table in ["nodes", "edges", "node_labels", "runs"] {
        assert_eq!(
            duckdb_rows(&export.join(format!("{table}.parquet"))),
            sql_count(dir.path(), &format!("SELECT count(*) AS n FROM {table}")),
            "`{table}`: DuckDB over the export (left) vs graphloom sql (right)"
        );
    }
}
