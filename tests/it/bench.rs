//! The `graphloom bench run`, `bench add` and `bench sql` generators and
//! drivers, at a small size: what they print as figures must come from
//! runs that did the whole job.

use graphloom::bench::add::{AddBench, run_add_bench};
use graphloom::bench::pipeline::{RunBench, run_pipeline_bench};
use graphloom::bench::sql::{SqlBench, run_sql_bench};

#[tokio::test(flavor = "multi_thread")]
async fn the_run_bench_replays_its_archive_from_the_cache_without_a_request_into_the_same_graph() {
    let dir = tempfile::tempdir().expect("temp dir");
    let report = run_pipeline_bench(RunBench {
        episodes: 120,
        scale: Some(2),
        seed: 3,
        dir: dir.path().to_path_buf(),
        concurrency: 4,
    })
    .await
    .expect("bench runs");
    assert_eq!(
        report.sizes.iter().map(|s| s.episodes).collect::<Vec<_>>(),
        vec![60, 120]
    );
    for size in &report.sizes {
        let (first, replay) = (&size.first, &size.replay);
        assert_eq!(first.run.episodes_added, size.episodes, "{first:?}");
        assert!(first.run.failures_by_stage.is_empty(), "{first:?}");
        assert_eq!(first.http_requests, first.calls(), "{first:?}");
        assert!(first.run.edges_added > 0 && first.run.nodes_added > 0);
        assert_eq!(replay.http_requests, 0, "{replay:?}");
        assert_eq!(replay.run.cache_hits, first.calls(), "{replay:?}");
        assert_eq!(
            (replay.run.nodes_added, replay.run.edges_added),
            (first.run.nodes_added, first.run.edges_added)
        );
        assert!(
            replay
                .run
                .timings
                .iter()
                .any(|(s, _)| s == graphloom::stage::Stage::Resolve),
            "{replay:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_add_bench_accounts_for_every_line_it_generates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let report = run_add_bench(AddBench {
        nodes: 2_000,
        facts: 1_000,
        seed: 5,
        dir: dir.path().to_path_buf(),
    })
    .await
    .expect("bench runs");
    assert_eq!(report.sizes.len(), 2);
    for s in &report.sizes {
        // A tenth of the facts name an endpoint that is nowhere: those
        // lines fail; every other line is a node or an edge.
        assert!(s.failures > 0, "{s:?}");
        assert_eq!(s.edges_added as usize + s.failures, s.facts, "{s:?}");
        assert_eq!(s.nodes_added as usize, s.nodes + s.implicit_nodes, "{s:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sql_bench_times_answers_that_duckdb_confirms_on_the_same_files() {
    if !crate::interop::python_ready() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let settings = SqlBench {
        graph: None,
        nodes: 2_000,
        facts: 1_000,
        seed: 5,
        dir: dir.path().to_path_buf(),
        runs: 1,
        python: "python3".to_string(),
        graphloom: env!("CARGO_BIN_EXE_graphloom").into(),
    };
    let report = run_sql_bench(settings.clone()).await.expect("bench runs");
    assert!(report.built, "{report}");
    assert_eq!(report.duckdb_missing, None, "{report}");
    assert!(report.nodes >= 2_000 && report.edges > 0, "{report}");
    assert_eq!(report.queries.len(), 3, "{report}");
    for q in &report.queries {
        assert_eq!(q.same_answer, Some(true), "{report}");
        // Every query counts something: an empty answer would compare
        // equal on both sides and prove nothing.
        let counted: u64 = q
            .answer
            .iter()
            .filter_map(|row| row.rsplit(',').next()?.parse::<u64>().ok())
            .sum();
        assert!(counted > 0, "{report}");
    }
    // A second bench of the same size reuses the graph it built.
    let again = run_sql_bench(settings).await.expect("bench runs again");
    assert!(!again.built, "{again}");
    assert_eq!(again.nodes, report.nodes);
}
