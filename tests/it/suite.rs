//! The quality suite's corpora (`corpora/*/`): each is a user-style
//! pipeline in a domain no rule was written from, with its episodes and
//! gold file. These checks keep each corpus what the suite needs it to be
//! (a terse ontology with hierarchies, subtype endpoints and an identity
//! property; 12–25 episodes; gold that names only declared types and
//! episodes that exist), so a score on it means what it says.

use std::collections::BTreeSet;

use graphloom::ontology::Ontology;
use graphloom::spec::PipelineSpec;
use serde_json::Value;

fn corpora() -> Vec<std::path::PathBuf> {
    let dir = crate::common::repo().join("corpora");
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpora/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("pipeline.toml").is_file())
        .collect();
    out.sort();
    out
}

fn episode_ids(dir: &std::path::Path) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for entry in std::fs::read_dir(dir.join("data")).expect("data/") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("a data file");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: not a JSON line: {e}", path.display()));
            let id = record["id"].as_str().expect("an id").to_string();
            assert!(
                record["content"].is_string(),
                "{}: {id} has no content",
                path.display()
            );
            assert!(
                ids.insert(id.clone()),
                "{}: episode id {id} twice",
                path.display()
            );
        }
    }
    ids
}

#[test]
fn every_suite_corpus_has_a_terse_hierarchical_ontology_and_gold_that_fits_it() {
    let all = corpora();
    assert!(
        all.len() >= 4,
        "the suite holds {} corpora, fewer than 4",
        all.len()
    );
    for dir in all {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a name")
            .to_string();
        let spec = PipelineSpec::from_path(&dir.join("pipeline.toml"))
            .unwrap_or_else(|e| panic!("{name}: the pipeline does not parse: {e}"));
        let ontology = Ontology::try_from(&spec.ontology)
            .unwrap_or_else(|e| panic!("{name}: the ontology does not check: {e}"));
        let source = spec.source.as_ref().expect("a source");
        assert_eq!(
            source.url,
            format!("file://./corpora/{name}/data/"),
            "{name}"
        );

        let parents = ontology
            .entity_tree
            .iter()
            .filter(|n| !n.children.is_empty())
            .count();
        assert!(
            parents >= 2,
            "{name}: {parents} entity hierarchies, fewer than 2"
        );
        assert!(
            ontology.edge_tree.iter().any(|n| !n.children.is_empty()),
            "{name}: no edge hierarchy"
        );
        let subtype_ends = ontology.edge_types.values().any(|e| {
            e.source_targets.iter().any(|st| {
                [&st.source, &st.target].iter().any(|t| {
                    ontology
                        .entity_tree
                        .get(t)
                        .is_some_and(|n| n.parent.is_some())
                })
            })
        });
        assert!(
            subtype_ends,
            "{name}: no edge type names a subtype as an end"
        );
        assert!(
            ontology
                .entity_types
                .values()
                .any(|t| !t.identity_properties.is_empty()),
            "{name}: no identity property"
        );

        let ids = episode_ids(&dir);
        assert!(
            (12..=25).contains(&ids.len()),
            "{name}: {} episodes",
            ids.len()
        );

        let gold: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("gold.json")).expect("gold.json"),
        )
        .unwrap_or_else(|e| panic!("{name}: gold.json does not parse: {e}"));
        let mut entities = BTreeSet::new();
        for e in gold["entities"].as_array().expect("gold entities") {
            let ename = e["name"].as_str().expect("a name");
            let chain: Vec<String> = serde_json::from_value(e["chain"].clone()).expect("a chain");
            let last = chain.last().expect("a non-empty chain");
            assert_eq!(
                ontology.entity_tree.chain(last).as_ref(),
                Some(&chain),
                "{name}: gold entity {ename}: chain {chain:?} is not the ontology's"
            );
            for ep in e["episodes"].as_array().expect("episodes") {
                let ep = ep.as_str().expect("an episode id");
                assert!(
                    ids.contains(ep),
                    "{name}: gold entity {ename} names episode {ep}"
                );
            }
            entities.insert(ename.to_string());
            for alias in e["aliases"].as_array().into_iter().flatten() {
                entities.insert(alias.as_str().expect("an alias").to_string());
            }
        }
        let facts = gold["facts"].as_array().expect("gold facts");
        assert!(!facts.is_empty(), "{name}: no gold facts");
        for f in facts {
            let rel = f["relation_type"].as_str().expect("a relation type");
            let chain: Vec<String> = serde_json::from_value(f["chain"].clone()).expect("a chain");
            assert_eq!(
                ontology.edge_tree.chain(rel).as_ref(),
                Some(&chain),
                "{name}: gold fact {f}: chain is not the ontology's"
            );
            for end in ["source", "target"] {
                let n = f[end].as_str().expect("an end");
                assert!(
                    entities.contains(n),
                    "{name}: gold fact {rel}: {end} {n} is no gold entity"
                );
            }
            for ep in f["episodes"].as_array().expect("episodes") {
                let ep = ep.as_str().expect("an episode id");
                assert!(
                    ids.contains(ep),
                    "{name}: gold fact {rel} names episode {ep}"
                );
            }
        }
    }
}
