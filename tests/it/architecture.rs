//! The one-way data flow of the library, read from its source: each module
//! may import only modules earlier in the flow and leaf modules.
//!
//! The flow is `ontology → source → llm → extract → mapping → classify → resolve →
//! store → query`. Any other module is, by rule, either a *leaf* (it
//! imports no flow module and no non-leaf: `spec`, text normalisation,
//! object store locations, …) that everyone may import, or a *top*
//! (orchestration: `run`, `add`, `bench`, …) that may import anything and
//! that no flow module or leaf imports. The crate roots (`lib.rs`,
//! `main.rs`) and the binary's own modules (`cli/`) are outside the rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const FLOW: [&str; 9] = [
    "ontology", "source", "llm", "extract", "mapping", "classify", "resolve", "store", "query",
];

/// The code of a file without its comments (doc links are not imports).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Module → the crate modules its files name (`crate::x` paths).
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src");
            let first = rel.iter().next().expect("a component").to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            if module == "lib" || module == "main" || module == "cli" {
                continue;
            }
            let code = code_of(&std::fs::read_to_string(&path).expect("read file"));
            let set = out.entry(module.clone()).or_default();
            for (i, _) in code.match_indices("crate::") {
                let name: String = code[i + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    set.insert(name);
                }
            }
        }
    }
    out
}

/// The imports that break the rule, as `from → to`, and the leaves found.
fn violations(graph: &BTreeMap<String, BTreeSet<String>>) -> (Vec<String>, BTreeSet<String>) {
    // Leaves: the largest set of non-flow modules that import only each
    // other.
    let mut leaves: BTreeSet<&str> = graph
        .keys()
        .map(String::as_str)
        .filter(|m| !FLOW.contains(m))
        .collect();
    loop {
        let before = leaves.len();
        let keep: BTreeSet<&str> = leaves
            .iter()
            .copied()
            .filter(|m| graph[*m].iter().all(|d| leaves.contains(d.as_str())))
            .collect();
        leaves = keep;
        if leaves.len() == before {
            break;
        }
    }
    let position = |m: &str| FLOW.iter().position(|f| *f == m);
    let mut wrong = Vec::new();
    for (m, deps) in graph {
        for d in deps {
            let ok = leaves.contains(d.as_str())
                || match (position(m), position(d)) {
                    (Some(a), Some(b)) => b < a,
                    // A top may import anything.
                    (None, _) => !leaves.contains(m.as_str()),
                    (Some(_), None) => false,
                };
            if !ok {
                wrong.push(format!("{m} → {d}"));
            }
        }
    }
    (wrong, leaves.into_iter().map(str::to_string).collect())
}

#[test]
fn every_import_follows_the_data_flow_or_names_a_leaf() {
    let graph = imports(&crate::common::repo().join("src"));
    for m in FLOW {
        assert!(graph.contains_key(m), "flow module `{m}` not found in src/");
    }
    let (wrong, leaves) = violations(&graph);
    assert!(
        wrong.is_empty(),
        "imports against the flow {FLOW:?} (leaves: {leaves:?}):\n{}",
        wrong.join("\n")
    );
    for leaf in ["spec", "text", "rows"] {
        assert!(
            leaves.contains(leaf),
            "`{leaf}` is no longer a leaf: {graph:?}"
        );
    }
}

#[test]
fn the_flow_rule_rejects_backward_imports_and_flow_modules_that_import_orchestration() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for m in FLOW.iter().chain(&["spec", "text", "run"]) {
            g.entry(m.to_string()).or_default();
        }
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    let ok = graph(&[
        ("extract", "llm"),
        ("store", "ontology"),
        ("text", "spec"),
        ("run", "store"),
        ("resolve", "text"),
    ]);
    assert_eq!(violations(&ok).0, Vec::<String>::new());
    // Backward in the flow, and a flow module importing a top.
    let bad = graph(&[("source", "store"), ("llm", "run"), ("run", "llm")]);
    assert_eq!(violations(&bad).0, vec!["llm → run", "source → store"]);
    // A would-be leaf that imports a flow module is no leaf, so importing
    // it from the flow is an error too.
    let bad = graph(&[("spec", "extract"), ("source", "spec")]);
    assert_eq!(violations(&bad).0, vec!["source → spec"]);
}
