"""Connections the database dropped (a restart, a network cut, an idle timeout).

A persistent connection (``CONN_MAX_AGE``) that the database dropped fails its next
query. Django's ``CONN_HEALTH_CHECKS`` tests one at the start of each request that uses
it; :func:`drop_dead_connections` is for a request's reads that meet one anyway (no
health checks configured, or the connection dropped after the check). The mirror's
worker needs neither: it writes in ``atomic`` blocks, and a block whose rollback fails
drops its connection, so the next flush connects afresh.
"""

from __future__ import annotations

from contextlib import suppress

from django.db import DatabaseError, connections


def drop_dead_connections() -> bool:
    """Close this thread's connections that failed a query and no longer answer, so that
    their next query connects afresh; whether there was one. A connection inside a
    transaction is left alone: reconnecting would lose the transaction's work silently.

    Only connections that saw an error are tested (``SELECT 1``), so this costs nothing
    when all is well."""
    dropped = False
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or not connection.errors_occurred or connection.in_atomic_block:
            continue
        if connection.is_usable():
            connection.errors_occurred = False  # an error of a query's own (as Django resets it)
            continue
        with suppress(DatabaseError):  # closing a broken connection may fail: it is gone either way
            connection.close()
        dropped = True
    return dropped
