//! Loading known nodes and facts without an LLM (`graphloom add`).
//!
//! Input is JSON Lines; each line is `{"node": {...}}` or `{"fact": {...}}`.
//! Every line either becomes rows or a `failures` row with its line number
//! and reason; good lines load even when others fail.
//!
//! Rules (docs/mapping.md, "Loading known nodes and facts"):
//! * a node's type must be declared (or `Entity`, unless `ontology.strict`);
//!   it gets the labels of its whole chain and the properties of its last
//!   type only;
//! * added nodes are never merged with existing nodes or with each other:
//!   each node line creates a node;
//! * a fact's endpoints are the first node of this file with the same
//!   normalised name and type, or a new node created for the fact.

use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Map, Value};

use object_store::ObjectStoreExt;

use crate::objstore;
use crate::ontology::{ENTITY_LABEL, Ontology, PropertyType, is_relation_type_name};
use crate::stage::{Stage, Timings};
use crate::store::rows::{EdgeRow, FailureRow, NodeRow};
use crate::store::{self, Changes, GraphStore, RunRow, RunStats, StoreError, Transaction};
use crate::text::{NameKeys, normalize_name};
use crate::values::{check_value, parse_time};

/// Errors of the add command (bad lines are failures rows, not errors).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AddError {
    /// The input file could not be read.
    #[error("cannot read {location}: {source}")]
    Read {
        location: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing the graph failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The task parsing the lines stopped unexpectedly (a panic).
    #[error("add: the task loading the lines failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// Result alias for the add command.
pub type Result<T, E = AddError> = std::result::Result<T, E>;

/// What an add did.
#[derive(Debug, Clone)]
pub struct AddReport {
    /// The committed `runs` row.
    pub run: RunRow,
    /// Lines that loaded nothing, with reasons.
    pub failures: Vec<FailureRow>,
    /// Nodes created for fact endpoints that no node line declared.
    pub implicit_nodes: usize,
    /// Wall time of each step: `read` (the input file), `open` (lock,
    /// recovery, the committed graph), `load` (parsing and checking the
    /// lines into rows), `commit` (the table commits and the runs row).
    pub timings: Timings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    node: Option<NodeIn>,
    fact: Option<FactIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeIn {
    name: String,
    #[serde(rename = "type", default)]
    node_type: Option<String>,
    #[serde(default)]
    attributes: Map<String, Value>,
    #[serde(default)]
    summary: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FactIn {
    source: String,
    #[serde(default)]
    source_type: Option<String>,
    target: String,
    #[serde(default)]
    target_type: Option<String>,
    relation_type: String,
    fact: String,
    #[serde(default)]
    valid_at: Option<String>,
    #[serde(default)]
    invalid_at: Option<String>,
    #[serde(default)]
    attributes: Map<String, Value>,
}

/// Reads the input, from a local path or an object store URL (with
/// `options` over the environment's settings).
async fn read_input(
    location: &str,
    options: &std::collections::BTreeMap<String, String>,
) -> Result<(String, Vec<u8>)> {
    let read_err = |source: Box<dyn std::error::Error + Send + Sync>| AddError::Read {
        location: location.to_string(),
        source,
    };
    if location.contains("://") && !location.starts_with("file://") {
        let url = url::Url::parse(location).map_err(|e| read_err(e.into()))?;
        let store = objstore::store_for(&url, options).map_err(|e| read_err(e.into()))?;
        let path = objstore::path_of(&url);
        let got = store.get(&path).await.map_err(|e| read_err(e.into()))?;
        let bytes = got.bytes().await.map_err(|e| read_err(e.into()))?;
        return Ok((objstore::redacted(&url), bytes.to_vec()));
    }
    let path = location.strip_prefix("file://").unwrap_or(location);
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|e| read_err(e.into()))?;
    let uri = std::fs::canonicalize(path)
        .ok()
        .and_then(|p| url::Url::from_file_path(p).ok())
        .map_or_else(|| path.to_string(), |u| u.to_string());
    Ok((uri, bytes))
}

/// Builds rows from the input's lines; pure, so tests can check the rules
/// without a store.
struct Loader {
    ontology: Ontology,
    group_id: String,
    run_id: String,
    source_uri: String,
    file_name: String,
    now: DateTime<Utc>,
    next_short_id: i64,
    nodes: Vec<NodeRow>,
    edges: Vec<EdgeRow>,
    failures: Vec<FailureRow>,
    /// (normalised name, type) → index of the first node with them.
    by_key: HashMap<(String, String), usize>,
    /// normalised name → indexes of nodes with that name.
    by_name: HashMap<String, Vec<usize>>,
    implicit_nodes: usize,
}

impl Loader {
    fn fail(&mut self, line: usize, reason: String, text: &str) {
        let item = format!("{}:{line}", self.file_name);
        self.failures.push(
            FailureRow::new(
                &self.run_id,
                crate::stage::Stage::Add,
                item,
                reason,
                self.now,
            )
            .at(self.source_uri.clone(), Some(line as i64))
            .excerpt(text),
        );
    }

    fn load(&mut self, bytes: &[u8]) {
        for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
            let line_no = i + 1;
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            let text = match std::str::from_utf8(raw) {
                Ok(t) => t,
                Err(e) => {
                    let lossy = String::from_utf8_lossy(raw).into_owned();
                    self.fail(
                        line_no,
                        format!(
                            "line is not valid UTF-8 (invalid byte at offset {})",
                            e.valid_up_to()
                        ),
                        &lossy,
                    );
                    continue;
                }
            };
            let text = text.trim_start_matches('\u{feff}');
            if text.trim().is_empty() {
                continue;
            }
            if let Err(reason) = self.load_line(text) {
                self.fail(line_no, reason, text);
            }
        }
    }

    fn load_line(&mut self, text: &str) -> std::result::Result<(), String> {
        let line: Line =
            serde_json::from_str(text).map_err(|e| format!("not a valid line: {e}"))?;
        match (line.node, line.fact) {
            (Some(node), None) => self.add_node(node).map(|_| ()),
            (None, Some(fact)) => self.add_fact(fact),
            (Some(_), Some(_)) => Err("a line holds either \"node\" or \"fact\", not both".into()),
            (None, None) => Err("a line must hold a \"node\" or a \"fact\" object".into()),
        }
    }

    fn check_attributes(
        &self,
        node_type: &str,
        attributes: Map<String, Value>,
    ) -> std::result::Result<Map<String, Value>, String> {
        // The generic type declares no properties; keep what the user gave.
        let Some(spec) = self.ontology.entity_types.get(node_type) else {
            return Ok(attributes);
        };
        let mut out = Map::new();
        for (key, value) in attributes {
            let Some(prop) = spec.properties.iter().find(|p| p.name == key) else {
                let known: Vec<&str> = spec.properties.iter().map(|p| p.name.as_str()).collect();
                return Err(format!(
                    "attribute `{key}` is not a property of `{node_type}` (its properties: {}; properties are not inherited)",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ));
            };
            if value.is_null() {
                continue;
            }
            let checked = check_value(prop.kind, &value).ok_or_else(|| {
                format!(
                    "attribute `{key}` must be {}, got {value}",
                    describe(prop.kind)
                )
            })?;
            out.insert(key, checked);
        }
        Ok(out)
    }

    fn add_node(&mut self, node: NodeIn) -> std::result::Result<usize, String> {
        let name = node.name.trim().to_string();
        if name.is_empty() {
            return Err("node name is empty".into());
        }
        let node_type = node.node_type.unwrap_or_else(|| ENTITY_LABEL.to_string());
        let labels = self.ontology.user_type_labels(&node_type)?;
        let attributes = self.check_attributes(&node_type, node.attributes)?;
        Ok(self.push_node(name, node_type, labels, attributes, node.summary))
    }

    fn push_node(
        &mut self,
        name: String,
        node_type: String,
        labels: Vec<String>,
        attributes: Map<String, Value>,
        summary: Option<String>,
    ) -> usize {
        let idx = self.nodes.len();
        let normalized = normalize_name(&name);
        self.by_key
            .entry((normalized.clone(), node_type.clone()))
            .or_insert(idx);
        self.by_name
            .entry(normalized.clone())
            .or_default()
            .push(idx);
        self.nodes.push(NodeRow {
            node_id: uuid::Uuid::now_v7().to_string(),
            short_id: self.next_short_id,
            group_id: self.group_id.to_string(),
            name,
            name_normalized: normalized,
            node_type,
            labels,
            summary,
            attributes: Value::Object(attributes).to_string(),
            episode_ids: Vec::new(),
            created_at: self.now,
            updated_at: self.now,
            rank: 0,
            name_embedding: None,
            origin: "add".into(),
            run_id: self.run_id.to_string(),
        });
        self.next_short_id += 1;
        idx
    }

    /// Finds the endpoint node of a fact, creating it when the file has none.
    fn endpoint(
        &mut self,
        side: &str,
        name: &str,
        node_type: Option<&str>,
    ) -> std::result::Result<usize, String> {
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("fact {side} is empty"));
        }
        let normalized = normalize_name(name);
        match node_type {
            Some(t) => {
                let labels = self
                    .ontology
                    .user_type_labels(t)
                    .map_err(|e| format!("fact {side}: {e}"))?;
                if let Some(idx) = self.by_key.get(&(normalized, t.to_string())) {
                    return Ok(*idx);
                }
                self.implicit_nodes += 1;
                Ok(self.push_node(name.to_string(), t.to_string(), labels, Map::new(), None))
            }
            None => {
                let found = self.by_name.get(&normalized).cloned().unwrap_or_default();
                let types: std::collections::BTreeSet<&str> = found
                    .iter()
                    .map(|i| self.nodes[*i].node_type.as_str())
                    .collect();
                match types.len() {
                    0 => {
                        let labels = self
                            .ontology
                            .user_type_labels(ENTITY_LABEL)
                            .map_err(|e| format!("fact {side}: {e}"))?;
                        self.implicit_nodes += 1;
                        Ok(self.push_node(
                            name.to_string(),
                            ENTITY_LABEL.into(),
                            labels,
                            Map::new(),
                            None,
                        ))
                    }
                    1 => Ok(found[0]),
                    _ => Err(format!(
                        "fact {side} `{name}` matches nodes of several types ({}); give {side}_type",
                        types.into_iter().collect::<Vec<_>>().join(", ")
                    )),
                }
            }
        }
    }

    fn add_fact(&mut self, fact: FactIn) -> std::result::Result<(), String> {
        let relation = fact.relation_type.trim();
        if !is_relation_type_name(relation) {
            return Err(format!(
                "relation_type {relation:?} must be SCREAMING_SNAKE_CASE (e.g. EMPLOYED_BY)"
            ));
        }
        let text = fact.fact.trim();
        if text.is_empty() {
            return Err("fact text is empty".into());
        }
        let valid_at =
            parse_time(fact.valid_at.as_deref()).map_err(|e| format!("valid_at: {e}"))?;
        let invalid_at =
            parse_time(fact.invalid_at.as_deref()).map_err(|e| format!("invalid_at: {e}"))?;
        if let (Some(v), Some(i)) = (valid_at, invalid_at)
            && i < v
        {
            return Err(format!("invalid_at {i} is before valid_at {v}"));
        }
        // Check endpoint types and the edge type before creating any node,
        // so a rejected fact leaves no stray node behind.
        for (side, t) in [("source", &fact.source_type), ("target", &fact.target_type)] {
            if let Some(t) = t {
                self.ontology
                    .user_type_labels(t)
                    .map_err(|e| format!("fact {side}: {e}"))?;
            }
        }
        let nodes_before = self.nodes.len();
        let implicit_before = self.implicit_nodes;
        let result = self.link(&fact, relation, text, valid_at, invalid_at);
        if result.is_err() {
            // Undo endpoint nodes created for a fact that was then rejected.
            self.rollback_nodes(nodes_before);
            self.implicit_nodes = implicit_before;
        }
        result
    }

    fn link(
        &mut self,
        fact: &FactIn,
        relation: &str,
        text: &str,
        valid_at: Option<DateTime<Utc>>,
        invalid_at: Option<DateTime<Utc>>,
    ) -> std::result::Result<(), String> {
        let source = self.endpoint("source", &fact.source, fact.source_type.as_deref())?;
        let target = self.endpoint("target", &fact.target, fact.target_type.as_deref())?;
        if source == target {
            return Err(
                "a fact needs two distinct entities; source and target are the same node".into(),
            );
        }
        let (st, tt) = (
            self.nodes[source].node_type.clone(),
            self.nodes[target].node_type.clone(),
        );
        if !self.ontology.edge_allows(relation, &st, &tt) {
            let allowed: Vec<String> = self.ontology.edge_types[relation]
                .source_targets
                .iter()
                .map(|p| format!("{} -> {}", p.source, p.target))
                .collect();
            return Err(format!(
                "`{relation}` does not allow {st} -> {tt} (allowed: {}; edge subtypes do not inherit source_targets)",
                allowed.join(", ")
            ));
        }
        let attributes = match self.ontology.edge_types.get(relation) {
            Some(spec) => {
                let mut out = Map::new();
                for (key, value) in fact.attributes.clone() {
                    let prop = spec
                        .properties
                        .iter()
                        .find(|p| p.name == key)
                        .ok_or_else(|| {
                            format!("attribute `{key}` is not a property of `{relation}`")
                        })?;
                    if value.is_null() {
                        continue;
                    }
                    let v = check_value(prop.kind, &value).ok_or_else(|| {
                        format!(
                            "attribute `{key}` must be {}, got {value}",
                            describe(prop.kind)
                        )
                    })?;
                    out.insert(key, v);
                }
                out
            }
            None => fact.attributes.clone(),
        };
        self.nodes[source].rank += 1;
        self.nodes[target].rank += 1;
        self.edges.push(EdgeRow {
            edge_id: uuid::Uuid::now_v7().to_string(),
            group_id: self.group_id.to_string(),
            source_node_id: self.nodes[source].node_id.clone(),
            target_node_id: self.nodes[target].node_id.clone(),
            relation_type: relation.to_string(),
            fact: text.to_string(),
            attributes: Value::Object(attributes).to_string(),
            episode_ids: Vec::new(),
            valid_at,
            invalid_at,
            created_at: self.now,
            expired_at: None,
            fact_embedding: None,
            origin: "add".into(),
            run_id: self.run_id.to_string(),
        });
        Ok(())
    }

    /// Removes the nodes from index `keep` on (at most the two endpoints
    /// of one fact) and their index entries. Touches only those entries:
    /// sweeping the whole index here made loading facts with untyped,
    /// undeclared endpoints quadratic (each rejected fact paid for every
    /// node loaded so far).
    fn rollback_nodes(&mut self, keep: usize) {
        while self.nodes.len() > keep {
            let idx = self.nodes.len() - 1;
            let node = self.nodes.pop().expect("len > keep");
            self.next_short_id -= 1;
            let key = (node.name_normalized.clone(), node.node_type.clone());
            if self.by_key.get(&key) == Some(&idx) {
                self.by_key.remove(&key);
            }
            if let Some(list) = self.by_name.get_mut(&node.name_normalized) {
                list.retain(|i| *i != idx);
                if list.is_empty() {
                    self.by_name.remove(&node.name_normalized);
                }
            }
        }
    }
}

