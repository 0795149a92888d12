//! Community detection: hierarchical Leiden over modularity.
//!
//! The algorithm follows Traag, Waltman & van Eck, "From Louvain to Leiden:
//! guaranteeing well-connected communities" (Scientific Reports 9, 2019):
//! fast local moving with a queue, a randomised refinement that only merges
//! well-connected pieces inside each community, and aggregation on the refined
//! partition seeded with the unrefined one. The hierarchy on top mirrors what
//! graphrag gets from graspologic's `hierarchical_leiden`: communities larger
//! than `max_cluster_size` are split again on their induced subgraph.
//!
//! The file is std-only and does not refer to the rest of the crate so that it
//! can be compiled and tested on its own with `rustc --test`.
//!
//! Memory stays linear in nodes plus edges: the graph is CSR with `u32` ids,
//! every per-node array lives in a reusable [`Workspace`], and the hot loops
//! never allocate per node. Results are reproducible bit for bit: the only
//! randomness is a seeded splitmix64 stream, iteration orders never come from
//! hash maps, and the parallel splitting of the hierarchy writes each result
//! into a slot fixed by its input position, so scheduling cannot show through.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Marks "no value" in `u32` id arrays; node ids stay below it.
const NONE: u32 = u32::MAX;

/// Top bit of a community id in local moving: the node is waiting in the queue.
/// Ids stay below it because graphs are limited to 2^31 nodes.
const QUEUED: u32 = 1 << 31;

/// Relative margin a move must beat before it is taken. Without it, gains
/// that are equal on paper but differ by rounding could make nodes bounce
/// between two communities forever.
const MOVE_EPS: f64 = 1e-12;

/// Undirected weighted graph in CSR form over nodes 0..n.
///
/// Every undirected edge is stored in both endpoints' neighbour lists;
/// self-loops are kept apart in `loops` because they never influence where a
/// node moves, only its degree. Neighbour lists are sorted and duplicate-free
/// so the same edge set gives the same graph whatever order it came in.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// `offsets[v]..offsets[v + 1]` is v's range in `targets` / `weights`.
    offsets: Vec<u64>,
    targets: Vec<u32>,
    weights: Vec<f64>,
    /// Self-loop weight per node, each loop counted once.
    loops: Vec<f64>,
    /// Weighted degree: neighbour weights plus twice the self-loop weight.
    degree: Vec<f64>,
    /// Sum of all degrees, i.e. twice the total edge weight (2m).
    total: f64,
}

impl Graph {
    /// From an edge list (u, v, w); self-loops and duplicate pairs allowed (duplicates add up); u,v < n.
    ///
    /// Modularity needs positive weights, so edges whose weight is not a
    /// positive finite number are ignored; a node left with no weight counts
    /// as isolated. Panics if an endpoint is out of range or `n` exceeds 2^31
    /// (one bit of the `u32` ids is used as a flag).
    pub fn from_edges(n: usize, edges: &[(u32, u32, f64)]) -> Graph {
        assert!(
            n <= QUEUED as usize,
            "graph with {n} nodes exceeds the 2^31 node limit"
        );
        let mut offsets = vec![0u64; n + 1];
        let mut loops = vec![0.0f64; n];
        for &(u, v, w) in edges {
            assert!(
                (u as usize) < n && (v as usize) < n,
                "edge ({u}, {v}) out of range for {n} nodes"
            );
            if !(w > 0.0 && w.is_finite()) {
                continue;
            }
            if u == v {
                loops[u as usize] += w;
            } else {
                offsets[u as usize + 1] += 1;
                offsets[v as usize + 1] += 1;
            }
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let slots = offsets[n] as usize;
        let mut fill: Vec<u64> = offsets[..n].to_vec();
        let mut pairs: Vec<(u32, f64)> = vec![(0, 0.0); slots];
        for &(u, v, w) in edges {
            if !(w > 0.0 && w.is_finite()) || u == v {
                continue;
            }
            pairs[fill[u as usize] as usize] = (v, w);
            fill[u as usize] += 1;
            pairs[fill[v as usize] as usize] = (u, w);
            fill[v as usize] += 1;
        }
        drop(fill);

        // Sorting by (target, weight) makes the merged sums independent of the
        // input edge order, which keeps results reproducible across callers
        // that build the same graph differently.
        let mut targets = Vec::with_capacity(slots);
        let mut weights = Vec::with_capacity(slots);
        let mut degree = vec![0.0f64; n];
        let mut start = 0usize;
        for v in 0..n {
            let end = offsets[v + 1] as usize;
            let list = &mut pairs[start..end];
            list.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            let first = targets.len();
            for &(t, w) in list.iter() {
                if targets.len() > first && targets[targets.len() - 1] == t {
                    let last = weights.len() - 1;
                    weights[last] += w;
                } else {
                    targets.push(t);
                    weights.push(w);
                }
            }
            start = end;
            offsets[v + 1] = targets.len() as u64;
            degree[v] = weights[first..].iter().sum::<f64>() + 2.0 * loops[v];
        }
        drop(pairs);
        targets.shrink_to_fit();
        weights.shrink_to_fit();
        let total = degree.iter().sum();
        Graph {
            offsets,
            targets,
            weights,
            loops,
            degree,
            total,
        }
    }

    /// Number of nodes, isolated ones included.
    pub fn node_count(&self) -> usize {
        self.degree.len()
    }

    fn adj(&self, v: usize) -> (&[u32], &[f64]) {
        let (s, e) = (self.offsets[v] as usize, self.offsets[v + 1] as usize);
        (&self.targets[s..e], &self.weights[s..e])
    }

    /// Empties the graph but keeps its buffers, so work graphs can be rebuilt
    /// level after level without going back to the allocator.
    fn reset(&mut self) {
        self.offsets.clear();
        self.offsets.push(0);
        self.targets.clear();
        self.weights.clear();
        self.loops.clear();
        self.degree.clear();
        self.total = 0.0;
    }
}

/// Parameters of [`leiden`] and [`hierarchical_leiden`].
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// Seed of the random stream; the same graph and seed give the same output.
    pub seed: u64,
    /// Modularity resolution γ; larger values give smaller communities.
    pub resolution: f64,
    /// Communities with more members than this are split at the next level.
    pub max_cluster_size: usize,
    /// Number of hierarchy levels at most, level 0 included (0 acts as 1).
    pub max_levels: usize,
    /// Refinement randomness θ (in edge-weight units); 0 makes the refinement greedy.
    pub randomness: f64,
}

impl Default for Params {
    /// graphrag's defaults: seed 0xDEADBEEF, γ = 1, clusters of at most 10.
    fn default() -> Self {
        Params {
            seed: 0xDEAD_BEEF,
            resolution: 1.0,
            max_cluster_size: 10,
            max_levels: 16,
            randomness: 0.01,
        }
    }
}

/// One community of the hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Community {
    /// Position in the output, counting from 0.
    pub id: u32,
    /// Depth in the hierarchy; level 0 partitions the whole graph.
    pub level: u32,
    /// Id of the community of the level above that this one was split from.
    pub parent: Option<u32>,
    /// Node ids, sorted ascending.
    pub members: Vec<u32>,
}

