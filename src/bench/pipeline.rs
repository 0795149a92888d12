//! `graphloom bench run`: the whole pipeline over a synthetic archive, with
//! the built-in OpenAI-compatible test server answering every call from
//! the prompt's text, then a replay of the same archive into a fresh graph
//! from the response cache alone.
//!
//! The archive is mail and chat about purchase orders between companies,
//! in threads of four messages: a buyer issues a purchase order to a
//! seller, the seller confirms it, someone chats about it, and a person
//! joins a company. People, companies and order numbers are functions of
//! `(seed, index)`; a fifth of the people change employer half way
//! through the archive. Buyers work for one of three home companies (the
//! archive's owner and two sister companies), so those three are
//! mentioned in most episodes however large the archive, as in a real
//! mailbox: what grows with the archive must not be their mention count
//! squared. Sellers, people and orders grow with the archive. The responder knows, for each episode's text, the
//! entities and facts the generator put there, and answers the subtype
//! walks (orders are purchase orders, employment is full time),
//! adjudication (no candidate) and contradiction questions (none) from the
//! prompt alone, so every call has a deterministic answer and the cache
//! key of every call is the same on every run.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Duration as Days, TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::resolution::{BenchError, word};
use crate::llm::CacheMode;
use crate::llm::test_server::{Behavior, ChatRequestView, Reply, TestServer};
use crate::ontology::Ontology;
use crate::run::{RunOptions, RunReport};
use crate::spec::PipelineSpec;
use crate::stage::Stage;
use crate::store::GraphStore;

/// Settings of `graphloom bench run`.
#[derive(Debug, Clone)]
pub struct RunBench {
    /// Episodes in the archive.
    pub episodes: usize,
    /// Also run at `episodes / scale` and print each stage's time ratio.
    pub scale: Option<usize>,
    /// Generator seed.
    pub seed: u64,
    /// Working directory (archive, cache, graphs); emptied first.
    pub dir: PathBuf,
    /// `llm.max_concurrency` of the runs.
    pub concurrency: u32,
}

/// The stages a run reports, grouped as the bench prints them.
pub const STAGE_GROUPS: [(&str, &[Stage]); 5] = [
    ("source", &[Stage::Source]),
    ("extract", &[Stage::ExtractEntities, Stage::ExtractFacts]),
    ("classify", &[Stage::ClassifyEntities, Stage::ClassifyFacts]),
    ("resolve", &[Stage::Resolve]),
    ("commit", &[Stage::Open, Stage::Commit]),
];

/// One run of the pipeline.
#[derive(Debug, Clone)]
pub struct PassReport {
    /// What the run reported.
    pub run: RunReport,
    /// HTTP requests the test server received during the run.
    pub http_requests: usize,
    /// CPU seconds of this process (server included) during the run.
    pub cpu_seconds: Option<f64>,
    /// `/proc/loadavg` (1-minute) before and after.
    pub load: (Option<f64>, Option<f64>),
    /// Peak resident memory of the process during the run (Linux).
    pub peak_rss: Option<u64>,
}

impl PassReport {
    /// Seconds of a group of [`STAGE_GROUPS`].
    pub fn group(&self, stages: &[Stage]) -> f64 {
        stages.iter().map(|s| self.run.stage(*s)).sum()
    }

    /// Episodes per second over the whole run.
    pub fn episodes_per_second(&self) -> f64 {
        self.run.episodes_planned as f64 / self.run.seconds.max(1e-9)
    }

    /// LLM calls the run made, cache hits included.
    pub fn calls(&self) -> usize {
        self.run.calls_by_stage.values().sum()
    }
}

/// Both passes at one size.
#[derive(Debug, Clone)]
pub struct SizeReport {
    /// Episodes in the archive.
    pub episodes: usize,
    /// Seconds spent generating the archive (not counted).
    pub generate_seconds: f64,
    /// The run against the test server with an empty cache.
    pub first: PassReport,
    /// The replay into a fresh graph from the cache (`--replay`).
    pub replay: PassReport,
}

/// What `bench run` measured.
#[derive(Debug, Clone)]
pub struct RunBenchReport {
    /// Sizes, smallest first.
    pub sizes: Vec<SizeReport>,
    /// Cores the machine has.
    pub cores: usize,
}

