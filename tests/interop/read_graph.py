#!/usr/bin/env python3
"""Reads a graphloom graph the way an external engine would.

Usage: read_graph.py [--storage-options JSON] ROOT

ROOT is a graph directory, or an object store URL (s3://bucket/prefix,
az://container/prefix; also s3a://, gs://, abfs://, abfss://, azure://). For
a URL, --storage-options gives the object store's options as a JSON object of
strings, passed as is to deltalake's DeltaTable(uri, version=...,
storage_options=...), e.g. for a local S3 server (moto)
  {"AWS_ENDPOINT_URL": "http://127.0.0.1:PORT", "AWS_ALLOW_HTTP": "true",
   "AWS_ACCESS_KEY_ID": "...", "AWS_SECRET_ACCESS_KEY": "...",
   "AWS_REGION": "us-east-1"}
and for Azurite {"use_emulator": "true"} with the environment variable
AZURITE_BLOB_STORAGE_URL=http://127.0.0.1:PORT (the emulator mode takes its
address only from there; it also skips List Blobs' startFrom, which Azurite
3.35 ignores). For a directory the options are passed too, and ignored.

A graphloom graph is as of its last `runs` row with status 'completed'; that
row's `table_versions` column maps every other table to the Delta version the
run left it at. This script finds that row with the Python `deltalake`
package, then counts every table's rows at its pinned version twice:

* with `deltalake` (DeltaTable(path, version=v).to_pyarrow_table());
* with DuckDB over the Parquet files of that version
  (DeltaTable.file_uris() -> read_parquet([...])), since DuckDB's delta
  extension would need a download.

`runs` itself is not in `table_versions`: like graphloom, it is read at its
latest version (it is append-only and every row in it is final).

It also runs, in DuckDB over the pinned files, the number of nodes labelled
'Contract' and the number of edges whose relation_type is EMPLOYED_BY or one
of its subtypes per edge_type_closure.

Prints one JSON object:
  {"deltalake": {table: count}, "duckdb": {table: count},
   "duckdb_contract_nodes": n, "duckdb_employment_edges": n}
and exits non-zero, with a message on stderr, on any error.

For a URL ROOT only deltalake reads the graph: DuckDB would need its httpfs
(or azure) extension to read s3:// or az:// files, which is a download, so
"duckdb", "duckdb_contract_nodes" and "duckdb_employment_edges" are null
("deltalake" is computed exactly as for a directory, and a run that pins no
`nodes`, `edges` or `edge_type_closure` is still an error).
"""

import json
import os
import re
import sys

PROG = "read_graph.py"
REQUIREMENTS = "tests/interop/requirements.txt"

# Reader features that make "read every Parquet file in file_uris()" wrong:
# deletion vectors hide rows inside files, column mapping renames columns.
UNSUPPORTED_READER_FEATURES = {"deletionVectors", "columnMapping"}

# Object store URL schemes deltalake reads; any other scheme is refused
# rather than mistaken for a relative directory name.
URL_SCHEMES = {"s3", "s3a", "gs", "az", "azure", "abfs", "abfss"}
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GraphError(Exception):
    pass


def finish(code):
    """Exits without interpreter teardown, after flushing our output.

    pyarrow and the deltalake extension both run native thread pools; at
    interpreter exit their destructors sometimes race and the process dies
    with SIGABRT ("terminate called without an active exception", see
    delta-io/delta-rs#2184, apache/arrow#34314) after all the work is done.
    os._exit skips that teardown so the exit status is ours.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(message, code=1):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    finish(code)


try:
    import duckdb
    from deltalake import DeltaTable
    import pyarrow  # noqa: F401  (needed by DeltaTable.to_pyarrow_table)
except ImportError as e:
    fail(f"{e}; install the interop test dependencies with `pip install -r {REQUIREMENTS}`", code=3)


def one_line(e):
    """An object store error on one line: deltalake prints its S3/Azure
    errors' cause chains as indented, coloured lines starting with an arrow
    (each arrow stands for a ': ')."""
    return " ".join(ANSI.sub("", str(e)).split()).replace(" ↳ ", ": ")


def is_url(root):
    """Whether ROOT is an object store URL (raises on an unknown scheme)."""
    m = SCHEME.match(root)
    if not m:
        return False
    scheme = m.group(1).lower()
    if scheme not in URL_SCHEMES:
        raise GraphError(f"{root}: unsupported URL scheme `{scheme}://` (use a directory or one of {', '.join(s + '://' for s in sorted(URL_SCHEMES))})")
    if not root[m.end():].strip("/"):
        raise GraphError(f"{root}: no bucket or container in the URL")
    return True


def table_location(root, name, url):
    return root.rstrip("/") + "/" + name if url else os.path.join(root, name)


def open_table(root, name, version=None, storage_options=None):
    url = is_url(root)
    path = table_location(root, name, url)
    if url:
        # No os.path on a URL: ask the object store for the table's log.
        try:
            exists = DeltaTable.is_deltatable(path, storage_options=storage_options)
        except Exception as e:
            raise GraphError(f"table `{name}`: cannot look for a Delta table at {path}: {one_line(e)}") from e
    else:
        exists = os.path.isdir(os.path.join(path, "_delta_log"))
    if not exists:
        raise GraphError(f"table `{name}`: no Delta table at {path}")
    try:
        table = DeltaTable(path, version=version, storage_options=storage_options)
    except Exception as e:  # deltalake raises its own DeltaError family
        at = "latest version" if version is None else f"version {version}"
        raise GraphError(f"table `{name}`: cannot open {path} at {at}: {one_line(e) if url else e}") from e
    protocol = table.protocol()
    if protocol.min_reader_version == 2:
        raise GraphError(f"table `{name}` uses column mapping (reader version 2); its Parquet files cannot be read directly")
    features = set(protocol.reader_features or [])
    bad = features & UNSUPPORTED_READER_FEATURES
    if bad:
        raise GraphError(f"table `{name}` uses reader features {sorted(bad)}; its Parquet files cannot be read directly")
    return table


def last_completed_run(runs):
    rows = runs.to_pyarrow_table(columns=["run_id", "run_seq", "status", "table_versions"]).to_pylist()
    completed = [r for r in rows if r["status"] == "completed"]
    if not completed:
        raise GraphError(f"no completed run in `runs` ({len(rows)} rows): the graph has nothing to read yet")
    run = max(completed, key=lambda r: r["run_seq"])
    try:
        versions = json.loads(run["table_versions"])
    except (TypeError, ValueError) as e:
        raise GraphError(f"run {run['run_id']} has unreadable table_versions {run['table_versions']!r}: {e}") from e
    if not isinstance(versions, dict) or not all(isinstance(v, int) and v >= 0 for v in versions.values()):
        raise GraphError(f"run {run['run_id']} has table_versions that is not an object of versions: {versions!r}")
    return run, versions


def scalar(con, sql):
    """One value from DuckDB. fetchall(), not fetchone(): DuckDB 2 refuses
    further work on a connection whose last result was not fully fetched."""
    rows = con.execute(sql).fetchall()
    if len(rows) != 1 or len(rows[0]) != 1:
        raise GraphError(f"DuckDB returned {rows!r} for a single-value query: {sql}")
    return rows[0][0]


def duckdb_source(con, name, table):
    """Registers a DuckDB view `name` over the table's files at its version."""
    uris = table.file_uris()
    if uris:
        # A literal list keeps the view self-contained (views take no parameters).
        files = ", ".join("'" + u.replace("'", "''") + "'" for u in uris)
        con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM read_parquet([{files}])')
    else:
        # No files at this version (a table no run has written yet): an empty
        # relation with the table's columns, so queries over it still bind.
        schema = table.to_pyarrow_table().schema
        empty = schema.empty_table()
        con.register(f"{name}__empty", empty)
        con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "{name}__empty"')
    return len(uris)


