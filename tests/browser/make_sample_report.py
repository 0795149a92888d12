#!/usr/bin/env python3
"""Writes a sample `graphloom report` page from assets/report/template.html.

Fills the template the way the Rust side does: the one placeholder
`/*GRAPHLOOM_DATA*/` is replaced textually by the JSON document, with
every `<` escaped as `\\u003c` so no `</script>` can end the data block.

    python3 tests/browser/make_sample_report.py OUT.html          # 3 runs, failures, eval
    python3 tests/browser/make_sample_report.py --empty OUT.html  # a graph with no run
    python3 tests/browser/make_sample_report.py --json OUT.html   # also print the JSON and expected counts

Standard library only.
"""

import argparse
import json
import random
import sys
from pathlib import Path

PLACEHOLDER = "/*GRAPHLOOM_DATA*/"
TEMPLATE = Path(__file__).resolve().parents[2] / "assets" / "report" / "template.html"
BOUNDS_MS = [0, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000]
GRAPH = "s3://acme-knowledge/graphs/procurement"


def fill(template: str, doc: dict) -> str:
    if template.count(PLACEHOLDER) != 1:
        raise SystemExit(f"template must hold {PLACEHOLDER} exactly once, found {template.count(PLACEHOLDER)}")
    text = json.dumps(doc, ensure_ascii=False).replace("<", "\\u003c")
    return template.replace(PLACEHOLDER, text, 1)


def latency_counts(rng: random.Random, n: int, median_ms: float, slow_tail: int = 0) -> list:
    """n server calls spread over the buckets around a median (log-normal), plus a few slow ones."""
    counts = [0] * len(BOUNDS_MS)
    for i in range(n):
        ms = median_ms * rng.lognormvariate(0, 0.55)
        if i < slow_tail:
            ms = rng.uniform(45000, 150000)
        b = max(j for j, lo in enumerate(BOUNDS_MS) if lo <= ms)
        counts[b] += 1
    return counts


# Per stage: tokens per call (prompt, completion), median latency, price per 1k tokens applies to all.
STAGE_SHAPE = {
    "extract_entities": (1150, 260, 3400),
    "extract_facts": (1500, 420, 5200),
    "classify_entities": (620, 60, 900),
    "classify_edges": (540, 55, 800),
    "resolve_entities": (880, 120, 1500),
    "judge_contradictions": (760, 140, 1700),
    "summarize": (950, 180, 2300),
}
PRICE_PROMPT, PRICE_COMPLETION = 0.15e-6, 0.60e-6  # USD per token


