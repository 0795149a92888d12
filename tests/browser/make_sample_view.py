#!/usr/bin/env python3
"""Writes a `graphloom view` page from assets/view/template.html the way the
Rust side does, for trying the template in a browser (check_page.mjs).

The template's two placeholders are replaced textually:
  /*GRAPHLOOM_LIB*/   the vendored cytoscape.min.js, every `</script`
                      escaped as `<\\/script`;
  /*GRAPHLOOM_DATA*/  the JSON document, every `<` escaped as \\u003c.

Usage:
  make_sample_view.py OUT.html                 built-in sample (14 nodes, 20 edges)
  make_sample_view.py OUT.html --nodes 2000    random graph, N nodes / 2N edges
  make_sample_view.py OUT.html --empty         no nodes at all
Options: --as-of TIME (initial as-of, default none), --max-nodes N (cap the
nodes shown, as the Rust side does, and say so), --seed S.

Standard library only.
"""
import argparse
import json
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "assets" / "view" / "template.html"
LIB = ROOT / "assets" / "vendor" / "cytoscape" / "cytoscape.min.js"

LIB_PLACEHOLDER = "/*GRAPHLOOM_LIB*/"
DATA_PLACEHOLDER = "/*GRAPHLOOM_DATA*/"

ENTITY_TYPES = [
    ("Entity", None),
    ("Person", "Entity"),
    ("Organization", "Entity"),
    ("Contract", "Entity"),
    ("PurchaseOrder", "Contract"),
    ("ServiceAgreement", "Contract"),
    ("Location", "Entity"),
]
EDGE_TYPES = [
    ("RELATES_TO", None),
    ("EMPLOYED_BY", None),
    ("WORKS_FULL_TIME_FOR", "EMPLOYED_BY"),
    ("PARTY_TO", None),
    ("SUPPLIES", None),
    ("SIGNED", None),
    ("LOCATED_IN", None),
]


def chain(type_name):
    parents = dict(ENTITY_TYPES)
    out = []
    cur = type_name
    while cur is not None:
        out.append(cur)
        cur = parents[cur]
    return list(reversed(out))


def node(nid, name, type_name, summary=None, **attributes):
    labels = chain(type_name)
    return {
        "id": nid,
        "name": name,
        "type": type_name,
        "labels": labels,
        "top": labels[1] if len(labels) > 1 else labels[0],
        "summary": summary,
        "attributes": attributes,
    }


def edge(eid, source, target, type_name, fact, valid_at=None, invalid_at=None, expired_at=None):
    return {
        "id": eid,
        "source": source,
        "target": target,
        "type": type_name,
        "fact": fact,
        "valid_at": valid_at,
        "invalid_at": invalid_at,
        "expired_at": expired_at,
    }