fn mix(seed: u64, k: u64) -> u64 {
    let mut x = seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

struct Person {
    name: String,
    first: String,
    user: String,
}

struct Company {
    name: String,
    domain: String,
}

const SECTORS: [&str; 8] = [
    "Systems",
    "Logistics",
    "Supply",
    "Outfitters",
    "Analytics",
    "Foods",
    "Hardware",
    "Partners",
];
const PRODUCTS: [&str; 6] = [
    "laptops",
    "monitors",
    "docking stations",
    "software seats",
    "support hours",
    "headsets",
];
const ROLES: [&str; 5] = [
    "buyer",
    "account manager",
    "procurement lead",
    "finance analyst",
    "operations manager",
];

/// Home companies: the buyers' side, mentioned in most episodes.
const HOMES: usize = 3;

/// People and companies of an archive of `episodes` episodes.
struct World {
    seed: u64,
    people: Vec<Person>,
    companies: Vec<Company>,
}

impl World {
    fn new(episodes: usize, seed: u64) -> World {
        let companies = (episodes / 50).max(8);
        let people = (episodes / 6).max(20);
        let companies = (0..companies as u64)
            .map(|c| {
                let mut rng = StdRng::seed_from_u64(mix(seed ^ 0xc0, c));
                let stem = word(&mut rng, 2);
                let sector = SECTORS[rng.random_range(0..SECTORS.len())];
                Company {
                    domain: format!("{}.test", stem.to_lowercase()),
                    name: format!("{stem} {sector}"),
                }
            })
            .collect();
        let people = (0..people as u64)
            .map(|p| {
                let mut rng = StdRng::seed_from_u64(mix(seed ^ 0x9e, p));
                let first = word(&mut rng, 2);
                let last = word(&mut rng, 2);
                Person {
                    name: format!("{first} {last}"),
                    user: format!("{}.{}", first.to_lowercase(), last.to_lowercase()),
                    first,
                }
            })
            .collect();
        World {
            seed,
            people,
            companies,
        }
    }

    /// Employer of person `p` in the first (0) or second (1) half of the
    /// archive: three in ten work for a home company (`0..HOMES`), the
    /// rest for a seller; a fifth of the people move, within their side.
    fn employer(&self, p: usize, era: usize) -> usize {
        let h = mix(self.seed ^ 0xe3, p as u64);
        let (first, n) = if p % 10 < 3 {
            (0, HOMES as u64)
        } else {
            (HOMES as u64, self.companies.len() as u64 - HOMES as u64)
        };
        let base = h % n;
        let k = if era == 1 && (h >> 20).is_multiple_of(5) {
            (base + 1 + (h >> 32) % (n - 1).max(1)) % n
        } else {
            base
        };
        (first + k) as usize
    }

    fn email(&self, p: usize, company: usize) -> String {
        format!("{}@{}", self.people[p].user, self.companies[company].domain)
    }
}

fn entity(name: &str, kind: &str, attributes: &[(&str, String)]) -> Value {
    let attributes: Vec<Value> = attributes
        .iter()
        .map(|(n, v)| json!({"name": n, "value": v}))
        .collect();
    json!({"name": name, "type": kind, "attributes": attributes})
}

/// The fact that `person` works for `company`.
fn works_for(person: &Person, company: &Company, valid_at: Option<&str>) -> Value {
    fact(
        &person.name,
        &company.name,
        "EMPLOYED_BY",
        format!("{} works for {}.", person.name, company.name),
        valid_at,
    )
}

fn fact(source: &str, target: &str, relation: &str, text: String, valid_at: Option<&str>) -> Value {
    json!({
        "source": source,
        "target": target,
        "relation_type": relation,
        "fact": text,
        "valid_at": valid_at,
        "invalid_at": null
    })
}

/// The replies the model gives for one episode: entities and facts.
struct Answer {
    entities: String,
    facts: String,
}

/// A generated archive: JSON Lines records and the answers by content.
struct Archive {
    lines: Vec<String>,
    answers: HashMap<String, Answer>,
}

fn generate(episodes: usize, seed: u64) -> Archive {
    let world = World::new(episodes, seed);
    let start: DateTime<Utc> = Utc
        .with_ymd_and_hms(2024, 1, 1, 8, 0, 0)
        .single()
        .unwrap_or_default();
    let mut lines = Vec::with_capacity(episodes);
    let mut answers = HashMap::with_capacity(episodes);
    for i in 0..episodes {
        let thread = i / 4;
        let at = start + Days::minutes(7 * i as i64);
        let mut rng = StdRng::seed_from_u64(mix(seed ^ 0x7d, thread as u64));
        let order = Order::draw(&world, &mut rng, thread, usize::from(i >= episodes / 2), at);
        let (content, entities, facts) = match i % 4 {
            0 => order.purchase_order(),
            1 => order.confirmation(),
            2 => order.shipping_chat(),
            _ => order.new_joiner(&mut rng),
        };
        lines.push(
            json!({
                "id": format!("ep-{i}"),
                "content": content,
                "kind": "message",
                "reference_time": order.ref_time,
                "document_id": format!("thread-{thread}"),
                "source_description": "procurement mail",
            })
            .to_string(),
        );
        answers.insert(
            content,
            Answer {
                entities: json!({ "entities": entities }).to_string(),
                facts: json!({ "facts": facts }).to_string(),
            },
        );
    }
    Archive { lines, answers }
}

/// One generated episode: its text, and the entities and facts the model
/// answers for it.
type Episode = (String, Vec<Value>, Vec<Value>);

/// The purchase order a thread of four episodes is about, as drawn from
/// the thread's generator.
struct Order<'w> {
    world: &'w World,
    /// When the episode was written.
    at: DateTime<Utc>,
    /// The half of the archive (0 or 1), for [`World::employer`].
    era: usize,
    buyer: usize,
    seller: usize,
    /// The buyer's and the seller's companies.
    b: usize,
    s: usize,
    po: String,
    product: &'static str,
    qty: u32,
    amount: u64,
    ref_time: String,
}

