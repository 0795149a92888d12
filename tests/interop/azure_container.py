#!/usr/bin/env python3
"""Creates a blob container on an Azurite blob service.

Usage: azure_container.py BLOB_ENDPOINT CONTAINER

BLOB_ENDPOINT is Azurite's path-style account URL, e.g.
http://127.0.0.1:10000/devstoreaccount1. The request is SharedKey-signed
with Azurite's well-known development account (devstoreaccount1 and its
published key), through the `azure-storage-blob` package of
tests/interop/requirements.txt.

Idempotent: a container that already exists is fine. Exits 0 on success;
otherwise non-zero with a one-line message on stderr (2: bad usage, 3:
azure-storage-blob missing, 1: anything the service or the network said).
"""

import os
import sys
from urllib.parse import urlsplit

PROG = "azure_container.py"
REQUIREMENTS = "tests/interop/requirements.txt"

# Azurite's well-known development storage account (published in Azurite's
# README and Microsoft's docs; it is not a secret).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

# The newest blob service version Azurite 3.35.0 accepts: newer
# azure-storage-blob releases default to later ones, which Azurite refuses
# unless it runs with --skipApiVersionCheck.
API_VERSION = "2025-11-05"


def finish(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(message, code=1):
    # One line, whatever the SDK's message looks like.
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    finish(code)


try:
    from azure.core.exceptions import AzureError, ResourceExistsError
    from azure.storage.blob import BlobServiceClient, LinearRetry
except ImportError as e:
    fail(f"{e}; install the interop test dependencies with `pip install -r {REQUIREMENTS}`", code=3)


def first_line(e):
    """The SDK's errors span lines (code, XML body); the first says what."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def create_container(endpoint, container):
    """True if created, False if it already existed; raises on error."""
    client = BlobServiceClient(
        account_url=endpoint,
        credential={"account_name": ACCOUNT_NAME, "account_key": ACCOUNT_KEY},
        api_version=API_VERSION,
        # The storage SDK's default retries back off for 15 s and more; these
        # ride out an Azurite still starting (about 2 s) yet fail in about 5 s
        # when nothing listens at the endpoint.
        retry_policy=LinearRetry(backoff=1, random_jitter_range=0, retry_total=5),
        connection_timeout=5,
        read_timeout=30,
    )
    try:
        client.create_container(container)
        return True
    except ResourceExistsError:
        return False


def main(argv):
    if len(argv) != 3:
        fail(f"usage: {PROG} BLOB_ENDPOINT CONTAINER (e.g. http://127.0.0.1:10000/{ACCOUNT_NAME} graphs)", code=2)
    endpoint, container = argv[1].rstrip("/"), argv[2]
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        fail(f"{argv[1]} is not an http(s) URL", code=2)
    if url.path.strip("/") != ACCOUNT_NAME:
        fail(f"{argv[1]}: expected Azurite's path-style endpoint ending in /{ACCOUNT_NAME}", code=2)
    try:
        created = create_container(endpoint, container)
    except AzureError as e:
        fail(f"cannot create container `{container}` at {endpoint}: {type(e).__name__}: {first_line(e)}")
    except Exception as e:  # ValueError for a bad container name, and the like
        fail(f"cannot create container `{container}` at {endpoint}: {type(e).__name__}: {e}")
    print(f"container `{container}` {'created' if created else 'already exists'} at {endpoint}")
    finish(0)


if __name__ == "__main__":
    main(sys.argv)
