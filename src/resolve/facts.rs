//! Fact resolution: duplicate facts fold into one edge and, within
//! functional edge families or by LLM judgement, a newer fact invalidates
//! an older contradicting one. Nothing is deleted.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{jaccard, normalize_name, shingle_hashes};
use crate::rows::EdgeRow;

/// What fact resolution changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FactResolution {
    /// New edges folded into an existing or earlier edge.
    pub duplicates: usize,
    /// Edges invalidated by a newer contradicting fact.
    pub invalidated: usize,
    /// Committed edges that changed and must be written back.
    pub changed_committed: std::collections::BTreeSet<String>,
    /// Each new edge folded into another, by id, with the id of the edge
    /// it joined: what was stated of the one holds for the other.
    pub folds: Vec<(String, String)>,
}

impl FactResolution {
    /// Ends the live edge `e` at `until`, learnt `now`, and counts it; a
    /// committed edge is marked to be written back.
    fn end_edge(
        &mut self,
        e: &mut EdgeRow,
        until: Moment,
        now: chrono::DateTime<chrono::Utc>,
        committed: bool,
    ) {
        e.invalid_at = until;
        e.expired_at = Some(now);
        self.invalidated += 1;
        if committed {
            self.changed_committed.insert(e.edge_id.clone());
        }
    }
}

