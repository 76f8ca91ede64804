"""The ORM mirror of the store, for the admin. The store stays the source of truth:
these rows are written only by :mod:`persistent_memory.mirror`."""

from __future__ import annotations

import json
from typing import Any

from django.db import models
from django.utils import timezone

from persistent_memory.owners import storage_id


class MemorySession(models.Model):
    """One session as last synced from the store."""

    #: The columns a sync writes (everything but the id it is found by).
    SYNCED_FIELDS = (
        "state",
        "created_at",
        "expires_at",
        "ttl_seconds",
        "key_count",
        "history_length",
        "last_activity",
        "synced_at",
        "gone_at",
        "history_digest",
        "sync_error",
        "sync_failed_at",
        "journal_seq",
    )

    class State(models.TextChoices):
        LIVE = "live", "live"
        EXPIRED = "expired", "expired"
        DELETED = "deleted", "deleted"

    owner = models.CharField(
        max_length=200, blank=True, default="", db_index=True, help_text="Empty: unowned (the node's)."
    )
    session_id = models.CharField(max_length=128, db_index=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.LIVE, db_index=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True, help_text="Empty: never expires.")
    ttl_seconds = models.FloatField(null=True, blank=True)
    key_count = models.PositiveIntegerField(default=0)
    history_length = models.PositiveIntegerField(default=0)
    last_activity = models.DateTimeField(db_index=True, help_text="Time of the newest history entry.")
    synced_at = models.DateTimeField(default=timezone.now)
    gone_at = models.DateTimeField(
        null=True, blank=True, help_text="When the sync found it gone from the store."
    )
    #: Of the mirrored history: the next sync writes only new entries when it is a prefix.
    history_digest = models.CharField(max_length=32, blank=True, default="", editable=False)
    sync_error = models.TextField(
        blank=True,
        default="",
        help_text="Why the mirror could not write this session (it retries); empty when the last sync did.",
    )
    sync_failed_at = models.DateTimeField(null=True, blank=True, help_text="When that sync failed.")
    #: The memory backend's journal position this row was read at: a restart replays
    #: the journal's later writes to it (see persistent_memory.journal).
    journal_seq = models.BigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-last_activity"]
        verbose_name = "memory session"
        constraints = [
            models.UniqueConstraint(fields=["owner", "session_id"], name="pm_unique_owner_session")
        ]
        indexes = [
            # The admin's "sync failing" filter; only failing rows are in it.
            models.Index(
                fields=["sync_failed_at"],
                condition=models.Q(sync_failed_at__isnull=False),
                name="pm_session_sync_failed",
            )
        ]

    def __str__(self) -> str:
        return f"{self.session_id} ({self.owner})" if self.owner else self.session_id

    @property
    def storage_id(self) -> str:
        """The store's id of this session (see :mod:`persistent_memory.owners`)."""
        return storage_id(self.owner, self.session_id)


class MemoryValue(models.Model):
    """One key of a session and its value."""

    session = models.ForeignKey(MemorySession, on_delete=models.CASCADE, related_name="values")
    key = models.CharField(max_length=256)
    #: The value's JSON text exactly as the store holds it (ASCII: U+0000 is the escape
    #: ``\u0000``, which PostgreSQL's jsonb refuses and a text column holds).
    value = models.TextField(default="null", help_text="JSON text, as the store holds it.")

    class Meta:
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["session", "key"], name="pm_unique_session_key")]

    def __str__(self) -> str:
        return self.key  # the session is shown around it; fetching its id would cost a query

    @property
    def decoded_value(self) -> Any:
        """The value itself (what ``MemoryStore.get`` returns)."""
        return json.loads(self.value)


class HistoryEntry(models.Model):
    """One entry of a session's history (an operation, or a summary of many)."""

    session = models.ForeignKey(MemorySession, on_delete=models.CASCADE, related_name="history")
    position = models.PositiveIntegerField(help_text="0 is the oldest.")
    op = models.CharField(max_length=32, db_index=True)
    # "" for entries on no one key (clear all, summaries): no valid key is empty.
    key = models.CharField(max_length=256, blank=True, default="", db_index=True)
    timestamp = models.DateTimeField(db_index=True)
    details = models.JSONField(default=dict, blank=True, help_text="cleared keys, or a summary's counts.")

    class Meta:
        ordering = ["session", "-position"]
        verbose_name_plural = "history entries"
        constraints = [
            models.UniqueConstraint(fields=["session", "position"], name="pm_unique_session_position")
        ]

    def __str__(self) -> str:
        return f"{self.op} {self.key or ''}".strip()

    def describe(self) -> str:
        """A readable line, e.g. "summary of 150 operations: put 100, increment 50; keys: a, b"."""
        if self.op != "summary":
            cleared = self.details.get("cleared")
            if cleared is not None:
                return f"clear all: {', '.join(cleared) or 'nothing'}"
            return f"{self.op} {self.key}" if self.key else self.op
        counts = self.details.get("op_counts") or {}
        ops = ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
        keys = ", ".join(self.details.get("keys_touched") or []) or "none"
        return f"summary of {self.details.get('summarized_count', 0)} operations: {ops}; keys: {keys}"
