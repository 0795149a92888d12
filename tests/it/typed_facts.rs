//! Typed facts on a user's own ontology: relations refine the types of
//! their ends (domain and range inference), and an end the model states
//! as words and a time expression is dated by the resolver against the
//! stating episode. The model is a faithful HTTP server that types every
//! entity at its top-level type and lets the entity walk choose no
//! subtype, as the 1.5B model did on terse one-line descriptions.

use graphloom::llm::test_server::{Behavior, ChatRequestView, Reply, TestServer};
use graphloom::run::RunOptions;
use graphloom::spec::PipelineSpec;
use serde_json::{Value, json};

use crate::common;
use crate::run_pipeline::query;

/// Written on Wednesday 12 March 2025.
const EPISODE: &str = r#"{"id": "chat-1", "kind": "message", "reference_time": "2025-03-12T09:30:00Z", "content": "Hana: Vellumctl depends on Vellum. Brightforge pays for Vellum work until the end of June. Priya Natarajan left Brightforge last Friday. Ravi Menon works for Brightforge."}"#;

fn facts() -> Value {
    json!({"facts": [
        {"source": "Vellumctl", "relation_type": "DEPENDS_ON", "target": "Vellum",
         "fact": "Vellumctl depends on Vellum.", "ends": "no"},
        {"source": "Brightforge", "relation_type": "SUPPORTS", "target": "Vellum",
         "fact": "Brightforge pays for Vellum work.",
         "ends": "end of june"},
        {"source": "Priya Natarajan", "relation_type": "WORKS_FOR", "target": "Brightforge",
         "fact": "Priya Natarajan worked for Brightforge.",
         "ends": "last friday"},
        {"source": "Ravi Menon", "relation_type": "WORKS_FOR", "target": "Brightforge",
         "fact": "Ravi Menon works for Brightforge.",
         "ends": "when he retires"}
    ]})
}