/// Hierarchical Leiden: level 0 partitions the whole graph; every community with more than
/// max_cluster_size members is split at the next level by running Leiden on its induced subgraph
/// (as graphrag's hierarchical Leiden does), until max_levels or it cannot be split.
///
/// Nodes without edges belong to no community, as graphrag leaves isolated
/// entities out. Output order: level by level, and within a level by
/// smallest member. A community whose subgraph Leiden keeps whole has no
/// children.
pub fn hierarchical_leiden(graph: &Graph, params: &Params) -> Vec<Community> {
    let mut ws = Workspace::default();
    let mut membership = Vec::new();
    let k = leiden_core(graph, params, params.seed, &mut ws, &mut membership);
    drop(ws);

    let mut out: Vec<Community> = Vec::new();
    for members in group_members(&membership, k, |v| v) {
        // Isolated nodes never move, so they are exactly the singleton
        // communities whose node has no weight.
        if members.len() == 1 && graph.degree[members[0] as usize] <= 0.0 {
            continue;
        }
        let id = out.len() as u32;
        out.push(Community {
            id,
            level: 0,
            parent: None,
            members,
        });
    }

    let max_levels = params.max_levels.max(1);
    let first: Vec<u32> = out
        .iter()
        .filter(|c| c.members.len() > params.max_cluster_size)
        .map(|c| c.id)
        .collect();
    if first.is_empty() || max_levels < 2 {
        return out;
    }
    // Later levels only ever look inside the communities being split, so they
    // work on a compact copy holding just those subgraphs, community after
    // community. In the input a community's nodes are scattered over memory;
    // in the copy they are contiguous, which is what keeps splitting fast on
    // graphs far larger than the CPU cache.
    let lists: Vec<&[u32]> = first
        .iter()
        .map(|&c| out[c as usize].members.as_slice())
        .collect();
    let (compact, old_of) = compact_subgraphs(graph, &lists);
    drop(lists);
    // Each frontier entry: the community's id and its members as compact ids.
    let mut frontier: Vec<(u32, Vec<u32>)> = Vec::with_capacity(first.len());
    let mut base = 0u32;
    for &c in &first {
        let len = out[c as usize].members.len() as u32;
        frontier.push((c, (base..base + len).collect()));
        base += len;
    }
    drop(first);

    let mut level = 1u32;
    while !frontier.is_empty() && (level as usize) < max_levels {
        let splits = split_all(&compact, &old_of, params, level, &frontier);
        let mut children: Vec<(Community, Vec<u32>)> = Vec::new();
        for ((parent, _), parts) in frontier.iter().zip(splits) {
            for local in parts {
                // Compact ids follow original id order inside a level-0
                // community, so mapped member lists come out sorted.
                let members = local.iter().map(|&x| old_of[x as usize]).collect();
                children.push((
                    Community {
                        id: 0,
                        level,
                        parent: Some(*parent),
                        members,
                    },
                    local,
                ));
            }
        }
        // Siblings of different parents are disjoint, so smallest member is a total order.
        children.sort_by_key(|(c, _)| c.members[0]);
        frontier.clear();
        let first_id = out.len();
        for (i, (mut c, local)) in children.into_iter().enumerate() {
            c.id = (first_id + i) as u32;
            if c.members.len() > params.max_cluster_size {
                frontier.push((c.id, local));
            }
            out.push(c);
        }
        level += 1;
    }
    out
}

/// One flat Leiden partition: community index per node (0..k, numbered by first appearance in node order).
///
/// Isolated nodes each get a singleton community here.
pub fn leiden(graph: &Graph, params: &Params) -> Vec<u32> {
    let mut ws = Workspace::default();
    let mut membership = Vec::new();
    leiden_core(graph, params, params.seed, &mut ws, &mut membership);
    membership
}

/// Modularity Q = Σ_c [ L_c / m − γ (K_c / 2m)² ] of a partition, where L_c is
/// the weight inside c (self-loops once) and K_c its total degree; the same
/// convention as networkx. A graph without edges has modularity 0.
///
/// `membership[v]` is any label per node; nodes sharing a label share a community.
pub fn modularity(graph: &Graph, membership: &[u32], resolution: f64) -> f64 {
    let n = graph.node_count();
    assert_eq!(
        membership.len(),
        n,
        "membership length differs from node count"
    );
    if graph.total <= 0.0 {
        return 0.0;
    }
    // Labels need not be dense; compact them when they would make the
    // per-community arrays much larger than the graph.
    let max = membership.iter().copied().max().unwrap_or(0) as usize;
    let labels: Vec<u32> = if max < 4 * n + 16 {
        membership.to_vec()
    } else {
        let mut distinct = membership.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        membership
            .iter()
            .map(|l| distinct.binary_search(l).map_or(0, |i| i as u32))
            .collect()
    };
    let k = labels.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut inside = vec![0.0f64; k];
    let mut tot = vec![0.0f64; k];
    for v in 0..n {
        let c = labels[v] as usize;
        tot[c] += graph.degree[v];
        inside[c] += 2.0 * graph.loops[v];
        let (nb, w) = graph.adj(v);
        for (&u, &w) in nb.iter().zip(w) {
            if labels[u as usize] as usize == c {
                inside[c] += w;
            }
        }
    }
    // `inside` counted every internal edge from both ends: it holds 2·L_c.
    let two_m = graph.total;
    inside
        .iter()
        .zip(&tot)
        .map(|(&i, &t)| i / two_m - resolution * (t / two_m) * (t / two_m))
        .sum()
}

// ---------------------------------------------------------------------------
// Hierarchy helpers

/// Groups nodes by a dense label 0..k into sorted member lists, mapping each
/// node through `id` (local → global ids for subgraphs).
fn group_members(labels: &[u32], k: usize, id: impl Fn(u32) -> u32) -> Vec<Vec<u32>> {
    let mut sizes = vec![0usize; k];
    for &l in labels {
        sizes[l as usize] += 1;
    }
    let mut groups: Vec<Vec<u32>> = sizes.iter().map(|&s| Vec::with_capacity(s)).collect();
    for (v, &l) in labels.iter().enumerate() {
        groups[l as usize].push(id(v as u32));
    }
    groups
}

/// Seed of one split: a function of the run seed, the level and the
/// community's smallest member, so a result never depends on which thread
/// or in which order the split ran.
fn split_seed(seed: u64, level: u32, first_member: u32) -> u64 {
    mix64(mix64(seed ^ 0x5EED_0F1E_1DE7_u64) ^ ((level as u64) << 32 | first_member as u64))
}