def read_graph(root, storage_options=None):
    url = is_url(root)
    if not url and not os.path.isdir(root):
        raise GraphError(f"{root} is not a directory")
    runs = open_table(root, "runs", storage_options=storage_options)
    run, versions = last_completed_run(runs)

    tables = {
        name: open_table(root, name, version, storage_options)
        for name, version in sorted(versions.items())
    }
    tables["runs"] = runs

    con = None if url else duckdb.connect()
    delta_counts = {}
    duck_counts = {}
    for name, table in sorted(tables.items()):
        delta_counts[name] = table.to_pyarrow_table().num_rows
        if con is not None:
            duckdb_source(con, name, table)
            duck_counts[name] = scalar(con, f'SELECT count(*) FROM "{name}"')

    for needed in ("nodes", "edges", "edge_type_closure"):
        if needed not in tables:
            raise GraphError(f"run {run['run_id']} pins no version of `{needed}` (table_versions: {versions})")

    if con is None:
        # See the docstring: DuckDB cannot read object store files offline.
        return {
            "deltalake": delta_counts,
            "duckdb": None,
            "duckdb_contract_nodes": None,
            "duckdb_employment_edges": None,
        }

    contract_nodes = scalar(con, "SELECT count(*) FROM nodes WHERE list_contains(labels, 'Contract')")
    # Same semantics as graphloom's edge_type_matches: the type itself or any
    # descendant of it in the closure.
    employment_edges = scalar(
        con,
        """
        SELECT count(*)
        FROM edges AS e
        WHERE e.relation_type = 'EMPLOYED_BY'
           OR e.relation_type IN (
                SELECT c.descendant FROM edge_type_closure AS c
                WHERE c.ancestor = 'EMPLOYED_BY')
        """,
    )

    return {
        "deltalake": delta_counts,
        "duckdb": duck_counts,
        "duckdb_contract_nodes": contract_nodes,
        "duckdb_employment_edges": employment_edges,
    }


def parse_storage_options(text):
    try:
        options = json.loads(text)
    except ValueError as e:
        fail(f"--storage-options is not valid JSON: {e}", code=2)
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        fail(f"--storage-options must be a JSON object of strings, got {text}", code=2)
    return options


def parse_args(argv):
    """(root, storage_options) from argv; exits with code 2 on bad usage."""
    usage = f"usage: {PROG} [--storage-options JSON] ROOT"
    args = argv[1:]
    storage_options = None
    positional = []
    while args:
        arg = args.pop(0)
        if arg == "--storage-options":
            if not args:
                fail(f"--storage-options needs a JSON object ({usage})", code=2)
            storage_options = parse_storage_options(args.pop(0))
        elif arg.startswith("--storage-options="):
            storage_options = parse_storage_options(arg.split("=", 1)[1])
        elif arg.startswith("-") and arg != "-":
            fail(f"unknown option {arg} ({usage})", code=2)
        else:
            positional.append(arg)
    if len(positional) != 1:
        fail(usage, code=2)
    return positional[0], storage_options


def main(argv):
    root, storage_options = parse_args(argv)
    try:
        result = read_graph(root, storage_options)
    except GraphError as e:
        fail(str(e))
    except Exception as e:  # anything unexpected from deltalake, pyarrow or duckdb
        fail(f"{type(e).__name__}: {e}")
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    finish(0)


if __name__ == "__main__":
    main(sys.argv)