def sample() -> dict:
    rng = random.Random(20261203)
    runs_spec = [
        # run_id, seq, command, status, start, duration ms, episodes seen/added, nodes, edges, error, priced,
        # {stage: (calls, cache_hits, errors, wait share)}
        dict(run_id="01JDX4K2M7Q8", seq=1, command="run", status="completed",
             start="2026-12-03T08:12:04Z", end="2026-12-03T08:31:47Z", duration=1_183_000,
             seen=64, added=61, nodes=212, edges=187, error=None, priced=True,
             stages={"extract_entities": (61, 0, 2, 0.12), "extract_facts": (61, 0, 5, 0.15),
                     "classify_entities": (148, 0, 0, 0.30), "classify_edges": (121, 0, 1, 0.28),
                     "resolve_entities": (34, 0, 0, 0.05), "summarize": (47, 0, 0, 0.10)}),
        dict(run_id="01JDX9TW0B3N", seq=2, command="run", status="failed",
             start="2026-12-03T09:02:10Z", end="2026-12-03T09:06:55Z", duration=285_000,
             seen=40, added=0, nodes=0, edges=0, priced=False,
             error="LLM server http://10.0.4.21:8080/v1/chat/completions answered 503 Service Unavailable "
                   "on 6 attempts over 94 s (stage extract_facts, episode mail/2024-04/0412.eml#3); "
                   "the run stopped before committing and left no rows in the graph tables",
             stages={"extract_entities": (40, 38, 0, 0.02), "extract_facts": (12, 9, 3, 0.71)}),
        dict(run_id="01JDXC55RRF1", seq=3, command="run", status="completed",
             start="2026-12-03T09:40:31Z", end="2026-12-03T09:58:02Z", duration=1_051_000,
             seen=67, added=67, nodes=245, edges=233, error=None, priced=True,
             stages={"extract_entities": (67, 40, 1, 0.08), "extract_facts": (67, 9, 4, 0.11),
                     "classify_entities": (96, 22, 0, 0.22), "classify_edges": (88, 17, 0, 0.20),
                     "resolve_entities": (29, 3, 1, 0.04), "judge_contradictions": (18, 0, 2, 0.06),
                     "summarize": (52, 6, 0, 0.09)}),
    ]

    failure_groups = [
        # run, stage, reason class, count, examples
        ("01JDX4K2M7Q8", "extract_entities", "reply is not valid JSON", 2, [
            ("episode 17", "s3://acme-knowledge/corpus/mail/2024-03.jsonl",
             "reply is not valid JSON: expected ',' or '}' after object member at line 14 column 3",
             '{"entities": [{"name": "Acme Industrial GmbH", "type": "Organization"} {"name": "PO-4417"'),
            ("episode 41", "s3://acme-knowledge/corpus/chat/ops-channel.jsonl",
             "reply is not valid JSON: unterminated string starting at line 2 column 18", None),
        ]),
        ("01JDX4K2M7Q8", "extract_facts", "reply cut at max_tokens", 4, [
            ("episode 12", "s3://acme-knowledge/corpus/contracts/msa-acme-2023.txt#chunk-4",
             "reply cut at max_tokens (1024): finish_reason=length after 1024 completion tokens",
             "The Supplier shall deliver the Goods listed in Schedule A to the Buyer's warehouse at "
             "Hamburg-Billbrook no later than 14 days after receipt of a Purchase Order; where the "
             "quantity ordered exceeds 500 units the delivery window extends to 21 days unless the "
             "parties agree otherwise in writing. Prices are fixed for the Initial Term and thereafter "
             "adjusted annually by the change in the producer price index, capped at 4% per year."),
            ("episode 30", "s3://acme-knowledge/corpus/contracts/msa-acme-2023.txt#chunk-9",
             "reply cut at max_tokens (1024): finish_reason=length", None),
            ("episode 52", "s3://acme-knowledge/corpus/mail/2024-04.jsonl",
             "reply cut at max_tokens (1024): finish_reason=length",
             "Re: PO-4471 <urgent> — please confirm the revised delivery date (was 2024-04-22) & quantity"),
        ]),
        ("01JDX4K2M7Q8", "extract_facts", "unknown edge type", 1, [
            ("episode 58", "s3://acme-knowledge/corpus/erp/open-orders.parquet#row=311",
             "edge type 'SUPPLIES_TO' is not in the ontology (closest: SUPPLIES, DELIVERS_TO)", None),
        ]),
        ("01JDX4K2M7Q8", "classify_edges", "reply chose no listed subtype", 1, [
            ("edge e-118 (PO-4417 → Acme Industrial GmbH)", "s3://acme-knowledge/corpus/erp/po.parquet#row=17",
             "reply named 'PurchaseAgreement', which is not a subtype of ContractWith", None),
        ]),
        ("01JDX9TW0B3N", "extract_facts", "HTTP 503 from server", 3, [
            ("episode 12", "s3://acme-knowledge/corpus/mail/2024-04.jsonl",
             "LLM server answered 503 Service Unavailable on 6 attempts over 94 s", None),
            ("episode 13", "s3://acme-knowledge/corpus/mail/2024-04.jsonl",
             "LLM server answered 503 Service Unavailable on 6 attempts over 91 s", None),
            ("episode 14", "s3://acme-knowledge/corpus/mail/2024-04.jsonl",
             "LLM server answered 503 Service Unavailable on 6 attempts over 90 s", None),
        ]),
        ("01JDXC55RRF1", "extract_entities", "reply is not valid JSON", 1, [
            ("episode 9", "s3://acme-knowledge/corpus/chat/ops-channel.jsonl",
             "reply is not valid JSON: trailing characters at line 31 column 1",
             "```json\n{\"entities\": []}\n```\nNote: the message mentions no named entity."),
        ]),
        ("01JDXC55RRF1", "extract_facts", "reply cut at max_tokens", 3, [
            ("episode 12", "s3://acme-knowledge/corpus/contracts/msa-acme-2023.txt#chunk-4",
             "reply cut at max_tokens (1024): finish_reason=length", None),
            ("episode 33", "s3://acme-knowledge/corpus/contracts/sow-2025-logistics.txt#chunk-2",
             "reply cut at max_tokens (1024): finish_reason=length",
             "Statement of Work No. 7 under the Master Services Agreement dated 2023-02-01 between "
             "Acme Industrial GmbH and Nordhafen Logistics AG covering inbound freight, customs "
             "brokerage, cross-docking and returns handling for the period 2025-01-01 to 2025-12-31."),
        ]),
        ("01JDXC55RRF1", "extract_facts", "fact dates out of order", 1, [
            ("episode 47", "s3://acme-knowledge/corpus/erp/po.parquet#row=88",
             "valid_to 2024-03-01 is before valid_from 2024-04-08 for fact PO-4471 ORDERED_FROM Acme", None),
        ]),
        ("01JDXC55RRF1", "resolve_entities", "adjudication reply ambiguous", 1, [
            ("pair (J. Meyer, Julia Meyer-Holt)", "s3://acme-knowledge/corpus/mail/2024-05.jsonl",
             "reply answered both 'same' and 'different' for one candidate pair", None),
        ]),
        ("01JDXC55RRF1", "judge_contradictions", "reply chose no listed subtype", 2, [
            ("facts f-402 / f-417", "s3://acme-knowledge/corpus/erp/po.parquet#row=120",
             "reply verdict 'partially' is none of contradicts, compatible, unrelated", None),
            ("facts f-511 / f-530", "s3://acme-knowledge/corpus/mail/2025-08.jsonl",
             "reply verdict missing", '{"reason": "both dates could hold if the order was split < 2 shipments"}'),
        ]),
    ]

    fail_by_run = {}
    for run_id, _stage, _reason, count, _ in failure_groups:
        fail_by_run[run_id] = fail_by_run.get(run_id, 0) + count

    runs, stages, lat = [], [], []
    for r in runs_spec:
        tot = dict(calls=0, prompt=0, completion=0, cost=0.0)
        for stage, (calls, hits, errors, wait_share) in r["stages"].items():
            p_per, c_per, median = STAGE_SHAPE[stage]
            server = calls - hits
            prompt = int(server * p_per * rng.uniform(0.85, 1.15))
            completion = int(server * c_per * rng.uniform(0.8, 1.2))
            slow = 1 if stage in ("extract_facts", "summarize") and server > 20 else 0
            if r["status"] == "failed" and stage == "extract_facts":
                slow = 3
            counts = latency_counts(rng, server, median, slow)
            http_ms = int(sum(
                (BOUNDS_MS[i] + (BOUNDS_MS[i + 1] if i + 1 < len(BOUNDS_MS) else BOUNDS_MS[i] * 1.3)) / 2 * c
                for i, c in enumerate(counts)))
            wait_ms = int(http_ms * wait_share / (1 - wait_share))
            cost = round(prompt * PRICE_PROMPT + completion * PRICE_COMPLETION, 6) if r["priced"] else None
            stages.append(dict(run_id=r["run_id"], stage=stage, calls=calls, cache_hits=hits, errors=errors,
                               prompt_tokens=prompt, completion_tokens=completion, http_ms=http_ms,
                               wait_ms=wait_ms, cost_usd=cost))
            lat.append(dict(run_id=r["run_id"], stage=stage, counts=counts))
            tot["calls"] += calls
            tot["prompt"] += prompt
            tot["completion"] += completion
            tot["cost"] += cost or 0.0
        runs.append(dict(
            run_id=r["run_id"], run_seq=r["seq"], command=r["command"], status=r["status"],
            started_at=r["start"], finished_at=r["end"], duration_ms=r["duration"],
            episodes_seen=r["seen"], episodes_added=r["added"], nodes_added=r["nodes"], edges_added=r["edges"],
            failures=fail_by_run.get(r["run_id"], 0), llm_calls=tot["calls"],
            prompt_tokens=tot["prompt"], completion_tokens=tot["completion"],
            cost_usd=round(tot["cost"], 6) if r["priced"] else None, error=r["error"]))

    failures = [
        dict(run_id=run_id, stage=stage, reason=reason, count=count,
             examples=[dict(item=i, source_uri=u, reason=why, excerpt=ex) for i, u, why, ex in examples])
        for run_id, stage, reason, count, examples in failure_groups
    ]

    eval_text = "\n".join([
        "graphloom eval --gold pipelines/gold/procurement.json s3://acme-knowledge/graphs/procurement",
        "",
        "entities   gold 58   found 61   matched 53",
        "  precision 0.869   recall 0.914   f1 0.891",
        "facts      gold 74   found 69   matched 47",
        "  precision 0.681   recall 0.635   f1 0.657",
        "",
        "by fact family        gold  found  matched  recall",
        "  ordering              31     30       24   0.774",
        "  contacts              12     11        7   0.583",
        "  contract terms        19     17        9   0.474",
        "  delivery dates        12     11        7   0.583",
        "",
        "type accuracy (matched entities)   0.925",
        "invalidated facts (gold 6)         found 4   correct 3",
    ])
    evaluation = {
        "gold": "pipelines/gold/procurement.json",
        "metrics": [
            {"name": "entity precision", "value": 0.869},
            {"name": "entity recall", "value": 0.914},
            {"name": "fact precision", "value": 0.681},
            {"name": "fact recall", "value": 0.635},
            {"name": "fact recall (contract terms)", "value": 0.474},
            {"name": "type accuracy", "value": 0.925},
            {"name": "invalidation precision", "value": 0.75},
            {"name": "temporal accuracy", "value": None},
        ],
        "text": eval_text,
    }

    return {
        "graph": GRAPH,
        "generated_at": "2026-12-03T10:04:12Z",
        "runs": runs,
        "stages": stages,
        "latency": {"bounds_ms": BOUNDS_MS, "by_stage": lat},
        "failures": failures,
        "eval": evaluation,
    }