/// Splits every frontier community of the compact graph; result i belongs to
/// `frontier[i]`, in compact ids, and is empty when Leiden keeps it whole.
fn split_all(
    compact: &Graph,
    old_of: &[u32],
    params: &Params,
    level: u32,
    frontier: &[(u32, Vec<u32>)],
) -> Vec<Vec<Vec<u32>>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(frontier.len());
    let work = |ws: &mut Workspace, local: &mut Vec<u32>, sub: &mut Graph, i: usize| {
        let members = &frontier[i].1;
        let seed = split_seed(params.seed, level, old_of[members[0] as usize]);
        split_one(compact, members, params, seed, ws, local, sub)
    };
    if threads <= 1 {
        let (mut ws, mut local, mut sub) = (Workspace::default(), Vec::new(), Graph::default());
        return (0..frontier.len())
            .map(|i| work(&mut ws, &mut local, &mut sub, i))
            .collect();
    }
    // Threads pull indices from a shared counter and store each result at its
    // own index, so the output is the same whichever thread did what.
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Vec<Vec<u32>>>> = (0..frontier.len())
        .map(|_| Mutex::new(Vec::new()))
        .collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let (mut ws, mut local, mut sub) =
                    (Workspace::default(), Vec::new(), Graph::default());
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= frontier.len() {
                        break;
                    }
                    let parts = work(&mut ws, &mut local, &mut sub, i);
                    if let Ok(mut slot) = slots[i].lock() {
                        *slot = parts;
                    }
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}

/// Runs Leiden on the subgraph of `graph` induced by `members` (sorted);
/// returns the parts as sorted lists of `graph` ids, or nothing when it stays whole.
fn split_one(
    graph: &Graph,
    members: &[u32],
    params: &Params,
    seed: u64,
    ws: &mut Workspace,
    local: &mut Vec<u32>,
    sub: &mut Graph,
) -> Vec<Vec<u32>> {
    induced_subgraph(graph, members, local, sub);
    let mut labels = std::mem::take(&mut ws.result);
    let k = leiden_core(sub, params, seed, ws, &mut labels);
    let parts = if k <= 1 {
        Vec::new()
    } else {
        group_members(&labels, k, |v| members[v as usize])
    };
    ws.result = labels;
    parts
}

/// Copies the subgraphs induced by each of the disjoint, sorted member lists
/// into one graph, list after list, keeping only edges inside a list. Node i
/// of the copy is `old_of[i]` of `g`; within a list, the order of ids (and so
/// of every neighbour list) is the original one, so splitting a community of
/// the copy gives exactly what splitting it in `g` would.
fn compact_subgraphs(g: &Graph, lists: &[&[u32]]) -> (Graph, Vec<u32>) {
    let total: usize = lists.iter().map(|l| l.len()).sum();
    let mut rank = vec![NONE; g.node_count()];
    let mut old_of = Vec::with_capacity(total);
    for list in lists {
        for &v in list.iter() {
            rank[v as usize] = old_of.len() as u32;
            old_of.push(v);
        }
    }
    let mut out = Graph::default();
    out.reset();
    let mut base = 0usize;
    for list in lists {
        let end = base + list.len();
        for &v in list.iter() {
            let (nb, w) = g.adj(v as usize);
            let mut d = 0.0;
            for (&u, &w) in nb.iter().zip(w) {
                // NONE (not being split) is far above any `end`.
                let r = rank[u as usize] as usize;
                if r >= base && r < end {
                    out.targets.push(r as u32);
                    out.weights.push(w);
                    d += w;
                }
            }
            out.offsets.push(out.targets.len() as u64);
            let lw = g.loops[v as usize];
            out.loops.push(lw);
            out.degree.push(d + 2.0 * lw);
        }
        base = end;
    }
    out.total = out.degree.iter().sum();
    (out, old_of)
}

/// Builds the subgraph induced by the sorted `members` into `out`, local id i
/// standing for `members[i]`. Only the members' own neighbour lists are read;
/// `local` is a global-id → local-id map that is left all `NONE` afterwards,
/// so the cost is the members' degrees, not the graph size.
fn induced_subgraph(g: &Graph, members: &[u32], local: &mut Vec<u32>, out: &mut Graph) {
    if local.len() < g.node_count() {
        local.resize(g.node_count(), NONE);
    }
    for (i, &m) in members.iter().enumerate() {
        local[m as usize] = i as u32;
    }
    out.reset();
    for &m in members {
        let (nb, w) = g.adj(m as usize);
        let mut d = 0.0;
        for (&u, &w) in nb.iter().zip(w) {
            let l = local[u as usize];
            if l != NONE {
                out.targets.push(l);
                out.weights.push(w);
                d += w;
            }
        }
        out.offsets.push(out.targets.len() as u64);
        let lw = g.loops[m as usize];
        out.loops.push(lw);
        out.degree.push(d + 2.0 * lw);
    }
    out.total = out.degree.iter().sum();
    for &m in members {
        local[m as usize] = NONE;
    }
}

// ---------------------------------------------------------------------------
// Leiden proper

/// Reusable per-run buffers. Every phase clears and resizes what it uses to
/// the current graph, so nothing left from an earlier (bigger or smaller) run
/// can leak into a result, and the recursion over thousands of small
/// subgraphs does not allocate per call once the buffers have grown.
#[derive(Default)]
struct Workspace {
    /// Community of each node of the current level graph.
    comm: Vec<u32>,
    next_comm: Vec<u32>,
    comm_weight: Vec<f64>,
    /// Local moving: (community weight, accumulated edge weight from the node).
    slots: Vec<(f64, f64)>,
    comm_size: Vec<u32>,
    empty: Vec<u32>,
    /// Dense accumulator of weights towards communities, zero outside use.
    acc: Vec<f64>,
    touched: Vec<u32>,
    queue: Vec<u32>,
    perm: Vec<u32>,
    refined: Vec<u32>,
    ref_weight: Vec<f64>,
    ref_ext: Vec<f64>,
    ref_size: Vec<u32>,
    cand: Vec<(u32, f64)>,
    order: Vec<u32>,
    start: Vec<u32>,
    relabel: Vec<u32>,
    /// Original node → node of the current level graph.
    node_map: Vec<u32>,
    result: Vec<u32>,
    ga: Graph,
    gb: Graph,
}

/// Leiden on `input`; writes labels 0..k (first appearance in node order) to
/// `out` and returns k. Every returned community is connected.
fn leiden_core(
    input: &Graph,
    params: &Params,
    seed: u64,
    ws: &mut Workspace,
    out: &mut Vec<u32>,
) -> usize {
    let n0 = input.node_count();
    out.clear();
    if n0 == 0 {
        return 0;
    }
    if input.total <= 0.0 {
        out.extend(0..n0 as u32);
        return n0;
    }
    let mut rng = Rng::new(seed);
    // Gains are kept in edge-weight units: w(v, C) − γ k_v K_C / 2m.
    let gamma2m = params.resolution / input.total;
    ws.node_map.clear();
    ws.node_map.extend(0..n0 as u32);
    ws.comm.clear();
    ws.comm.extend(0..n0 as u32);

    let mut ga = std::mem::take(&mut ws.ga);
    let mut gb = std::mem::take(&mut ws.gb);
    let mut on_input = true;
    loop {
        let g: &Graph = if on_input { input } else { &ga };
        let n = g.node_count();
        fast_move_nodes(g, gamma2m, &mut rng, ws);
        let k = renumber(&mut ws.comm, &mut ws.relabel, n);
        // Every community is one aggregate node: nothing left to merge, and
        // each aggregate node is a union of connected refined pieces.
        if k == n {
            break;
        }
        let mut r = refine(g, gamma2m, params.randomness, k, &mut rng, ws);
        if r == n {
            // Refinement merged nothing (every merge lowers quality), so
            // aggregating on it would loop forever. Aggregate on the
            // communities themselves, as Louvain does; the final split into
            // connected components restores Leiden's guarantee.
            ws.refined.clone_from(&ws.comm);
            r = k;
        }
        aggregate(g, r, ws, &mut gb);
        // The unrefined partition is the starting point of the next level.
        ws.next_comm.clear();
        ws.next_comm.resize(r, 0);
        for v in 0..n {
            ws.next_comm[ws.refined[v] as usize] = ws.comm[v];
        }
        std::mem::swap(&mut ws.comm, &mut ws.next_comm);
        for x in ws.node_map.iter_mut() {
            *x = ws.refined[*x as usize];
        }
        std::mem::swap(&mut ga, &mut gb);
        on_input = false;
    }
    out.extend(ws.node_map.iter().map(|&a| ws.comm[a as usize]));
    ws.ga = ga;
    ws.gb = gb;
    split_disconnected(input, out, ws)
}

