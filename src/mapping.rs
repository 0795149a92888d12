//! Record mapping: structured records (episodes of kind `json`) turned into
//! entities and facts by the `[[mapping]]` rules of the spec, with no LLM
//! call. What a mapping makes is the same [`Mention`]s and
//! [`FactMention`]s extraction makes, so mapped records and extracted text
//! go through one resolution.
//!
//! Rules (docs/mapping.md, "Record mapping"):
//! * the first mapping whose `files` glob matches the end of the record's
//!   file path and whose `when` fields all hold applies; a record no
//!   mapping applies to is extracted by the LLM like any other episode;
//! * a required entity whose name (or type) cannot be rendered, because a
//!   field is missing, null, empty or not a plain value, fails the record:
//!   one `failures` row naming the field, and the episode is not committed
//!   (a later run tries it again, after the data or the mapping is fixed);
//! * a property value that does not fit the property's kind or pattern,
//!   and a fact time that is not a time, are dropped with a `failures` row
//!   each; the rest of the record loads;
//! * values come from the record, so they are grounded by construction.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};

use crate::extract::{FactMention, Mention, NAME_MAX_CHARS, Rejected, Withdrawal};
use crate::ontology::{ENTITY_LABEL, Ontology, PropertyType};
use crate::source::{Episode, EpisodeKind};
use crate::spec::mapping::{EndMapSpec, EntityMapSpec, FactMapSpec, MappingSpec};
use crate::stage::Stage;
use crate::values::{check_value, coerce_text, parse_time};

/// Characters of the record kept as a mention's context (what adjudication
/// and summaries see of it).
const CONTEXT_CHARS: usize = 400;

/// A mapping rule the ontology or the mapping itself does not allow, with
/// the key it is about (`mapping[0].entities[1].type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingIssue {
    /// Where in the spec.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Errors of the mapping layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MappingError {
    /// The `[[mapping]]` tables break rules; every problem is listed.
    #[error("invalid record mapping:\n{}", list(.0))]
    Invalid(Vec<MappingIssue>),
}

fn list(issues: &[MappingIssue]) -> String {
    issues
        .iter()
        .map(|i| format!("  - {}: {}", i.path, i.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Result alias for the mapping layer.
pub type Result<T, E = MappingError> = std::result::Result<T, E>;

/// Text with `{field}` placeholders, parsed once.
#[derive(Debug, Clone, PartialEq)]
struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    /// A field; `true` when optional (`{middle_name?}`: empty when absent).
    Field(String, bool),
}

impl Template {
    fn parse(text: &str) -> std::result::Result<Self, String> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut field = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some('{') | None => {
                                return Err(format!(
                                    "`{text}`: a `{{` is not closed (write `{{{{` for a brace)"
                                ));
                            }
                            Some(c) => field.push(c),
                        }
                    }
                    let field = field.trim().to_string();
                    let (name, optional) = match field.strip_suffix('?') {
                        Some(f) => (f.trim().to_string(), true),
                        None => (field.clone(), false),
                    };
                    if name.is_empty() || name.split('.').any(str::is_empty) {
                        return Err(format!("`{text}`: `{{{field}}}` names no field"));
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Field(name, optional));
                }
                '}' => return Err(format!("`{text}`: a `}}` closes nothing (write `}}}}`)")),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Text(lit));
        }
        Ok(Template { parts })
    }

    /// A template without fields: its text.
    fn constant(&self) -> Option<String> {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Field(..) => None,
            })
            .collect()
    }

    /// The text for `record`, or the required field that has no plain
    /// value. Optional fields that are absent leave nothing, and the runs
    /// of spaces they leave behind become one.
    fn render(&self, record: &Map<String, Value>) -> std::result::Result<String, Missing> {
        let mut out = String::new();
        let mut skipped = false;
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(f, false) => out.push_str(&plain(record, f)?),
                Part::Field(f, true) => match plain(record, f) {
                    Ok(v) => out.push_str(&v),
                    Err(_) => skipped = true,
                },
            }
        }
        if skipped {
            out = out.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        Ok(out.trim().to_string())
    }
}

/// A field a template or a rule needed and did not find as a plain value.
#[derive(Debug, Clone, PartialEq)]
struct Missing {
    field: String,
    why: &'static str,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "field `{}` {}", self.field, self.why)
    }
}

/// The value at a dotted path (`a.b`), `None` when absent or null.
fn field<'r>(record: &'r Map<String, Value>, path: &str) -> Option<&'r Value> {
    let mut parts = path.split('.');
    let mut cur = record.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_object()?.get(p)?;
    }
    (!cur.is_null()).then_some(cur)
}

/// A field's value as text: strings, numbers and booleans.
fn plain(record: &Map<String, Value>, path: &str) -> std::result::Result<String, Missing> {
    let missing = |why| Missing {
        field: path.to_string(),
        why,
    };
    match field(record, path) {
        None => Err(missing("is missing or null")),
        Some(Value::String(s)) if s.trim().is_empty() => Err(missing("is empty")),
        Some(Value::String(s)) => Ok(s.trim().to_string()),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(v.to_string()),
        Some(_) => Err(missing("is an object or a list, not a value")),
    }
}

/// `*` (any run of characters but `/`) and `?` (one such character).
fn glob_matches(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len())
            .take_while(|&i| i == 0 || text[i - 1] != '/')
            .any(|i| glob_matches(rest, &text[i..])),
        Some(('?', rest)) => text
            .split_first()
            .is_some_and(|(c, t)| *c != '/' && glob_matches(rest, t)),
        Some((p, rest)) => text
            .split_first()
            .is_some_and(|(c, t)| c == p && glob_matches(rest, t)),
    }
}

