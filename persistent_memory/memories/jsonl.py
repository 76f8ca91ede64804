"""Long-term memories as JSON Lines: one memory an object a line, for backups and moves
between databases. Import upserts by (owner, key) through the service, with source
"import"; ids are not kept (the target database gives its own)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime

from persistent_memory.exceptions import InvalidMemory, PersistentMemoryError
from persistent_memory.memories import records
from persistent_memory.memories.service import memories_for
from persistent_memory.models import LongTermMemory

EXPORTED = tuple(name for name in records.FIELDS if name != "id")


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def export_lines(rows: QuerySet[LongTermMemory]) -> Iterator[str]:
    """One JSON line (with its newline) per memory of ``rows``, oldest first."""
    for row in rows.order_by("pk").iterator():
        memory = records.as_dict(row)
        yield json.dumps({name: _jsonable(memory[name]) for name in EXPORTED}, ensure_ascii=False) + "\n"


def _moment(value: Any) -> Any:
    """An exported time (ISO 8601) as a datetime; anything else as it is, for the
    service to refuse."""
    return parse_datetime(value) if isinstance(value, str) else value


@dataclass
class ImportReport:
    imported: int = 0
    refused: int = 0


def import_lines(lines: Iterable[str | bytes], *, owner: str | None = None) -> ImportReport:
    """Upsert each line's memory (into ``owner``'s memories when given, else the line's
    owner); a line that is not a valid memory is counted as refused and skipped."""
    report = ImportReport()
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode()
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise InvalidMemory("not a JSON object")
            expires_at, said_at = (_moment(item.get(name)) for name in ("expires_at", "said_at"))
            memories_for(owner if owner is not None else item.get("owner", "")).add(
                item.get("content"),
                type=item.get("type", "factual"),
                key=item.get("key"),
                session_id=item.get("session_id") or None,
                metadata=item.get("metadata"),
                source="import",
                source_messages=item.get("source_messages") or (),
                expires_at=expires_at,
                said_at=said_at,
            )
            report.imported += 1
        except (ValueError, TypeError, PersistentMemoryError):
            report.refused += 1
    return report