fn describe(kind: PropertyType) -> &'static str {
    match kind {
        PropertyType::Text => "text (a JSON string)",
        PropertyType::Int => "an int (a JSON integer)",
        PropertyType::Float => "a float (a JSON number)",
        PropertyType::Bool => "a bool (true or false)",
        PropertyType::Date => "a date (\"YYYY-MM-DD\")",
    }
}

/// Loads `location` (JSON Lines; a path or an object store URL, read with
/// `input_options` as storage options) into the graph as one run. Nodes
/// are written with their name blocking keys under `name_keys` (from the
/// spec's `[resolve]` settings, [`crate::spec::resolve::ResolveSpec::name_keys`]).
pub async fn add_file(
    store: &GraphStore,
    ontology: &Ontology,
    name_keys: &NameKeys,
    group_id: &str,
    location: &str,
    input_options: &std::collections::BTreeMap<String, String>,
) -> Result<AddReport> {
    let mut timings = Timings::default();
    let mark = Instant::now();
    let (source_uri, bytes) = read_input(location, input_options).await?;
    let mark = timings.lap(Stage::Read, mark);
    let mut tx = store.begin("add", group_id).await?;
    let outcome = load(
        &mut tx,
        ontology,
        group_id,
        source_uri,
        bytes,
        &mut timings,
        mark,
    )
    .await;
    // Staging computes every node's blocking keys, CPU work timed with the
    // commit.
    let mark = Instant::now();
    let outcome = outcome.and_then(|(changes, mut stats, implicit)| {
        stats.ontology_hash = tx.stage_changes(&changes, ontology, name_keys)?;
        Ok((changes, stats, implicit))
    });
    let (changes, stats, implicit_nodes) = match outcome {
        Ok(o) => o,
        Err(e) => {
            tx.fail(&e.to_string(), RunStats::default()).await.ok();
            return Err(e);
        }
    };
    let run = tx.commit(stats).await?;
    timings.lap(Stage::Commit, mark);
    Ok(AddReport {
        run,
        failures: changes.failures,
        implicit_nodes,
        timings,
    })
}

