#!/usr/bin/env python3
"""graphloom on FEBRL4 and FEBRL3, scored like the splink baseline.

Usage: python graphloom_bench.py [--graphloom BIN] [OUTDIR]   (default OUTDIR: /tmp/febrl)
       python graphloom_bench.py --scale N [OUTDIR]       (synthetic records, N/10 and N)

Needs prepare.py's output in OUTDIR. For each dataset it builds a graph with
`graphloom run` using febrl.toml (records mapped to Person entities, no LLM
call, matched by the `[[resolve.linkage]]` rule), reads which records ended
in which node with `graphloom sql`, and scores the predicted pairs against
gold_pairs.csv:

  febrl4: two runs into one graph, file "a" first, then file "b" against
          the committed nodes; predicted pairs are a-b pairs sharing a node.
  febrl3: one run; predicted pairs are all pairs sharing a node.

Seconds are the wall time of the `graphloom run` processes; peak RSS is the
largest of theirs (ru_maxrss of the children). When OUTDIR/splink_results.json
exists (splink_baseline.py), splink's rows are printed in the same table.
Writes OUTDIR/graphloom_results.json. Standard library only.
"""

import argparse
import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def split_febrl4(outdir):
    """febrl4/records.jsonl -> febrl4/a/records.jsonl and febrl4/b/records.jsonl."""
    src = outdir / "febrl4" / "records.jsonl"
    files = {}
    for tag in ("a", "b"):
        d = outdir / "febrl4" / tag
        d.mkdir(parents=True, exist_ok=True)
        files[tag] = open(d / "records.jsonl", "w", encoding="utf-8")
    with open(src, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            files[rec["content"]["file"]].write(line)
    for f in files.values():
        f.close()
    return [outdir / "febrl4" / "a", outdir / "febrl4" / "b"]


PIPELINE = HERE / "febrl.toml"


def run_graphloom(binary, sources, graph):
    """Runs one `graphloom run` per source into `graph`; returns seconds and
    the largest peak RSS (MiB) of those processes."""
    if graph.exists():
        shutil.rmtree(graph)
    seconds, peak = 0.0, 0.0
    for source in sources:
        log = graph.parent / f"{graph.name}-{source.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            started = time.perf_counter()
            proc = subprocess.Popen(
                [binary, "run", str(PIPELINE), "--source", f"file://{source}/",
                 "--graph", f"file://{graph}/", "--no-cache"],
                stdout=out, stderr=subprocess.STDOUT,
            )
            # wait4 gives this child's own rusage (RUSAGE_CHILDREN would mix
            # in every earlier child).
            _, status, usage = os.wait4(proc.pid, 0)
            seconds += time.perf_counter() - started
        peak = max(peak, usage.ru_maxrss / 1024)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            sys.exit(f"graphloom run failed ({code}):\n{log.read_text()}")
        print(log.read_text().strip(), file=sys.stderr)
    return seconds, peak


def sql(binary, graph, query):
    proc = subprocess.run(
        [binary, "sql", "--graph", f"file://{graph}/", "--format", "json", query],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"graphloom sql failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


def clusters(binary, graph):
    """{node short_id: [record ids]} for Person nodes, and the counts the
    table reports (nodes by type, nodes holding two types, failures)."""
    rows = sql(binary, graph, (
        "SELECT n.short_id AS node, e.source_id AS rec FROM "
        "(SELECT short_id, unnest(episode_ids) AS eid FROM nodes WHERE type = 'Person') n "
        "JOIN episodes e ON e.episode_id = n.eid"
    ))
    out = {}
    for r in rows:
        out.setdefault(r["node"], []).append(r["rec"])
    by_type = {r["type"]: r["n"] for r in sql(
        binary, graph, "SELECT type, count(*) AS n FROM nodes GROUP BY type")}
    mixed = sql(binary, graph, (
        "SELECT count(*) AS n FROM nodes "
        "WHERE has_label(labels, 'Person') AND has_label(labels, 'Suburb')"))[0]["n"]
    failures = sql(binary, graph, "SELECT count(*) AS n FROM failures")[0]["n"]
    return out, by_type, mixed, failures


def predicted_pairs(groups, link_only):
    pairs = set()
    for recs in groups.values():
        for x, y in itertools.combinations(sorted(set(recs)), 2):
            if link_only and ("-org" in x) == ("-org" in y):
                continue  # FEBRL4 scores a-b links only
            pairs.add((x, y))
    return pairs


def gold(path):
    with open(path, newline="") as f:
        return {(r["rec_id_1"], r["rec_id_2"]) for r in csv.DictReader(f)}


SYLLABLES = ["ka", "ri", "mo", "len", "tas", "bel", "do", "vin", "sha", "ro", "el", "mi",
             "nor", "quo", "zan", "pe", "ty", "gra", "hul", "fen", "ost", "li", "cra", "we"]


def synthetic(n, seed, path):
    """n FEBRL-like person records, a fifth of them corrupted copies (one to
    three fields: a typo, a swap, a dropped value) of earlier ones; returns
    the gold pairs."""
    import random
    rng = random.Random(seed)

    def word(k):
        return "".join(rng.choice(SYLLABLES) for _ in range(k))

    def typo(v):
        if len(v) < 2:
            return v + "x"
        i = rng.randrange(len(v) - 1)
        return v[:i] + v[i + 1] + v[i] + v[i + 2:] if rng.random() < 0.5 else v[:i] + "q" + v[i + 1:]

    suburbs = [word(2) + " " + rng.choice(["hills", "park", "vale", "bay"]) for _ in range(max(50, n // 40))]
    originals, records, pairs = [], [], []
    for i in range(n):
        if originals and rng.random() < 0.2:
            j, base = rng.choice(originals)
            rec = dict(base)
            for field in rng.sample(["given_name", "surname", "date_of_birth", "soc_sec_id",
                                      "postcode", "address_1", "suburb"], rng.randint(1, 3)):
                r = rng.random()
                if r < 0.15:
                    rec.pop(field, None)
                elif r < 0.25 and field in ("given_name", "surname"):
                    rec["given_name"], rec["surname"] = rec.get("surname", ""), rec.get("given_name", "")
                elif field in rec:
                    rec[field] = typo(rec[field])
            rid = f"rec-{j}-dup-{i}"
            pairs.append(tuple(sorted((rid, f"rec-{j}-org"))))
        else:
            rec = {
                "given_name": word(rng.randint(2, 3)), "surname": word(rng.randint(2, 4)),
                "street_number": str(rng.randint(1, 300)),
                "address_1": word(2) + " street", "suburb": rng.choice(suburbs),
                # Postcodes, like suburbs, grow with the data: a key of fixed
                # cardinality makes blocks (and their pairs) grow with the
                # square of the records until max_block skips them.
                "postcode": str(rng.randint(10_000, 10_000 + max(1000, n // 10))),
                "state": rng.choice(["nsw", "vic", "qld"]),
                "date_of_birth": f"{rng.randint(1930, 2005)}{rng.randint(1, 12):02}{rng.randint(1, 28):02}",
                "soc_sec_id": str(rng.randint(1_000_000, 9_999_999)),
            }
            originals.append((i, rec))
            rid = f"rec-{i}-org"
        records.append({"id": rid, "kind": "json", "reference_time": "2020-01-01T00:00:00Z",
                        "content": {"rec_id": rid, **rec}})
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "records.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    # Gold: every pair within a group of one original and its copies.
    groups = {}
    for a, b in pairs:
        org = a if a.endswith("-org") else b
        groups.setdefault(org, {org}).update((a, b))
    return {p for g in groups.values() for p in itertools.combinations(sorted(g), 2)}


def scale(binary, outdir, n, seed):
    """Runs on n/10 and n synthetic records; prints times and their ratio."""
    results = []
    for size in (n // 10, n):
        src = outdir / f"synthetic-{size}"
        truth = synthetic(size, seed, src)
        graph = outdir / "graphs" / f"synthetic-{size}"
        seconds, peak = run_graphloom(binary, [src], graph)
        groups, _, _, _ = clusters(binary, graph)
        predicted = predicted_pairs(groups, link_only=False)
        tp = len(predicted & truth)
        p = tp / len(predicted) if predicted else 0.0
        r = tp / len(truth) if truth else 0.0
        results.append((size, seconds, peak, p, r))
        print(f"{size:>9} records: {seconds:7.1f} s, peak {peak:6.0f} MiB, P {p:.4f} R {r:.4f}")
    (small, t1, *_), (big, t2, *_) = results
    print(f"{big // small}x the records: {t2 / t1:.1f}x the time")


def main():
    global PIPELINE
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", nargs="?", default="/tmp/febrl")
    ap.add_argument("--graphloom", default=shutil.which("graphloom") or "graphloom")
    ap.add_argument("--scale", type=int, metavar="N",
                    help="instead of FEBRL: synthetic records at N/10 and N, time ratio")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pipeline", type=Path, default=PIPELINE,
                    help="another pipeline spec than febrl.toml (e.g. other linkage settings)")
    args = ap.parse_args()
    PIPELINE = args.pipeline.resolve()
    outdir = Path(args.outdir).resolve()
    if args.scale:
        scale(args.graphloom, outdir, args.scale, args.seed)
        return
    rows = []
    for dataset in ("febrl4", "febrl3"):
        if not (outdir / dataset / "records.jsonl").exists():
            sys.exit(f"{outdir / dataset / 'records.jsonl'} is missing: run prepare.py {outdir} first")
        sources = split_febrl4(outdir) if dataset == "febrl4" else [outdir / dataset]
        graph = outdir / "graphs" / dataset
        seconds, peak = run_graphloom(args.graphloom, sources, graph)
        groups, by_type, mixed, failures = clusters(args.graphloom, graph)
        predicted = predicted_pairs(groups, link_only=dataset == "febrl4")
        truth = gold(outdir / dataset / "gold_pairs.csv")
        tp = len(predicted & truth)
        p = tp / len(predicted) if predicted else 0.0
        r = tp / len(truth)
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        rows.append({
            "dataset": dataset, "system": "graphloom", "metric": "cluster-pairwise",
            "threshold": None, "pairs_predicted": len(predicted), "true_positives": tp,
            "precision": p, "recall": r, "f1": f1, "seconds": seconds, "peak_rss_mib": peak,
            "nodes_by_type": by_type, "mixed_type_nodes": mixed, "failures": failures,
            "person_nodes": len(groups),
        })
    splink_rows = []
    splink = outdir / "splink_results.json"
    if splink.exists():
        splink_rows = [r for r in json.loads(splink.read_text())["rows"]
                       if "TUNED" not in r["metric"]]
    print(f"{'dataset':8} {'system':14} {'metric':42} {'pairs':>6} {'P':>6} {'R':>6} "
          f"{'F1':>6} {'sec':>6} {'MiB':>6}")
    for r in sorted(rows + splink_rows, key=lambda r: (r["dataset"] != "febrl4", r["system"])):
        print(f"{r['dataset']:8} {r['system']:14} {r['metric'][:42]:42} {r['pairs_predicted']:6} "
              f"{r['precision']:6.4f} {r['recall']:6.4f} {r['f1']:6.4f} {r['seconds']:6.1f} "
              f"{r['peak_rss_mib']:6.0f}")
    for r in rows:
        print(f"{r['dataset']}: graphloom made {r['person_nodes']} Person nodes "
              f"(nodes by type: {r['nodes_by_type']}), {r['mixed_type_nodes']} nodes of two "
              f"types, {r['failures']} failures rows")
    (outdir / "graphloom_results.json").write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