/// Whether the glob matches the last path components of `uri` (as many as
/// the glob has), the `#…` fragment left out.
fn file_matches(glob: &str, uri: &str) -> bool {
    let path = uri.split('#').next().unwrap_or(uri);
    let depth = glob.split('/').count();
    let components: Vec<&str> = path.rsplit('/').take(depth).collect();
    if components.len() < depth {
        return false;
    }
    let tail: Vec<char> = components
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("/")
        .chars()
        .collect();
    let pattern: Vec<char> = glob.chars().collect();
    glob_matches(&pattern, &tail)
}

/// The text a `when` value compares by.
fn when_text(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// One entity rule, checked against the ontology.
#[derive(Debug, Clone)]
struct EntityRule {
    id: String,
    /// A type template: constant for most mappings, a field for records
    /// that say their own type.
    entity_type: Template,
    /// `name`, then its fallbacks.
    names: Vec<Template>,
    properties: Vec<(String, String)>,
    optional: bool,
    each: Option<String>,
}

/// One fact rule.
#[derive(Debug, Clone)]
struct FactRule {
    relation: String,
    chain: Vec<String>,
    source: usize,
    target: usize,
    fact: Option<Template>,
    valid_at: Option<String>,
    invalid_at: Option<String>,
    /// Field → value pairs that must all hold.
    when: Vec<(String, String)>,
    /// Field → value pairs none of which may hold.
    unless: Vec<(String, String)>,
}

/// One end rule (`[[mapping.ends]]`).
#[derive(Debug, Clone)]
struct EndRule {
    /// Position of the entity rule.
    entity: usize,
    relation: String,
    at: String,
    when: Vec<(String, String)>,
    unless: Vec<(String, String)>,
}

impl FactRule {
    /// Whether the fact is made from these fields.
    fn applies(&self, fields: &Map<String, Value>) -> bool {
        let holds = |(f, want): &(String, String)| plain(fields, f).is_ok_and(|v| &v == want);
        self.when.iter().all(holds) && !self.unless.iter().any(holds)
    }
}

/// One checked `[[mapping]]` table.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// Its position in the spec, for messages (`mapping[0]`).
    index: usize,
    files: Option<String>,
    when: Vec<(String, String)>,
    entities: Vec<EntityRule>,
    facts: Vec<FactRule>,
    ends: Vec<EndRule>,
}

/// Every `[[mapping]]` of a spec, checked against the ontology.
#[derive(Debug, Clone, Default)]
pub struct Mappings {
    list: Vec<Mapping>,
}

/// What one record made.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mapped {
    /// The record's entities, in rule order (facts index into them).
    pub mentions: Vec<Mention>,
    /// The facts between them.
    pub facts: Vec<FactMention>,
    /// The ends it states for every relationship of a type one of them has.
    pub withdrawals: Vec<Withdrawal>,
    /// Values and facts dropped, one `failures` row each.
    pub rejected: Vec<Rejected>,
}

impl Mappings {
    /// Checks every mapping against the ontology and lists every problem.
    pub fn compile(specs: &[MappingSpec], ontology: &Ontology) -> Result<Self> {
        let mut issues = Vec::new();
        let list = specs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| compile_one(i, s, ontology, &mut issues))
            .collect();
        if issues.is_empty() {
            Ok(Mappings { list })
        } else {
            Err(MappingError::Invalid(issues))
        }
    }

    /// Whether there are no mappings.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The mapping that applies to `episode`, if any: a `json` record whose
    /// file and fields match. The record is parsed once here and returned.
    pub fn find(&self, episode: &Episode) -> Option<(&Mapping, Map<String, Value>)> {
        if self.list.is_empty() || episode.kind != EpisodeKind::Json {
            return None;
        }
        let Ok(Value::Object(record)) = serde_json::from_str::<Value>(&episode.content) else {
            return None;
        };
        let m = self
            .list
            .iter()
            .find(|m| m.applies(&episode.source_uri, &record))?;
        Some((m, record))
    }
}

impl Mapping {
    fn applies(&self, uri: &str, record: &Map<String, Value>) -> bool {
        self.files.as_deref().is_none_or(|g| file_matches(g, uri))
            && self
                .when
                .iter()
                .all(|(f, want)| plain(record, f).is_ok_and(|v| &v == want))
    }

