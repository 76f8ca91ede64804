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
        "idle_ttl_seconds",
        "key_count",
        "history_length",
        "last_activity",
        "synced_at",
        "gone_at",
        "history_digest",
        "sync_error",
        "sync_failed_at",
        "journal_seq",
        "checkpoint_epoch",
        "checkpoint_seq",
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
    idle_ttl_seconds = models.FloatField(
        null=True, blank=True, help_text="Expires this long after its last write; empty: no idle expiry."
    )
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
    #: The memory backend's checkpoint counters this row's entries were written at (see
    #: persistent_memory.mirror.checkpoints); empty and 0: none.
    checkpoint_epoch = models.CharField(max_length=32, blank=True, default="", editable=False)
    checkpoint_seq = models.BigIntegerField(default=0, editable=False)

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


class CheckpointEntry(models.Model):
    """One entry of a session's graph checkpoints, as the memory backend holds it (named as
    :mod:`persistent_memory.backends.checkpoints` says), so that a restart finds it."""

    session = models.ForeignKey(MemorySession, on_delete=models.CASCADE, related_name="checkpoint_entries")
    name = models.TextField()
    value = models.TextField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "name"], name="pm_unique_checkpoint_entry")]

    def __str__(self) -> str:
        return self.name


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


class MemoryConversation(models.Model):
    """One conversation of a session (see :mod:`persistent_memory.conversations`)."""

    session = models.ForeignKey(MemorySession, on_delete=models.CASCADE, related_name="conversations")
    name = models.CharField(max_length=256)
    head = models.CharField(
        max_length=128, blank=True, default="", help_text="The newest message of the current thread."
    )
    seq = models.BigIntegerField(default=0, help_text="The last seq given to a message.")
    message_count = models.PositiveIntegerField(default=0)
    tokens = models.BigIntegerField(default=0, help_text="Tokens of all its messages, every branch.")
    branch_count = models.PositiveIntegerField(default=0, help_text="Messages no other one answers.")
    trimmed = models.BigIntegerField(default=0, help_text="Messages removed beyond MAX_MESSAGES.")
    #: The rolling summaries as JSON text (a list of ``Summary._asdict()``, one per branch
    #: that has one, by anchor_seq; ASCII, so U+0000 fits PostgreSQL), exactly as the
    #: store holds them; empty: none.
    summary = models.TextField(blank=True, default="", editable=False)
    #: Of the mirrored messages' texts, in any order: a sync that finds the same digest
    #: over the snapshot's older messages writes only the newer ones.
    digest = models.CharField(max_length=32, blank=True, default="", editable=False)

    class Meta:
        ordering = ["session", "name"]
        constraints = [
            models.UniqueConstraint(fields=["session", "name"], name="pm_unique_session_conversation")
        ]

    def __str__(self) -> str:
        return self.name


class MemoryMessage(models.Model):
    """One message of a conversation (every branch; see :attr:`MemoryConversation.head`)."""

    conversation = models.ForeignKey(MemoryConversation, on_delete=models.CASCADE, related_name="messages")
    message_id = models.CharField(max_length=128)
    parent_id = models.CharField(max_length=128, blank=True, default="", help_text="Empty: a first message.")
    seq = models.BigIntegerField()
    role = models.CharField(max_length=16, db_index=True)
    #: The content as plain text (the parts' texts joined), for reading and searching.
    content_text = models.TextField(blank=True, default="")
    name = models.CharField(max_length=64, blank=True, default="")
    tool_call_id = models.CharField(max_length=256, blank=True, default="")
    tool_calls = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    tokens = models.PositiveIntegerField(default=0)
    tokenizer = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_index=True)
    #: The message's JSON text exactly as the store holds it: a restore from the mirror
    #: gives the store these bytes back (the columns above are copies for the admin).
    stored = models.TextField(help_text="JSON text, as the store holds it.")
    #: Of ``stored``: tells a message from another one stored under the same id since.
    digest = models.CharField(max_length=32, editable=False)
    #: The EMBEDDER's vector of ``content_text`` as float32 bytes, its model and length
    #: (None: not embedded; see persistent_memory.memories.message_search). Messages are
    #: searched by meaning only where MESSAGE_EMBEDDINGS is on.
    embedding_f32 = models.BinaryField(null=True, blank=True, editable=False)
    # db_default: the mirror inserts rows by raw SQL, naming only the columns it copies.
    embedding_model = models.CharField(max_length=200, blank=True, db_default="", editable=False)
    embedding_dimensions = models.PositiveIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "message_id"], name="pm_unique_conversation_message"
            )
        ]
        indexes = [models.Index(fields=["conversation", "seq"], name="pm_message_seq")]

    def __str__(self) -> str:
        return self.message_id

    @property
    def decoded(self) -> dict[str, Any]:
        """The message as ``get_messages`` returns it."""
        return json.loads(self.stored)


