"""Identifiers shared across processes."""

from __future__ import annotations

import itertools
import os
import secrets

RequestId = str

_counter = itertools.count()


def new_request_id(prefix: str = "req") -> RequestId:
    """A process-unique, unguessable request id."""
    return f"{prefix}-{os.getpid():x}{next(_counter):x}-{secrets.token_hex(4)}"


def new_run_id() -> str:
    """An id for one runtime instance; it prefixes shared-memory names and socket paths."""
    return f"{os.getpid():x}{secrets.token_hex(3)}"