    /// The entities and facts of one record, or why the record cannot be
    /// mapped (it then fails as a whole).
    pub fn apply(
        &self,
        ontology: &Ontology,
        episode: &Episode,
        record: &Map<String, Value>,
    ) -> std::result::Result<Mapped, String> {
        let mut out = Mapped::default();
        let context: String = episode.content.chars().take(CONTEXT_CHARS).collect();
        // Per rule, the position of its mention for each item (one item
        // for a plain entity; None where an optional one is absent) and,
        // for a rule with `each`, the item it was read from.
        let mut at: Vec<Vec<Made<'_>>> = Vec::with_capacity(self.entities.len());
        for (k, rule) in self.entities.iter().enumerate() {
            let path = format!("mapping[{}].entities[{k}] (`{}`)", self.index, rule.id);
            let scopes: Vec<&Map<String, Value>> = match &rule.each {
                None => vec![record],
                Some(list) => match field(record, list) {
                    None => Vec::new(),
                    Some(Value::Array(items)) => {
                        let objects: Vec<&Map<String, Value>> =
                            items.iter().filter_map(Value::as_object).collect();
                        if objects.len() != items.len() && !rule.optional {
                            return Err(format!(
                                "{path}: field `{list}` holds an item that is not an object"
                            ));
                        }
                        objects
                    }
                    Some(_) if rule.optional => Vec::new(),
                    Some(_) => return Err(format!("{path}: field `{list}` is not a list")),
                },
            };
            let mut positions = Vec::with_capacity(scopes.len());
            for scope in scopes {
                let made =
                    self.entity(ontology, episode, rule, &path, scope, &context, &mut out)?;
                positions.push((made, rule.each.is_some().then_some(scope)));
            }
            at.push(positions);
        }
        for (k, rule) in self.facts.iter().enumerate() {
            let path = format!("mapping[{}].facts[{k}] (`{}`)", self.index, rule.relation);
            let (from, to) = (&at[rule.source], &at[rule.target]);
            let same_list = self.entities[rule.source].each.is_some()
                && self.entities[rule.source].each == self.entities[rule.target].each;
            // Each pair with the list item it belongs to, if any (checked
            // at load: at most one list takes part).
            let pairs: Vec<(usize, usize, Option<Item<'_>>)> = if same_list {
                from.iter()
                    .zip(to)
                    .filter_map(|((s, item), (t, _))| Some(((*s)?, (*t)?, *item)))
                    .collect()
            } else {
                let (ss, ts) = (present(from), present(to));
                ss.iter()
                    .flat_map(|(s, si)| ts.iter().map(move |(t, ti)| (*s, *t, si.or(*ti))))
                    .collect()
            };
            for (s, t, item) in pairs {
                // A fact made once per item reads its fields from the item
                // first (a member's `since`), then from the record. Lists
                // are left out of the copy (no template renders one), so a
                // record of n items costs n small copies, not n copies of
                // its lists.
                let scope = item.map(|item| {
                    let mut merged: Map<String, Value> = record
                        .iter()
                        .filter(|(_, v)| !v.is_array())
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    merged.extend(item.iter().map(|(k, v)| (k.clone(), v.clone())));
                    merged
                });
                let fields = scope.as_ref().unwrap_or(record);
                if !rule.applies(fields) {
                    continue;
                }
                self.fact(ontology, episode, rule, &path, fields, s, t, &mut out);
            }
        }
        for (k, rule) in self.ends.iter().enumerate() {
            let path = format!("mapping[{}].ends[{k}] (`{}`)", self.index, rule.relation);
            for (subject, item) in present(&at[rule.entity]) {
                self.end(
                    ontology, episode, rule, &path, record, item, subject, &mut out,
                );
            }
        }
        Ok(out)
    }

    /// The end of `rule` for mention `subject` (read from `item` of its
    /// list, if any), or a `failures` row saying why there is none.
    #[allow(clippy::too_many_arguments)]
    fn end(
        &self,
        ontology: &Ontology,
        episode: &Episode,
        rule: &EndRule,
        path: &str,
        record: &Map<String, Value>,
        item: Option<Item<'_>>,
        subject: usize,
        out: &mut Mapped,
    ) {
        // A list item's own fields first, then the record's.
        let plain_in = |f: &str| {
            item.and_then(|i| plain(i, f).ok())
                .or_else(|| plain(record, f).ok())
        };
        let holds = |(f, want): &(String, String)| plain_in(f).is_some_and(|v| &v == want);
        if !rule.when.iter().all(holds) || rule.unless.iter().any(holds) {
            return;
        }
        let entity = &out.mentions[subject];
        // A type from a field is checked record by record.
        let fits = ontology.edge_types.get(&rule.relation).is_some_and(|t| {
            t.source_targets.is_empty()
                || t.source_targets
                    .iter()
                    .any(|st| ontology.entity_fits(entity.type_name(), &st.source))
        });
        let reject = |reason: String, excerpt: String| Rejected {
            stage: Stage::MapRecords,
            episode_id: episode.episode_id.clone(),
            reason,
            excerpt,
        };
        if !fits {
            let reason = format!(
                "{path}: `{}` has no {} source; nothing ended",
                rule.relation,
                entity.type_name()
            );
            out.rejected.push(reject(reason, entity.name.clone()));
            return;
        }
        let Some(text) = plain_in(&rule.at) else {
            return;
        };
        match parse_time(Some(&text)) {
            Ok(Some(at)) => out.withdrawals.push(Withdrawal {
                subject,
                relation_type: rule.relation.clone(),
                at,
            }),
            Ok(None) => {}
            Err(why) => out.rejected.push(reject(
                format!("{path}: field `{}`: {why}; nothing ended", rule.at),
                text,
            )),
        }
    }

