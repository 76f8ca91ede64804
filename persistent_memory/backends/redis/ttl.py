"""TTLs as the Redis backend's library reads them in ARGV; shared by the backend and its parts."""

from __future__ import annotations


def ttl_text(ttl_seconds: float | None) -> str:
    """A session's TTL as its meta hash keeps it: the node writes "None" for no TTL and a
    number otherwise."""
    return "None" if ttl_seconds is None else repr(ttl_seconds)


def ttl_ms(ttl_seconds: float | None) -> str:
    """A TTL in whole milliseconds (at least 1), "0" for none."""
    return "0" if ttl_seconds is None else str(max(1, round(ttl_seconds * 1000)))