impl<'w> Order<'w> {
    /// Draws the order of `thread` from `rng` (the draws of every episode
    /// of the thread, in this order), written at `at` in `era`.
    fn draw(
        world: &'w World,
        rng: &mut StdRng,
        thread: usize,
        era: usize,
        at: DateTime<Utc>,
    ) -> Self {
        let people = world.people.len();
        // Buyers are people p with p % 10 < 3 (home companies), sellers
        // the others.
        let buyer = (rng.random_range(0..people.div_ceil(10)) * 10 + rng.random_range(0..3))
            .min(people - 1);
        let mut seller = rng.random_range(0..people);
        if seller % 10 < 3 {
            seller = (seller - seller % 10 + 3).min(people - 1);
        }
        let b = world.employer(buyer, era);
        let s = world.employer(seller, era);
        let po = format!("PO-{}", 100_000 + thread);
        let product = PRODUCTS[rng.random_range(0..PRODUCTS.len())];
        let qty: u32 = rng.random_range(5..500);
        let amount = qty as u64 * rng.random_range(20..2_000u64);
        let ref_time = at.format("%Y-%m-%dT%H:%M:%SZ").to_string();
        Order {
            world,
            at,
            era,
            buyer,
            seller,
            b,
            s,
            po,
            product,
            qty,
            amount,
            ref_time,
        }
    }

    /// The buyer, the seller and their companies.
    fn parties(&self) -> (&'w Person, &'w Person, &'w Company, &'w Company) {
        let w = self.world;
        (
            &w.people[self.buyer],
            &w.people[self.seller],
            &w.companies[self.b],
            &w.companies[self.s],
        )
    }

    /// The date `d` days after the episode.
    fn day(&self, d: i64) -> String {
        (self.at + Days::days(d)).format("%Y-%m-%d").to_string()
    }