/// Queue-based local moving (Leiden's FastMoveNodes): visit nodes in random
/// order, move each to the neighbouring community with the best modularity
/// gain, and requeue the neighbours a move may have made movable.
fn fast_move_nodes(g: &Graph, gamma2m: f64, rng: &mut Rng, ws: &mut Workspace) {
    let n = g.node_count();
    let Workspace {
        comm,
        slots,
        comm_size,
        empty,
        touched,
        queue,
        ..
    } = ws;
    // On big graphs every neighbour costs cache misses, so the state read per
    // neighbour is packed: a community's weight sits next to its accumulator,
    // and a node's "queued" flag lives in the spare top bit of its community.
    slots.clear();
    slots.resize(n, (0.0, 0.0));
    comm_size.clear();
    comm_size.resize(n, 0);
    for v in 0..n {
        slots[comm[v] as usize].0 += g.degree[v];
        comm_size[comm[v] as usize] += 1;
    }
    // A node may also open an empty community; keep a stack of unused ids.
    empty.clear();
    empty.extend((0..n as u32).rev().filter(|&c| comm_size[c as usize] == 0));
    queue.clear();
    queue.extend(0..n as u32);
    rng.shuffle(queue);
    for c in comm.iter_mut() {
        *c |= QUEUED;
    }

    // `queue` is a ring buffer: a node is in it at most once, so n slots suffice.
    let (mut head, mut len) = (0usize, n);
    while len > 0 {
        let v = queue[head] as usize;
        head = if head + 1 == n { 0 } else { head + 1 };
        len -= 1;
        let old = (comm[v] & !QUEUED) as usize;
        comm[v] = old as u32;

        let (nb, nw) = g.adj(v);
        let kv = g.degree[v];
        touched.clear();
        for (&u, &w) in nb.iter().zip(nw) {
            let c = (comm[u as usize] & !QUEUED) as usize;
            let slot = &mut slots[c];
            if slot.1 == 0.0 {
                touched.push(c as u32);
            }
            slot.1 += w;
        }
        slots[old].0 -= kv;
        comm_size[old] -= 1;
        let stay = slots[old].1 - gamma2m * kv * slots[old].0;
        let (mut best, mut best_gain) = (old, stay);
        for &c in touched.iter() {
            let (weight, acc) = slots[c as usize];
            let gain = acc - gamma2m * kv * weight;
            if gain > best_gain {
                best = c as usize;
                best_gain = gain;
            }
        }
        // Alone the node gains 0; if its own community is now empty that is
        // the "stay" option already.
        if comm_size[old] != 0
            && best_gain < 0.0
            && let Some(&e) = empty.last()
        {
            best = e as usize;
            best_gain = 0.0;
        }
        if best != old && best_gain - stay <= MOVE_EPS * kv {
            best = old;
        }
        slots[best].0 += kv;
        comm_size[best] += 1;
        if best != old {
            if comm_size[best] == 1 {
                empty.pop();
            }
            if comm_size[old] == 0 {
                empty.push(old as u32);
            }
            comm[v] = best as u32;
            for &u in nb {
                let cu = &mut comm[u as usize];
                if *cu & QUEUED == 0 && *cu as usize != best {
                    *cu |= QUEUED;
                    let mut tail = head + len;
                    if tail >= n {
                        tail -= n;
                    }
                    queue[tail] = u;
                    len += 1;
                }
            }
        }
        for &c in touched.iter() {
            slots[c as usize].1 = 0.0;
        }
    }
}

/// Leiden's refinement: inside each community S, start from singletons and
/// let each well-connected singleton join a well-connected piece of S, chosen
/// at random with probability ∝ exp(gain / θ) among non-negative gains. The
/// pieces stay connected because a node only joins a piece it has an edge to.
/// Leaves labels 0..r in `ws.refined` and returns r.
fn refine(
    g: &Graph,
    gamma2m: f64,
    theta: f64,
    k: usize,
    rng: &mut Rng,
    ws: &mut Workspace,
) -> usize {
    let n = g.node_count();
    let Workspace {
        comm,
        comm_weight,
        acc,
        touched,
        perm,
        refined,
        ref_weight,
        ref_ext,
        ref_size,
        cand,
        order,
        start,
        relabel,
        ..
    } = ws;
    comm_weight.clear();
    comm_weight.resize(k, 0.0);
    for v in 0..n {
        comm_weight[comm[v] as usize] += g.degree[v];
    }
    // Bucket nodes by community, in one random order for the whole graph, so
    // each community's visiting order is random without a shuffle per community.
    perm.clear();
    perm.extend(0..n as u32);
    rng.shuffle(perm);
    bucket(comm, k, perm.iter().copied(), start, order);

    refined.clear();
    refined.extend(0..n as u32);
    ref_weight.clear();
    ref_weight.extend_from_slice(&g.degree);
    ref_size.clear();
    ref_size.resize(n, 1);
    ref_ext.clear();
    ref_ext.resize(n, 0.0);
    acc.clear();
    acc.resize(n, 0.0);

    for s in 0..k {
        let members = &order[start[s] as usize..start[s + 1] as usize];
        if members.len() < 2 {
            continue;
        }
        let s32 = s as u32;
        for &v in members {
            let (nb, nw) = g.adj(v as usize);
            let mut e = 0.0;
            for (&u, &w) in nb.iter().zip(nw) {
                if comm[u as usize] == s32 {
                    e += w;
                }
            }
            ref_ext[v as usize] = e;
        }
        let ks = comm_weight[s];
        for &v in members {
            let vi = v as usize;
            // Only nodes still alone may move, and only if they are well
            // connected to the rest of S.
            if refined[vi] != v || ref_size[vi] != 1 {
                continue;
            }
            let kv = g.degree[vi];
            if ref_ext[vi] < gamma2m * kv * (ks - kv) {
                continue;
            }
            let (nb, nw) = g.adj(vi);
            touched.clear();
            for (&u, &w) in nb.iter().zip(nw) {
                if comm[u as usize] != s32 {
                    continue;
                }
                let c = refined[u as usize] as usize;
                if acc[c] == 0.0 {
                    touched.push(c as u32);
                }
                acc[c] += w;
            }
            // Staying alone is the first candidate with gain 0, so exact ties
            // (and the greedy θ = 0 case) keep the node where it is.
            cand.clear();
            cand.push((v, 0.0));
            let mut max_gain = 0.0f64;
            for &c in touched.iter() {
                let ci = c as usize;
                let cw = ref_weight[ci];
                if ref_ext[ci] < gamma2m * cw * (ks - cw) {
                    continue;
                }
                let gain = acc[ci] - gamma2m * kv * cw;
                if gain >= 0.0 {
                    cand.push((c, gain));
                    max_gain = max_gain.max(gain);
                }
            }
            let chosen = if cand.len() == 1 {
                v
            } else if theta <= 0.0 {
                cand.iter()
                    .find(|&&(_, gain)| gain == max_gain)
                    .map_or(v, |&(c, _)| c)
            } else {
                // Shift by the best gain so exp never overflows; terms far
                // below it are negligible and skipped to save exp calls.
                let weight = |gain: f64| {
                    let x = (gain - max_gain) / theta;
                    if x < -50.0 { 0.0 } else { x.exp() }
                };
                let total: f64 = cand.iter().map(|&(_, gain)| weight(gain)).sum();
                let mut r = rng.unit() * total;
                // Rounding can leave r just past the last term; the last
                // candidate with any weight is then the right answer.
                let mut pick = v;
                for &(c, gain) in cand.iter() {
                    let p = weight(gain);
                    if p > 0.0 {
                        pick = c;
                        if r < p {
                            break;
                        }
                        r -= p;
                    }
                }
                pick
            };
            if chosen != v {
                let ci = chosen as usize;
                ref_weight[ci] += kv;
                ref_ext[ci] += ref_ext[vi] - 2.0 * acc[ci];
                ref_size[ci] += 1;
                ref_size[vi] = 0;
                refined[vi] = chosen;
            }
            for &c in touched.iter() {
                acc[c as usize] = 0.0;
            }
        }
    }
    renumber(refined, relabel, n)
}