def sample_graph():
    nodes = [
        node("n1", "Dana Whitfield", "Person", "Procurement lead at Acme Industrial.", role="procurement lead"),
        node("n2", "Marco Ruiz", "Person", "Logistics manager; moved from Acme to Borealis in 2023."),
        node("n3", "Priya Natarajan", "Person", "Operations director at Borealis Logistics.", role="operations director"),
        node("n4", "Lena Okafor", "Person", "Former account manager at Cobalt Parts."),
        node("n5", "Acme Industrial", "Organization", "Manufacturer of industrial pumps.", industry="manufacturing"),
        node("n6", "Borealis Logistics", "Organization", "Freight and warehousing company.", industry="logistics"),
        node("n7", "Cobalt Parts GmbH", "Organization", "Supplier of machined parts.", country="DE"),
        node("n8", "MSA-2023-Borealis", "ServiceAgreement", "Master services agreement for warehousing.",
             term_months=36, value={"amount": 1200000, "currency": "EUR"}),
        node("n9", "PO-4417", "PurchaseOrder", "Purchase order for 400 pump housings.", po_number="PO-4417", amount=86400),
        node("n10", "PO-4502", "PurchaseOrder", None, po_number="PO-4502", amount=12950),
        node("n11", "Master Supply Contract", "Contract", "Framework contract between Acme and Cobalt.",
             signed="2022-07-01"),
        node("n12", "Rotterdam", "Location", None, country="NL"),
        node("n13", "Austin", "Location", None, country="US"),
        node("n14", "Project Kestrel", "Entity", "Internal programme to re-source pump housings."),
    ]
    edges = [
        edge("e1", "n1", "n5", "WORKS_FULL_TIME_FOR", "Dana works full time for Acme Industrial.", "2021-03-01T00:00:00Z"),
        edge("e2", "n2", "n5", "EMPLOYED_BY", "Marco was employed by Acme Industrial.", "2019-06-01T00:00:00Z",
             invalid_at="2023-09-30T00:00:00Z"),
        edge("e3", "n2", "n6", "WORKS_FULL_TIME_FOR", "Marco works full time for Borealis Logistics.", "2023-10-01T00:00:00Z"),
        edge("e4", "n3", "n6", "EMPLOYED_BY", "Priya is employed by Borealis Logistics.", "2022-01-15T00:00:00Z"),
        edge("e5", "n4", "n7", "WORKS_FULL_TIME_FOR", "Lena worked full time for Cobalt Parts.", "2020-05-01T00:00:00Z",
             invalid_at="2024-02-29T00:00:00Z"),
        edge("e6", "n5", "n11", "PARTY_TO", "Acme Industrial is a party to the Master Supply Contract.", "2022-07-01T00:00:00Z"),
        edge("e7", "n7", "n11", "PARTY_TO", "Cobalt Parts is a party to the Master Supply Contract.", "2022-07-01T00:00:00Z"),
        edge("e8", "n9", "n11", "RELATES_TO", "PO-4417 is issued under the Master Supply Contract.", "2024-01-10T00:00:00Z"),
        edge("e9", "n10", "n11", "RELATES_TO", "PO-4502 is issued under the Master Supply Contract.", "2024-06-03T00:00:00Z"),
        edge("e10", "n5", "n9", "PARTY_TO", "Acme Industrial placed PO-4417.", "2024-01-10T00:00:00Z"),
        edge("e11", "n7", "n9", "SUPPLIES", "Cobalt Parts supplied the goods of PO-4417.", "2024-01-10T00:00:00Z",
             invalid_at="2024-04-15T00:00:00Z"),
        edge("e12", "n6", "n8", "PARTY_TO", "Borealis Logistics is a party to MSA-2023-Borealis.", "2023-03-01T00:00:00Z"),
        edge("e13", "n5", "n8", "PARTY_TO", "Acme Industrial is a party to MSA-2023-Borealis.", "2023-03-01T00:00:00Z"),
        edge("e14", "n1", "n9", "SIGNED", "Dana signed PO-4417.", "2024-01-10T00:00:00Z"),
        edge("e15", "n5", "n13", "LOCATED_IN", "Acme Industrial is based in Austin."),
        edge("e16", "n6", "n13", "LOCATED_IN", "Borealis Logistics is headquartered in Austin.", "2018-01-01T00:00:00Z",
             expired_at="2024-03-20T00:00:00Z"),
        edge("e17", "n6", "n12", "LOCATED_IN", "Borealis Logistics is headquartered in Rotterdam.", "2018-01-01T00:00:00Z"),
        edge("e18", "n14", "n5", "RELATES_TO", "Project Kestrel is run by Acme Industrial.", "2024-02-01T00:00:00Z"),
        edge("e19", "n3", "n14", "RELATES_TO", "Priya advises Project Kestrel.", "2024-02-01T00:00:00Z"),
        edge("e20", "n2", "n10", "SIGNED", "Marco signed PO-4502 <for Borealis>.", "2024-06-03T00:00:00Z"),
    ]
    return nodes, edges


