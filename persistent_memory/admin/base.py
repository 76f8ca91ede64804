"""What the admin's modules share: read-only admins of the mirror's rows and how they show
stored JSON and times."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateformat import format as format_date


class ReadOnlyMixin:
    """The mirror only changes through the store."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def pretty_json(text: str) -> str:
    """Stored JSON text indented for reading; control characters such as U+0000 stay
    visible as escapes. Text that is not JSON (written to Redis by another program) is
    shown as it is."""
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = text
    # A lone surrogate (only another program's data could hold one) as its escape.
    return pretty.encode("utf-8", "backslashreplace").decode()


def when(moment: datetime | None) -> str:
    """A local time to the minute: "2026-11-22 18:43"."""
    return "—" if moment is None else format_date(timezone.localtime(moment), "Y-m-d H:i")


def short_when(moment: datetime) -> str:
    """A list column's time: "Nov 22, 18:43" this year, "2025-11-22" before."""
    local = timezone.localtime(moment)
    return format_date(local, "M j, H:i" if local.year == timezone.localtime().year else "Y-m-d")