    /// The first episode of a thread: the buyer's purchase order.
    fn purchase_order(&self) -> Episode {
        let (pb, ps, cb, cs) = self.parties();
        let (world, buyer, seller, b, s) = (self.world, self.buyer, self.seller, self.b, self.s);
        let (po, ref_time) = (self.po.as_str(), self.ref_time.as_str());
        let (product, qty, amount) = (self.product, self.qty, self.amount);
        let day = |d: i64| self.day(d);
        (
            format!(
                "From: {} <{}>\nTo: {} <{}>\nSubject: Purchase order {po}\n\nHi {},\n\n{} issues purchase order {po} to {} for {qty} {product} at {amount} USD. Please confirm delivery by {}.\n\nThanks,\n{}",
                pb.name,
                world.email(buyer, b),
                ps.name,
                world.email(seller, s),
                ps.first,
                cb.name,
                cs.name,
                day(14),
                pb.first
            ),
            vec![
                entity(&pb.name, "Person", &[("email", world.email(buyer, b))]),
                entity(&ps.name, "Person", &[("email", world.email(seller, s))]),
                entity(&cb.name, "Company", &[("domain", cb.domain.clone())]),
                entity(&cs.name, "Company", &[("domain", cs.domain.clone())]),
                entity(po, "Contract", &[("details", format!("{qty} {product}"))]),
            ],
            vec![
                fact(
                    &cb.name,
                    po,
                    "PARTY_TO",
                    format!("{} is the buyer on {po}.", cb.name),
                    Some(ref_time),
                ),
                fact(
                    &cs.name,
                    po,
                    "PARTY_TO",
                    format!("{} is the seller on {po}.", cs.name),
                    Some(ref_time),
                ),
                fact(
                    &pb.name,
                    po,
                    "SIGNED",
                    format!("{} signed {po}.", pb.name),
                    Some(ref_time),
                ),
                works_for(pb, cb, None),
            ],
        )
    }

    /// The second: the seller confirms.
    fn confirmation(&self) -> Episode {
        let (_, ps, _, cs) = self.parties();
        let (world, seller, s) = (self.world, self.seller, self.s);
        let (po, ref_time, product) = (self.po.as_str(), self.ref_time.as_str(), self.product);
        let day = |d: i64| self.day(d);
        (
            format!(
                "From: {} <{}>\nSubject: RE: Purchase order {po}\n\n{} confirms {po} and will ship the {product} on {}.\n\n{}, account manager at {}",
                ps.name,
                world.email(seller, s),
                cs.name,
                day(10),
                ps.name,
                cs.name
            ),
            vec![
                entity(
                    &ps.name,
                    "Person",
                    &[
                        ("email", world.email(seller, s)),
                        ("role", "account manager".into()),
                    ],
                ),
                entity(&cs.name, "Company", &[]),
                entity(po, "Contract", &[]),
            ],
            vec![
                fact(
                    &cs.name,
                    po,
                    "PARTY_TO",
                    format!("{} confirmed {po}.", cs.name),
                    Some(ref_time),
                ),
                works_for(ps, cs, None),
            ],
        )
    }

    /// The third: a chat line about receiving the shipment.
    fn shipping_chat(&self) -> Episode {
        let (pb, ps, cb, cs) = self.parties();
        let po = self.po.as_str();
        let day = |d: i64| self.day(d);
        let buyer_inc = format!("{} Inc.", cb.name);
        (
            format!(
                "{}: {} from {} says {po} ships on {}. Can someone at {buyer_inc} receive it?",
                pb.name,
                ps.name,
                cs.name,
                day(10)
            ),
            vec![
                entity(&pb.name, "Person", &[]),
                entity(&ps.name, "Person", &[]),
                entity(&cs.name, "Company", &[]),
                entity(&buyer_inc, "Company", &[]),
                entity(po, "Contract", &[]),
            ],
            vec![
                works_for(ps, cs, None),
                fact(
                    &buyer_inc,
                    po,
                    "PARTY_TO",
                    format!("{} receives {po}.", cb.name),
                    None,
                ),
            ],
        )
    }

    /// The fourth: someone of either side joins a company (two more draws
    /// from the thread's `rng`).
    fn new_joiner(&self, rng: &mut StdRng) -> Episode {
        let (world, era) = (self.world, self.era);
        let people = world.people.len();
        let day = |d: i64| self.day(d);
        let p = rng.random_range(0..people);
        let c = world.employer(p, era);
        let person = &world.people[p];
        let company = &world.companies[c];
        let role = ROLES[rng.random_range(0..ROLES.len())];
        let date = day(-3);
        (
            format!(
                "{} <{}> joined {} as {role} on {date}. Please add {} to the vendor portal.",
                person.name,
                world.email(p, c),
                company.name,
                person.first
            ),
            vec![
                entity(
                    &person.name,
                    "Person",
                    &[("email", world.email(p, c)), ("role", role.into())],
                ),
                entity(
                    &company.name,
                    "Company",
                    &[("domain", company.domain.clone())],
                ),
            ],
            vec![works_for(person, company, Some(&date))],
        )
    }
}