def iso(dt):
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def random_graph(n, seed):
    rng = random.Random(seed)
    types = [t for t, _ in ENTITY_TYPES]
    edge_types = [t for t, _ in EDGE_TYPES]
    nodes = []
    for i in range(1, n + 1):
        type_name = rng.choice(types)
        nodes.append(node(f"n{i}", f"{type_name} {i}", type_name, None, index=i))
    start = datetime(2019, 1, 1, tzinfo=timezone.utc)
    edges = []
    # Preferential attachment, as extracted graphs tend to be: a few hubs,
    # many nodes with one or two edges. `ends` lists every edge end so far.
    ends = []
    for i in range(1, 2 * n + 1 if n > 1 else 1):
        s = i - 1 if i <= n else rng.randrange(n)
        if ends and rng.random() < 0.7:
            t = rng.choice(ends)
        else:
            t = rng.randrange(n)
        if t == s:
            t = (s + 1) % n
        ends += [s, t]
        valid = start + timedelta(days=rng.randrange(0, 5 * 365))
        invalid = expired = None
        r = rng.random()
        if r < 0.15:
            invalid = iso(valid + timedelta(days=rng.randrange(1, 700)))
        elif r < 0.2:
            expired = iso(valid + timedelta(days=rng.randrange(1, 700)))
        edges.append(edge(f"e{i}", nodes[s]["id"], nodes[t]["id"], rng.choice(edge_types),
                          f"random fact {i}", iso(valid) if rng.random() < 0.9 else None, invalid, expired))
    return nodes, edges


def build_document(nodes, edges, args, title):
    matched = len(nodes)
    shown = nodes
    capped = args.max_nodes is not None and matched > args.max_nodes
    if capped:
        shown = nodes[: args.max_nodes]
        keep = {nd["id"] for nd in shown}
        edges = [e for e in edges if e["source"] in keep and e["target"] in keep]
    query = None if args.empty or args.nodes else "SELECT node_id FROM nodes WHERE has_label(labels, 'Entity')"
    cap_sql = (query or "SELECT node_id FROM nodes") + f" ORDER BY node_id LIMIT {args.max_nodes or 500}"
    return {
        "title": title,
        "generated_at": "2026-12-03T10:00:00Z",
        "query": query,
        "as_of": args.as_of,
        "cap": {
            "max_nodes": args.max_nodes or 500,
            "matched_nodes": matched,
            "shown_nodes": len(shown),
            "capped": capped,
            "sql": cap_sql,
        },
        "entity_types": [{"name": n, "parent": p} for n, p in ENTITY_TYPES],
        "edge_types": [{"name": n, "parent": p} for n, p in EDGE_TYPES],
        "nodes": shown,
        "edges": edges,
    }


def fill(template, lib, document):
    lib = lib.replace("</script", "<\\/script")
    payload = json.dumps(document, ensure_ascii=False).replace("<", "\\u003c")
    assert template.count(LIB_PLACEHOLDER) == 1 and template.count(DATA_PLACEHOLDER) == 1
    # Data first, so nothing in the library can be mistaken for a placeholder.
    out = template.replace(DATA_PLACEHOLDER, payload)
    return out.replace(LIB_PLACEHOLDER, lib)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--nodes", type=int, default=0, help="random graph of N nodes and 2N edges")
    ap.add_argument("--empty", action="store_true", help="a graph with no nodes")
    ap.add_argument("--as-of", default=None, help="initial as-of time (RFC 3339)")
    ap.add_argument("--max-nodes", type=int, default=None, help="cap the nodes shown")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    if args.empty:
        nodes, edges = [], []
        title = "graph file:///tmp/empty (run 1)"
    elif args.nodes:
        nodes, edges = random_graph(args.nodes, args.seed)
        title = f"graph file:///tmp/random-{args.nodes} (run 1)"
    else:
        nodes, edges = sample_graph()
        title = "graph file:///tmp/sample (run 3)"
    document = build_document(nodes, edges, args, title)
    html = fill(TEMPLATE.read_text(encoding="utf-8"), LIB.read_text(encoding="utf-8"), document)
    Path(args.out).write_text(html, encoding="utf-8")
    print(f"wrote {args.out}: {len(document['nodes'])} nodes, {len(document['edges'])} edges", file=sys.stderr)


if __name__ == "__main__":
    main()
