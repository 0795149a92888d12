//! The ontology: entity and edge types, their hierarchies, and the rules that
//! make a hierarchy valid (DESIGN.md §3).
//!
//! Types are declared flat (`entity_types`, `edge_types`); the hierarchies
//! only hold structure as nested tables whose keys are declared type names
//! and where `{}` marks a leaf. A declared type that appears in no hierarchy
//! is a top-level type without subtypes.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

pub use crate::spec::ontology::{
    EdgeTypeSpec, EntityTypeSpec, Hierarchy, OntologySpec, PropertySpec, PropertyType, SourceTarget,
};
use indexmap::IndexMap;

/// The built-in label every node carries; no custom type may use it.
pub const ENTITY_LABEL: &str = "Entity";
/// Most direct subtypes a type may have.
pub const MAX_DIRECT_SUBTYPES: usize = 10;
/// Most subtype levels below a top-level type.
pub const MAX_SUBTYPE_LEVELS: usize = 4;
/// Most entity types in one ontology, subtypes included.
pub const MAX_ENTITY_TYPES: usize = 100;

/// Node columns that entity properties must not shadow: properties live in
/// the `attributes` JSON, and a property called `name` or `labels` would be
/// ambiguous next to the column of the same name.
pub const RESERVED_NODE_PROPERTIES: &[&str] = &[
    "uuid",
    "node_id",
    "short_id",
    "group_id",
    "name",
    "name_normalized",
    "type",
    "labels",
    "summary",
    "attributes",
    "episode_ids",
    "created_at",
    "updated_at",
    "rank",
    "name_embedding",
    "origin",
    "run_id",
];

/// Edge columns that edge properties must not shadow.
pub const RESERVED_EDGE_PROPERTIES: &[&str] = &[
    "uuid",
    "edge_id",
    "group_id",
    "source_node_id",
    "target_node_id",
    "relation_type",
    "fact",
    "attributes",
    "episode_ids",
    "valid_at",
    "invalid_at",
    "created_at",
    "expired_at",
    "fact_embedding",
    "origin",
    "run_id",
];

/// One problem found in an ontology, with the spec path it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OntologyIssue {
    /// Dotted path into the spec, e.g. `ontology.entity_type_hierarchy.Contract`.
    pub path: String,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

impl fmt::Display for OntologyIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Errors of the ontology layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OntologyError {
    /// The ontology breaks one or more rules; every issue is listed.
    #[error("invalid ontology ({} error{}):\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, render_issues(.0))]
    Invalid(Vec<OntologyIssue>),
}