/// Collapses each group of `ws.refined` (labels 0..r) into one node of `out`:
/// edges between groups add up, edges inside become a self-loop, degrees add.
fn aggregate(g: &Graph, r: usize, ws: &mut Workspace, out: &mut Graph) {
    let n = g.node_count();
    let Workspace {
        refined,
        acc,
        touched,
        order,
        start,
        ..
    } = ws;
    bucket(refined, r, 0..n as u32, start, order);
    acc.clear();
    acc.resize(r, 0.0);
    out.reset();
    for a in 0..r {
        let a32 = a as u32;
        let (mut lw, mut inner, mut d) = (0.0, 0.0, 0.0);
        touched.clear();
        for &v in &order[start[a] as usize..start[a + 1] as usize] {
            let vi = v as usize;
            lw += g.loops[vi];
            d += g.degree[vi];
            let (nb, nw) = g.adj(vi);
            for (&u, &w) in nb.iter().zip(nw) {
                let b = refined[u as usize];
                if b == a32 {
                    inner += w;
                } else {
                    if acc[b as usize] == 0.0 {
                        touched.push(b);
                    }
                    acc[b as usize] += w;
                }
            }
        }
        for &b in touched.iter() {
            out.targets.push(b);
            out.weights.push(acc[b as usize]);
            acc[b as usize] = 0.0;
        }
        out.offsets.push(out.targets.len() as u64);
        // Internal edges were seen from both ends.
        out.loops.push(lw + inner / 2.0);
        out.degree.push(d);
    }
    out.total = g.total;
}

/// Splits every community of `labels` into its connected components and
/// renumbers by first appearance; returns the community count. Leiden already
/// returns connected communities except after the Louvain-style fallback in
/// aggregation, and splitting a disconnected community never lowers modularity.
fn split_disconnected(g: &Graph, labels: &mut [u32], ws: &mut Workspace) -> usize {
    let n = g.node_count();
    let parent = &mut ws.perm;
    parent.clear();
    parent.extend(0..n as u32);
    fn find(parent: &mut [u32], mut x: u32) -> u32 {
        while parent[x as usize] != x {
            let up = parent[parent[x as usize] as usize];
            parent[x as usize] = up;
            x = up;
        }
        x
    }
    for v in 0..n {
        let (nb, _) = g.adj(v);
        for &u in nb {
            if (u as usize) > v && labels[u as usize] == labels[v] {
                let (a, b) = (find(parent, v as u32), find(parent, u));
                if a != b {
                    // The smaller index wins, which keeps roots deterministic.
                    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
                    parent[hi as usize] = lo;
                }
            }
        }
    }
    for (v, l) in labels.iter_mut().enumerate() {
        *l = find(parent, v as u32);
    }
    renumber(labels, &mut ws.relabel, n)
}

/// Relabels `labels` (all < bound) to 0..k by first appearance; returns k.
fn renumber(labels: &mut [u32], map: &mut Vec<u32>, bound: usize) -> usize {
    map.clear();
    map.resize(bound, NONE);
    let mut k = 0u32;
    for l in labels.iter_mut() {
        let m = &mut map[*l as usize];
        if *m == NONE {
            *m = k;
            k += 1;
        }
        *l = *m;
    }
    k as usize
}

/// Counting sort: after it, `order[start[c]..start[c + 1]]` holds the items
/// with label c, in the order `items` yielded them.
fn bucket(
    labels: &[u32],
    k: usize,
    items: impl Iterator<Item = u32> + Clone,
    start: &mut Vec<u32>,
    order: &mut Vec<u32>,
) {
    start.clear();
    start.resize(k + 1, 0);
    for &l in labels {
        start[l as usize + 1] += 1;
    }
    for c in 0..k {
        start[c + 1] += start[c];
    }
    order.clear();
    order.resize(labels.len(), 0);
    // `start[c]` serves as c's write cursor, ending at c's end = start of c + 1;
    // shifting by one afterwards restores the starts.
    for v in items {
        let c = labels[v as usize] as usize;
        order[start[c] as usize] = v;
        start[c] += 1;
    }
    for c in (1..=k).rev() {
        start[c] = start[c - 1];
    }
    start[0] = 0;
}

// ---------------------------------------------------------------------------
// Randomness