/// Reads the committed graph's largest short id, loads the lines into rows
/// (off the async runtime: parsing is CPU work proportional to the file).
async fn load(
    tx: &mut Transaction,
    ontology: &Ontology,
    group_id: &str,
    source_uri: String,
    bytes: Vec<u8>,
    timings: &mut Timings,
    mark: Instant,
) -> Result<(Changes, RunStats, usize)> {
    let ctx = tx.base_context().await?;
    let next_short_id = store::max_short_id(&ctx).await? + 1;
    let mark = timings.lap(Stage::Open, mark);
    let file_name = source_uri
        .rsplit('/')
        .next()
        .unwrap_or(&source_uri)
        .to_string();
    let mut loader = Loader {
        ontology: ontology.clone(),
        group_id: group_id.to_string(),
        run_id: tx.run_id().to_string(),
        source_uri: source_uri.clone(),
        file_name,
        now: Utc::now(),
        next_short_id,
        nodes: Vec::new(),
        edges: Vec::new(),
        failures: Vec::new(),
        by_key: HashMap::new(),
        by_name: HashMap::new(),
        implicit_nodes: 0,
    };
    let loader = tokio::task::spawn_blocking(move || {
        loader.load(&bytes);
        loader
    })
    .await
    .map_err(AddError::Task)?;
    let changes = Changes {
        nodes: loader.nodes,
        edges: loader.edges,
        failures: loader.failures,
        ..Changes::default()
    };
    let stats = RunStats {
        nodes_added: changes.nodes.len() as i64,
        edges_added: changes.edges.len() as i64,
        failures: changes.failures.len() as i64,
        ..RunStats::default()
    };
    timings.lap(Stage::Load, mark);
    Ok((changes, stats, loader.implicit_nodes))
}
