"""What a caller is told of a server-side error, and what the log keeps.

A store error about the servers (a backend that cannot be reached or is out of memory,
a journal that cannot be written) carries details for the operator: an address, a
script hash, a line number, an OS error. Callers of the REST API and the MCP tools get
its code, a plain message and a request id instead; the details go to the
``persistent_memory`` loggers under that id, so one line of a caller's report finds them.
Errors about the caller's own request (a missing session, a quota of its owner) are
told as they are.
"""

from __future__ import annotations

import uuid

from persistent_memory.exceptions import (
    BackendUnavailable,
    CapacityExceeded,
    PersistentMemoryError,
    QuotaExceeded,
    ReplicasBehind,
    SessionsFull,
)

#: The response header that carries an error's request id (also ``request_id`` in the body).
REQUEST_ID_HEADER = "X-Request-ID"

#: Store errors whose message is for the operator -> what callers read instead (None: the
#: message is about the caller's request and is theirs to read). Subclasses first.
PLAIN_DETAILS: list[tuple[type[PersistentMemoryError], str | None]] = [
    (QuotaExceeded, None),
    (SessionsFull, None),
    (CapacityExceeded, "The memory store is full: nothing was written."),
    (
        ReplicasBehind,
        "The write was not confirmed by enough replicas in time and may have been applied: "
        "send it again with the same Idempotency-Key.",
    ),
    (BackendUnavailable, "The memory store is unavailable; try again later."),
]


def new_request_id() -> str:
    """A fresh id for one error: 32 hex digits, in the answer and in the log line."""
    return uuid.uuid4().hex


def plain_detail(error: PersistentMemoryError) -> str | None:
    """What a caller reads instead of ``error``'s message, when that message is for the
    operator only; None when it is the caller's to read."""
    for error_class, detail in PLAIN_DETAILS:
        if isinstance(error, error_class):
            return detail
    return None


def caller_detail(error: PersistentMemoryError) -> str:
    """The message a caller reads for ``error``."""
    return plain_detail(error) or str(error)