class LongTermMemory(models.Model):
    """One long-term memory of an owner: the database is its source of truth (unlike the
    mirror's rows above). Written only through :mod:`persistent_memory.memories`."""

    class Type(models.TextChoices):
        FACTUAL = "factual", "factual"
        EPISODIC = "episodic", "episodic"
        PROCEDURAL = "procedural", "procedural"
        SEMANTIC = "semantic", "semantic"

    class Source(models.TextChoices):
        API = "api", "api"
        EXTRACTION = "extraction", "extraction"
        MCP = "mcp", "mcp"
        ADMIN = "admin", "admin"
        IMPORT = "import", "import"

    owner = models.CharField(max_length=200, blank=True, default="", help_text="Empty: unowned.")
    session_id = models.CharField(
        max_length=128, blank=True, default="", db_index=True, help_text="Empty: not tied to a session."
    )
    type = models.CharField(max_length=16, choices=Type.choices, default=Type.FACTUAL)
    #: Stable per owner: writing the same key again updates the memory (its current
    #: version: superseded ones keep the key too).
    key = models.CharField(max_length=256)
    content = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.API, db_index=True)
    source_messages = models.JSONField(
        default=list, blank=True, help_text="Ids of the messages it came from."
    )
    said_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When what it says was said (an extracted memory: its newest source message's time). "
        "Empty: unknown.",
    )
    happened_at = models.DateTimeField(
        null=True, blank=True, help_text="When what it describes happened. Empty: unknown (or not an event)."
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True, help_text="Empty: never.")
    #: A superseded version: what the memory ``superseded_by`` said until ``valid_until``,
    #: when a write replaced its content (MEMORY_KEEP_SUPERSEDED). The memory keeps its id;
    #: its versions are rows of their own, deleted with it (CASCADE: every delete path,
    #: the ORM's and the admin's, takes the chain along; SET_NULL would turn old versions
    #: into current memories under a taken key).
    superseded_by = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="superseded",
        editable=False,
        help_text="The current memory this is an older version of. Empty: current.",
    )
    valid_until = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When it stopped being true (the new version's said_at, else the time of the "
        "write). Empty: current.",
    )
    access_count = models.PositiveIntegerField(default=0)
    last_accessed_at = models.DateTimeField(null=True, blank=True)
    tokens = models.PositiveIntegerField(default=0, help_text="Tokens of the content (TOKENIZER).")
    #: The EMBEDDER's vector of the content (None: not embedded yet, or no embedder). On
    #: PostgreSQL with pgvector the table ``pm_memory_vector`` holds it as a ``vector`` too (0014).
    embedding = models.JSONField(null=True, blank=True, editable=False)
    #: The model that made ``embedding``, and its length: a vector is only ever compared
    #: with vectors of the same model and length.
    embedding_model = models.CharField(max_length=200, blank=True, default="", editable=False)
    embedding_dimensions = models.PositiveIntegerField(null=True, blank=True, editable=False)
    #: The same vector as float32 bytes, which numpy and sqlite-vec read without parsing
    #: text (at 10,000 memories, decoding the JSON of every vector took 0.8 s a search).
    embedding_f32 = models.BinaryField(null=True, blank=True, editable=False)
    #: What the memory said before a merge changed it, oldest first (at most
    #: ``records.MAX_HISTORY`` entries): ``{"content", "key", "at", "reason"}``. Kept for
    #: compatibility; the superseded versions (``superseded``) are the full record.
    history = models.JSONField(default=list, blank=True, editable=False)

    class Meta:
        ordering = ["-updated_at", "-id"]
        verbose_name = "long-term memory"
        verbose_name_plural = "long-term memories"
        constraints = [
            # One current memory per key: its superseded versions keep the key they had.
            models.UniqueConstraint(
                fields=["owner", "key"],
                condition=models.Q(superseded_by__isnull=True),
                name="pm_unique_owner_memory_key",
            )
        ]
        indexes = [
            models.Index(fields=["owner", "-updated_at"], name="pm_memory_owner_recent"),
            models.Index(fields=["owner", "type"], name="pm_memory_owner_type"),
        ]

    def __str__(self) -> str:
        return self.key


class BackgroundWork(models.Model):
    """Where the app's tasks on Django's task framework stand (see :mod:`persistent_memory.tasks`):
    one row per kind of work and conversation (the empty strings for work of the whole store).
    ``enqueued_at`` is the debounce lease (a task is waiting: another is not enqueued),
    ``running_until`` keeps two workers off one conversation, and the cursor is the last
    message an extraction read, so a message is extracted once however often a task runs."""

    kind = models.CharField(max_length=16)
    owner = models.CharField(max_length=200, blank=True, default="")
    session_id = models.CharField(max_length=128, blank=True, default="")
    conversation = models.CharField(max_length=256, blank=True, default="")
    enqueued_at = models.DateTimeField(null=True, blank=True)
    running_until = models.DateTimeField(null=True, blank=True)
    cursor_id = models.CharField(max_length=256, blank=True, default="")
    cursor_at = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "background work"
        verbose_name_plural = "background work"
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "owner", "session_id", "conversation"], name="pm_background_work_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.owner}/{self.session_id}/{self.conversation}"