fn render_issues(issues: &[OntologyIssue]) -> String {
    issues
        .iter()
        .map(|i| format!("  - {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Result alias for the ontology layer.
pub type Result<T, E = OntologyError> = std::result::Result<T, E>;

/// Position of one type in its hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeNode {
    /// Type name.
    pub name: String,
    /// Parent type, `None` for a top-level type.
    pub parent: Option<String>,
    /// 1 for a top-level type, 2 for its subtypes, and so on.
    pub depth: usize,
    /// Direct subtypes in the order the hierarchy lists them.
    pub children: Vec<String>,
}

/// A validated forest of types: every declared type appears exactly once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeTree {
    nodes: IndexMap<String, TypeNode>,
}

impl TypeTree {
    /// Every type, top-level types in declared order, each followed by its
    /// subtrees (pre-order).
    pub fn iter(&self) -> impl Iterator<Item = &TypeNode> {
        let mut order = Vec::with_capacity(self.nodes.len());
        for top in self.nodes.values().filter(|n| n.parent.is_none()) {
            self.preorder(top, &mut order);
        }
        order.into_iter()
    }

    fn preorder<'a>(&'a self, node: &'a TypeNode, out: &mut Vec<&'a TypeNode>) {
        out.push(node);
        for child in &node.children {
            if let Some(c) = self.nodes.get(child) {
                self.preorder(c, out);
            }
        }
    }

    /// Looks up one type.
    pub fn get(&self, name: &str) -> Option<&TypeNode> {
        self.nodes.get(name)
    }

    /// Whether the type is declared.
    pub fn contains(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// Number of types.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no types.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Top-level types in declared order.
    pub fn top_level(&self) -> impl Iterator<Item = &TypeNode> {
        self.nodes.values().filter(|n| n.parent.is_none())
    }

    /// The chain from the top-level type down to `name`, root first, or
    /// `None` for an undeclared type.
    pub fn chain(&self, name: &str) -> Option<Vec<String>> {
        let mut chain = Vec::new();
        let mut cur = self.nodes.get(name)?;
        loop {
            chain.push(cur.name.clone());
            match &cur.parent {
                Some(p) => cur = self.nodes.get(p)?,
                None => break,
            }
        }
        chain.reverse();
        Some(chain)
    }

    /// Whether `ancestor` is `name` itself or one of its parents.
    pub fn is_a(&self, name: &str, ancestor: &str) -> bool {
        self.chain(name)
            .is_some_and(|c| c.iter().any(|t| t == ancestor))
    }

    /// Rows of the closure table: (ancestor, descendant, distance), with a
    /// distance-0 row for each type so that a filter on any type matches
    /// itself through the same join.
    pub fn closure(&self) -> Vec<(String, String, i32)> {
        let mut rows = Vec::new();
        for node in self.iter() {
            let chain = self.chain(&node.name).unwrap_or_default();
            let n = chain.len();
            for (i, ancestor) in chain.iter().enumerate() {
                rows.push((ancestor.clone(), node.name.clone(), (n - 1 - i) as i32));
            }
        }
        rows
    }

    /// Renders the forest as an indented tree, one type per line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let tops: Vec<_> = self.top_level().collect();
        for top in tops {
            out.push_str(&top.name);
            out.push('\n');
            self.render_children(top, "", &mut out);
        }
        out
    }

    fn render_children(&self, node: &TypeNode, prefix: &str, out: &mut String) {
        let n = node.children.len();
        for (i, child) in node.children.iter().enumerate() {
            let last = i + 1 == n;
            out.push_str(prefix);
            out.push_str(if last { "└── " } else { "├── " });
            out.push_str(child);
            out.push('\n');
            if let Some(c) = self.nodes.get(child) {
                let next = format!("{prefix}{}", if last { "    " } else { "│   " });
                self.render_children(c, &next, out);
            }
        }
    }
}

/// A validated ontology: the declared types plus their trees.
#[derive(Debug, Clone, Default)]
pub struct Ontology {
    /// Whether entities that fit no type are dropped.
    pub strict: bool,
    /// Entity types by name.
    pub entity_types: IndexMap<String, EntityTypeSpec>,
    /// Edge types by name.
    pub edge_types: IndexMap<String, EdgeTypeSpec>,
    /// Entity type hierarchy.
    pub entity_tree: TypeTree,
    /// Edge type hierarchy.
    pub edge_tree: TypeTree,
    spec: OntologySpec,
}

impl TryFrom<&OntologySpec> for Ontology {
    type Error = OntologyError;

    fn try_from(spec: &OntologySpec) -> Result<Self> {
        let mut issues = Vec::new();
        let entity_types = check_entity_types(spec, &mut issues);
        let edge_types = check_edge_types(spec, &entity_types, &mut issues);
        let entity_names: Vec<&str> = spec.entity_types.iter().map(|t| t.name.as_str()).collect();
        let edge_names: Vec<&str> = spec.edge_types.iter().map(|t| t.name.as_str()).collect();
        let entity_tree = build_tree(
            "ontology.entity_type_hierarchy",
            "entity",
            &entity_names,
            &spec.entity_type_hierarchy,
            &mut issues,
        );
        let edge_tree = build_tree(
            "ontology.edge_type_hierarchy",
            "edge",
            &edge_names,
            &spec.edge_type_hierarchy,
            &mut issues,
        );
        if entity_types.len() > MAX_ENTITY_TYPES {
            issues.push(OntologyIssue {
                path: "ontology.entity_types".into(),
                message: format!(
                    "{} entity types declared; at most {MAX_ENTITY_TYPES} are allowed, subtypes included",
                    entity_types.len()
                ),
            });
        }
        if !issues.is_empty() {
            return Err(OntologyError::Invalid(issues));
        }
        Ok(Ontology {
            strict: spec.strict,
            entity_types,
            edge_types,
            entity_tree,
            edge_tree,
            spec: spec.clone(),
        })
    }
}

