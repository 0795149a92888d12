//! The spec reference's key table (docs/spec.md) against the spec
//! itself: the same keys, and every default the table writes as a literal
//! equal to the spec's default. And the README's minimal pipeline: the
//! same bytes as `pipelines/minimal.toml`, a spec that parses, an ontology
//! that checks.

use std::collections::BTreeMap;
use std::path::Path;

use graphloom::spec::PipelineSpec;
use serde_json::Value;

/// `key → default cell` of each row of the key table in docs/spec.md; a
/// row naming two keys (`a` / `b`) with two defaults gives both.
fn readme_table() -> BTreeMap<String, String> {
    let doc =
        std::fs::read_to_string(crate::common::repo().join("docs/spec.md")).expect("docs/spec.md");
    let section = doc
        .split("\n## Every key\n")
        .nth(1)
        .expect("an Every key section in docs/spec.md")
        .split("\n## ")
        .next()
        .expect("section text");
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').splitn(3, " | ").collect();
        let (keys, default) = (cells[0].trim(), cells[1].trim());
        let keys: Vec<&str> = keys.split(" / ").map(|k| k.trim_matches('`')).collect();
        let defaults: Vec<&str> = if keys.len() > 1 {
            default.split(" / ").collect()
        } else {
            vec![default]
        };
        assert_eq!(keys.len(), defaults.len(), "{line}");
        for (k, d) in keys.into_iter().zip(defaults) {
            assert!(
                out.insert(k.to_string(), d.to_string()).is_none(),
                "`{k}` is in the table twice"
            );
        }
    }
    out
}

/// Every key of the spec with its default, `section.key` (the sections
/// are tables; their keys are the spec's fields), and `section.sub.key`
/// for a sub-table such as `[llm.batch]`.
fn spec_defaults() -> BTreeMap<String, Value> {
    let spec = PipelineSpec::from_toml(
        "[source]\nurl = \"file:///archive/\"\n[output]\ngraph = \"file:///graph/\"\n",
        Path::new("defaults.toml"),
    )
    .expect("a minimal spec parses");
    let value = serde_json::to_value(&spec).expect("the spec serialises");
    let mut out = BTreeMap::new();
    for (section, keys) in value.as_object().expect("an object") {
        match keys.as_object() {
            Some(keys) => {
                for (key, v) in keys {
                    match v.as_object().filter(|sub| !sub.is_empty()) {
                        // A sub-table with defaults (`[llm.batch]`): its
                        // keys are rows (maps such as `extra_body` default
                        // to empty and are one row).
                        Some(sub) => {
                            for (k, v) in sub {
                                out.insert(format!("{section}.{key}.{k}"), v.clone());
                            }
                        }
                        None => {
                            out.insert(format!("{section}.{key}"), v.clone());
                        }
                    }
                }
            }
            // An array of tables (`[[mapping]]`) is one row of its own.
            None => {
                out.insert(section.clone(), keys.clone());
            }
        }
    }
    out
}

/// A default cell written as one TOML literal in backticks (`400`,
/// `"jsonl"`, `{}`), or `none`, as a JSON value; other cells (required
/// keys, defaults derived from other keys, lists shortened with …) are
/// prose.
fn literal(cell: &str) -> Option<Value> {
    if cell == "none" {
        return Some(Value::Null);
    }
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    if inner.contains('`') {
        return None;
    }
    let table: toml::Table = toml::from_str(&format!("v = {inner}")).ok()?;
    serde_json::to_value(&table["v"]).ok()
}

#[test]
fn the_readme_spec_table_lists_every_key_with_the_spec_default() {
    let table = readme_table();
    let spec = spec_defaults();
    let only_readme: Vec<&String> = table.keys().filter(|k| !spec.contains_key(*k)).collect();
    let only_spec: Vec<&String> = spec.keys().filter(|k| !table.contains_key(*k)).collect();
    assert!(
        only_readme.is_empty() && only_spec.is_empty(),
        "keys in docs/spec.md's table but not in the spec: {only_readme:?}; in the spec but not in the table: {only_spec:?}"
    );
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (key, cell) in &table {
        let Some(written) = literal(cell) else {
            continue;
        };
        checked += 1;
        let actual = &spec[key];
        // TOML writes 0.0 and 0 alike for floats; compare numbers as f64.
        let same = match (&written, actual) {
            (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
            _ => written == *actual,
        };
        if !same {
            wrong.push(format!(
                "{key}: docs/spec.md says {cell}, the spec has {actual}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Most defaults are literals: a table that stopped writing them would
    // check nothing.
    assert!(checked >= 50, "only {checked} literal defaults checked");
}

/// The first ```toml block of the README's "Your own documents in 15
/// minutes" section.
fn readme_minimal_block() -> String {
    let readme = std::fs::read_to_string(crate::common::repo().join("README.md")).expect("README");
    let section = readme
        .split("\n## Your own documents in 15 minutes\n")
        .nth(1)
        .expect("a \"Your own documents in 15 minutes\" section in the README");
    let block = section
        .split("\n```toml\n")
        .nth(1)
        .expect("a toml block in that section");
    let end = block.find("\n```\n").expect("the block's closing fence");
    format!("{}\n", &block[..end])
}

#[test]
fn the_readme_minimal_spec_is_pipelines_minimal_toml_and_checks() {
    let path = crate::common::repo().join("pipelines/minimal.toml");
    let file = std::fs::read_to_string(&path).expect("pipelines/minimal.toml");
    assert_eq!(
        readme_minimal_block(),
        file,
        "the README's minimal spec and pipelines/minimal.toml differ"
    );
    assert!(
        file.lines().count() <= 30,
        "the minimal spec grew past 30 lines"
    );

    let spec = PipelineSpec::from_path(&path).expect("the minimal spec parses");
    let ontology = graphloom::ontology::Ontology::try_from(&spec.ontology)
        .expect("the minimal spec's ontology checks");
    graphloom::mapping::Mappings::compile(&spec.mapping, &ontology).expect("no mapping to refuse");
    // One hierarchy: a parent with two subtypes, which a filter on the
    // parent label matches.
    let labels = |t: &str| ontology.labels_for(t).expect("a declared type");
    assert_eq!(labels("Company"), ["Entity", "Organization", "Company"]);
    assert_eq!(
        labels("University"),
        ["Entity", "Organization", "University"]
    );
    assert_eq!(ontology.edge_types.len(), 1);

    // Its episodes: JSON Lines records with content, under source.url.
    let source = spec.source.as_ref().expect("a source");
    assert_eq!(source.url, "file://./pipelines/data/minimal/");
    let dir = crate::common::repo().join("pipelines/data/minimal");
    let mut records = 0;
    for entry in std::fs::read_dir(&dir).expect("pipelines/data/minimal") {
        let text = std::fs::read_to_string(entry.expect("an entry").path()).expect("a file");
        for line in text.lines() {
            let record: Value = serde_json::from_str(line).expect("a JSON line");
            assert!(record["content"].is_string(), "{line}");
            records += 1;
        }
    }
    assert!(records >= 3, "only {records} example episodes");
}
