//! `graphloom bench add`: `graphloom add` over synthetic node and fact
//! lines into a fresh graph, at the requested size and at a tenth of it,
//! so that the ratio shows whether loading grows linearly.
//!
//! Nodes are people (with an e-mail), companies (with a domain) and
//! purchase orders (with a number and an amount), in the example
//! pipeline's ontology. Facts are, per ten: four employments and three
//! company–order links with both endpoint types given, one person signing
//! an order with the types left out (found by name), one employment at a
//! company no node line declares (a node is created for it), and one fact
//! whose new, untyped source breaks the relation's `source_targets` (the
//! line fails, and the node created for its source is undone).

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::resolution::{BenchError, word};
use crate::ontology::Ontology;
use crate::spec::PipelineSpec;
use crate::store::GraphStore;

/// Settings of `graphloom bench add`.
#[derive(Debug, Clone)]
pub struct AddBench {
    /// Node lines.
    pub nodes: usize,
    /// Fact lines.
    pub facts: usize,
    /// Generator seed.
    pub seed: u64,
    /// Working directory (input files and graphs); emptied first.
    pub dir: PathBuf,
}

/// One load.
#[derive(Debug, Clone)]
pub struct AddSize {
    /// Node lines.
    pub nodes: usize,
    /// Fact lines.
    pub facts: usize,
    /// Bytes of input.
    pub bytes: usize,
    /// Wall time of `add`, reading the file to the last commit.
    pub seconds: f64,
    /// Its steps (read, open, load, commit).
    pub timings: crate::stage::Timings,
    /// Nodes and edges written, implicit endpoint nodes, failed lines.
    pub nodes_added: i64,
    pub edges_added: i64,
    pub implicit_nodes: usize,
    pub failures: usize,
    /// `/proc/loadavg` (1-minute) before the load.
    pub load: Option<f64>,
}

/// What `bench add` measured: the tenth first, then the full size.
#[derive(Debug, Clone)]
pub struct AddBenchReport {
    pub sizes: Vec<AddSize>,
}

const SECTORS: [&str; 6] = [
    "Systems",
    "Logistics",
    "Supply",
    "Analytics",
    "Hardware",
    "Partners",
];

