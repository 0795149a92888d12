//! How commands are told their pipeline spec: `--pipeline PATH` on every
//! command that reads one, the older positional form where it worked
//! before, and a usage error (exit 2) when both are given.

use std::process::Output;

use crate::common::{self, describe, graphloom};

const SPEC: &str = "pipelines/procurement.toml";

/// `graphloom args` run from the repository (the spec's paths are
/// relative to it).
fn in_repo(args: &[&str]) -> Output {
    graphloom(args)
        .current_dir(common::repo())
        .output()
        .expect("run graphloom")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command with the spec given by position and by `--pipeline`;
/// both must succeed and print the same, beginning with `start`.
fn same_both_ways(by_position: &[&str], by_flag: &[&str], start: &str) {
    let position = in_repo(by_position);
    let flag = in_repo(by_flag);
    assert_eq!(
        position.status.code(),
        Some(0),
        "{}",
        describe("positional", &position)
    );
    assert_eq!(
        flag.status.code(),
        Some(0),
        "{}",
        describe("--pipeline", &flag)
    );
    assert!(stdout(&flag).starts_with(start), "{}", stdout(&flag));
    assert_eq!(stdout(&flag), stdout(&position));
}

#[test]
fn ontology_check_reads_the_same_spec_by_flag_and_by_position() {
    same_both_ways(
        &["ontology", "check", SPEC],
        &["ontology", "check", "--pipeline", SPEC],
        "ontology of pipelines/procurement.toml is valid",
    );
}

#[test]
fn a_dry_run_plans_the_same_by_flag_and_by_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    let graph = dir.path().join("graph");
    let graph = graph.to_str().expect("utf-8");
    same_both_ways(
        &["run", SPEC, "--dry-run", "--graph", graph],
        &["run", "--dry-run", "--pipeline", SPEC, "--graph", graph],
        "dry run for ",
    );
}

#[test]
fn add_loads_the_same_by_flag_and_by_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    let facts = common::facts_file();
    let facts = facts.to_str().expect("utf-8");
    let mut counts = Vec::new();
    for (name, spec_first) in [("by-position", true), ("by-flag", false)] {
        let graph = dir.path().join(name);
        let graph = graph.to_str().expect("utf-8");
        let out = if spec_first {
            in_repo(&["add", SPEC, facts, "--graph", graph])
        } else {
            in_repo(&["add", "--pipeline", SPEC, facts, "--graph", graph])
        };
        assert_eq!(out.status.code(), Some(0), "{}", describe(name, &out));
        assert!(stdout(&out).starts_with("added "), "{}", stdout(&out));
        let query =
            "SELECT (SELECT count(*) FROM nodes) AS nodes, (SELECT count(*) FROM edges) AS edges";
        let out = in_repo(&["sql", "--graph", graph, "--format", "json", query]);
        assert_eq!(out.status.code(), Some(0), "{}", describe("sql", &out));
        counts.push(stdout(&out));
    }
    assert_eq!(counts[0], counts[1]);
}

#[test]
fn a_spec_given_both_ways_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let graph = dir.path().to_str().expect("utf-8");
    let facts = common::facts_file();
    let facts = facts.to_str().expect("utf-8");
    for args in [
        vec!["ontology", "check", "--pipeline", SPEC, SPEC],
        vec!["run", "--dry-run", "--pipeline", SPEC, SPEC],
        vec!["add", "--pipeline", SPEC, SPEC, facts, "--graph", graph],
        vec![
            "batches",
            "cancel",
            SPEC,
            "--pipeline",
            SPEC,
            "--graph",
            graph,
        ],
    ] {
        let out = in_repo(&args);
        assert_eq!(out.status.code(), Some(2), "{}", describe(args[0], &out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("error: the pipeline spec is given twice, as --pipeline")
                && stderr.contains("give it once, as --pipeline PATH"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(
        std::fs::read_dir(dir.path())
            .expect("list")
            .next()
            .is_none(),
        "a refused command wrote to the graph"
    );
}

#[test]
fn a_missing_spec_is_a_usage_error_naming_the_flag() {
    for args in [
        vec!["ontology", "check"],
        vec!["run", "--dry-run"],
        vec!["batches", "cancel"],
    ] {
        let out = in_repo(&args);
        assert_eq!(out.status.code(), Some(2), "{}", describe(args[0], &out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--pipeline <PATH>"), "{args:?}: {stderr}");
    }
}

#[test]
fn help_documents_the_pipeline_flag() {
    for args in [
        vec!["ontology", "check", "--help"],
        vec!["run", "--help"],
        vec!["add", "--help"],
        vec!["batches", "cancel", "--help"],
        vec!["sql", "--help"],
        vec!["status", "--help"],
    ] {
        let out = in_repo(&args);
        assert!(out.status.success(), "{}", describe(args[0], &out));
        assert!(stdout(&out).contains("--pipeline <PATH>"), "{args:?}");
    }
}
