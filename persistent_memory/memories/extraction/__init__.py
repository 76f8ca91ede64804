"""Extraction: memories found in conversations by the MEMORY_EXTRACTORS, upserted with
source "extraction". It only adds or updates: a memory under the same key from another
source is left as it is (see :meth:`MemoryService.add`), and nothing is ever deleted.

Runs off the hot path: in the serving process's background worker (see :mod:`.worker`),
fed by the ``messages_added`` signal of appends and of the enrich and store lanes, and
from ``manage.py memory_extract [--watch SECONDS]``, which reads each session's recent
messages through the store's conversation API.

An extractor is a callable ``(messages) -> list[Candidate]`` (messages in the chat
format, each with ``id``, ``role`` and ``content``). One that raises is logged and
counted in the report (:class:`~.candidates.ExtractionFailed`, raised by an extractor
for a failure it understands, without a traceback); the other extractors still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.memories.extraction.candidates import Candidate, ExtractionFailed
from persistent_memory.memories.rendering import is_injected
from persistent_memory.memories.service import memories_for

if TYPE_CHECKING:  # the store holds the extraction worker: only its type from here
    from persistent_memory.store import MemoryStore

Extractor = Callable[[list[dict[str, Any]]], list[Candidate]]

logger = logging.getLogger(__name__)
_EPOCH = datetime.fromtimestamp(0, tz=UTC)


def extractors() -> list[Extractor]:
    """The MEMORY_EXTRACTORS, imported."""
    found = []
    for path in memory_settings.MEMORY_EXTRACTORS or ():
        try:
            function = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"PERSISTENT_MEMORY: MEMORY_EXTRACTORS entry {path!r} cannot be imported: {exc}"
            ) from exc
        found.append(function)
    return found


@dataclass
class ExtractionReport:
    """What a run did."""

    sessions: int = 0
    messages: int = 0
    candidates: int = 0
    #: Memories created or changed (not those left as they were).
    written: int = 0
    refused: int = 0
    #: Extractor calls that raised, and the last error (type and message).
    failed: int = 0
    last_error: str | None = None


def _name(extractor: Extractor) -> str:
    module = getattr(extractor, "__module__", None) or type(extractor).__module__
    return f"{module}.{getattr(extractor, '__qualname__', type(extractor).__qualname__)}"


def find_candidates(messages: list[dict[str, Any]], report: ExtractionReport) -> list[Candidate]:
    """What the extractors find in ``messages`` (nothing written); an extractor that fails
    is logged and counted in ``report``, and the others still run. A list of memories that
    was injected into a prompt and stored with the conversation is never read."""
    found: list[Candidate] = []
    messages = [message for message in messages if not is_injected(message)]
    if not messages:
        return found
    for extractor in extractors():
        name = _name(extractor)
        try:
            candidates = list(extractor(messages))
        except ExtractionFailed as exc:  # a failure the extractor understood: no traceback
            report.failed, report.last_error = report.failed + 1, f"{name}: {exc}"
            logger.warning("persistent_memory: extractor %s failed: %s", name, exc)
            continue
        except Exception as exc:  # an extractor's bug must not stop the others
            report.failed, report.last_error = report.failed + 1, f"{name}: {type(exc).__name__}: {exc}"
            logger.exception("persistent_memory: extractor %s raised", name)
            continue
        report.candidates += len(candidates)
        for candidate in candidates:
            if isinstance(candidate, Candidate):
                found.append(candidate)
            else:
                report.refused += 1
    return found


def _said_at(candidate: Candidate, times: dict[str, float]) -> datetime | None:
    """When the candidate was said: the time of its newest source message (None: unknown)."""
    known = [times[source] for source in candidate.source_messages if source in times]
    return datetime.fromtimestamp(max(known), tz=UTC) if known else None


def message_times(messages: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Each message's id with its ``created_at`` (seconds since the epoch), where it has both."""
    return {
        message["id"]: message["created_at"]
        for message in messages
        if isinstance(message.get("id"), str) and isinstance(message.get("created_at"), int | float)
    }


def write_candidates(
    owner: str,
    candidates: list[Candidate],
    report: ExtractionReport,
    times: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Upsert ``candidates`` into ``owner``'s memories, the earliest said first, each
    with when it was said (``times``: message id to ``created_at``); the memories as they
    now are. ``report.written`` counts those changed: a memory of another source, one
    already so, or one said later than the candidate is left as it was."""
    service = memories_for(owner)
    dated = [(candidate, _said_at(candidate, times or {})) for candidate in candidates]
    # Unknown times first (in their order), then by time: the latest statement under a
    # key is the one written (earlier ones would only be replaced by it).
    dated.sort(key=lambda pair: (pair[1] is not None, pair[1] or _EPOCH))
    latest = {candidate.key: (candidate, said_at) for candidate, said_at in dated}
    written = []
    for candidate, said_at in latest.values():
        try:
            memory, changed = service.upsert(
                candidate.content,
                type=candidate.type,
                key=candidate.key,
                source="extraction",
                source_messages=candidate.source_messages,
                said_at=said_at,
            )
        except PersistentMemoryError:
            report.refused += 1  # a candidate the rules refuse (too long a key...): skip it
            continue
        if changed:
            report.written += 1
        written.append(memory)
    return written


def extract_messages(
    owner: str, messages: list[dict[str, Any]], *, report: ExtractionReport | None = None
) -> list[dict[str, Any]]:
    """Upsert what the extractors find in ``messages`` into ``owner``'s memories; the
    memories as they now are (a memory of another source under a key: unchanged)."""
    report = report or ExtractionReport()
    return write_candidates(owner, find_candidates(messages, report), report, message_times(messages))


def extract_sessions(
    store: MemoryStore, *, owner: str | None = None, last_messages: int = 50
) -> ExtractionReport:
    """Run the extractors over the newest ``last_messages`` of every conversation of every
    live session (of ``owner`` only, when given), then write what they found owner by
    owner, the earliest said first, so a newer statement under a key always wins."""
    report = ExtractionReport()
    infos: Iterable[dict[str, Any]] = store.list_session_infos(all_owners=True)
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for info in infos:
        if owner is None or info.get("owner", "") == owner:
            by_owner.setdefault(info.get("owner", ""), []).append(info)
    for session_owner, sessions in by_owner.items():
        scoped = store.for_owner(session_owner)
        candidates: list[Candidate] = []
        times: dict[str, float] = {}
        for info in sessions:
            try:
                conversations = scoped.list_conversations(info["session_id"])
                report.sessions += 1
                for conversation in conversations:
                    thread = scoped.get_messages(
                        info["session_id"], conversation=conversation["conversation"], limit=last_messages
                    )
                    report.messages += len(thread["messages"])
                    candidates += find_candidates(thread["messages"], report)
                    times.update(message_times(thread["messages"]))
            except PersistentMemoryError:
                continue  # expired or deleted meanwhile
        write_candidates(session_owner, candidates, report, times)
    return report