impl Ontology {
    /// The spec this ontology was validated from.
    pub fn spec(&self) -> &OntologySpec {
        &self.spec
    }

    /// The labels of a type a user names (a `graphloom add` line, a
    /// `[[mapping]]` rule), or why it cannot be used: `Entity` under
    /// `ontology.strict`, or a type that is not declared.
    pub fn user_type_labels(&self, entity_type: &str) -> std::result::Result<Vec<String>, String> {
        if entity_type == ENTITY_LABEL && self.strict {
            return Err(format!(
                "type `{ENTITY_LABEL}` is not allowed: ontology.strict requires a declared type"
            ));
        }
        self.labels_for(entity_type).ok_or_else(|| {
            let known: Vec<&str> = self.entity_types.keys().map(String::as_str).collect();
            format!(
                "unknown entity type `{entity_type}` (declared: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )
        })
    }

    /// Node labels for an entity type: `Entity` followed by the type's chain,
    /// root first. `None` for an undeclared type; `Entity` alone for the
    /// generic type.
    pub fn labels_for(&self, entity_type: &str) -> Option<Vec<String>> {
        if entity_type == ENTITY_LABEL {
            return Some(vec![ENTITY_LABEL.to_string()]);
        }
        let mut labels = vec![ENTITY_LABEL.to_string()];
        labels.extend(self.entity_tree.chain(entity_type)?);
        Some(labels)
    }

    /// Whether a node of type `node_type` may stand where `wanted` is
    /// required: `Entity` accepts anything, otherwise `wanted` must be in the
    /// node's chain (a PurchaseOrder is a Contract).
    pub fn entity_fits(&self, node_type: &str, wanted: &str) -> bool {
        wanted == ENTITY_LABEL || self.entity_tree.is_a(node_type, wanted)
    }

    /// Whether a declared edge type allows these endpoint types. Only the
    /// edge type's own `source_targets` count (no inheritance); an empty list
    /// allows any pair.
    pub fn edge_allows(&self, edge_type: &str, source_type: &str, target_type: &str) -> bool {
        match self.edge_types.get(edge_type) {
            None => true,
            Some(t) if t.source_targets.is_empty() => true,
            Some(t) => t.source_targets.iter().any(|st| {
                self.entity_fits(source_type, &st.source)
                    && self.entity_fits(target_type, &st.target)
            }),
        }
    }

    /// Whether a node of type `node_type` is, or may turn out to be, a
    /// `wanted`: it fits `wanted` ([`Ontology::entity_fits`]), or `wanted`
    /// lies below its type (an `Organization` may be a `Company`). The
    /// generic `Entity` may be nothing more specific: a type the model
    /// gave no declared type says too little to be offered as one.
    pub fn entity_may_be(&self, node_type: &str, wanted: &str) -> bool {
        self.entity_fits(node_type, wanted)
            || (node_type != ENTITY_LABEL && self.entity_tree.is_a(wanted, node_type))
    }

    /// The `source_targets` pairs of `edge_type` that endpoints of these
    /// types are, or may turn out to be ([`Ontology::entity_may_be`]);
    /// `None` for an undeclared type or one that allows any pair.
    pub fn edge_pairs_maybe(
        &self,
        edge_type: &str,
        source_type: &str,
        target_type: &str,
    ) -> Option<Vec<(&str, &str)>> {
        let t = self.edge_types.get(edge_type)?;
        if t.source_targets.is_empty() {
            return None;
        }
        Some(
            t.source_targets
                .iter()
                .filter(|p| {
                    self.entity_may_be(source_type, &p.source)
                        && self.entity_may_be(target_type, &p.target)
                })
                .map(|p| (p.source.as_str(), p.target.as_str()))
                .collect(),
        )
    }

    /// Whether endpoints of these types allow `edge_type` now or once one
    /// or both are refined to a subtype: relations refine types.
    pub fn edge_may_allow(&self, edge_type: &str, source_type: &str, target_type: &str) -> bool {
        self.edge_pairs_maybe(edge_type, source_type, target_type)
            .is_none_or(|pairs| !pairs.is_empty())
    }

    /// Stable hash of the ontology's content, recorded with each run so a
    /// change of ontology is visible in `runs`.
    pub fn content_hash(&self) -> String {
        let json = serde_json::to_vec(&self.spec).unwrap_or_default();
        blake3::hash(&json).to_hex()[..16].to_string()
    }
}

fn is_entity_type_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Edge types are stored as relation types, which are SCREAMING_SNAKE_CASE.
pub fn is_relation_type_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

fn is_property_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn check_properties(
    base: &str,
    properties: &[PropertySpec],
    reserved: &[&str],
    issues: &mut Vec<OntologyIssue>,
) {
    let mut seen = BTreeSet::new();
    for (i, p) in properties.iter().enumerate() {
        let path = format!("{base}.properties[{i}]");
        if !is_property_name(&p.name) {
            issues.push(OntologyIssue {
                path: path.clone(),
                message: format!(
                    "property name {:?} must start with a letter or `_` and hold only letters, digits and `_`",
                    p.name
                ),
            });
        }
        // Engines such as Spark and DuckDB resolve column names without
        // regard to case, so `Name` would clash with `name` there.
        if reserved.iter().any(|r| r.eq_ignore_ascii_case(&p.name)) {
            issues.push(OntologyIssue {
                path: path.clone(),
                message: format!(
                    "property name `{}` is reserved: it is a built-in column ({})",
                    p.name,
                    reserved.join(", ")
                ),
            });
        }
        if let Some(pattern) = &p.pattern
            && let Some(problem) = pattern_problem(p.kind, pattern)
        {
            issues.push(OntologyIssue {
                path: format!("{path}.pattern"),
                message: problem,
            });
        }
        if !seen.insert(p.name.as_str()) {
            issues.push(OntologyIssue {
                path,
                message: format!("duplicate property `{}`", p.name),
            });
        }
    }
}

/// Why `pattern` cannot be a property's pattern, if it cannot: only text
/// properties have one, and it must be anchored (JSON Schema patterns
/// match anywhere otherwise, and a grammar needs the whole value) and be a
/// regular expression.
fn pattern_problem(kind: PropertyType, pattern: &str) -> Option<String> {
    if kind != PropertyType::Text {
        return Some(format!("only text properties take a pattern, not {kind}"));
    }
    if !pattern.starts_with('^') || !pattern.ends_with('$') {
        return Some(format!(
            "pattern {pattern:?} must start with `^` and end with `$` (it describes the whole value)"
        ));
    }
    if let Err(e) = crate::text::Pattern::compile(pattern) {
        return Some(format!(
            "pattern {pattern:?} is not a regular expression: {e}"
        ));
    }
    crate::text::Pattern::unbounded(pattern).then(|| {
        format!(
            "pattern {pattern:?} repeats without a bound (`*`, `+` or `{{n,}}`): write a bound such as `{{1,64}}` (a grammar-constrained server applies the pattern instead of the value's length limit, so an unbounded pattern lets a model write on until its token limit)"
        )
    })
}

fn check_entity_types(
    spec: &OntologySpec,
    issues: &mut Vec<OntologyIssue>,
) -> IndexMap<String, EntityTypeSpec> {
    let mut out = IndexMap::new();
    for (i, t) in spec.entity_types.iter().enumerate() {
        let path = format!("ontology.entity_types[{i}] ({})", t.name);
        if t.name.eq_ignore_ascii_case(ENTITY_LABEL) {
            issues.push(OntologyIssue {
                path: path.clone(),
                message: format!("`{ENTITY_LABEL}` is reserved: every node already carries it"),
            });
        } else if !is_entity_type_name(&t.name) {
            issues.push(OntologyIssue {
                path: path.clone(),
                message: format!(
                    "type name {:?} must start with a letter and hold only letters, digits and `_`",
                    t.name
                ),
            });
        }
        if t.description.trim().is_empty() {
            issues.push(OntologyIssue {
                path: path.clone(),
                message: "description is empty; the classifier needs a membership rule".into(),
            });
        }
        check_properties(&path, &t.properties, RESERVED_NODE_PROPERTIES, issues);
        let mut seen_ids = BTreeSet::new();
        for (j, id) in t.identity_properties.iter().enumerate() {
            if !seen_ids.insert(id.as_str()) {
                issues.push(OntologyIssue {
                    path: format!("{path}.identity_properties[{j}]"),
                    message: format!("duplicate identity property `{id}`"),
                });
            }
            if !t.properties.iter().any(|p| &p.name == id) {
                issues.push(OntologyIssue {
                    path: format!("{path}.identity_properties[{j}]"),
                    message: format!(
                        "identity property `{id}` is not a property of `{}` (properties are not inherited from parent types)",
                        t.name
                    ),
                });
            }
        }
        if out.contains_key(&t.name) {
            issues.push(OntologyIssue {
                path,
                message: format!("duplicate entity type `{}`", t.name),
            });
        } else {
            out.insert(t.name.clone(), t.clone());
        }
    }
    out
}

fn check_edge_types(
    spec: &OntologySpec,
    entity_types: &IndexMap<String, EntityTypeSpec>,
    issues: &mut Vec<OntologyIssue>,
) -> IndexMap<String, EdgeTypeSpec> {
    let mut out = IndexMap::new();
    for (i, t) in spec.edge_types.iter().enumerate() {
        let path = format!("ontology.edge_types[{i}] ({})", t.name);
        if !is_relation_type_name(&t.name) {
            issues.push(OntologyIssue {
                path: path.clone(),
                message: format!(
                    "edge type name {:?} must be SCREAMING_SNAKE_CASE (e.g. EMPLOYED_BY)",
                    t.name
                ),
            });
        }
        if t.description.trim().is_empty() {
            issues.push(OntologyIssue {
                path: path.clone(),
                message: "description is empty; extraction needs to know when the type applies"
                    .into(),
            });
        }
        check_properties(&path, &t.properties, RESERVED_EDGE_PROPERTIES, issues);
        for (j, st) in t.source_targets.iter().enumerate() {
            for (side, name) in [("source", &st.source), ("target", &st.target)] {
                if name != ENTITY_LABEL && !entity_types.contains_key(name) {
                    issues.push(OntologyIssue {
                        path: format!("{path}.source_targets[{j}].{side}"),
                        message: format!("`{name}` is not a declared entity type"),
                    });
                }
            }
        }
        if out.contains_key(&t.name) {
            issues.push(OntologyIssue {
                path,
                message: format!("duplicate edge type `{}`", t.name),
            });
        } else {
            out.insert(t.name.clone(), t.clone());
        }
    }
    out
}

/// Builds the forest for one hierarchy, reporting every rule it breaks.
fn build_tree(
    base: &str,
    kind: &str,
    declared: &[&str],
    hierarchy: &Hierarchy,
    issues: &mut Vec<OntologyIssue>,
) -> TypeTree {
    let declared_set: BTreeSet<&str> = declared.iter().copied().collect();
    // First parent (or None for top level) each type was placed under.
    let mut placed: HashMap<String, Option<String>> = HashMap::new();
    let mut nodes: IndexMap<String, TypeNode> = IndexMap::new();

    struct Walk<'a> {
        base: &'a str,
        kind: &'a str,
        declared: &'a BTreeSet<&'a str>,
        placed: &'a mut HashMap<String, Option<String>>,
        nodes: &'a mut IndexMap<String, TypeNode>,
        issues: &'a mut Vec<OntologyIssue>,
    }