/// Resolves this run's edges against each other and against the committed
/// edges of the same source nodes (`committed`: all of them, expired ones
/// included, since a history is needed to place a fact in time).
///
/// Facts of a functional family that carry a `valid_at` form one timeline
/// per (source, family), taken in `valid_at` order (ties by a key made of
/// the fact's own content, never by run or arrival order), so the same
/// facts give the same edges however the archive was split into runs:
///
/// * a fact that restates an edge valid at its time (same target and
///   relation type, whatever its wording: the family holds one edge per
///   source at a time) folds into it: episode ids united, earliest
///   `valid_at` kept;
/// * any other fact starts an edge, and one to another target ends every
///   edge of the family valid at its time: `invalid_at` = its `valid_at`,
///   `expired_at` = `now`. An edge invalidated earlier is not valid any
///   more, so a later restatement of it is a new validity interval.
///   Facts that became true at the same moment cannot be ordered: neither
///   ends the other.
///
/// Every other fact (other families, or no `valid_at`) is a duplicate of
/// an unexpired edge with the same endpoints, relation type and alike
/// text, committed or earlier in this run, and folds into it; a fact with
/// an `invalid_at` (the relationship ended) folds into the alike edge, or
/// when there is none into such an edge whatever its text, and so ends it
/// (a fact taken after such an end that goes on past it folds into the
/// ended edge the same way) and every other live wording of that
/// relationship, and the edges of
/// its subtypes between the same nodes (`is_a(type, ancestor)`) valid at
/// its time, whichever came first: "Sofia is no longer responsible for
/// Ledger Service" ends her `ON_CALL_FOR` it, while an ended `ON_CALL_FOR`
/// leaves the broader `RESPONSIBLE_FOR` alone. Nothing else is invalidated without
/// an LLM judgement there (see [`contradiction_candidates`]). Nothing is
/// deleted.
///
/// What cannot converge: a committed edge already holds every restatement
/// it folded, without their times, so a fact to another target that
/// arrives in a later run but became true between two of them ends the
/// edge at its time and cannot split it.
///
/// `family` maps a relation type to its top-level type.
pub fn resolve_facts(
    new_edges: &mut Vec<EdgeRow>,
    committed: &mut [EdgeRow],
    functional: &[String],
    family: &dyn Fn(&str) -> String,
    is_a: &dyn Fn(&str, &str) -> bool,
    duplicate_similarity: f64,
    now: chrono::DateTime<chrono::Utc>,
) -> FactResolution {
    let functional: BTreeSet<&str> = functional.iter().map(String::as_str).collect();
    let timed = |e: &EdgeRow| {
        e.valid_at.is_some() && functional.contains(family(&e.relation_type).as_str())
    };
    let mut out = FactResolution::default();
    let mut folded = vec![false; new_edges.len()];
    let mut sweep = Sweep {
        committed_text: committed.iter().map(fact_shingles).collect(),
        new_text: new_edges.iter().map(fact_shingles).collect(),
        new_edges,
        committed,
        folded: &mut folded,
        out: &mut out,
        now,
        episodes_of: HashMap::new(),
    };

    // Timelines of the functional families.
    let mut lines: BTreeMap<(String, String), Vec<EdgeRef>> = BTreeMap::new();
    for (i, e) in sweep.committed.iter().enumerate().filter(|(_, e)| timed(e)) {
        lines
            .entry((e.source_node_id.clone(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::Committed(i));
    }
    for (i, e) in sweep.new_edges.iter().enumerate().filter(|(_, e)| timed(e)) {
        lines
            .entry((e.source_node_id.clone(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::New(i));
    }
    for line in lines.values_mut() {
        line.sort_by_cached_key(|r| sweep.order_key(*r));
        sweep.timeline(line);
    }

    // Everything else: duplicates of unexpired edges, committed first,
    // then earlier edges of this run (timeline edges included, as
    // targets only: they were placed above).
    // (source, target) → the edges between them, of any type, with the
    // shingles of their fact text: a fact folds into and ends edges of its
    // own type, and the end of a broader relationship reaches its
    // narrower kinds.
    type Slots = Vec<(EdgeRef, Vec<u64>)>;
    let mut seen: HashMap<(String, String), Slots> = HashMap::new();
    let key = |e: &EdgeRow| (e.source_node_id.clone(), e.target_node_id.clone());
    for (i, e) in sweep.committed.iter().enumerate() {
        if e.expired_at.is_none() {
            seen.entry(key(e))
                .or_default()
                .push((EdgeRef::Committed(i), sweep.committed_text[i].clone()));
        }
    }
    for i in 0..sweep.new_edges.len() {
        if sweep.folded[i] {
            continue;
        }
        let e = &sweep.new_edges[i];
        let text = sweep.new_text[i].clone();
        if timed(e) {
            if e.expired_at.is_none() {
                seen.entry(key(e))
                    .or_default()
                    .push((EdgeRef::New(i), text));
            }
            continue;
        }
        let slots = seen.get(&key(e)).map_or(&[][..], Vec::as_slice);
        let same_type = |r: &EdgeRef| sweep.get(*r).relation_type == e.relation_type;
        let live = |r: &EdgeRef| overlap(sweep.get(*r), e);
        // A fact that says the relationship ended ("has left", "no longer")
        // ends the live edge of the same endpoints and type whatever its
        // wording: it is about that edge.
        // The edge it restates in so many words comes first: a record
        // that ends "X is the seller on PO-1" ends that edge, not another
        // fact between the same two nodes.
        let ends = e.invalid_at.is_some();
        let mut own = slots.iter().filter(|(r, _)| same_type(r));
        // Likewise a fact that goes on where an edge taken before it has
        // ended ("no longer on call for Fare Engine as of 1 May" before the
        // schedule that began it) is that relationship: it folds into the
        // ended edge, as the end would have folded into it the other way
        // round.
        let found = own
            .clone()
            .find(|(r, t)| alike(t, &text, duplicate_similarity) && live(r))
            .or_else(|| own.find(|(r, _)| live(r) && (ends || sweep.get(*r).invalid_at.is_some())))
            .map(|(r, _)| *r);
        // Other live wordings of the same relationship between the same
        // nodes ("ships PO-1", "is the seller on PO-1") end with it.
        let others: Vec<EdgeRef> = match (ends, found) {
            (true, Some(into)) => slots
                .iter()
                .map(|(r, _)| *r)
                .filter(|r| same_type(r) && *r != into && live(r))
                .collect(),
            _ => Vec::new(),
        };
        // The end of a broader relationship ends its narrower kinds valid
        // at its time, earlier edges or this one, in whichever order they
        // come.
        let narrower_of = |broad: &EdgeRow, narrow: &EdgeRow| {
            broad.invalid_at.is_some()
                && narrow.relation_type != broad.relation_type
                && is_a(&narrow.relation_type, &broad.relation_type)
                && overlap(narrow, broad)
        };
        let narrower: Vec<EdgeRef> = slots
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| narrower_of(e, sweep.get(*r)))
            .collect();
        let ended_by: Moment = slots
            .iter()
            .filter(|(r, _)| narrower_of(sweep.get(*r), e))
            .filter_map(|(r, _)| sweep.get(*r).invalid_at)
            .min();
        let end = e.invalid_at;
        for r in others.into_iter().chain(narrower) {
            sweep.end_at(r, end);
        }
        if ended_by.is_some() {
            sweep.end_at(EdgeRef::New(i), ended_by);
        }
        match found {
            Some(into) => sweep.fold(i, into),
            None => seen
                .entry(key(&sweep.new_edges[i]))
                .or_default()
                .push((EdgeRef::New(i), text)),
        }
    }

    let mut k = 0;
    new_edges.retain(|_| {
        k += 1;
        !folded[k - 1]
    });
    out
}

fn fact_shingles(e: &EdgeRow) -> Vec<u64> {
    shingle_hashes(&normalize_name(&e.fact))
}

/// Whether two facts can be one validity interval: not when one is known
/// to have ended before the other began (a restatement after an end is a
/// new interval).
fn overlap(a: &EdgeRow, b: &EdgeRow) -> bool {
    let before = |end: Moment, start: Moment| matches!((end, start), (Some(e), Some(s)) if e <= s);
    !before(a.invalid_at, b.valid_at) && !before(b.invalid_at, a.valid_at)
}

fn alike(a: &[u64], b: &[u64], similarity: f64) -> bool {
    a == b || jaccard(a, b) >= similarity
}

/// The edges of one fact-resolution pass and what it changed.
struct Sweep<'a> {
    new_edges: &'a mut [EdgeRow],
    committed: &'a mut [EdgeRow],
    /// Shingles of each edge's fact text, which folding never changes.
    new_text: Vec<Vec<u64>>,
    committed_text: Vec<Vec<u64>>,
    /// New edges folded into another edge (dropped at the end).
    folded: &'a mut [bool],
    out: &'a mut FactResolution,
    now: chrono::DateTime<chrono::Utc>,
    /// The episode ids of each edge something was folded into, as a set:
    /// a fact stated in thousands of episodes must not cost their number
    /// squared.
    episodes_of: HashMap<EdgeRef, std::collections::HashSet<String>>,
}

/// A point in valid time, if known.
type Moment = Option<chrono::DateTime<chrono::Utc>>;

impl Sweep<'_> {
    fn get(&self, r: EdgeRef) -> &EdgeRow {
        r.row(self.new_edges, self.committed)
    }

    fn get_mut(&mut self, r: EdgeRef) -> &mut EdgeRow {
        if let EdgeRef::Committed(i) = r {
            let id = self.committed[i].edge_id.clone();
            self.out.changed_committed.insert(id);
        }
        match r {
            EdgeRef::Committed(i) => &mut self.committed[i],
            EdgeRef::New(i) => &mut self.new_edges[i],
        }
    }

    /// Timeline order: `valid_at`, then the fact's content (its first
    /// episode, text, target, type), the same in every run.
    fn order_key(&self, r: EdgeRef) -> (Moment, String, String, String, String) {
        let e = self.get(r);
        (
            e.valid_at,
            e.episode_ids.iter().min().cloned().unwrap_or_default(),
            e.fact.clone(),
            e.target_node_id.clone(),
            e.relation_type.clone(),
        )
    }

    /// The moment an edge stops being valid, if it has one. An edge expired
    /// without an `invalid_at` (not written by graphloom) counts as ended
    /// when it began.
    fn end(&self, r: EdgeRef) -> Moment {
        let e = self.get(r);
        e.invalid_at
            .or(e.expired_at.map(|_| e.valid_at.unwrap_or_default()))
    }

    /// Whether `b` restates the timeline edge `a`: the same target and
    /// relation type, whatever the wording. A functional family has one
    /// edge per source at a time, so "works under contract for Tidewell"
    /// from a record and "Hamid is our IR contractor" from chat, both
    /// valid then, are one relationship.
    fn restates(&self, a: EdgeRef, b: EdgeRef) -> bool {
        let (x, y) = (self.get(a), self.get(b));
        x.target_node_id == y.target_node_id && x.relation_type == y.relation_type
    }

    /// Walks one (source, family) timeline, sorted by [`Sweep::order_key`],
    /// a moment at a time: the facts of one `valid_at` cannot be ordered,
    /// so none of them ends another, and an edge valid before stays valid
    /// while one of them still names its target.
    fn timeline(&mut self, line: &[EdgeRef]) {
        let mut valid: Vec<EdgeRef> = Vec::new();
        let times: Vec<Moment> = line.iter().map(|x| self.get(*x).valid_at).collect();
        let mut from = 0;
        while from < line.len() {
            let at = times[from];
            let to = from + times[from..].iter().take_while(|t| **t == at).count();
            let moment = &line[from..to];
            from = to;
            valid.retain(|e| self.end(*e).is_none_or(|end| Some(end) > at));
            let targets: BTreeSet<String> = moment
                .iter()
                .map(|x| self.get(*x).target_node_id.clone())
                .collect();
            // Between committed edges this was settled when the later one
            // was committed, with restatements since folded away: only a
            // new fact ends a committed edge.
            let news = moment.iter().any(|x| matches!(x, EdgeRef::New(_)));
            let ended: Vec<EdgeRef> = valid
                .iter()
                .copied()
                .filter(|e| matches!(e, EdgeRef::New(_)) || news)
                .filter(|e| !targets.contains(&self.get(*e).target_node_id))
                .collect();
            for e in ended {
                self.end_at(e, at);
            }
            valid.retain(|e| self.end(*e).is_none_or(|end| Some(end) > at));
            for &x in moment {
                match (x, valid.iter().position(|e| self.restates(*e, x))) {
                    (EdgeRef::New(i), Some(p)) => self.fold(i, valid[p]),
                    // A committed edge restating an edge of this run that
                    // came before it takes it in, since committed edges
                    // stay; two committed edges both stay.
                    (EdgeRef::Committed(_), Some(p)) => match valid[p] {
                        EdgeRef::New(i) => {
                            self.fold(i, x);
                            valid[p] = x;
                        }
                        EdgeRef::Committed(_) => valid.push(x),
                    },
                    (_, None) => valid.push(x),
                }
            }
        }
    }

    /// Folds new edge `i` into `into`: episode ids united, earliest
    /// `valid_at` kept.
    /// A restatement that says when the fact ended ("until March", "has
    /// left") ends the edge then: the earlier end wins, and an edge that
    /// was stated valid and is ended by a later statement is expired like
    /// any invalidated edge.
    fn fold(&mut self, i: usize, into: EdgeRef) {
        self.folded[i] = true;
        self.out.duplicates += 1;
        let joined = self.get(into).edge_id.clone();
        self.out
            .folds
            .push((self.new_edges[i].edge_id.clone(), joined));
        let (ids, valid, end) = {
            let e = &self.new_edges[i];
            (e.episode_ids.clone(), e.valid_at, e.invalid_at)
        };
        let now = self.now;
        let mut seen = self
            .episodes_of
            .remove(&into)
            .unwrap_or_else(|| self.get(into).episode_ids.iter().cloned().collect());
        let t = self.get_mut(into);
        for id in ids {
            if seen.insert(id.clone()) {
                t.episode_ids.push(id);
            }
        }
        self.episodes_of.insert(into, seen);
        let t = self.get_mut(into);
        t.valid_at = match (t.valid_at, valid) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(end) = end else { return };
        let until = t.invalid_at.map_or(end, |a| a.min(end));
        if t.invalid_at == Some(until) {
            return;
        }
        t.invalid_at = Some(until);
        if t.expired_at.is_none() {
            t.expired_at = Some(now);
            self.out.invalidated += 1;
        }
    }

    /// Ends an edge at `at` (or earlier, if it already ended earlier).
    fn end_at(&mut self, r: EdgeRef, at: Moment) {
        let e = self.get(r);
        let until = match (e.invalid_at, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if until == e.invalid_at && e.expired_at.is_some() {
            return;
        }
        let now = self.now;
        let newly = e.expired_at.is_none();
        let e = self.get_mut(r);
        e.invalid_at = until;
        if newly {
            e.expired_at = Some(now);
            self.out.invalidated += 1;
        }
    }
}

/// Where an edge lives during fact resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EdgeRef {
    /// A committed edge, by position.
    Committed(usize),
    /// A new edge of this run, by position.
    New(usize),
}

impl EdgeRef {
    /// The edge it refers to, among this run's `new_edges` and the
    /// `committed` ones.
    pub fn row<'e>(self, new_edges: &'e [EdgeRow], committed: &'e [EdgeRow]) -> &'e EdgeRow {
        match self {
            EdgeRef::Committed(i) => &committed[i],
            EdgeRef::New(i) => &new_edges[i],
        }
    }
}

/// Facts the LLM should judge for contradiction: for each valid new edge
/// outside the functional families, the other valid edges of the same
/// source and relation family that point to another target and that
/// `replaceable(new edge, older edge)` allows, at most `max` of them,
/// most recent first.
///
/// The run allows it when the new edge's start was stated and the older
/// target is of the new target's type: a new fact replaces an older one
/// at a time the text gives ("from 1 July Notification Hub sends every
/// SMS through Skylark"), and by another thing of the same kind (a
/// supplier for a supplier). Without these, the 1.5B model judged that
/// one new responsibility ended four others, that being responsible for
/// a ticket ended being responsible for a service, and that a second
/// wording of a fact about the same target contradicted the first; an
/// end a text states for the same target is read without the LLM
/// (`invalid_at`, which folds into the live edge).
pub fn contradiction_candidates(
    new_edges: &[EdgeRow],
    committed: &[EdgeRow],
    functional: &[String],
    family: &dyn Fn(&str) -> String,
    replaceable: &dyn Fn(&EdgeRow, &EdgeRow) -> bool,
    max: usize,
) -> Vec<(usize, Vec<EdgeRef>)> {
    use std::cmp::Reverse;
    let live = |e: &EdgeRow| e.expired_at.is_none() && e.invalid_at.is_none();
    // Peers per (source, family), committed first, then new, each in
    // order; functional families are settled without the LLM.
    let mut by_source: HashMap<(&str, String), Vec<EdgeRef>> = HashMap::new();
    for (i, e) in committed.iter().enumerate().filter(|(_, e)| live(e)) {
        by_source
            .entry((e.source_node_id.as_str(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::Committed(i));
    }
    for (i, e) in new_edges.iter().enumerate().filter(|(_, e)| live(e)) {
        by_source
            .entry((e.source_node_id.as_str(), family(&e.relation_type)))
            .or_default()
            .push(EdgeRef::New(i));
    }
    let get = |r: EdgeRef| r.row(new_edges, committed);
    let mut found: Vec<(usize, Vec<EdgeRef>)> = Vec::new();
    for ((_, f), peers) in &by_source {
        if functional.contains(f) {
            continue;
        }
        // A new edge is asked about the committed peers and the new peers
        // before it (each pair of new edges once: the later one asks),
        // most recent first, ties in peer order, skipping those with its
        // target and those `replaceable` turns down. `ready`
        // holds the peers before it, ordered so, as the new edges are
        // taken in order: each question reads the first few that pass.
        let key = |k: usize| (Reverse(get(peers[k]).valid_at), k);
        let mut ready: BTreeSet<(Reverse<Option<chrono::DateTime<chrono::Utc>>>, usize)> =
            BTreeSet::new();
        for (k, r) in peers.iter().enumerate() {
            match r {
                EdgeRef::Committed(_) => {
                    ready.insert(key(k));
                }
                // A record's fact asks nothing: it ends by its own
                // `invalid_at` field, and a record listing one purchase
                // order does not contradict the record of another (a small
                // model judged that it did). It is still a peer that
                // facts read from text may contradict.
                EdgeRef::New(i) if new_edges[*i].origin == "map" => {
                    ready.insert(key(k));
                }
                EdgeRef::New(i) => {
                    let e = &new_edges[*i];
                    let others: Vec<EdgeRef> = ready
                        .iter()
                        .filter(|(_, j)| {
                            let older = get(peers[*j]);
                            older.target_node_id != e.target_node_id && replaceable(e, older)
                        })
                        .take(max.max(1))
                        .map(|(_, j)| peers[*j])
                        .collect();
                    if !others.is_empty() {
                        found.push((*i, others));
                    }
                    ready.insert(key(k));
                }
            }
        }
    }
    found.sort_by_key(|(i, _)| *i);
    found
}

/// Applies contradiction verdicts: of each contradicting pair the fact
/// that became true earlier (`valid_at`, else when it was recorded) is
/// invalidated at the other's `valid_at` and expired at `now`. Already
/// expired facts, and pairs that became true at the same moment (no
/// order to go by), stay as they are.
pub fn apply_contradictions(
    new_edges: &mut [EdgeRow],
    committed: &mut [EdgeRow],
    pairs: &[(usize, EdgeRef)],
    now: chrono::DateTime<chrono::Utc>,
    out: &mut FactResolution,
) {
    // Other wordings of one relationship (same endpoints and type) end
    // with it, as they do when a text states the end: "Notification Hub
    // is supplied by Relaywave" and "… supplies Relaywave" are one
    // supplier. Indexed once, so the verdicts cost a lookup each.
    type Key = (String, String, String);
    let key = |e: &EdgeRow| {
        (
            e.source_node_id.clone(),
            e.target_node_id.clone(),
            e.relation_type.clone(),
        )
    };
    let mut wordings: HashMap<Key, Vec<EdgeRef>> = HashMap::new();
    for (j, e) in committed.iter().enumerate() {
        wordings
            .entry(key(e))
            .or_default()
            .push(EdgeRef::Committed(j));
    }
    for (j, e) in new_edges.iter().enumerate() {
        wordings.entry(key(e)).or_default().push(EdgeRef::New(j));
    }
    for &(i, other) in pairs {
        let new_time = new_edges[i].valid_at.unwrap_or(new_edges[i].created_at);
        let o_valid = other.row(new_edges, committed).valid_at;
        let o_time = o_valid.unwrap_or(other.row(new_edges, committed).created_at);
        // Facts that became true at the same time cannot be ordered:
        // neither is taken for the current one, both stay valid.
        if o_time == new_time {
            continue;
        }
        let (older, until) = if o_time < new_time {
            (other, new_edges[i].valid_at.or(Some(now)))
        } else {
            (EdgeRef::New(i), o_valid.or(Some(now)))
        };
        let (older_key, live) = {
            let e = older.row(new_edges, committed);
            (key(e), e.expired_at.is_none())
        };
        if !live {
            continue;
        }
        // The index holds the older edge itself with its other wordings.
        for &r in wordings.get(&older_key).map_or(&[][..], Vec::as_slice) {
            let e = match r {
                EdgeRef::Committed(j) => &mut committed[j],
                EdgeRef::New(j) => &mut new_edges[j],
            };
            // A wording that started at or after the end, or has ended
            // already, is not this interval.
            let started_after = matches!((e.valid_at, until), (Some(v), Some(u)) if v >= u);
            if e.expired_at.is_some() || e.invalid_at.is_some() || started_after {
                continue;
            }
            out.end_edge(e, until, now, matches!(r, EdgeRef::Committed(_)));
        }
    }
}

/// An end stated for every relationship of one type (subtypes included)
/// that one node has as source: a leaver's last day for the on-call
/// shifts they take (`[[mapping.ends]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Withdrawn {
    /// The node whose relationships end.
    pub node_id: String,
    /// The edge type that ends, with its subtypes.
    pub relation_type: String,
    /// When they end.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// Ends, at the stated time, every live edge (this run's or committed) of
/// a withdrawn node and type that started before then, by `started` (an
/// edge it knows no start of is taken to have started before). An edge
/// that starts at or after the end (the person back on a rotation) stays.
/// `is_a(type, ancestor)` says whether an edge type is the withdrawn type
/// or below it.
pub fn apply_withdrawals(
    new_edges: &mut [EdgeRow],
    committed: &mut [EdgeRow],
    withdrawn: &[Withdrawn],
    is_a: &dyn Fn(&str, &str) -> bool,
    started: &dyn Fn(&EdgeRow) -> Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
    out: &mut FactResolution,
) {
    // Indexed by node once, so a run of many ends reads each edge once.
    let mut by_node: HashMap<&str, Vec<&Withdrawn>> = HashMap::new();
    for w in withdrawn {
        by_node.entry(w.node_id.as_str()).or_default().push(w);
    }
    let mut end = |e: &mut EdgeRow, committed: bool| {
        if e.expired_at.is_some() || e.invalid_at.is_some() {
            return;
        }
        let Some(ends) = by_node.get(e.source_node_id.as_str()) else {
            return;
        };
        // The earliest end that covers the edge and comes after its start.
        let start = started(e);
        let until = ends
            .iter()
            .filter(|w| is_a(&e.relation_type, &w.relation_type))
            .filter(|w| start.is_none_or(|v| v < w.at))
            .map(|w| w.at)
            .min();
        if until.is_some() {
            out.end_edge(e, until, now, committed);
        }
    };
    for e in committed.iter_mut() {
        end(e, true);
    }
    for e in new_edges.iter_mut() {
        end(e, false);
    }
}

#[cfg(test)]
mod fact_tests {
    use super::*;
    use crate::rows::EdgeRow;
    use chrono::{TimeZone, Utc};

    fn edge(id: &str, target: &str, valid: Option<i32>) -> EdgeRow {
        EdgeRow {
            edge_id: id.into(),
            group_id: "g".into(),
            source_node_id: "priya".into(),
            target_node_id: target.into(),
            relation_type: "WORKS_FULL_TIME_FOR".into(),
            fact: format!("Priya works for {target}."),
            attributes: "{}".into(),
            episode_ids: vec![format!("ep-{id}")],
            valid_at: valid.map(|y| Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap()),
            invalid_at: None,
            created_at: Utc::now(),
            expired_at: None,
            fact_embedding: None,
            origin: "extract".into(),
            run_id: "r".into(),
        }
    }

    fn family(_: &str) -> String {
        "EMPLOYED_BY".into()
    }

    /// Every older edge may be replaced.
    fn anyone(_: &EdgeRow, _: &EdgeRow) -> bool {
        true
    }

    fn no_subtypes(_: &str, _: &str) -> bool {
        false
    }

    /// Fact resolution with no functional type and no type hierarchy.
    fn plain(
        new: &mut Vec<EdgeRow>,
        committed: &mut [EdgeRow],
        now: chrono::DateTime<Utc>,
    ) -> FactResolution {
        resolve_facts(new, committed, &[], &family, &no_subtypes, 0.9, now)
    }

    /// Fact resolution with EMPLOYED_BY functional.
    fn employment(
        new: &mut Vec<EdgeRow>,
        committed: &mut [EdgeRow],
        now: chrono::DateTime<Utc>,
    ) -> FactResolution {
        resolve_facts(
            new,
            committed,
            &["EMPLOYED_BY".into()],
            &family,
            &no_subtypes,
            0.9,
            now,
        )
    }

    #[test]
    fn a_withdrawal_ends_the_nodes_earlier_facts_of_its_type_and_subtypes_only() {
        let at = Utc.with_ymd_and_hms(2025, 5, 30, 0, 0, 0).unwrap();
        let mut committed = vec![edge("c", "acme", Some(2021))];
        let mut new = vec![
            edge("sub", "brightline", Some(2024)),
            edge("unknown-start", "lumen", None),
            edge("later", "northwind", Some(2026)),
            edge("other-type", "harbour", Some(2024)),
            edge("other-node", "acme", Some(2024)),
            edge("ended", "vale", Some(2022)),
        ];
        new[0].relation_type = "CONTRACTS_FOR".into();
        new[3].relation_type = "ON_CALL_FOR".into();
        new[4].source_node_id = "dana".into();
        let ended_before = Utc.with_ymd_and_hms(2023, 1, 1, 0, 0, 0).unwrap();
        new[5].invalid_at = Some(ended_before);
        let is_a = |t: &str, ancestor: &str| {
            t == ancestor || (t == "CONTRACTS_FOR" && ancestor == "WORKS_FULL_TIME_FOR")
        };
        let withdrawn = [Withdrawn {
            node_id: "priya".into(),
            relation_type: "WORKS_FULL_TIME_FOR".into(),
            at,
        }];
        let now = Utc::now();
        let mut out = FactResolution::default();
        let started = |e: &EdgeRow| e.valid_at;
        apply_withdrawals(
            &mut new,
            &mut committed,
            &withdrawn,
            &is_a,
            &started,
            now,
            &mut out,
        );
        assert_eq!(out.invalidated, 3, "{new:?}");
        assert_eq!(committed[0].invalid_at, Some(at));
        assert_eq!(committed[0].expired_at, Some(now));
        assert!(out.changed_committed.contains("c"), "written back");
        let ends: Vec<(&str, Option<chrono::DateTime<Utc>>)> = new
            .iter()
            .map(|e| (e.edge_id.as_str(), e.invalid_at))
            .collect();
        assert_eq!(
            ends,
            vec![
                ("sub", Some(at)),
                ("unknown-start", Some(at)),
                ("later", None),
                ("other-type", None),
                ("other-node", None),
                ("ended", Some(ended_before)),
            ],
            "a subtype ends, and an edge of unknown start; one that starts \
             after the end, another type, another node's, and one that ended \
             already keep what they had"
        );
    }

    #[test]
    fn a_new_fact_that_predates_a_committed_one_is_stored_already_invalid() {
        let mut committed = vec![edge("c", "brightline", Some(2025))];
        let mut new = vec![edge("n", "acme", Some(2021))];
        let now = Utc::now();
        let r = employment(&mut new, &mut committed, now);
        assert_eq!(r.invalidated, 1);
        assert!(
            r.changed_committed.is_empty(),
            "the committed, newer fact stays valid"
        );
        assert_eq!(new[0].invalid_at, committed[0].valid_at);
        assert_eq!(new[0].expired_at, Some(now));
        assert_eq!(committed[0].expired_at, None);
    }

    #[test]
    fn non_functional_types_are_left_alone_and_same_targets_fold_whatever_the_wording() {
        let mut committed = vec![edge("c", "acme", Some(2021))];
        let mut new = vec![edge("n", "brightline", Some(2025))];
        let r = plain(&mut new, &mut committed, Utc::now());
        assert_eq!(r.invalidated, 0);
        let mut committed = vec![edge("c", "acme", Some(2021))];
        let mut new = vec![edge("n", "acme", Some(2023))];
        new[0].fact = "Priya still works for acme.".into();
        let r = employment(&mut new, &mut committed, Utc::now());
        // Another wording of the same employment, while it holds: one
        // edge, whatever the words.
        assert_eq!((r.invalidated, r.duplicates), (0, 1));
    }

    #[test]
    fn a_duplicate_of_a_committed_fact_merges_into_it() {
        let mut committed = vec![edge("c", "acme", Some(2022))];
        let mut new = vec![edge("n", "acme", Some(2021))];
        let r = plain(&mut new, &mut committed, Utc::now());
        assert_eq!(r.duplicates, 1);
        assert!(new.is_empty());
        assert_eq!(
            committed[0].episode_ids,
            vec!["ep-c".to_string(), "ep-n".to_string()]
        );
        assert_eq!(
            committed[0].valid_at,
            Some(Utc.with_ymd_and_hms(2021, 1, 1, 0, 0, 0).unwrap()),
            "earliest valid_at kept"
        );
        assert!(r.changed_committed.contains("c"));
    }

    #[test]
    fn near_identical_fact_texts_are_one_fact() {
        let mut committed = vec![edge("c", "acme", Some(2022))];
        committed[0].fact = "Priya Raman works for Acme as a buyer.".into();
        let mut new = vec![edge("n", "acme", Some(2022))];
        new[0].fact = "Priya Raman works for Acme as a buyer".into();
        let r = plain(&mut new, &mut committed, Utc::now());
        assert_eq!(r.duplicates, 1);
        let mut new = vec![edge("n", "acme", Some(2022))];
        new[0].fact = "Priya Raman left Acme.".into();
        let r = plain(&mut new, &mut committed, Utc::now());
        assert_eq!(r.duplicates, 0, "a different statement is not a duplicate");
    }

    #[test]
    fn a_fact_from_a_record_asks_no_contradiction_question_but_can_be_asked_about() {
        let committed = vec![edge("c", "acme", Some(2020))];
        let mut new = vec![edge("n", "brightline", Some(2024))];
        new[0].origin = "map".into();
        assert!(contradiction_candidates(&new, &committed, &[], &family, &anyone, 4).is_empty());
        // A fact read from text after it is asked about it.
        new.push(edge("t", "globex", Some(2025)));
        let cases = contradiction_candidates(&new, &committed, &[], &family, &anyone, 4);
        assert_eq!(cases.len(), 1);
        assert_eq!(cases[0].0, 1);
        assert!(cases[0].1.contains(&EdgeRef::New(0)), "{cases:?}");
    }

    #[test]
    fn the_judge_is_asked_only_about_older_facts_to_another_target_the_run_allows_replacing() {
        let committed = vec![
            edge("c", "acme", Some(2020)),
            edge("d", "initech", Some(2021)),
        ];
        let mut new = vec![edge("n", "brightline", Some(2024))];
        // The run allows replacing Acme, not Initech.
        let acme_only = |e: &EdgeRow, older: &EdgeRow| {
            e.episode_ids == ["ep-n"] && older.target_node_id == "acme"
        };
        let cases = contradiction_candidates(&new, &committed, &[], &family, &acme_only, 4);
        assert_eq!(cases, vec![(0, vec![EdgeRef::Committed(0)])]);
        // Another wording about the same target is not asked about.
        new[0].target_node_id = "acme".into();
        new[0].fact = "Priya is a buyer at Acme.".into();
        let cases = contradiction_candidates(&new, &committed, &[], &family, &anyone, 4);
        assert_eq!(cases, vec![(0, vec![EdgeRef::Committed(1)])]);
    }

    #[test]
    fn a_judged_contradiction_invalidates_the_older_fact_whichever_came_first() {
        let now = Utc::now();
        let mut committed = vec![edge("c", "acme", Some(2020))];
        let mut new = vec![edge("n", "brightline", Some(2024))];
        let cases = contradiction_candidates(&new, &committed, &[], &family, &anyone, 4);
        assert_eq!(cases, vec![(0, vec![EdgeRef::Committed(0)])]);
        let mut out = FactResolution::default();
        apply_contradictions(
            &mut new,
            &mut committed,
            &[(0, EdgeRef::Committed(0))],
            now,
            &mut out,
        );
        assert_eq!(committed[0].invalid_at, new[0].valid_at);
        assert_eq!(committed[0].expired_at, Some(now));
        assert!(out.changed_committed.contains("c"));
        assert_eq!(new[0].expired_at, None);

        // Out of order: the new fact is the older one.
        let mut committed = vec![edge("c", "acme", Some(2024))];
        let mut new = vec![edge("n", "brightline", Some(2020))];
        let mut out = FactResolution::default();
        apply_contradictions(
            &mut new,
            &mut committed,
            &[(0, EdgeRef::Committed(0))],
            now,
            &mut out,
        );
        assert_eq!(new[0].invalid_at, committed[0].valid_at);
        assert_eq!(committed[0].expired_at, None);
        assert!(out.changed_committed.is_empty());
    }

    #[test]
    fn a_judged_contradiction_ends_every_live_wording_of_the_older_relationship() {
        let now = Utc::now();
        let mut committed = vec![edge("c", "acme", Some(2020)), edge("d", "acme", Some(2021))];
        committed[1].fact = "Acme employs Priya.".into();
        // A third wording that starts after the new fact is another interval.
        let mut later = edge("e", "acme", Some(2025));
        later.fact = "Priya is back at Acme.".into();
        committed.push(later);
        let mut new = vec![edge("n", "brightline", Some(2024))];
        let mut out = FactResolution::default();
        apply_contradictions(
            &mut new,
            &mut committed,
            &[(0, EdgeRef::Committed(0))],
            now,
            &mut out,
        );
        assert_eq!(committed[0].invalid_at, new[0].valid_at);
        assert_eq!(
            committed[1].invalid_at, new[0].valid_at,
            "the other wording"
        );
        assert_eq!(committed[2].invalid_at, None);
        assert_eq!(out.invalidated, 2);
        assert_eq!(out.changed_committed.len(), 2);
    }

    #[test]
    fn functional_types_are_not_sent_to_the_judge() {
        let committed = vec![edge("c", "acme", Some(2020))];
        let new = vec![edge("n", "brightline", Some(2024))];
        let cases = contradiction_candidates(
            &new,
            &committed,
            &["EMPLOYED_BY".into()],
            &family,
            &anyone,
            4,
        );
        assert!(cases.is_empty());
    }

    #[test]
    fn facts_that_became_true_at_the_same_moment_both_stay_valid() {
        let now = Utc::now();
        let mut committed = vec![edge("c", "acme", Some(2024))];
        let mut new = vec![edge("n", "brightline", Some(2024))];
        let mut out = FactResolution::default();
        apply_contradictions(
            &mut new,
            &mut committed,
            &[(0, EdgeRef::Committed(0))],
            now,
            &mut out,
        );
        assert_eq!(out.invalidated, 0);
        assert_eq!((committed[0].expired_at, new[0].expired_at), (None, None));
        let r = employment(&mut new, &mut committed, now);
        assert_eq!(r.invalidated, 0, "functional types too");
    }

    /// (target, valid_at year, invalid_at year, episodes) of every edge.
    fn shape(edges: &[EdgeRow]) -> Vec<(String, i32, Option<i32>, Vec<String>)> {
        use chrono::Datelike;
        let mut out: Vec<_> = edges
            .iter()
            .map(|e| {
                let mut eps = e.episode_ids.clone();
                eps.sort();
                (
                    e.target_node_id.clone(),
                    e.valid_at.map_or(0, |v| v.year()),
                    e.invalid_at.map(|v| v.year()),
                    eps,
                )
            })
            .collect();
        out.sort();
        out
    }

    /// Runs fact resolution over `facts` split into runs at `cuts`, each
    /// run seeing every edge the earlier ones committed.
    fn in_runs(facts: &[EdgeRow], cuts: &[usize]) -> Vec<EdgeRow> {
        let mut committed: Vec<EdgeRow> = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain([facts.len()].iter()) {
            let mut new = facts[from..to].to_vec();
            employment(&mut new, &mut committed, Utc::now());
            committed.extend(new);
            from = to;
        }
        committed
    }

    #[test]
    fn a_return_to_an_earlier_employer_is_a_new_interval_not_the_old_edge() {
        let facts = vec![
            edge("1", "acme", Some(2020)),
            edge("2", "brightline", Some(2021)),
            edge("3", "acme", Some(2022)),
            edge("4", "acme", Some(2023)),
        ];
        let one = shape(&in_runs(&facts, &[]));
        assert_eq!(
            one,
            vec![
                ("acme".into(), 2020, Some(2021), vec!["ep-1".into()]),
                (
                    "acme".into(),
                    2022,
                    None,
                    vec!["ep-3".into(), "ep-4".into()]
                ),
                ("brightline".into(), 2021, Some(2022), vec!["ep-2".into()]),
            ]
        );
        assert_eq!(shape(&in_runs(&facts, &[1, 2, 3])), one, "one run per fact");
        assert_eq!(shape(&in_runs(&facts, &[2])), one, "two runs");
    }

    #[test]
    fn a_late_fact_between_two_committed_intervals_ends_and_starts_them_as_one_run_would() {
        // The Brightline fact of 2021 arrives after 2020 and 2022 were
        // committed: the Acme edge of 2020 ends in 2021, and the 2022 fact
        // is a new interval in both orders.
        let facts = vec![
            edge("1", "acme", Some(2020)),
            edge("3", "acme", Some(2022)),
            edge("2", "brightline", Some(2021)),
        ];
        let mut sorted = facts.clone();
        sorted.sort_by_key(|e| e.valid_at);
        let one = shape(&in_runs(&sorted, &[]));
        assert_eq!(one.len(), 3, "{one:?}");
        // 2020 and 2022 alone fold into one edge; the late fact cannot
        // split it (the documented limit): it ends that edge in 2021.
        let late = shape(&in_runs(&facts, &[2]));
        assert_eq!(
            late,
            vec![
                (
                    "acme".into(),
                    2020,
                    Some(2021),
                    vec!["ep-1".into(), "ep-3".into()]
                ),
                ("brightline".into(), 2021, None, vec!["ep-2".into()]),
            ]
        );
        // Arriving before the 2022 fact, it gives what one run gives.
        assert_eq!(
            shape(&in_runs(&facts, &[1])),
            shape(&in_runs(&sorted, &[1, 2]))
        );
    }

    #[test]
    fn facts_in_time_order_give_the_same_edges_however_they_are_split_into_runs() {
        // A fixed-seed walk over 60 cases of 12 facts among 3 employers,
        // each compared in one run, one run per fact and random cuts.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let targets = ["acme", "brightline", "cobalt"];
        for case in 0..60 {
            let mut year = 2000;
            let facts: Vec<EdgeRow> = (0..12)
                .map(|k| {
                    // Some facts share a year (ties stay both valid).
                    year += next(2) as i32;
                    edge(
                        &format!("{case}-{k}"),
                        targets[next(3) as usize],
                        Some(year),
                    )
                })
                .collect();
            let one = shape(&in_runs(&facts, &[]));
            // Runs split between moments: the facts of one moment are
            // read from one episode, which no run boundary splits.
            let each: Vec<usize> = (1..facts.len())
                .filter(|k| facts[*k].valid_at != facts[k - 1].valid_at)
                .collect();
            assert_eq!(shape(&in_runs(&facts, &each)), one, "case {case}: per fact");
            let mut cuts: Vec<usize> = (0..3)
                .filter(|_| !each.is_empty())
                .map(|_| each[next(each.len() as u64) as usize])
                .collect();
            cuts.sort();
            assert_eq!(
                shape(&in_runs(&facts, &cuts)),
                one,
                "case {case}: cuts {cuts:?}"
            );
            // Facts of one moment in any order within a run.
            let mut shuffled = facts.clone();
            for k in (1..shuffled.len()).rev() {
                shuffled.swap(k, next(k as u64 + 1) as usize);
            }
            assert_eq!(
                shape(&in_runs(&shuffled, &[])),
                one,
                "case {case}: shuffled"
            );
        }
    }

    #[test]
    fn a_restatement_that_says_the_fact_ended_ends_the_edge() {
        let year = |y| Some(Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap());
        for functional in [true, false] {
            let types: Vec<String> = if functional {
                vec!["EMPLOYED_BY".into()]
            } else {
                vec![]
            };
            let mut committed = vec![edge("c", "acme", Some(2020))];
            let mut new = vec![edge("n", "acme", Some(2022))];
            new[0].invalid_at = year(2024);
            let now = Utc::now();
            let r = resolve_facts(
                &mut new,
                &mut committed,
                &types,
                &family,
                &no_subtypes,
                0.9,
                now,
            );
            assert_eq!(
                (r.duplicates, r.invalidated),
                (1, 1),
                "functional: {functional}"
            );
            assert_eq!(committed[0].invalid_at, year(2024));
            assert_eq!(committed[0].expired_at, Some(now));
            assert!(r.changed_committed.contains("c"));
        }
    }

    #[test]
    fn a_fact_that_the_relationship_ended_ends_the_live_edge_whatever_its_wording() {
        let year = |y| Some(Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap());
        let mut committed = vec![edge("c", "acme", Some(2020))];
        committed[0].fact = "Dana works for Acme".into();
        let mut new = vec![edge("n", "acme", None)];
        new[0].fact = "Dana is no longer employed by Acme".into();
        new[0].invalid_at = year(2024);
        let now = Utc::now();
        let r = plain(&mut new, &mut committed, now);
        assert_eq!((r.duplicates, r.invalidated), (1, 1));
        assert!(new.is_empty(), "the end folds into the edge it ends");
        assert_eq!(committed[0].invalid_at, year(2024));
        assert_eq!(committed[0].expired_at, Some(now));
        // Without an end, different wording is a different fact.
        let mut committed = vec![edge("c", "acme", Some(2020))];
        committed[0].fact = "Dana works for Acme".into();
        let mut new = vec![edge("n", "acme", None)];
        new[0].fact = "Dana leads the Acme account team".into();
        let r = plain(&mut new, &mut committed, now);
        assert_eq!((r.duplicates, r.invalidated), (0, 0));
        assert_eq!(committed[0].invalid_at, None);
    }

    #[test]
    fn an_end_and_the_fact_it_ends_make_one_ended_edge_in_either_order() {
        let day = |m, d| Some(Utc.with_ymd_and_hms(2025, m, d, 0, 0, 0).unwrap());
        let schedule = || {
            let mut e = edge("schedule", "fares", None);
            e.fact = "Kenji is primary on call for fare-engine".into();
            e.valid_at = day(1, 6);
            e
        };
        let end = || {
            let mut e = edge("chat", "fares", None);
            e.fact = "Kenji is no longer on call for Fare Engine as of 1 May".into();
            e.invalid_at = day(5, 1);
            e
        };
        let now = Utc::now();
        for mut new in [vec![schedule(), end()], vec![end(), schedule()]] {
            let r = plain(&mut new, &mut [], now);
            assert_eq!(r.duplicates, 1, "{new:?}");
            assert_eq!(new.len(), 1);
            assert_eq!((new[0].valid_at, new[0].invalid_at), (day(1, 6), day(5, 1)));
            let mut episodes = new[0].episode_ids.clone();
            episodes.sort();
            assert_eq!(episodes, ["ep-chat", "ep-schedule"]);
        }
        // A committed end takes a later run's schedule the same way.
        let mut committed = vec![end()];
        let mut new = vec![schedule()];
        let r = plain(&mut new, &mut committed, now);
        assert_eq!(r.duplicates, 1);
        assert_eq!(
            (committed[0].valid_at, committed[0].invalid_at),
            (day(1, 6), day(5, 1))
        );
        assert!(r.changed_committed.contains("chat"));
        // A fact that starts after the end is a new interval.
        let mut committed = vec![end()];
        let mut again = schedule();
        again.valid_at = day(8, 11);
        let mut new = vec![again];
        let r = plain(&mut new, &mut committed, now);
        assert_eq!((r.duplicates, new.len()), (0, 1));
        assert_eq!(new[0].invalid_at, None);
    }

    #[test]
    fn an_ended_broader_relationship_ends_its_narrower_kinds_and_not_the_reverse() {
        let year = |y| Some(Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap());
        let is_a = |r: &str, ancestor: &str| {
            r == ancestor || (ancestor == "RESPONSIBLE_FOR" && ["ON_CALL_FOR", "OWNS"].contains(&r))
        };
        let typed = |id: &str, relation: &str, fact: &str| {
            let mut e = edge(id, "ledger", Some(2020));
            e.relation_type = relation.into();
            e.fact = fact.into();
            e
        };
        let ended = || {
            let mut e = typed("n", "RESPONSIBLE_FOR", "Sofia is no longer on Ledger");
            e.valid_at = None;
            e.invalid_at = year(2024);
            e
        };
        let mut committed = vec![
            typed("call", "ON_CALL_FOR", "Sofia is on call for Ledger"),
            typed("elsewhere", "ON_CALL_FOR", "Sofia is on call for Fares"),
            typed("assigned", "ASSIGNED_TO", "Sofia works on Ledger"),
        ];
        committed[1].target_node_id = "fares".into();
        let mut new = vec![ended()];
        let now = Utc::now();
        let r = resolve_facts(&mut new, &mut committed, &[], &family, &is_a, 0.9, now);
        assert_eq!(r.invalidated, 1, "{committed:?}");
        assert_eq!(committed[0].invalid_at, year(2024));
        assert_eq!(committed[0].expired_at, Some(now));
        // Another target and a type outside the broader one stay live; the
        // end itself is a fact of its own.
        assert_eq!(
            (committed[1].invalid_at, committed[2].invalid_at),
            (None, None)
        );
        assert_eq!(new.len(), 1);

        // The same when the end came first: a narrower fact valid before it
        // ends there, one that starts after it stays live.
        let mut committed = vec![ended()];
        let mut new = vec![
            typed("early", "ON_CALL_FOR", "Sofia is on call for Ledger"),
            typed("later", "ON_CALL_FOR", "Sofia is on call for Ledger again"),
        ];
        new[1].valid_at = year(2025);
        let r = resolve_facts(&mut new, &mut committed, &[], &family, &is_a, 0.9, now);
        assert_eq!(r.invalidated, 1);
        assert_eq!((new[0].invalid_at, new[1].invalid_at), (year(2024), None));

        // An ended narrower kind leaves the broader relationship alone.
        let mut committed = vec![typed("r", "RESPONSIBLE_FOR", "Sofia answers for Ledger")];
        let mut new = vec![typed(
            "n",
            "ON_CALL_FOR",
            "Sofia is no longer on call for Ledger",
        )];
        new[0].invalid_at = year(2024);
        let r = resolve_facts(&mut new, &mut committed, &[], &family, &is_a, 0.9, now);
        assert_eq!((r.invalidated, committed[0].invalid_at), (0, None));
    }

    #[test]
    fn a_restatement_after_an_extracted_end_is_a_new_interval() {
        let year = |y| Some(Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap());
        // Not a functional type: the end was stated, not derived, so the
        // edge is not expired, and the later fact still may not fold in.
        let mut committed = vec![edge("c", "acme", Some(2020))];
        committed[0].invalid_at = year(2021);
        let mut new = vec![edge("n", "acme", Some(2023))];
        let r = plain(&mut new, &mut committed, Utc::now());
        assert_eq!(r.duplicates, 0);
        assert_eq!(new.len(), 1);
        assert_eq!(committed[0].invalid_at, year(2021));
    }
}