def empty() -> dict:
    return {
        "graph": "file:///tmp/graphloom/empty-graph",
        "generated_at": "2026-12-03T10:00:00Z",
        "runs": [],
        "stages": [],
        "latency": {"bounds_ms": BOUNDS_MS, "by_stage": []},
        "failures": [],
        "eval": None,
    }


def expected_counts(doc: dict, run_id: str = "") -> dict:
    """What the page's data-graphloom-counts element should say for a selection."""
    def pick(rows):
        return [r for r in rows if run_id == "" or r["run_id"] == run_id]
    stages = pick(doc["stages"])
    return {
        "runs": str(len(pick(doc["runs"]))),
        "stages": str(len({s["stage"] for s in stages})),
        "failures": str(sum(f["count"] for f in pick(doc["failures"]))),
        "calls": str(sum(s["calls"] for s in stages)),
        "eval": "1" if doc["eval"] else "0",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="HTML file to write")
    ap.add_argument("--empty", action="store_true", help="a graph with no run")
    ap.add_argument("--template", default=str(TEMPLATE), help="template to fill")
    ap.add_argument("--json", action="store_true", help="print the JSON document and expected counts on stdout")
    args = ap.parse_args()
    doc = empty() if args.empty else sample()
    html = fill(Path(args.template).read_text(encoding="utf-8"), doc)
    Path(args.out).write_text(html, encoding="utf-8")
    if args.json:
        selections = [""] + [r["run_id"] for r in doc["runs"]]
        print(json.dumps({"doc": doc, "expected": {s or "all": expected_counts(doc, s) for s in selections}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