    /// One entity of `rule` from `scope` (the record, or one item of its
    /// `each` list): its mention's position, None when an optional one is
    /// absent, or why the record fails.
    #[allow(clippy::too_many_arguments)]
    fn entity(
        &self,
        ontology: &Ontology,
        episode: &Episode,
        rule: &EntityRule,
        path: &str,
        record: &Map<String, Value>,
        context: &str,
        out: &mut Mapped,
    ) -> std::result::Result<Option<usize>, String> {
        let rendered = rule.entity_type.render(record).and_then(|t| {
            // The first template that renders a name; else the first
            // one's outcome, for its error.
            let mut tries = rule.names.iter().map(|n| n.render(record));
            let first = tries.next().expect("a rule has a name template");
            if matches!(&first, Ok(n) if !n.is_empty()) {
                return first.map(|n| (t, n));
            }
            match tries.find(|r| matches!(r, Ok(n) if !n.is_empty())) {
                Some(found) => found.map(|n| (t, n)),
                None => first.map(|n| (t, n)),
            }
        });
        let (type_name, name) = match rendered {
            Ok((_, n)) if n.is_empty() && rule.optional => return Ok(None),
            Ok(tn) => tn,
            Err(_) if rule.optional => return Ok(None),
            Err(missing) => return Err(format!("{path}: {missing}")),
        };
        if name.is_empty() {
            return Err(format!("{path}: the name is empty"));
        }
        if name.chars().count() > NAME_MAX_CHARS {
            return Err(format!(
                "{path}: the name has more than {NAME_MAX_CHARS} characters"
            ));
        }
        let chain = entity_chain(ontology, &type_name).map_err(|m| format!("{path}: {m}"))?;
        let mut attributes = Map::new();
        for (property, from) in &rule.properties {
            let kind = ontology
                .entity_types
                .get(&type_name)
                .and_then(|t| t.properties.iter().find(|p| &p.name == property))
                .map(|p| (p.kind, p.pattern.clone()));
            let Some(value) = field(record, from) else {
                continue;
            };
            // A type from a field may lack a property the rule names.
            let Some((kind, pattern)) = kind else {
                continue;
            };
            match typed(kind, pattern.as_deref(), value) {
                Ok(v) => {
                    attributes.insert(property.clone(), v);
                }
                Err(why) => out.rejected.push(Rejected {
                    stage: Stage::MapRecords,
                    episode_id: episode.episode_id.clone(),
                    reason: format!(
                        "{path}: field `{from}` for property `{property}` {why}; not stored"
                    ),
                    excerpt: value.to_string(),
                }),
            }
        }
        out.mentions.push(Mention {
            episode_id: episode.episode_id.clone(),
            name,
            chain,
            attributes,
            context: context.to_string(),
            mapped: true,
        });
        Ok(Some(out.mentions.len() - 1))
    }

    /// The fact of `rule` between mentions `s` and `t`, or a `failures`
    /// row saying why it is not stored.
    #[allow(clippy::too_many_arguments)]
    fn fact(
        &self,
        ontology: &Ontology,
        episode: &Episode,
        rule: &FactRule,
        path: &str,
        record: &Map<String, Value>,
        s: usize,
        t: usize,
        out: &mut Mapped,
    ) {
        let reject = |reason: String, excerpt: String| Rejected {
            stage: Stage::MapRecords,
            episode_id: episode.episode_id.clone(),
            reason,
            excerpt,
        };
        let (source, target) = (&out.mentions[s], &out.mentions[t]);
        if !ontology.edge_allows(&rule.relation, source.type_name(), target.type_name()) {
            out.rejected.push(reject(
                format!(
                    "{path}: `{}` does not allow {} → {}; fact not stored",
                    rule.relation,
                    source.type_name(),
                    target.type_name()
                ),
                format!("{} → {}", source.name, target.name),
            ));
            return;
        }
        let mut times = [None, None];
        let mut bad = None;
        for (slot, from) in [&rule.valid_at, &rule.invalid_at].into_iter().enumerate() {
            let Some(from) = from else { continue };
            let text = match field(record, from) {
                None => continue,
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
            };
            match parse_time(Some(&text)) {
                Ok(t) => times[slot] = t,
                Err(why) => bad = Some((from.clone(), why, text)),
            }
        }
        if let Some((from, why, text)) = bad {
            out.rejected.push(reject(
                format!("{path}: field `{from}`: {why}; fact not stored"),
                text,
            ));
            return;
        }
        let fact = match &rule.fact {
            Some(template) => match template.render(record) {
                Ok(text) => text,
                Err(missing) => {
                    out.rejected.push(reject(
                        format!("{path}: {missing}; fact not stored"),
                        String::new(),
                    ));
                    return;
                }
            },
            None => format!(
                "{} {} {}",
                source.name,
                rule.relation.to_lowercase().replace('_', " "),
                target.name
            ),
        };
        out.facts.push(FactMention {
            episode_id: episode.episode_id.clone(),
            source: s,
            target: t,
            chain: rule.chain.clone(),
            fact,
            valid_at: times[0],
            invalid_at: times[1],
            mapped: true,
            // A record's relation is declared and fits its mapped types.
            written_types: Vec::new(),
            start_stated: times[0].is_some(),
            // A record states its facts' ends itself.
            moved: false,
        });
    }
}

/// One item of a rule's `each` list.
type Item<'a> = &'a Map<String, Value>;

/// What a rule made from one scope: its mention (None when an optional
/// one is absent) and, for a rule with `each`, the item it was read from.
type Made<'a> = (Option<usize>, Option<Item<'a>>);

/// The mentions a rule made, with the list item each was read from;
/// optional ones that are absent left out.
fn present<'a>(made: &[Made<'a>]) -> Vec<(usize, Option<Item<'a>>)> {
    made.iter()
        .filter_map(|(m, item)| Some(((*m)?, *item)))
        .collect()
}

/// The chain of a type a record names, or why it cannot be used.
fn entity_chain(ontology: &Ontology, type_name: &str) -> std::result::Result<Vec<String>, String> {
    // Labels are `Entity` then the chain.
    ontology
        .user_type_labels(type_name)
        .map(|labels| labels.into_iter().skip(1).collect())
}

