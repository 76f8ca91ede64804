"""Long-term memories as JSON Lines: one memory an object a line, for backups and moves
between databases, its superseded versions in its ``versions`` (newest first). Import
upserts by (owner, key) through the service, with source "import", and adds the versions
the memory does not hold yet, with their times; ids are not kept (the target database
gives its own)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Prefetch, QuerySet
from django.utils.dateparse import parse_datetime

from persistent_memory.exceptions import InvalidMemory, PersistentMemoryError
from persistent_memory.memories import records
from persistent_memory.memories.lifecycle import current_filter
from persistent_memory.memories.service import memories_for
from persistent_memory.models import LongTermMemory

#: A line's fields (and each version's): ids are the database's own.
EXPORTED = tuple(name for name in records.FIELDS if name not in ("id", "superseded_by"))
#: The times a line (or a version) holds, as ISO 8601 text.
TIMES = ("said_at", "happened_at", "created_at", "updated_at", "expires_at", "valid_until")


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _exported(row: LongTermMemory) -> dict[str, Any]:
    memory = records.as_dict(row)
    return {name: _jsonable(memory[name]) for name in EXPORTED}


def export_lines(rows: QuerySet[LongTermMemory]) -> Iterator[str]:
    """One JSON line (with its newline) per memory of ``rows``, oldest first, with its
    superseded versions in ``versions``, newest first (a version of ``rows`` whose memory
    is not in them is not written: it has no line of its own)."""
    versions = Prefetch("superseded", queryset=LongTermMemory.objects.order_by("-valid_until", "-id"))
    for row in (
        rows.filter(current_filter()).order_by("pk").prefetch_related(versions).iterator(chunk_size=500)
    ):
        line = {**_exported(row), "versions": [_exported(version) for version in row.superseded.all()]}
        yield json.dumps(line, ensure_ascii=False) + "\n"


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
            versions = item.get("versions") or []
            if not isinstance(versions, list) or not all(isinstance(version, dict) for version in versions):
                raise InvalidMemory("Invalid versions: must be a list of JSON objects.")
            service = memories_for(owner if owner is not None else item.get("owner", ""))
            with transaction.atomic():  # a refused version leaves no part of the line
                memory = service.add(
                    item.get("content"),
                    type=item.get("type", "factual"),
                    key=item.get("key"),
                    session_id=item.get("session_id") or None,
                    metadata=item.get("metadata"),
                    source="import",
                    source_messages=item.get("source_messages") or (),
                    expires_at=_moment(item.get("expires_at")),
                    said_at=_moment(item.get("said_at")),
                    happened_at=_moment(item.get("happened_at")),
                )
                if versions:
                    service.restore_versions(
                        memory["id"],
                        [
                            {**version, **{name: _moment(version.get(name)) for name in TIMES}}
                            for version in versions
                        ],
                    )
            report.imported += 1
        except (ValueError, TypeError, PersistentMemoryError):
            report.refused += 1
    return report
