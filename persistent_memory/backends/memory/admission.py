"""The memory backend's admission of new sessions: the per-owner cap and the fair share
of a full process (see :func:`admit`). A rule, not a part: it keeps no state of its own,
and reads and updates the session table it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistent_memory.exceptions import QuotaExceeded, SessionsFull
from persistent_memory.owners import namespace_of

if TYPE_CHECKING:
    from persistent_memory.backends.memory.sessions import IndexedTable


def admit(table: IndexedTable, session_id: str, now: float) -> None:
    """Raise unless a write may create the session ``session_id`` now; a no-op when it
    is live (the write does not create it) and while a restore loads sessions. It is the
    backend's ``_admit`` method (``MemoryBackend._admit = admit``), ``table`` its ``self``.

    Every write that may create a session calls this before it is journaled, so that
    the journal holds only admitted writes, and a restore (the mirror's rows, then the
    journal's replay) admits everything unconditionally: all of it was admitted once,
    and a restart must not lose an acknowledged session nor bring back a refused one.
    The caps apply to new sessions: a restart with a lower ``MAX_SESSIONS`` or
    ``max_sessions_per_owner`` loads every session and refuses new ones until deletions
    and expiries bring the owner, or the process, under them again.

    An owner (a namespace; "": unowned) is held to its cap (``max_sessions_per_owner``:
    ``QuotaExceeded``). A full process (``max_sessions`` live) still admits an owner
    holding fewer sessions than its fair share, ``max_sessions // owners`` (owners
    holding sessions, this one counted; without ``max_sessions_per_owner`` at most a
    tenth of ``max_sessions``), and refuses the others (``SessionsFull``):
    owners who filled the process cannot lock a newcomer out, and nothing acknowledged
    is evicted to make room. The total may then go over ``max_sessions``, never past
    ``CEILING * max_sessions``, where even a newcomer is refused, so that
    ``max_sessions`` still bounds the process's memory. Below that ceiling the fair
    share alone bounds it: admitting only below the share keeps the j-th largest
    holding at most ``max_sessions // j``, so the total stays within
    ``sum(min(cap, max_sessions // j) for j in 1..owners)``, about
    ``max_sessions * (1 + ln(owners / 10))`` with a cap of a tenth in the worst order of
    arrivals (the ceiling is reached after about 27 such owners). Without a cap the
    first owner, alone, may take all ``max_sessions``; each next one then gets at most
    ``min(max_sessions // 10, max_sessions // j)``: the ceiling is reached after about
    12 owners each taking all it is given.
    """
    if table._restoring:
        return
    existing = table._sessions.get(session_id)
    if existing is not None:
        if not existing.expired(now):
            return
        table._drop(session_id)  # as _live does: the place it held is free
        table._mark(session_id)
    owner = namespace_of(session_id)
    held = table._owned.get(owner, 0)
    cap = table.max_sessions_per_owner
    if owner and cap is not None and held >= cap:
        table._reclaim(now)
        held = table._owned.get(owner, 0)
        if held >= cap:
            raise QuotaExceeded(f"This owner holds its maximum of {cap} sessions (MAX_SESSIONS_PER_OWNER).")
    if len(table._sessions) >= table.max_sessions:
        table._reclaim(now)
        held = table._owned.get(owner, 0)
        share = table.max_sessions // (len(table._owned) + (owner not in table._owned))
        if cap is None:
            # No cap: an owner alone took every place it wanted. Past MAX_SESSIONS the
            # others get at most a tenth each, so that a few owners taking all they are
            # given cannot bring the process to its ceiling and lock newcomers out.
            share = min(share, max(1, table.max_sessions // table.SHARE_PAST_FULL))
        # The messages are for callers too (SessionsFull): the setting to raise, and
        # nothing of the other owners' sessions but what the settings say.
        if len(table._sessions) >= table.CEILING * table.max_sessions:
            raise SessionsFull(
                f"The memory backend holds {table.CEILING} times its maximum of {table.max_sessions} "
                "sessions (MAX_SESSIONS): delete sessions, or raise MAX_SESSIONS."
            )
        if len(table._sessions) >= table.max_sessions and held >= share:
            raise SessionsFull(
                f"The memory backend holds its maximum of {table.max_sessions} sessions (MAX_SESSIONS), "
                f"and this owner its share of them ({share}): delete sessions, or raise MAX_SESSIONS."
            )