fn answer(req: &ChatRequestView) -> Reply {
    let system = req.last("system").unwrap_or_default();
    let user = req.last("user").unwrap_or_default();
    if user.contains("TASK: list the named entities") {
        Reply::json(&json!({"entities": [
            {"name": "Vellumctl", "type": "Project"},
            {"name": "Vellum", "type": "Project"},
            {"name": "Brightforge", "type": "Organization"},
            {"name": "Priya Natarajan", "type": "Person"},
            {"name": "Ravi Menon", "type": "Person"}
        ]}))
    } else if user.contains("TASK: state every fact") {
        Reply::json(&facts())
    } else if system.contains("already classified as") {
        // The entity walk finds no subtype; the edge walk names the kind
        // of support the fact's words give.
        let items: Vec<Value> = user
            .split("\n[")
            .filter_map(|block| {
                let (id, text) = block.trim_start_matches('[').split_once(']')?;
                let id: u64 = id.parse().ok()?;
                let sub = if system.contains("is a fact") && text.contains("pays for") {
                    "SPONSORS"
                } else {
                    "none"
                };
                Some(json!({"id": id, "subtype": sub}))
            })
            .collect();
        common::walk_reply(items)
    } else {
        // Resolution asks nothing of this graph; anything else is a bug.
        Reply::error(400, "unexpected prompt", "invalid_request_error", None)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn relations_refine_parent_types_and_stated_ends_are_dated_against_their_episode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("episodes");
    std::fs::create_dir_all(&source).expect("mkdir");
    std::fs::write(source.join("chat.jsonl"), format!("{EPISODE}\n")).expect("write");
    let server = TestServer::start(Behavior::with_responder(answer))
        .await
        .expect("server");
    let mut spec = PipelineSpec::from_path(&common::repo().join("corpora/software/pipeline.toml"))
        .expect("the software corpus's pipeline");
    let store = common::against_test_server(&mut spec, &source, server.base_url(), dir.path());
    let ontology = graphloom::ontology::Ontology::try_from(&spec.ontology).expect("ontology");
    let report = graphloom::run::run(&spec, &ontology, &store, &RunOptions::default())
        .await
        .expect("run");
    assert_eq!(report.episodes_added, 1, "{:?}", report.failure_samples);

    // The fact call offered DEPENDS_ON (between subtypes of Project) for
    // two mentions at Project.
    let fact_call = server
        .requests()
        .into_iter()
        .find(|r| r.body.to_string().contains("TASK: state every fact"))
        .expect("a fact call");
    let body = fact_call.body.to_string();
    assert!(
        body.contains(r#""enum":["DEPENDS_ON"]"#),
        "the fact schema offers a relation whose ends are subtypes of the mentions' types: {body}"
    );

    let labels = query(&store, "SELECT name, labels FROM nodes ORDER BY name").await;
    let label_of = |name: &str| -> Vec<String> {
        labels
            .iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["labels"].as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|l| l.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    // SPONSORS (Company → Project), chosen by the edge walk, makes
    // Brightforge a company; DEPENDS_ON makes its target a library, and
    // leaves its source, which may be either kind of project, at Project.
    assert_eq!(
        label_of("Brightforge"),
        ["Entity", "Organization", "Company"]
    );
    assert_eq!(label_of("Vellum"), ["Entity", "Project", "Library"]);
    assert_eq!(label_of("Vellumctl"), ["Entity", "Project"]);

    let edges = query(
        &store,
        "SELECT s.name AS source, e.relation_type, t.name AS target, \
                CAST(e.invalid_at AS VARCHAR) AS invalid_at \
         FROM edges e JOIN nodes s ON e.source_node_id = s.node_id \
         JOIN nodes t ON e.target_node_id = t.node_id ORDER BY s.name",
    )
    .await;
    let edge = |source: &str| -> (String, String) {
        let row = edges
            .iter()
            .find(|r| r["source"] == source)
            .unwrap_or_else(|| panic!("an edge from {source}: {edges:?}"));
        (
            row["relation_type"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            row["invalid_at"].as_str().unwrap_or_default().to_string(),
        )
    };
    let (sponsors, end) = edge("Brightforge");
    assert_eq!(sponsors, "SPONSORS");
    assert!(end.starts_with("2025-06-30"), "end of June: {end}");
    let (works, end) = edge("Priya Natarajan");
    assert_eq!(works, "WORKS_FOR");
    assert!(end.starts_with("2025-03-07"), "the Friday before: {end}");
    // An end that names no day (from a server that ignores the schema's
    // pattern) is not taken.
    let (works, end) = edge("Ravi Menon");
    assert_eq!((works.as_str(), end.as_str()), ("WORKS_FOR", ""));
    // DEPENDS_ON cannot hold from a bare Project: kept under the generic
    // type, with a row that says so.
    let (generic, _) = edge("Vellumctl");
    assert_eq!(generic, graphloom::extract::GENERIC_RELATION);

    let failures = query(&store, "SELECT reason FROM failures").await;
    let reasons: Vec<&str> = failures
        .iter()
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("`DEPENDS_ON` does not allow Project → Library")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("`when he retires` names no day")),
        "{reasons:?}"
    );

    // The run scored as a suite of one corpus, next to one not run yet.
    let suite = dir.path().join("suite");
    let corpus = suite.join("software");
    std::fs::create_dir_all(&corpus).expect("mkdir");
    let mut scored = spec.clone();
    scored.output.graph = dir
        .path()
        .join("graph")
        .to_str()
        .expect("utf-8")
        .to_string();
    std::fs::write(
        corpus.join("pipeline.toml"),
        toml::to_string(&scored).expect("spec as TOML"),
    )
    .expect("write spec");
    let gold = json!({
        "entities": [
            {"name": "Brightforge", "chain": ["Organization", "Company"], "episodes": ["chat-1"]},
            {"name": "Vellum", "chain": ["Project", "Library"], "episodes": ["chat-1"]},
            {"name": "Vellumctl", "chain": ["Project", "CommandLineTool"], "episodes": ["chat-1"]},
            {"name": "Priya Natarajan", "chain": ["Person"], "episodes": ["chat-1"]}
        ],
        "facts": [
            {"source": "Priya Natarajan", "target": "Brightforge", "relation_type": "WORKS_FOR",
             "episodes": ["chat-1"], "invalid_at": "2025-03-07T00:00:00Z"}
        ]
    });
    std::fs::write(corpus.join("gold.json"), gold.to_string()).expect("write gold");
    let out = common::graphloom(&["eval", "--suite", suite.to_str().expect("utf-8")])
        .output()
        .expect("eval --suite");
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("| software |"))
        .unwrap_or_else(|| panic!("a row for the corpus: {table}"));
    // Two of the three subtypes reached (Vellumctl stays a Project); the
    // ended fact dated right.
    assert!(row.starts_with("| software | "), "{row}");
    assert!(row.contains("| 2 of 3 |"), "{row}");
    assert!(row.contains("| 1 of 1 |"), "{row}");
    assert!(table.contains("| **worst** | "), "{table}");
    let idle = suite.join("idle");
    std::fs::create_dir_all(&idle).expect("mkdir");
    scored.output.graph = dir
        .path()
        .join("never-run")
        .to_str()
        .expect("utf-8")
        .to_string();
    std::fs::write(
        idle.join("pipeline.toml"),
        toml::to_string(&scored).expect("toml"),
    )
    .expect("write spec");
    std::fs::write(idle.join("gold.json"), gold.to_string()).expect("write gold");
    let out = common::graphloom(&["eval", "--suite", suite.to_str().expect("utf-8")])
        .output()
        .expect("eval --suite");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("| software |"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("corpus idle not scored"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
