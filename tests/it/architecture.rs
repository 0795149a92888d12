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
    for path in rust_files(src) {
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
    for leaf in ["spec", "text", "rows", "cues"] {
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

/// `text` with comments blanked and the insides of string and char
/// literals replaced by `x`, line breaks kept: what is left is code whose
/// braces are real braces. Lifetimes (`'a`) stay as they are.
fn mask(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
            && matches!(next, Some('"') | Some('#'))
        {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            out.extend(&c[i..=j]);
            i = j + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    out.push('"');
                    out.extend(std::iter::repeat_n('#', hashes));
                    i += 1 + hashes;
                    break;
                }
                out.push(if c[i] == '\n' { '\n' } else { 'x' });
                i += 1;
            }
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push('x');
                    i += 1;
                }
                if i < c.len() {
                    out.push(if c[i] == '\n' { '\n' } else { 'x' });
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A char literal ('{', '\'', '\u{7b}'); a lifetime has no
            // closing quote two chars on.
            out.push('\'');
            i += 1;
            if c.get(i) == Some(&'\\') {
                out.push('x');
                i += 1;
            }
            while i < c.len() && c[i] != '\'' {
                out.push('x');
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The index of the brace closing the one at `open` in masked `code`.
fn closing(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &b) in code.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    code.len().saturating_sub(1)
}

/// The sizes of a file in lines of code: non-blank lines that are not only
/// a comment, outside `#[cfg(test)]` modules. Returns the file's count and
/// each function's (name, first line, lines of code, counted from its
/// `fn` line to its closing brace).
fn sizes(text: &str) -> (usize, Vec<(String, usize, usize)>) {
    let masked = mask(text);
    let code = masked.as_bytes();
    let line_at: Vec<usize> = {
        let mut v = Vec::with_capacity(code.len() + 1);
        let mut line = 0;
        for &b in code {
            v.push(line);
            if b == b'\n' {
                line += 1;
            }
        }
        v.push(line);
        v
    };
    let lines: Vec<&str> = masked.split('\n').collect();
    let mut counted: Vec<bool> = lines.iter().map(|l| !l.trim().is_empty()).collect();
    // Test modules: `#[cfg(test)]`, other attributes, then `mod name {`.
    for (at, _) in masked.match_indices("#[cfg(test)]") {
        let rest = &masked[at + "#[cfg(test)]".len()..];
        let mut tail = rest.trim_start();
        while tail.starts_with("#[") {
            tail = tail[tail.find(']').map_or(tail.len(), |k| k + 1)..].trim_start();
        }
        let item = tail.strip_prefix("pub ").unwrap_or(tail);
        if !item.starts_with("mod ") {
            continue;
        }
        let start = masked.len() - tail.len();
        let Some(open) = masked[start..].find(['{', ';']).map(|k| start + k) else {
            continue;
        };
        let end = if code[open] == b'{' {
            closing(code, open)
        } else {
            open
        };
        counted[line_at[at]..=line_at[end]].fill(false);
    }
    let file = counted.iter().filter(|c| **c).count();
    let mut functions = Vec::new();
    for (at, _) in masked.match_indices("fn ") {
        if at > 0 && (code[at - 1].is_ascii_alphanumeric() || code[at - 1] == b'_') {
            continue;
        }
        let name: String = masked[at + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's brace: the first `{` or `;` outside the signature's
        // brackets (`[u8; 4]`).
        let mut depth = 0i32;
        let mut body = None;
        for (k, &b) in code.iter().enumerate().skip(at) {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b'{' if depth == 0 => {
                    body = Some(k);
                    break;
                }
                b';' if depth == 0 => break,
                _ => {}
            }
        }
        let Some(open) = body else { continue };
        let (first, last) = (line_at[at], line_at[closing(code, open)]);
        if !counted[first] {
            continue;
        }
        let n = (first..=last).filter(|&l| counted[l]).count();
        functions.push((name, first + 1, n));
    }
    (file, functions)
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Most lines of code a file of `src/` may have.
const FILE_LIMIT: usize = 1500;
/// Most lines of code a function may have.
const FUNCTION_LIMIT: usize = 150;

#[test]
fn no_file_or_function_is_over_the_size_limits() {
    let src = crate::common::repo().join("src");
    let mut over = Vec::new();
    for path in rust_files(&src) {
        let text = std::fs::read_to_string(&path).expect("read file");
        let (file, functions) = sizes(&text);
        let rel = path.strip_prefix(&src).expect("under src").display();
        if file > FILE_LIMIT {
            over.push(format!("{rel}: {file} lines of code (limit {FILE_LIMIT})"));
        }
        for (name, line, n) in functions {
            if n > FUNCTION_LIMIT {
                over.push(format!(
                    "{rel}:{line} fn {name}: {n} lines of code (limit {FUNCTION_LIMIT})"
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over the size limits:\n{}",
        over.join("\n")
    );
}

#[test]
fn the_size_counter_skips_comments_blanks_literals_and_test_modules() {
    let text = r##"//! Docs.

/// A function.
fn small() {
    // a comment
    let s = "}}}"; let c = '{';
    let r = r#"{ "}" "#;

    /* a block
       comment } */
    let l: &'static str = "a";
}

#[cfg(test)]
mod tests {
    fn inside() {}
}

fn after(x: [u8; 4]) -> u8 {
    x[0]
}
"##;
    let (file, functions) = sizes(text);
    assert_eq!(file, 8, "{}", mask(text));
    assert_eq!(
        functions,
        vec![("small".to_string(), 4, 5), ("after".to_string(), 19, 3)]
    );
}

#[test]
fn the_size_counter_finds_a_function_over_the_limit() {
    let mut text = String::from("fn big() {\n");
    for i in 0..FUNCTION_LIMIT {
        text.push_str(&format!("    let x{i} = \"{{\";\n    // not code\n\n"));
    }
    text.push_str("}\nfn next() {}\n");
    let (file, functions) = sizes(&text);
    assert_eq!(file, FUNCTION_LIMIT + 3);
    assert_eq!(functions[0], ("big".to_string(), 1, FUNCTION_LIMIT + 2));
    assert!(functions[0].2 > FUNCTION_LIMIT);
    assert_eq!(
        functions[1],
        ("next".to_string(), FUNCTION_LIMIT * 3 + 3, 1)
    );
}

/// The first path segments named after `prefix` in masked `code`: for
/// `super::a::f` and `super::{a::X, b}`, `a` (and `b`).
fn segments_after(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = closing(rest.as_bytes(), 0);
            let mut depth = 0;
            let mut part = String::new();
            for ch in group[..end.saturating_sub(1)].chars().chain([',']) {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(&part));
                        part.clear();
                        continue;
                    }
                    _ => {}
                }
                part.push(ch);
            }
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// The import graph among the files of one folder module: `files` maps
/// each file's module name to its code, `own` is the folder's own file
/// (`mod.rs`, or `x.rs` beside `x/`), `path` the folder's path from the
/// crate (`crate::llm::`).
///
/// The rule: the nodes are the sibling files, not the own file, and a
/// file imports a sibling when it names `super::sibling` or
/// `crate::folder::sibling` (a sibling's `self::x` names its own children,
/// so only the own file's `self::` could name a sibling). A name the own
/// file re-exports (`pub use b::X`) stands for its source: `super::X` is
/// an edge to `b`, and no edge when it comes from outside the folder. The
/// own file is no node: it is the siblings' parent, whose code may use its
/// children and be used by them (that pairing is the module tree, not an
/// import between siblings), and its re-exports are aliases, not code;
/// counting them as edges of the own file would make a false circle of
/// every `super::X` of a file the own file re-exports from.
fn folder_graph(
    files: &BTreeMap<String, String>,
    own: &str,
    path: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let own_code = files.get(own).map(String::as_str).unwrap_or("");
    // The own file's re-exports, name → source module.
    let mut exported: BTreeMap<String, String> = BTreeMap::new();
    let mut glob_from: Vec<String> = Vec::new();
    let mut rest = own_code;
    while let Some(k) = rest.find("pub use ") {
        let stmt_end = rest[k..].find(';').map_or(rest.len(), |e| k + e + 1);
        let stmt = &rest[k + "pub use ".len()..stmt_end - 1];
        let stmt = stmt.trim().strip_prefix("self::").unwrap_or(stmt.trim());
        let source: String = stmt
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        for name in stmt.split([',', '{', '}', ':', ' ', '\n']) {
            let name = name.trim();
            if name == "*" {
                glob_from.push(source.clone());
            } else if !name.is_empty() && name != source && name != "as" {
                exported.insert(name.to_string(), source.clone());
            }
        }
        rest = &rest[stmt_end..];
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in files {
        if module == own {
            continue;
        }
        let set = graph.entry(module.clone()).or_default();
        let mut names = segments_after(code, path);
        names.extend(segments_after(code, "super::"));
        for name in names {
            let target = if name == own {
                None
            } else if files.contains_key(&name) {
                Some(name)
            } else if let Some(source) = exported.get(&name) {
                files.contains_key(source).then(|| source.clone())
            } else {
                glob_from.iter().find(|g| files.contains_key(*g)).cloned()
            };
            if let Some(t) = target.filter(|t| t != module && t != own) {
                set.insert(t);
            }
        }
    }
    graph
}

/// The circles of `graph`, each as the path of one of its edges back to
/// its start (`a → b → a`).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut found = Vec::new();
    for start in graph.keys() {
        // Depth-first from `start`, looking for a way back to it through
        // larger names only, so each circle is reported once.
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, path)) = stack.pop() {
            for next in graph.get(&at).into_iter().flatten() {
                if next == start {
                    found.push(format!("{} → {start}", path.join(" → ")));
                } else if next > start && !path.contains(next) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    found
}

#[test]
fn no_folder_module_has_an_import_circle_among_its_files() {
    let src = crate::common::repo().join("src");
    let mut wrong = Vec::new();
    let mut folders: Vec<std::path::PathBuf> = rust_files(&src)
        .iter()
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .filter(|d| d != &src)
        .collect();
    folders.dedup();
    for dir in folders {
        let rel = dir.strip_prefix(&src).expect("under src");
        let path = format!(
            "crate::{}::",
            rel.iter()
                .map(|c| c.to_string_lossy().to_string())
                .collect::<Vec<_>>()
                .join("::")
        );
        let mut files: BTreeMap<String, String> = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let p = entry.expect("entry").path();
            if p.extension().is_some_and(|e| e == "rs") {
                let stem = p.file_stem().expect("stem").to_string_lossy().to_string();
                files.insert(stem, mask(&std::fs::read_to_string(&p).expect("read")));
            }
        }
        let own = if files.contains_key("mod") {
            "mod".to_string()
        } else {
            let beside = dir.with_extension("rs");
            let text = std::fs::read_to_string(&beside).unwrap_or_default();
            files.insert("(own)".into(), mask(&text));
            "(own)".to_string()
        };
        for circle in circles(&folder_graph(&files, &own, &path)) {
            wrong.push(format!("{}: {circle}", rel.display()));
        }
    }
    assert!(wrong.is_empty(), "import circles:\n{}", wrong.join("\n"));
}

#[test]
fn the_circle_rule_sees_sibling_imports_and_resolves_re_exports() {
    let files = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(m, c)| (m.to_string(), mask(c)))
            .collect()
    };
    let bad = files(&[
        ("mod", "pub mod a;\npub mod b;\n"),
        ("a", "use super::b::Thing;\n"),
        (
            "b",
            "use super::{a::Other, c};\nfn f() { crate::x::c::g(); }\n",
        ),
        ("c", "fn g() {}\n"),
    ]);
    assert_eq!(
        circles(&folder_graph(&bad, "mod", "crate::x::")),
        vec!["a → b → a"]
    );
    let via_path = files(&[
        ("mod", ""),
        ("a", "fn f() { crate::x::b::g(); }\n"),
        ("b", "use super::a;\n"),
    ]);
    assert_eq!(
        circles(&folder_graph(&via_path, "mod", "crate::x::")),
        vec!["a → b → a"]
    );
    // A re-export is its source: `super::F` names `b`, and names re-exported
    // from outside the folder are no edge at all.
    let ok = files(&[
        (
            "mod",
            "pub mod a;\npub mod b;\npub use b::F;\npub use crate::text::*;\n",
        ),
        ("a", "use super::{F, normalize};\n"),
        ("b", "// super::a is a comment\nlet s = \"super::a\";\n"),
    ]);
    let graph = folder_graph(&ok, "mod", "crate::x::");
    assert_eq!(graph["a"], BTreeSet::from(["b".to_string()]));
    assert!(graph["b"].is_empty() && !graph.contains_key("mod"));
    assert!(circles(&graph).is_empty());
    // The own file is the parent, no sibling: a child using what it
    // defines, and it using the child, is no circle.
    let own = files(&[
        ("mod", "pub mod a;\npub fn in_task() { a::run(); }\n"),
        ("a", "fn run() { super::in_task(); }\n"),
    ]);
    let graph = folder_graph(&own, "mod", "crate::x::");
    assert!(graph["a"].is_empty() && circles(&graph).is_empty());
}