/// A record value as a property of `kind` stores it: JSON values are taken
/// as they are when they fit, text is coerced like a model's text.
fn typed(
    kind: PropertyType,
    pattern: Option<&str>,
    value: &Value,
) -> std::result::Result<Value, String> {
    let v = check_value(kind, value)
        .or_else(|| match value {
            Value::String(s) => coerce_text(kind, s),
            Value::Number(n) if kind == PropertyType::Int => n
                .as_f64()
                .filter(|f| f.fract() == 0.0)
                .map(|f| Value::from(f as i64)),
            Value::Number(n) if kind == PropertyType::Text => Some(Value::String(n.to_string())),
            _ => None,
        })
        .ok_or_else(|| format!("is not {}", kind_words(kind)))?;
    if let (Some(p), Value::String(s)) = (pattern, &v)
        && !crate::text::Pattern::matches(p, s)
    {
        return Err(format!("does not have the property's shape ({p})"));
    }
    Ok(v)
}

fn kind_words(kind: PropertyType) -> &'static str {
    match kind {
        PropertyType::Text => "text",
        PropertyType::Int => "an integer",
        PropertyType::Float => "a number",
        PropertyType::Bool => "a boolean",
        PropertyType::Date => "a date (YYYY-MM-DD)",
    }
}

fn compile_one(
    index: usize,
    spec: &MappingSpec,
    ontology: &Ontology,
    issues: &mut Vec<MappingIssue>,
) -> Option<Mapping> {
    let before = issues.len();
    let mut issue = |path: String, message: String| issues.push(MappingIssue { path, message });
    let at = format!("mapping[{index}]");
    if let Some(glob) = &spec.files
        && (glob.trim().is_empty() || glob.starts_with('/'))
    {
        issue(
            format!("{at}.files"),
            "must be a non-empty relative glob such as `erp.jsonl` or `crm/*.parquet`".into(),
        );
    }
    let when = compile_when(&format!("{at}.when"), &spec.when, &mut issue);
    if spec.entities.is_empty() {
        issue(
            format!("{at}.entities"),
            "a mapping needs at least one [[mapping.entities]]".into(),
        );
    }
    // Every entity has its id, also one whose rule is broken: its facts
    // are then checked as far as they can be, not reported as dangling.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut entities: Vec<Option<EntityRule>> = Vec::new();
    for (k, e) in spec.entities.iter().enumerate() {
        let path = format!("{at}.entities[{k}]");
        if ids.insert(e.id.as_str(), k).is_some() {
            issue(
                format!("{path}.id"),
                format!("`{}` is used by two entities of this mapping", e.id),
            );
        }
        entities.push(compile_entity(&path, e, ontology, &mut issue));
    }
    let mut facts = Vec::new();
    for (k, f) in spec.facts.iter().enumerate() {
        let path = format!("{at}.facts[{k}]");
        if let Some(rule) = compile_fact(&path, f, ontology, &ids, &spec.entities, &mut issue) {
            facts.push(rule);
        }
    }
    let mut ends = Vec::new();
    for (k, e) in spec.ends.iter().enumerate() {
        let path = format!("{at}.ends[{k}]");
        if let Some(rule) = compile_end(&path, e, ontology, &ids, &spec.entities, &mut issue) {
            ends.push(rule);
        }
    }
    (issues.len() == before).then(|| Mapping {
        index,
        files: spec.files.clone(),
        when,
        entities: entities.into_iter().flatten().collect(),
        facts,
        ends,
    })
}

/// The message for a relation the ontology does not declare.
fn unknown_edge_type(ontology: &Ontology, relation: &str) -> String {
    let declared: Vec<&str> = ontology.edge_types.keys().map(String::as_str).collect();
    format!(
        "unknown edge type `{relation}` (declared: {})",
        declared.join(", ")
    )
}

/// The declared type of entity rule `k` when its template is a constant
/// (a type read from a field is only known record by record). Read from
/// the spec, so that a rule broken elsewhere (its name template) still
/// has its facts and ends checked; unknown types were reported with the
/// entity.
fn constant_type(ontology: &Ontology, specs: &[EntityMapSpec], k: usize) -> Option<String> {
    specs
        .get(k)
        .and_then(|e| Template::parse(&e.entity_type).ok())
        .and_then(|t| t.constant())
        .filter(|t| entity_chain(ontology, t).is_ok())
}

fn compile_end(
    path: &str,
    e: &EndMapSpec,
    ontology: &Ontology,
    ids: &HashMap<&str, usize>,
    specs: &[EntityMapSpec],
    issue: &mut impl FnMut(String, String),
) -> Option<EndRule> {
    let mut ok = true;
    let declared = ontology.edge_types.get(&e.relation);
    if declared.is_none() {
        issue(
            format!("{path}.relation"),
            unknown_edge_type(ontology, &e.relation),
        );
        ok = false;
    }
    let entity = ids.get(e.entity.as_str()).copied();
    if entity.is_none() {
        issue(
            format!("{path}.entity"),
            format!("`{}` is not the id of an entity of this mapping", e.entity),
        );
        ok = false;
    }
    if e.at.trim().is_empty() || e.at.split('.').any(str::is_empty) {
        issue(
            format!("{path}.at"),
            "must name a field (`field` or `a.b`)".into(),
        );
        ok = false;
    }
    // An entity type known now is checked now; one from a field is
    // checked record by record.
    let constant = entity.and_then(|k| constant_type(ontology, specs, k));
    if let (Some(t), Some(spec)) = (&constant, declared)
        && !spec.source_targets.is_empty()
        && !spec
            .source_targets
            .iter()
            .any(|st| ontology.entity_fits(t, &st.source))
    {
        issue(
            format!("{path}.relation"),
            format!(
                "`{}` never has a {t} as its source (its source_targets)",
                e.relation
            ),
        );
        ok = false;
    }
    let when = compile_when(&format!("{path}.when"), &e.when, issue);
    let unless = compile_when(&format!("{path}.unless"), &e.unless, issue);
    Some(EndRule {
        entity: entity?,
        relation: e.relation.clone(),
        at: e.at.clone(),
        when,
        unless,
    })
    .filter(|_| ok)
}

