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
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.memories.extraction.candidates import Candidate, ExtractionFailed
from persistent_memory.memories.service import memories_for
from persistent_memory.store import MemoryStore

Extractor = Callable[[list[dict[str, Any]]], list[Candidate]]

logger = logging.getLogger(__name__)


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
    is logged and counted in ``report``, and the others still run."""
    found: list[Candidate] = []
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


def write_candidates(
    owner: str, candidates: list[Candidate], report: ExtractionReport
) -> list[dict[str, Any]]:
    """Upsert ``candidates`` into ``owner``'s memories; the memories as they now are (a
    memory of another source under a key: unchanged)."""
    service = memories_for(owner)
    written = []
    for candidate in candidates:
        try:
            memory = service.add(
                candidate.content,
                type=candidate.type,
                key=candidate.key,
                source="extraction",
                source_messages=candidate.source_messages,
            )
        except PersistentMemoryError:
            report.refused += 1  # a candidate the rules refuse (too long a key...): skip it
            continue
        if memory["source"] == "extraction":
            report.written += 1
        written.append(memory)
    return written


def extract_messages(
    owner: str, messages: list[dict[str, Any]], *, report: ExtractionReport | None = None
) -> list[dict[str, Any]]:
    """Upsert what the extractors find in ``messages`` into ``owner``'s memories; the
    memories as they now are (a memory of another source under a key: unchanged)."""
    report = report or ExtractionReport()
    return write_candidates(owner, find_candidates(messages, report), report)


def extract_sessions(
    store: MemoryStore, *, owner: str | None = None, last_messages: int = 50
) -> ExtractionReport:
    """Run the extractors over the newest ``last_messages`` of every conversation of every
    live session (of ``owner`` only, when given)."""
    report = ExtractionReport()
    infos: Iterable[dict[str, Any]] = store.list_session_infos(all_owners=True)
    for info in infos:
        session_owner = info.get("owner", "")
        if owner is not None and session_owner != owner:
            continue
        scoped = store.for_owner(session_owner)
        try:
            conversations = scoped.list_conversations(info["session_id"])
            report.sessions += 1
            for conversation in conversations:
                thread = scoped.get_messages(
                    info["session_id"], conversation=conversation["conversation"], limit=last_messages
                )
                report.messages += len(thread["messages"])
                extract_messages(session_owner, thread["messages"], report=report)
        except PersistentMemoryError:
            continue  # expired or deleted meanwhile
    return report