/// The input file: `nodes` node lines, then `facts` fact lines; numbering
/// (order numbers, e-mails, domains, new companies) starts at `first`'s
/// node and fact index, so several files make distinct entities.
fn generate(nodes: usize, facts: usize, seed: u64, first: (usize, usize)) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = String::with_capacity((nodes + facts) * 160);
    let (mut people, mut companies, mut orders) = (Vec::new(), Vec::new(), Vec::new());
    for i in first.0..first.0 + nodes {
        let line = match i % 10 {
            0..=4 => {
                let (first, last) = (word(&mut rng, 2), word(&mut rng, 2));
                let name = format!("{first} {last}");
                let email = format!(
                    "{}.{}.{i}@example.test",
                    first.to_lowercase(),
                    last.to_lowercase()
                );
                let line = json!({"node": {"name": name, "type": "Person", "attributes": {"email": email}}});
                people.push(name);
                line
            }
            5..=7 => {
                let stem = word(&mut rng, 2);
                let name = format!("{stem} {}", SECTORS[i % SECTORS.len()]);
                let line = json!({"node": {"name": name, "type": "Company", "attributes": {"domain": format!("{}-{i}.test", stem.to_lowercase())}}});
                companies.push(name);
                line
            }
            _ => {
                let name = format!("PO-{}", 100_000 + i);
                let amount = rng.random_range(100..100_000) as f64;
                let line = json!({"node": {"name": name, "type": "PurchaseOrder", "attributes": {"po_number": name, "amount": amount}}});
                orders.push(name);
                line
            }
        };
        out.push_str(&line.to_string());
        out.push('\n');
    }
    let pick = |rng: &mut StdRng, list: &[String], fallback: &str| -> String {
        if list.is_empty() {
            fallback.to_string()
        } else {
            list[rng.random_range(0..list.len())].clone()
        }
    };
    for j in first.1..first.1 + facts {
        let person = pick(&mut rng, &people, "Nobody Known");
        let company = pick(&mut rng, &companies, "Nothing Known");
        let order = pick(&mut rng, &orders, "PO-0");
        let day = format!("20{:02}-{:02}-{:02}", 10 + j % 15, 1 + j % 12, 1 + j % 28);
        let line = match j % 10 {
            0..=3 => json!({"fact": {
                "source": person, "source_type": "Person", "target": company, "target_type": "Company",
                "relation_type": "EMPLOYED_BY", "fact": format!("{person} works for {company}."), "valid_at": day}}),
            4..=6 => json!({"fact": {
                "source": company, "source_type": "Company", "target": order, "target_type": "PurchaseOrder",
                "relation_type": "PARTY_TO", "fact": format!("{company} is a party to {order}.")}}),
            7 => json!({"fact": {
                "source": person, "target": order,
                "relation_type": "SIGNED", "fact": format!("{person} signed {order}."), "valid_at": day}}),
            8 => {
                let new = format!("{} Holdings {j}", word(&mut rng, 2));
                json!({"fact": {
                    "source": person, "source_type": "Person", "target": new, "target_type": "Company",
                    "relation_type": "EMPLOYED_BY", "fact": format!("{person} works for {new}.")}})
            }
            _ => {
                let ghost = format!("{} Ghost {j}", word(&mut rng, 2));
                json!({"fact": {
                    "source": ghost, "target": company, "target_type": "Company",
                    "relation_type": "EMPLOYED_BY", "fact": format!("{ghost} works for {company}.")}})
            }
        };
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// Where a load of `nodes` and `facts` lines under `dir` puts its graph.
pub(crate) fn graph_dir(dir: &std::path::Path, nodes: usize, facts: usize) -> PathBuf {
    dir.join(format!("n{nodes}-f{facts}")).join("graph")
}

/// Generates the lines and loads them into a fresh graph at
/// [`graph_dir`] (anything already there is removed first), in one
/// `graphloom add`.
pub(crate) async fn load_one(
    settings: &AddBench,
    nodes: usize,
    facts: usize,
) -> Result<AddSize, BenchError> {
    load(settings, nodes, facts, nodes).await
}

/// As [`load_one`], in loads of at most `per_load` node lines each (and
/// the matching share of fact lines): what a graph too large for one
/// load's memory is built with. Each load's entities are new (unique
/// numbers, e-mails and domains continue from the previous load); its
/// facts link its own entities.
pub(crate) async fn load(
    settings: &AddBench,
    nodes: usize,
    facts: usize,
    per_load: usize,
) -> Result<AddSize, BenchError> {
    let step = |e: String| BenchError::Step(e);
    let graph_dir = graph_dir(&settings.dir, nodes, facts);
    let dir = graph_dir.parent().unwrap_or(&settings.dir).to_path_buf();
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let spec = PipelineSpec::from_toml(
        include_str!("../../pipelines/procurement.toml"),
        std::path::Path::new("pipelines/procurement.toml"),
    )
    .map_err(|e| step(e.to_string()))?;
    let ontology = Ontology::try_from(&spec.ontology).map_err(|e| step(e.to_string()))?;
    let graph = format!("file://{}/", graph_dir.display());
    let store = GraphStore::open(&graph, &Default::default()).map_err(|e| step(e.to_string()))?;
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok());
    let loads = nodes.div_ceil(per_load.max(1)).max(1);
    let mut size = AddSize {
        nodes,
        facts,
        bytes: 0,
        seconds: 0.0,
        timings: Default::default(),
        nodes_added: 0,
        edges_added: 0,
        implicit_nodes: 0,
        failures: 0,
        load,
    };
    for k in 0..loads {
        let share = |total: usize| total * (k + 1) / loads - total * k / loads;
        let first = (nodes * k / loads, facts * k / loads);
        let input = dir.join(format!("lines-{k}.jsonl"));
        let text = generate(share(nodes), share(facts), settings.seed + k as u64, first);
        std::fs::write(&input, &text)?;
        let started = Instant::now();
        let report = crate::add::add_file(
            &store,
            &ontology,
            &spec.resolve.name_keys(),
            "bench",
            &input.display().to_string(),
            &Default::default(),
        )
        .await
        .map_err(|e| step(e.to_string()))?;
        size.seconds += started.elapsed().as_secs_f64();
        size.bytes += text.len();
        for (stage, seconds) in report.timings.0 {
            match size.timings.0.iter_mut().find(|(s, _)| *s == stage) {
                Some((_, total)) => *total += seconds,
                None => size.timings.0.push((stage, seconds)),
            }
        }
        size.nodes_added += report.run.nodes_added;
        size.edges_added += report.run.edges_added;
        size.implicit_nodes += report.implicit_nodes;
        size.failures += report.failures.len();
        if loads > 1 {
            std::fs::remove_file(&input)?;
        }
    }
    Ok(size)
}

/// Runs the benchmark: a tenth of the size first, then the size.
pub async fn run_add_bench(settings: AddBench) -> Result<AddBenchReport, BenchError> {
    let small = load_one(&settings, settings.nodes / 10, settings.facts / 10).await?;
    let large = load_one(&settings, settings.nodes, settings.facts).await?;
    Ok(AddBenchReport {
        sizes: vec![small, large],
    })
}

impl fmt::Display for AddBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "bench add: {} build, {} cores",
            super::build_kind(),
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )?;
        for s in &self.sizes {
            let steps: Vec<String> = s
                .timings
                .iter()
                .map(|(n, t)| format!("{n} {t:.2}"))
                .collect();
            writeln!(
                f,
                "  {} nodes + {} facts ({:.0} MB): {:.2} s ({}); +{} nodes ({} for fact endpoints), +{} edges, {} failed lines; load {}",
                s.nodes,
                s.facts,
                s.bytes as f64 / 1e6,
                s.seconds,
                steps.join(", "),
                s.nodes_added,
                s.implicit_nodes,
                s.edges_added,
                s.failures,
                s.load.map_or("?".to_string(), |l| format!("{l:.2}"))
            )?;
        }
        if let [small, large] = self.sizes.as_slice() {
            let x = (large.nodes + large.facts) as f64 / (small.nodes + small.facts).max(1) as f64;
            let ratio = |a: f64, b: f64| {
                if a > 0.0 {
                    format!("{:.1}×", b / a)
                } else {
                    "-".into()
                }
            };
            let steps: Vec<String> = small
                .timings
                .iter()
                .zip(large.timings.iter())
                .map(|((n, a), (_, b))| format!("{n} {}", ratio(a, b)))
                .collect();
            write!(
                f,
                "  time ratio for {x:.0}× the lines: {} ({})",
                ratio(small.seconds, large.seconds),
                steps.join(", ")
            )?;
        }
        Ok(())
    }
}