/// Field → value conditions as text, each value checked.
fn compile_when(
    path: &str,
    when: &BTreeMap<String, toml::Value>,
    issue: &mut impl FnMut(String, String),
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (f, v) in when {
        match when_text(v) {
            Some(t) => out.push((f.clone(), t)),
            None => issue(
                format!("{path}.{f}"),
                "must be a string, a number or a boolean".into(),
            ),
        }
    }
    out
}

fn compile_entity(
    path: &str,
    e: &EntityMapSpec,
    ontology: &Ontology,
    issue: &mut impl FnMut(String, String),
) -> Option<EntityRule> {
    let mut ok = true;
    if e.id.trim().is_empty() {
        issue(format!("{path}.id"), "must not be empty".into());
        ok = false;
    }
    let mut names = Vec::new();
    for (key, text) in std::iter::once(("name".to_string(), &e.name)).chain(
        e.name_fallback
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("name_fallback[{i}]"), t)),
    ) {
        match Template::parse(text) {
            Ok(t) => names.push(t),
            Err(m) => {
                issue(format!("{path}.{key}"), m);
                ok = false;
            }
        }
    }
    let entity_type = Template::parse(&e.entity_type)
        .map_err(|m| issue(format!("{path}.type"), m))
        .ok();
    if let Some(t) = entity_type.as_ref().and_then(Template::constant) {
        match entity_chain(ontology, &t) {
            Err(m) => {
                issue(format!("{path}.type"), m);
                ok = false;
            }
            Ok(_) => {
                let declared: Vec<&str> = ontology
                    .entity_types
                    .get(&t)
                    .map(|s| s.properties.iter().map(|p| p.name.as_str()).collect())
                    .unwrap_or_default();
                for property in e.properties.keys() {
                    if t != ENTITY_LABEL && !declared.contains(&property.as_str()) {
                        issue(
                            format!("{path}.properties.{property}"),
                            format!(
                                "`{property}` is not a property of `{t}` (its properties: {}; properties are not inherited)",
                                if declared.is_empty() {
                                    "none".into()
                                } else {
                                    declared.join(", ")
                                }
                            ),
                        );
                        ok = false;
                    }
                }
            }
        }
    }
    if let Some(list) = &e.each
        && (list.trim().is_empty() || list.split('.').any(str::is_empty))
    {
        issue(
            format!("{path}.each"),
            "must name a list field (`field` or `a.b`)".into(),
        );
        ok = false;
    }
    for (property, from) in &e.properties {
        if from.trim().is_empty() || from.split('.').any(str::is_empty) {
            issue(
                format!("{path}.properties.{property}"),
                "must name a field (`field` or `a.b`)".into(),
            );
            ok = false;
        }
    }
    Some(EntityRule {
        id: e.id.clone(),
        entity_type: entity_type?,
        names,
        properties: e
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        optional: e.optional,
        each: e.each.clone(),
    })
    .filter(|_| ok)
}