    fn walk(w: &mut Walk<'_>, parent: Option<&str>, depth: usize, path: &str, h: &Hierarchy) {
        if h.0.len() > MAX_DIRECT_SUBTYPES && parent.is_some() {
            w.issues.push(OntologyIssue {
                path: path.to_string(),
                message: format!(
                    "`{}` has {} direct subtypes; at most {MAX_DIRECT_SUBTYPES} are allowed",
                    parent.unwrap_or_default(),
                    h.0.len()
                ),
            });
        }
        for (name, sub) in &h.0 {
            let child_path = format!("{path}.{name}");
            if name.eq_ignore_ascii_case(ENTITY_LABEL) && w.kind == "entity" {
                w.issues.push(OntologyIssue {
                    path: child_path.clone(),
                    message: format!(
                        "`{ENTITY_LABEL}` is built in and cannot appear in a hierarchy: every type is already an {ENTITY_LABEL}; list its subtypes as top-level types"
                    ),
                });
                continue;
            }
            if !w.declared.contains(name.as_str()) {
                let lost: Vec<&str> = sub.keys().collect();
                w.issues.push(OntologyIssue {
                    path: child_path.clone(),
                    message: format!(
                        "`{name}` is not a declared {} type; declare it in ontology.{}_types{}",
                        w.kind,
                        w.kind,
                        if lost.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " (its subtypes {} are not placed until it is)",
                                lost.join(", ")
                            )
                        }
                    ),
                });
                continue;
            }
            if let Some(first) = w.placed.get(name) {
                let first = first.as_deref().unwrap_or("the top level");
                let here = parent.unwrap_or("the top level");
                w.issues.push(OntologyIssue {
                    path: child_path,
                    message: format!(
                        "`{name}` appears under two parents ({first} and {here}); a type has one parent"
                    ),
                });
                continue;
            }
            // depth 1 = top level; subtype levels below it = depth - 1.
            if depth - 1 > MAX_SUBTYPE_LEVELS {
                w.issues.push(OntologyIssue {
                    path: child_path,
                    message: format!(
                        "`{name}` is {} subtype levels below its top-level type; at most {MAX_SUBTYPE_LEVELS} are allowed",
                        depth - 1
                    ),
                });
                continue;
            }
            w.placed.insert(name.clone(), parent.map(str::to_string));
            w.nodes.insert(
                name.clone(),
                TypeNode {
                    name: name.clone(),
                    parent: parent.map(str::to_string),
                    depth,
                    children: sub
                        .keys()
                        .filter(|k| w.declared.contains(k))
                        .map(str::to_string)
                        .collect(),
                },
            );
            walk(w, Some(name), depth + 1, &child_path, sub);
        }
    }

    let mut w = Walk {
        base,
        kind,
        declared: &declared_set,
        placed: &mut placed,
        nodes: &mut nodes,
        issues,
    };
    let base_path = w.base.to_string();
    walk(&mut w, None, 1, &base_path, hierarchy);

    // Children lists may name types that were rejected further down (two
    // parents, too deep): keep only children whose parent really is this node.
    let parents: HashMap<String, Option<String>> = nodes
        .iter()
        .map(|(k, v)| (k.clone(), v.parent.clone()))
        .collect();
    for node in nodes.values_mut() {
        node.children.retain(|c| {
            parents
                .get(c)
                .is_some_and(|p| p.as_deref() == Some(node.name.as_str()))
        });
    }
    // Declared types missing from the hierarchy are top-level leaves.
    for name in declared {
        if !nodes.contains_key(*name) {
            nodes.insert(
                name.to_string(),
                TypeNode {
                    name: name.to_string(),
                    parent: None,
                    depth: 1,
                    children: Vec::new(),
                },
            );
        }
    }
    // Top-level types in declaration order, whatever order the hierarchy
    // named them in.
    let position: HashMap<&str, usize> =
        declared.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    nodes.sort_by_key(|name, _| position.get(name.as_str()).copied().unwrap_or(usize::MAX));
    TypeTree { nodes }
}