/// The current episode's text in an extraction prompt.
fn current_episode(user: &str) -> Option<&str> {
    let rest = user.split_once("<CURRENT EPISODE")?.1;
    let body = rest.split_once(">\n")?.1;
    Some(body.split_once("\n</CURRENT EPISODE>")?.0)
}

/// The numbered items of a batched prompt (`[k] ...` lines).
fn numbered_items(user: &str) -> Vec<(u64, &str)> {
    user.lines()
        .filter_map(|l| {
            let (k, rest) = l.strip_prefix('[')?.split_once("] ")?;
            Some((k.parse().ok()?, rest))
        })
        .collect()
}

/// Numbers `n` of the `"{label} n:"` headings of a resolution prompt.
fn numbered(user: &str, label: &str) -> Vec<u64> {
    user.lines()
        .filter_map(|l| l.strip_prefix(label)?.split_once(':')?.0.parse().ok())
        .collect()
}

fn answer(answers: &HashMap<String, Answer>, req: &ChatRequestView) -> Reply {
    let system = req.last("system").unwrap_or_default();
    let user = req.last("user").unwrap_or_default();
    let known = current_episode(user).and_then(|c| answers.get(c));
    if user.contains("TASK: list the named entities") {
        return Reply::Content(
            known.map_or_else(|| r#"{"entities": []}"#.to_string(), |a| a.entities.clone()),
        );
    }
    if user.contains("TASK: state every fact") {
        return Reply::Content(
            known.map_or_else(|| r#"{"facts": []}"#.to_string(), |a| a.facts.clone()),
        );
    }
    if system.contains("already classified as") {
        let facts = system.contains("is a fact");
        // Keyed by item number, as the walk's schema asks.
        let answers: serde_json::Map<String, Value> = numbered_items(user)
            .into_iter()
            .map(|(k, text)| {
                let answer = if facts {
                    json!(if text.contains(" works for ") {
                        "WORKS_FULL_TIME_FOR"
                    } else {
                        "none"
                    })
                } else {
                    let name = text.strip_prefix("name: ").unwrap_or(text);
                    if name.starts_with("PO-") {
                        json!({"subtype": "PurchaseOrder", "attributes": {"po_number": name}})
                    } else {
                        json!("none")
                    }
                };
                (k.to_string(), answer)
            })
            .collect();
        return Reply::json(&Value::Object(answers));
    }
    if system.contains("resolve entity mentions") {
        let items: Vec<Value> = numbered(user, "Mention ")
            .into_iter()
            .map(|k| json!({"id": k, "choice": 0}))
            .collect();
        return Reply::json(&json!({ "items": items }));
    }
    if system.contains("temporal knowledge graph consistent") {
        let items: Vec<Value> = numbered(user, "New fact ")
            .into_iter()
            .map(|k| json!({"id": k, "contradicts": []}))
            .collect();
        return Reply::json(&json!({ "items": items }));
    }
    Reply::Content("{}".into())
}

fn spec_for(
    archive: &Path,
    graph: &Path,
    cache: &Path,
    base_url: &str,
    concurrency: u32,
) -> Result<(PipelineSpec, Ontology), BenchError> {
    let step = |e: String| BenchError::Step(e);
    let mut doc: toml::Table = toml::from_str(include_str!("../../pipelines/procurement.toml"))
        .map_err(|e| step(format!("the example spec: {e}")))?;
    let url = |p: &Path| format!("file://{}/", p.display());
    let table = |v: Value| -> Result<toml::Value, BenchError> {
        toml::Value::try_from(v).map_err(|e| step(e.to_string()))
    };
    doc.insert(
        "source".into(),
        table(json!({"url": url(archive), "format": "jsonl"}))?,
    );
    doc.insert(
        "output".into(),
        table(json!({"graph": url(graph), "group_id": "bench"}))?,
    );
    doc.insert(
        "llm".into(),
        table(json!({
            "base_url": base_url,
            "model": "bench-model",
            "api_key_env": "GRAPHLOOM_BENCH_NO_KEY",
            "requests_per_minute": 100_000_000u32,
            "tokens_per_minute": 4_000_000_000u32,
            "max_concurrency": concurrency,
            "cache_url": url(cache),
        }))?,
    );
    let text = toml::to_string(&doc).map_err(|e| step(e.to_string()))?;
    let spec = PipelineSpec::from_toml(&text, Path::new("bench-run.toml"))
        .map_err(|e| step(e.to_string()))?;
    let ontology = Ontology::try_from(&spec.ontology).map_err(|e| step(e.to_string()))?;
    Ok((spec, ontology))
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU seconds (user + system) of this process so far.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux platform graphloom builds for.
    Some(ticks / 100.0)
}

async fn pass(
    spec: &PipelineSpec,
    ontology: &Ontology,
    server: &TestServer,
    cache: CacheMode,
) -> Result<PassReport, BenchError> {
    let store = GraphStore::open(&spec.output.graph, &Default::default())
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let options = RunOptions {
        cache,
        ..RunOptions::default()
    };
    server.take_requests();
    // Peak memory of this run only: reset the high-water mark first.
    super::reset_peak_rss();
    let load_before = load_average();
    let cpu_before = cpu_seconds();
    let run = crate::run::run(spec, ontology, &store, &options)
        .await
        .map_err(|e| BenchError::Step(e.to_string()))?;
    let cpu = match (cpu_before, cpu_seconds()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    Ok(PassReport {
        run,
        http_requests: server.take_requests().len(),
        cpu_seconds: cpu,
        load: (load_before, load_average()),
        peak_rss: super::peak_rss(),
    })
}

async fn one_size(settings: &RunBench, episodes: usize) -> Result<SizeReport, BenchError> {
    let dir = settings.dir.join(format!("n{episodes}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let archive_dir = dir.join("archive");
    std::fs::create_dir_all(&archive_dir)?;
    let started = Instant::now();
    let archive = generate(episodes, settings.seed);
    for (k, chunk) in archive.lines.chunks(1_000).enumerate() {
        let mut text = chunk.join("\n");
        text.push('\n');
        std::fs::write(archive_dir.join(format!("part-{k:05}.jsonl")), text)?;
    }
    let generate_seconds = started.elapsed().as_secs_f64();
    let answers = Arc::new(archive.answers);
    let server =
        TestServer::start(Behavior::with_responder(move |req| answer(&answers, req))).await?;
    let cache = dir.join("cache");
    let (spec, ontology) = spec_for(
        &archive_dir,
        &dir.join("graph"),
        &cache,
        &server.base_url(),
        settings.concurrency,
    )?;
    let first = pass(&spec, &ontology, &server, CacheMode::ReadWrite).await?;
    let (replay_spec, _) = spec_for(
        &archive_dir,
        &dir.join("graph-replay"),
        &cache,
        &server.base_url(),
        settings.concurrency,
    )?;
    let replay = pass(&replay_spec, &ontology, &server, CacheMode::Replay).await?;
    server.shutdown().await;
    Ok(SizeReport {
        episodes,
        generate_seconds,
        first,
        replay,
    })
}

/// Runs the benchmark: at `episodes / scale` first when a scale is given,
/// then at `episodes`.
pub async fn run_pipeline_bench(settings: RunBench) -> Result<RunBenchReport, BenchError> {
    let mut sizes = Vec::new();
    if let Some(scale) = settings.scale.filter(|s| *s > 1) {
        sizes.push(one_size(&settings, (settings.episodes / scale).max(1)).await?);
    }
    sizes.push(one_size(&settings, settings.episodes).await?);
    Ok(RunBenchReport {
        sizes,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}

fn load_text(p: &PassReport) -> String {
    let f = |l: Option<f64>| l.map_or("?".to_string(), |l| format!("{l:.2}"));
    format!("load {} → {}", f(p.load.0), f(p.load.1))
}

fn pass_line(name: &str, p: &PassReport) -> String {
    format!(
        "  {name}: {:.2} s = {:.0} episodes/s; {} calls ({} from the cache), {} HTTP requests; {} episodes added, +{} nodes, +{} edges, {} failures; CPU {}, peak memory {}; {}",
        p.run.seconds,
        p.episodes_per_second(),
        p.calls(),
        p.run.cache_hits,
        p.http_requests,
        p.run.episodes_added,
        p.run.nodes_added,
        p.run.edges_added,
        p.run.failures_by_stage.values().sum::<usize>(),
        p.cpu_seconds
            .map_or("?".to_string(), |c| format!("{c:.2} s")),
        p.peak_rss.map_or("?".to_string(), |b| format!(
            "{:.2} GiB",
            b as f64 / (1u64 << 30) as f64
        )),
        load_text(p),
    )
}

impl fmt::Display for RunBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "bench run: {} build, {} cores",
            super::build_kind(),
            self.cores
        )?;
        for s in &self.sizes {
            writeln!(
                f,
                "\n{} episodes (archive generated in {:.1} s, not counted)",
                s.episodes, s.generate_seconds
            )?;
            writeln!(f, "{}", pass_line("first run, test server", &s.first))?;
            writeln!(f, "{}", pass_line("replay from the cache", &s.replay))?;
            writeln!(f, "  {:<18} {:>10} {:>10}", "stage (s)", "first", "replay")?;
            for (group, stages) in STAGE_GROUPS {
                writeln!(
                    f,
                    "  {group:<18} {:>10.3} {:>10.3}",
                    s.first.group(stages),
                    s.replay.group(stages)
                )?;
                if stages.len() > 1 {
                    for stage in stages {
                        writeln!(
                            f,
                            "    {stage:<16} {:>10.3} {:>10.3}",
                            s.first.run.stage(*stage),
                            s.replay.run.stage(*stage)
                        )?;
                    }
                }
            }
            writeln!(
                f,
                "  {:<18} {:>10.3} {:>10.3}",
                "total", s.first.run.seconds, s.replay.run.seconds
            )?;
        }
        if let [small, .., large] = self.sizes.as_slice() {
            let x = large.episodes as f64 / small.episodes as f64;
            writeln!(
                f,
                "\ntime ratios for {x:.0}× the episodes ({} → {}):",
                small.episodes, large.episodes
            )?;
            writeln!(f, "  {:<18} {:>10} {:>10}", "stage", "first", "replay")?;
            let ratio = |a: f64, b: f64| {
                if a > 0.0 {
                    format!("{:.1}×", b / a)
                } else {
                    "-".to_string()
                }
            };
            for (group, stages) in STAGE_GROUPS {
                writeln!(
                    f,
                    "  {group:<18} {:>10} {:>10}",
                    ratio(small.first.group(stages), large.first.group(stages)),
                    ratio(small.replay.group(stages), large.replay.group(stages))
                )?;
            }
            writeln!(
                f,
                "  {:<18} {:>10} {:>10}",
                "total",
                ratio(small.first.run.seconds, large.first.run.seconds),
                ratio(small.replay.run.seconds, large.replay.run.seconds)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_responder_finds_the_episode_and_numbered_items() {
        let user = "<PREVIOUS EPISODES>\n[2024] x\n</PREVIOUS EPISODES>\n\n<CURRENT EPISODE kind=\"message\" source=\"m\">\nFrom: A <a@b.test>\nhi\n</CURRENT EPISODE>\nREFERENCE TIME: 2024";
        assert_eq!(current_episode(user), Some("From: A <a@b.test>\nhi"));
        let items = numbered_items("[1] name: PO-1\n    text: x\n[2] name: Acme\n");
        assert_eq!(items, vec![(1, "name: PO-1"), (2, "name: Acme")]);
        assert_eq!(
            numbered("x\nMention 1: \"a\"\nMention 12: \"b\"", "Mention "),
            vec![1, 12]
        );
    }

    #[test]
    fn the_archive_is_deterministic_and_answers_every_episode() {
        let a = generate(40, 3);
        let b = generate(40, 3);
        assert_eq!(a.lines, b.lines);
        // Two join messages may read the same (same person, role and day):
        // what matters is that every episode's text has its answer.
        for line in &a.lines {
            let record: Value = serde_json::from_str(line).expect("a JSON line");
            let content = record["content"].as_str().expect("content");
            assert!(a.answers.contains_key(content), "{content}");
        }
    }
}