fn compile_fact(
    path: &str,
    f: &FactMapSpec,
    ontology: &Ontology,
    ids: &HashMap<&str, usize>,
    specs: &[EntityMapSpec],
    issue: &mut impl FnMut(String, String),
) -> Option<FactRule> {
    let chain = ontology.edge_tree.chain(&f.relation);
    if chain.is_none() {
        issue(
            format!("{path}.relation"),
            unknown_edge_type(ontology, &f.relation),
        );
    }
    let mut end = |key: &str, id: &str| match ids.get(id) {
        Some(&k) => Some(k),
        None => {
            issue(
                format!("{path}.{key}"),
                format!("`{id}` is not the id of an entity of this mapping"),
            );
            None
        }
    };
    let source = end("source", &f.source);
    let target = end("target", &f.target);
    if let (Some(s), Some(t)) = (source, target)
        && let (Some(a), Some(b)) = (&specs[s].each, &specs[t].each)
        && a != b
    {
        issue(
            format!("{path}.target"),
            format!(
                "`{}` is made per item of `{a}` and `{}` per item of `{b}`: a fact joins items of one list only",
                f.source, f.target
            ),
        );
    }
    let fact = match f.fact.as_deref().map(Template::parse) {
        Some(Err(m)) => {
            issue(format!("{path}.fact"), m);
            return None;
        }
        Some(Ok(t)) => Some(t),
        None => None,
    };
    let (chain, source, target) = (chain?, source?, target?);
    // Endpoint types known now are checked now; a type from a field is
    // checked record by record.
    if let (Some(s), Some(t)) = (
        constant_type(ontology, specs, source),
        constant_type(ontology, specs, target),
    ) && !ontology.edge_allows(&f.relation, &s, &t)
    {
        issue(
            format!("{path}.relation"),
            format!(
                "`{}` does not allow {s} → {t} (its source_targets)",
                f.relation
            ),
        );
        return None;
    }
    Some(FactRule {
        relation: f.relation.clone(),
        chain,
        source,
        target,
        fact,
        valid_at: f.valid_at.clone(),
        invalid_at: f.invalid_at.clone(),
        when: compile_when(&format!("{path}.when"), &f.when, issue),
        unless: compile_when(&format!("{path}.unless"), &f.unless, issue),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_fields_and_escaped_braces() {
        let t = Template::parse("PO {po.number} ({{draft}})").expect("parses");
        let record = serde_json::json!({"po": {"number": 4417}});
        let record = record.as_object().expect("object");
        assert_eq!(t.render(record).expect("renders"), "PO 4417 ({draft})");
        assert!(Template::parse("{unclosed").is_err());
        assert!(Template::parse("stray }").is_err());
        assert!(Template::parse("{}").is_err());
        let optional = Template::parse("{first} {middle?} {last}").expect("parses");
        let person = serde_json::json!({"first": "Ada", "last": "Lovelace"});
        let person = person.as_object().expect("object");
        assert_eq!(optional.render(person).expect("renders"), "Ada Lovelace");
        let missing = Template::parse("{vendor}").expect("parses");
        let err = missing.render(record).expect_err("no vendor");
        assert_eq!(err.field, "vendor");
    }

    /// A spec of `[ontology]` and `[[mapping]]` tables (`body`), under a
    /// fixed source, output and LLM.
    fn spec_of(body: &str) -> crate::spec::PipelineSpec {
        toml::from_str(&format!(
            "[source]\nurl = \"file:///tmp/in/\"\n[output]\ngraph = \"file:///tmp/g/\"\n\
             [llm]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"none\"\n{body}"
        ))
        .expect("spec")
    }

    /// The ontology and mappings of [`spec_of`]`(body)`.
    fn compiled(body: &str) -> (Ontology, Mappings) {
        let spec = spec_of(body);
        let ontology = Ontology::try_from(&spec.ontology).expect("ontology");
        let mappings = Mappings::compile(&spec.mapping, &ontology).expect("compiles");
        (ontology, mappings)
    }

    /// A JSON record as the episode of a `.jsonl` line.
    fn record_episode(record: &serde_json::Value) -> Episode {
        Episode {
            episode_id: "e".into(),
            source_id: None,
            group_id: "g".into(),
            document_id: None,
            source_uri: "file:///tmp/in/r.jsonl#L1".into(),
            source_description: None,
            kind: EpisodeKind::Json,
            content: record.to_string(),
            reference_time: chrono::Utc::now(),
            reference_time_source: "field".into(),
            order: (0, 0),
        }
    }

    #[test]
    fn a_name_fallback_names_records_whose_name_fields_are_missing() {
        let (ontology, mappings) = compiled(
            r#"
            [ontology]
            strict = true
            [[ontology.entity_types]]
            name = "Person"
            description = "A person."
            [[mapping]]
            [[mapping.entities]]
            id = "p"
            type = "Person"
            name = "{given?} {surname?}"
            name_fallback = ["{nick}", "person {ssn}"]
            "#,
        );
        let name_of = |record: serde_json::Value| {
            let episode = record_episode(&record);
            let (m, record) = mappings.find(&episode).expect("applies");
            m.apply(&ontology, &episode, &record)
                .map(|out| out.mentions[0].name.clone())
        };
        let named = name_of(serde_json::json!({"given": "Ada", "surname": "Ng", "ssn": "7"}));
        assert_eq!(named.as_deref(), Ok("Ada Ng"));
        let by_ssn = name_of(serde_json::json!({"ssn": "7"}));
        assert_eq!(by_ssn.as_deref(), Ok("person 7"), "{{nick}} is missing");
        let none = name_of(serde_json::json!({"other": 1}));
        assert!(none.is_err_and(|e| e.contains("the name is empty")));
    }

    #[test]
    fn a_fact_made_per_list_item_reads_its_fields_and_conditions_from_the_item_then_the_record() {
        let (ontology, mappings) = compiled(
            r#"
            [ontology]
            strict = true
            [[ontology.entity_types]]
            name = "Person"
            description = "A person."
            [[ontology.entity_types]]
            name = "Team"
            description = "A team."
            [[ontology.edge_types]]
            name = "MEMBER_OF"
            description = "A person belongs to a team."
            source_targets = [{ source = "Person", target = "Team" }]
            [[mapping]]
            [[mapping.entities]]
            id = "team"
            type = "Team"
            name = "{team}"
            [[mapping.entities]]
            id = "member"
            type = "Person"
            name = "{name}"
            each = "members"
            [[mapping.facts]]
            relation = "MEMBER_OF"
            source = "member"
            target = "team"
            fact = "{name} is in {team}"
            valid_at = "since"
            unless = { role = "lead" }
            [[mapping.facts]]
            relation = "MEMBER_OF"
            source = "member"
            target = "team"
            fact = "{name} leads {team}"
            when = { role = "lead" }
            "#,
        );
        let record = serde_json::json!({
            "team": "Core", "since": "2020-01-01",
            "members": [
                {"name": "Ada", "since": "2022-03-01"},
                {"name": "Bo"},
                {"name": "Cy", "role": "lead"}
            ]
        });
        let episode = record_episode(&record);
        let (m, record) = mappings.find(&episode).expect("applies");
        let out = m.apply(&ontology, &episode, &record).expect("maps");
        let facts: Vec<(String, String)> = out
            .facts
            .iter()
            .map(|f| {
                let since = f.valid_at.map(|t| t.format("%Y-%m-%d").to_string());
                (f.fact.clone(), since.unwrap_or_default())
            })
            .collect();
        assert_eq!(
            facts,
            vec![
                ("Ada is in Core".to_string(), "2022-03-01".to_string()),
                ("Bo is in Core".to_string(), "2020-01-01".to_string()),
                ("Cy leads Core".to_string(), String::new()),
            ],
            "Ada's own `since`; Bo has none and takes the record's; \
             Cy's role picks the second rule (`when`) and not the first (`unless`)"
        );
    }

    /// An ontology of people and services, and a leaver mapping to which
    /// `[[mapping.ends]]` are appended.
    const LEAVERS: &str = r#"
        [ontology]
        strict = true
        [[ontology.entity_types]]
        name = "Person"
        description = "A person."
        [[ontology.entity_types]]
        name = "Service"
        description = "A service."
        [[ontology.edge_types]]
        name = "RESPONSIBLE_FOR"
        description = "A person answers for a service."
        source_targets = [{ source = "Person", target = "Service" }]
        [[ontology.edge_types]]
        name = "ON_CALL_FOR"
        description = "A person takes on-call shifts for a service."
        source_targets = [{ source = "Person", target = "Service" }]
        [ontology.edge_type_hierarchy]
        RESPONSIBLE_FOR = { ON_CALL_FOR = {} }
        [[mapping]]
        [[mapping.entities]]
        id = "person"
        type = "Person"
        name = "{name}"
    "#;

    #[test]
    fn a_records_end_names_its_entity_the_type_that_ends_and_when() {
        let (ontology, mappings) = compiled(&format!(
            "{LEAVERS}
            [[mapping.ends]]
            entity = \"person\"
            relation = \"ON_CALL_FOR\"
            at = \"last_day\"
            unless = {{ reason = \"retired\" }}
            "
        ));
        let ends = |record: serde_json::Value| {
            let episode = record_episode(&record);
            let (m, record) = mappings.find(&episode).expect("applies");
            m.apply(&ontology, &episode, &record).expect("maps")
        };
        let out = ends(serde_json::json!({"name": "Sofia", "last_day": "2025-05-30"}));
        assert_eq!(out.withdrawals.len(), 1, "{out:?}");
        let w = &out.withdrawals[0];
        assert_eq!(out.mentions[w.subject].name, "Sofia");
        assert_eq!(w.relation_type, "ON_CALL_FOR");
        assert_eq!(w.at.to_rfc3339(), "2025-05-30T00:00:00+00:00");
        let staying = ends(serde_json::json!({"name": "Sofia"}));
        assert!(staying.withdrawals.is_empty(), "no last day, nothing ends");
        assert!(staying.rejected.is_empty(), "{staying:?}");
        let retired = ends(
            serde_json::json!({"name": "Sofia", "last_day": "2025-05-30", "reason": "retired"}),
        );
        assert!(retired.withdrawals.is_empty(), "`unless` holds");
        let garbled = ends(serde_json::json!({"name": "Sofia", "last_day": "soon"}));
        assert!(garbled.withdrawals.is_empty());
        assert!(
            garbled.rejected[0].reason.contains("field `last_day`"),
            "{garbled:?}"
        );
    }

    #[test]
    fn an_end_rule_with_an_unknown_entity_or_type_or_a_type_the_entity_never_starts_is_refused() {
        let spec = spec_of(&format!(
            "{LEAVERS}
            [[mapping.entities]]
            id = \"service\"
            type = \"Service\"
            name = \"{{service}}\"
            [[mapping.ends]]
            entity = \"nobody\"
            relation = \"ON_CALL_FOR\"
            at = \"last_day\"
            [[mapping.ends]]
            entity = \"person\"
            relation = \"LEFT\"
            at = \"last_day\"
            [[mapping.ends]]
            entity = \"service\"
            relation = \"ON_CALL_FOR\"
            at = \"\"
            "
        ));
        let ontology = Ontology::try_from(&spec.ontology).expect("ontology");
        let err = Mappings::compile(&spec.mapping, &ontology)
            .expect_err("refused")
            .to_string();
        for expected in [
            "mapping[0].ends[0].entity: `nobody` is not the id of an entity",
            "mapping[0].ends[1].relation: unknown edge type `LEFT`",
            "mapping[0].ends[2].relation: `ON_CALL_FOR` never has a Service as its source",
            "mapping[0].ends[2].at: must name a field",
        ] {
            assert!(err.contains(expected), "missing `{expected}` in:\n{err}");
        }
    }

    #[test]
    fn globs_match_the_end_of_the_file_path() {
        let uri = "file:///data/erp/erp-2024.jsonl#L3";
        assert!(file_matches("erp-2024.jsonl", uri));
        assert!(file_matches("erp*.jsonl", uri));
        assert!(file_matches("erp/*.jsonl", uri));
        assert!(file_matches("erp-202?.jsonl", uri));
        assert!(!file_matches("crm/*.jsonl", uri));
        assert!(!file_matches("*.parquet", uri));
        // `*` stays within one path component.
        assert!(file_matches("*", uri));
        let chars = |s: &str| s.chars().collect::<Vec<_>>();
        assert!(!glob_matches(&chars("a*b"), &chars("a/b")));
        assert!(!file_matches("data*jsonl", uri));
    }
}