/// splitmix64: tiny, fast, and its output is fixed by its definition, unlike
/// library generators whose streams may change between versions.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(mix64(seed))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in 0..n without modulo bias worth caring about (Lemire's multiply-shift).
    fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn shuffle(&mut self, xs: &mut [u32]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Test-side generator, independent of the module's own stream.
    struct TRng(u64);
    impl TRng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, p: f64) -> bool {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
        }
    }

    /// `groups` groups of `size` nodes, intra-edge probability `p_in`, and
    /// `noise` random edges between arbitrary nodes. Returns edges and truth.
    fn planted(
        groups: usize,
        size: usize,
        p_in: f64,
        noise: usize,
        seed: u64,
    ) -> (usize, Vec<(u32, u32, f64)>, Vec<u32>) {
        let n = groups * size;
        let mut r = TRng(seed | 1);
        let mut edges = Vec::new();
        for g in 0..groups {
            let base = g * size;
            for i in 0..size {
                for j in i + 1..size {
                    if r.chance(p_in) {
                        edges.push(((base + i) as u32, (base + j) as u32, 1.0));
                    }
                }
            }
        }
        for _ in 0..noise {
            let (a, b) = (r.below(n as u64) as u32, r.below(n as u64) as u32);
            if a != b {
                edges.push((a, b, 1.0));
            }
        }
        let truth = (0..n).map(|v| (v / size) as u32).collect();
        (n, edges, truth)
    }

    fn nmi(a: &[u32], b: &[u32]) -> f64 {
        let n = a.len() as f64;
        let ka = *a.iter().max().unwrap() as usize + 1;
        let kb = *b.iter().max().unwrap() as usize + 1;
        let mut joint = vec![0.0; ka * kb];
        let (mut pa, mut pb) = (vec![0.0; ka], vec![0.0; kb]);
        for (&x, &y) in a.iter().zip(b) {
            joint[x as usize * kb + y as usize] += 1.0;
            pa[x as usize] += 1.0;
            pb[y as usize] += 1.0;
        }
        let h = |p: &[f64]| -> f64 {
            p.iter()
                .filter(|&&c| c > 0.0)
                .map(|&c| -(c / n) * (c / n).ln())
                .sum()
        };
        let mut mi = 0.0;
        for x in 0..ka {
            for y in 0..kb {
                let c = joint[x * kb + y];
                if c > 0.0 {
                    mi += (c / n) * ((c * n) / (pa[x] * pb[y])).ln();
                }
            }
        }
        let (ha, hb) = (h(&pa), h(&pb));
        if ha + hb == 0.0 {
            1.0
        } else {
            2.0 * mi / (ha + hb)
        }
    }

    /// Asynchronous label propagation in node order, as a quality baseline.
    fn label_propagation(g: &Graph) -> Vec<u32> {
        let n = g.node_count();
        let mut label: Vec<u32> = (0..n as u32).collect();
        let mut acc = vec![0.0; n];
        for _ in 0..50 {
            let mut changed = false;
            for v in 0..n {
                let (nb, w) = g.adj(v);
                if nb.is_empty() {
                    continue;
                }
                let mut best = (label[v], f64::MIN);
                for (&u, &w) in nb.iter().zip(w) {
                    acc[label[u as usize] as usize] += w;
                }
                for &u in nb {
                    let l = label[u as usize];
                    let s = acc[l as usize];
                    if s > best.1 || (s == best.1 && l < best.0) {
                        best = (l, s);
                    }
                }
                for &u in nb {
                    acc[label[u as usize] as usize] = 0.0;
                }
                if best.0 != label[v] && best.1 > acc[label[v] as usize] {
                    label[v] = best.0;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        label
    }

    fn is_connected(g: &Graph, members: &[u32]) -> bool {
        if members.len() <= 1 {
            return true;
        }
        let inside: std::collections::HashSet<u32> = members.iter().copied().collect();
        let mut seen = std::collections::HashSet::new();
        let mut q = VecDeque::from([members[0]]);
        seen.insert(members[0]);
        while let Some(v) = q.pop_front() {
            for &u in g.adj(v as usize).0 {
                if inside.contains(&u) && seen.insert(u) {
                    q.push_back(u);
                }
            }
        }
        seen.len() == members.len()
    }

    fn groups_of(labels: &[u32]) -> Vec<Vec<u32>> {
        let k = labels.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
        group_members(labels, k, |v| v)
    }

    #[test]
    fn from_edges_merges_duplicates_and_keeps_loops() {
        let g = Graph::from_edges(
            3,
            &[
                (0, 1, 1.0),
                (1, 0, 2.0),
                (2, 2, 0.5),
                (1, 2, 1.0),
                (0, 2, -1.0),
            ],
        );
        assert_eq!(g.adj(0), (&[1u32][..], &[3.0][..]));
        assert_eq!(g.adj(1), (&[0u32, 2][..], &[3.0, 1.0][..]));
        assert_eq!(g.loops[2], 0.5);
        assert_eq!(g.degree, vec![3.0, 4.0, 2.0]);
        assert_eq!(g.total, 9.0);
        // Same edge set in another order gives the same graph.
        let h = Graph::from_edges(3, &[(2, 1, 1.0), (2, 2, 0.5), (0, 1, 2.0), (1, 0, 1.0)]);
        assert_eq!(
            (g.offsets, g.targets, g.weights),
            (h.offsets, h.targets, h.weights)
        );
    }

    /// Triangles {0, 1, 2} and {3, 4, 5}, with the edge 2–3 when `joined`.
    fn two_triangles(joined: bool) -> Graph {
        let mut edges = vec![
            (0, 1, 1.0),
            (1, 2, 1.0),
            (0, 2, 1.0),
            (3, 4, 1.0),
            (4, 5, 1.0),
            (3, 5, 1.0),
        ];
        if joined {
            edges.push((2, 3, 1.0));
        }
        Graph::from_edges(6, &edges)
    }

    #[test]
    fn modularity_matches_hand_computation() {
        // Two triangles joined by one edge: Q = 2·(3/7 − (7/14)²) = 5/14.
        let g = two_triangles(true);
        let q = modularity(&g, &[0, 0, 0, 1, 1, 1], 1.0);
        assert!((q - 5.0 / 14.0).abs() < 1e-12, "{q}");
        assert!(
            (modularity(&g, &[7, 7, 7, 9_000_000, 9_000_000, 9_000_000], 1.0) - q).abs() < 1e-12
        );
        assert!((modularity(&g, &[0; 6], 1.0)).abs() < 1e-12);
        assert_eq!(leiden(&g, &Params::default()), vec![0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn two_disconnected_triangles() {
        let g = two_triangles(false);
        assert_eq!(leiden(&g, &Params::default()), vec![0, 0, 0, 1, 1, 1]);
        let h = hierarchical_leiden(&g, &Params::default());
        assert_eq!(h.len(), 2);
        assert_eq!(
            h[0],
            Community {
                id: 0,
                level: 0,
                parent: None,
                members: vec![0, 1, 2]
            }
        );
        assert_eq!(
            h[1],
            Community {
                id: 1,
                level: 0,
                parent: None,
                members: vec![3, 4, 5]
            }
        );
    }

    #[test]
    fn single_edge_and_empty_graph() {
        let g = Graph::from_edges(2, &[(0, 1, 1.0)]);
        assert_eq!(leiden(&g, &Params::default()), vec![0, 0]);
        let h = hierarchical_leiden(&g, &Params::default());
        assert_eq!(
            h,
            vec![Community {
                id: 0,
                level: 0,
                parent: None,
                members: vec![0, 1]
            }]
        );

        let empty = Graph::from_edges(0, &[]);
        assert_eq!(empty.node_count(), 0);
        assert!(leiden(&empty, &Params::default()).is_empty());
        assert!(hierarchical_leiden(&empty, &Params::default()).is_empty());
        assert_eq!(modularity(&empty, &[], 1.0), 0.0);
    }

    #[test]
    fn isolated_nodes_are_left_out_of_the_hierarchy() {
        // Nodes 0, 4 and 7 have no edges (7 only a zero-weight one).
        let g = Graph::from_edges(
            8,
            &[
                (1, 2, 1.0),
                (2, 3, 1.0),
                (1, 3, 1.0),
                (5, 6, 1.0),
                (6, 7, 0.0),
            ],
        );
        let flat = leiden(&g, &Params::default());
        assert_eq!(flat, vec![0, 1, 1, 1, 2, 3, 3, 4]);
        let h = hierarchical_leiden(&g, &Params::default());
        let members: Vec<Vec<u32>> = h.iter().map(|c| c.members.clone()).collect();
        assert_eq!(members, vec![vec![1, 2, 3], vec![5, 6]]);
        // All isolated: no community at all.
        assert!(hierarchical_leiden(&Graph::from_edges(5, &[]), &Params::default()).is_empty());
        assert_eq!(
            leiden(&Graph::from_edges(3, &[]), &Params::default()),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn recovers_planted_partition_and_beats_baselines() {
        let (n, edges, truth) = planted(20, 50, 0.3, 400, 7);
        let g = Graph::from_edges(n, &edges);
        let found = leiden(&g, &Params::default());
        let score = nmi(&found, &truth);
        let q = modularity(&g, &found, 1.0);
        let q_truth = modularity(&g, &truth, 1.0);
        let q_lpa = modularity(&g, &label_propagation(&g), 1.0);
        let q_single = modularity(&g, &(0..n as u32).collect::<Vec<_>>(), 1.0);
        println!(
            "planted: nmi {score:.4} Q {q:.5} truth {q_truth:.5} lpa {q_lpa:.5} singletons {q_single:.5}"
        );
        assert!(score >= 0.95, "nmi {score}");
        assert!(
            q >= q_lpa - 1e-12 && q >= q_single,
            "Q {q} lpa {q_lpa} single {q_single}"
        );
        assert!(
            q >= q_truth - 1e-3,
            "Q {q} below the planted partition's {q_truth}"
        );
    }

    #[test]
    fn deterministic_and_seed_stable() {
        let (n, edges, _) = planted(30, 40, 0.15, 1500, 11);
        let g = Graph::from_edges(n, &edges);
        let p = Params::default();
        assert_eq!(leiden(&g, &p), leiden(&g, &p));
        assert_eq!(hierarchical_leiden(&g, &p), hierarchical_leiden(&g, &p));
        let q0 = modularity(&g, &leiden(&g, &p), 1.0);
        for seed in 1..6 {
            let q = modularity(&g, &leiden(&g, &Params { seed, ..p.clone() }), 1.0);
            assert!(
                (q - q0).abs() <= 0.02 * q0.abs(),
                "seed {seed}: {q} vs {q0}"
            );
        }
    }

    /// Checks the structural promises of `hierarchical_leiden` on its output.
    fn check_hierarchy(g: &Graph, p: &Params, h: &[Community]) {
        let n = g.node_count();
        let mut level0 = vec![0u32; n];
        for (i, c) in h.iter().enumerate() {
            assert_eq!(c.id as usize, i);
            assert!(!c.members.is_empty());
            assert!(
                c.members.windows(2).all(|w| w[0] < w[1]),
                "members not sorted"
            );
            assert!((c.level as usize) < p.max_levels.max(1));
            if i > 0 {
                let prev = &h[i - 1];
                assert!(
                    prev.level < c.level
                        || (prev.level == c.level && prev.members[0] < c.members[0])
                );
            }
            match c.parent {
                None => {
                    assert_eq!(c.level, 0);
                    for &m in &c.members {
                        level0[m as usize] += 1;
                    }
                }
                Some(pid) => {
                    let parent = &h[pid as usize];
                    assert_eq!(parent.level + 1, c.level);
                    assert!(parent.members.len() > p.max_cluster_size);
                    assert!(
                        c.members
                            .iter()
                            .all(|m| parent.members.binary_search(m).is_ok())
                    );
                }
            }
        }
        for (v, &count) in level0.iter().enumerate() {
            let expected = u32::from(g.degree[v] > 0.0);
            assert_eq!(count, expected, "node {v} in {count} level-0 communities");
        }
        for c in h {
            let kids: Vec<&Community> = h.iter().filter(|k| k.parent == Some(c.id)).collect();
            if kids.is_empty() {
                if c.members.len() > p.max_cluster_size && (c.level as usize + 1) < p.max_levels {
                    let seed = split_seed(p.seed, c.level + 1, c.members[0]);
                    let mut ws = Workspace::default();
                    let parts = split_one(
                        g,
                        &c.members,
                        p,
                        seed,
                        &mut ws,
                        &mut Vec::new(),
                        &mut Graph::default(),
                    );
                    assert!(
                        parts.is_empty(),
                        "leaf {} of size {} is splittable",
                        c.id,
                        c.members.len()
                    );
                }
            } else {
                // Children partition their parent.
                let mut all: Vec<u32> = kids
                    .iter()
                    .flat_map(|k| k.members.iter().copied())
                    .collect();
                all.sort_unstable();
                assert_eq!(all, c.members);
            }
        }
    }

    #[test]
    fn hierarchy_is_consistent() {
        // Four 100-node groups plus isolated nodes 400..405.
        let (n, edges, _) = planted(4, 100, 0.12, 40, 3);
        let g = Graph::from_edges(n + 5, &edges);
        let p = Params::default();
        let h = hierarchical_leiden(&g, &p);
        assert!(h.iter().filter(|c| c.level == 0).count() >= 4);
        assert!(
            h.iter().any(|c| c.level >= 2),
            "expected at least two levels of splitting"
        );
        check_hierarchy(&g, &p, &h);
        // max_levels = 1 keeps only the top level.
        let flat = hierarchical_leiden(
            &g,
            &Params {
                max_levels: 1,
                ..p.clone()
            },
        );
        assert!(flat.iter().all(|c| c.level == 0));
        check_hierarchy(&g, &Params { max_levels: 1, ..p }, &flat);
    }

    #[test]
    fn random_graphs_across_parameters() {
        // Small random multigraphs with loops, over resolutions and randomness
        // values that also reach the refinement-merged-nothing fallback.
        for seed in 1..120u64 {
            let mut r = TRng(seed * 7919);
            let n = 5 + r.below(60);
            let m = 1 + r.below(3 * n);
            let edges: Vec<(u32, u32, f64)> = (0..m)
                .map(|_| {
                    (
                        r.below(n) as u32,
                        r.below(n) as u32,
                        0.1 + r.below(10) as f64,
                    )
                })
                .collect();
            let g = Graph::from_edges(n as usize, &edges);
            let singletons: Vec<u32> = (0..n as u32).collect();
            for gamma in [0.05, 1.0, 5.0, 20.0] {
                for theta in [0.0, 0.01, 1.0] {
                    let p = Params {
                        seed,
                        resolution: gamma,
                        randomness: theta,
                        max_cluster_size: 4,
                        ..Params::default()
                    };
                    let labels = leiden(&g, &p);
                    assert_eq!(labels, leiden(&g, &p));
                    // Dense labels numbered by first appearance.
                    let mut next = 0;
                    for &l in &labels {
                        assert!(l <= next);
                        next = next.max(l + 1);
                    }
                    for members in groups_of(&labels) {
                        assert!(
                            is_connected(&g, &members),
                            "seed {seed} γ {gamma} θ {theta}"
                        );
                    }
                    let q = modularity(&g, &labels, gamma);
                    assert!(
                        q >= modularity(&g, &singletons, gamma) - 1e-12,
                        "seed {seed} γ {gamma} θ {theta}"
                    );
                    let h = hierarchical_leiden(&g, &p);
                    check_hierarchy(&g, &p, &h);
                    for c in &h {
                        assert!(is_connected(&g, &c.members));
                    }
                }
            }
        }
    }

    #[test]
    fn every_community_is_connected() {
        // Sparse random graphs are where Louvain leaves disconnected communities.
        for seed in 1..6u64 {
            let n = 3000;
            let mut r = TRng(seed * 7919);
            let edges: Vec<(u32, u32, f64)> = (0..4000)
                .map(|_| {
                    (
                        r.below(n) as u32,
                        r.below(n) as u32,
                        1.0 + r.below(3) as f64,
                    )
                })
                .collect();
            let g = Graph::from_edges(n as usize, &edges);
            let p = Params {
                seed,
                ..Params::default()
            };
            for members in groups_of(&leiden(&g, &p)) {
                assert!(
                    is_connected(&g, &members),
                    "disconnected flat community of {}",
                    members.len()
                );
            }
            for c in hierarchical_leiden(&g, &p) {
                assert!(
                    is_connected(&g, &c.members),
                    "disconnected community {} level {}",
                    c.id,
                    c.level
                );
            }
        }
    }

    /// Community {1..6} is two triangles held together only by node 0, which
    /// sits in another community: what Louvain leaves behind when a bridge
    /// moves out. Refinement must not put the two triangles back together.
    #[test]
    fn refinement_never_merges_across_a_gap() {
        let e = [
            (1, 2),
            (2, 3),
            (1, 3),
            (4, 5),
            (5, 6),
            (4, 6),
            (0, 1),
            (0, 4),
            (0, 7),
            (7, 8),
            (8, 9),
            (7, 9),
        ];
        let edges: Vec<(u32, u32, f64)> = e.iter().map(|&(u, v)| (u, v, 1.0)).collect();
        let g = Graph::from_edges(10, &edges);
        for seed in 0..50 {
            for theta in [0.0, 0.01, 1.0] {
                let mut ws = Workspace {
                    comm: vec![1, 0, 0, 0, 0, 0, 0, 1, 1, 1],
                    ..Default::default()
                };
                let r = refine(&g, 1.0 / g.total, theta, 2, &mut Rng::new(seed), &mut ws);
                assert!(r < 10);
                let left: Vec<u32> = ws.refined[1..4].to_vec();
                let right: Vec<u32> = ws.refined[4..7].to_vec();
                assert!(
                    left.iter().all(|l| !right.contains(l)),
                    "seed {seed} θ {theta}: {:?}",
                    ws.refined
                );
                for members in groups_of(&ws.refined) {
                    assert!(
                        members
                            .iter()
                            .all(|&m| ws.comm[m as usize] == ws.comm[members[0] as usize])
                    );
                    assert!(is_connected(&g, &members));
                }
            }
        }
    }

    #[test]
    fn disconnected_labels_are_split() {
        let g = Graph::from_edges(
            7,
            &[
                (0, 1, 1.0),
                (1, 2, 1.0),
                (3, 4, 1.0),
                (4, 5, 1.0),
                (5, 3, 1.0),
            ],
        );
        let mut labels = vec![0, 0, 0, 0, 0, 0, 1];
        let k = split_disconnected(&g, &mut labels, &mut Workspace::default());
        assert_eq!((k, labels), (3, vec![0, 0, 0, 1, 1, 1, 2]));
    }

    #[test]
    fn resolution_changes_granularity() {
        let (n, edges, _) = planted(10, 30, 0.3, 100, 5);
        let g = Graph::from_edges(n, &edges);
        let count = |gamma: f64| {
            let m = leiden(
                &g,
                &Params {
                    resolution: gamma,
                    ..Params::default()
                },
            );
            *m.iter().max().unwrap() + 1
        };
        assert!(count(0.05) < count(1.0) && count(1.0) < count(20.0));
    }

    fn peak_rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .map(str::to_owned)
            })
            .and_then(|l| l.split_whitespace().nth(1).and_then(|x| x.parse().ok()))
            .unwrap_or(0)
    }

    /// Scale check, by hand: `LEIDEN_SCALE_N=1000000 /tmp/leiden_test --ignored scale --nocapture`.
    /// Planted groups of 10–50 nodes (a ring plus chords, ~1.8 edges per node)
    /// plus 0.2·N random edges, ids shuffled so memory access is realistic.
    #[test]
    #[ignore]
    fn scale() {
        let n: usize = std::env::var("LEIDEN_SCALE_N")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        let t = std::time::Instant::now();
        let mut r = TRng(0x1234_5678_9ABC_DEF1);
        let mut id: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            id.swap(i, r.below(i as u64 + 1) as usize);
        }
        let mut edges = Vec::with_capacity(2 * n + 16);
        let mut base = 0usize;
        while base < n {
            let size = (10 + r.below(41) as usize).min(n - base);
            for i in 0..size {
                if size > 1 {
                    edges.push((id[base + i], id[base + (i + 1) % size], 1.0));
                }
            }
            for _ in 0..(size * 4 / 5) {
                let (a, b) = (r.below(size as u64) as usize, r.below(size as u64) as usize);
                if a != b {
                    edges.push((id[base + a], id[base + b], 1.0));
                }
            }
            base += size;
        }
        for _ in 0..n / 5 {
            edges.push((r.below(n as u64) as u32, r.below(n as u64) as u32, 1.0));
        }
        drop(id);
        let m = edges.len();
        let g = Graph::from_edges(n, &edges);
        drop(edges);
        let built = t.elapsed();
        let t = std::time::Instant::now();
        let h = hierarchical_leiden(&g, &Params::default());
        let took = t.elapsed();
        let levels = h.iter().map(|c| c.level).max().map_or(0, |l| l + 1);
        let top: Vec<u32> = {
            let mut lab = vec![0u32; n];
            for c in h.iter().filter(|c| c.level == 0) {
                for &v in &c.members {
                    lab[v as usize] = c.id;
                }
            }
            lab
        };
        let q = modularity(&g, &top, 1.0);
        // FNV-1a over the whole output, to compare runs and versions bit for bit.
        let mut fp = 0xcbf2_9ce4_8422_2325u64;
        for c in &h {
            let head = [
                c.id,
                c.level,
                c.parent.unwrap_or(NONE),
                c.members.len() as u32,
            ];
            for x in head.iter().chain(&c.members) {
                fp = (fp ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3);
            }
        }
        println!(
            "scale: n {n} m {m} build {:.2}s hierarchical_leiden {:.2}s communities {} levels {levels} level0 Q {q:.4} peak RSS {} MiB fingerprint {fp:016x}",
            built.as_secs_f64(),
            took.as_secs_f64(),
            h.len(),
            peak_rss_kib() / 1024
        );
    }
}
