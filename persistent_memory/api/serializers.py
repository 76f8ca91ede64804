"""Request and response shapes of the API (validation and the OpenAPI schema)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from persistent_memory.conf import memory_settings
from persistent_memory.validation import INT64_MAX, INT64_MIN, SESSION_ID_PATTERN

LANES = ("questions", "answers")


def _entry(value: Any, *, lane: str) -> dict[str, Any]:
    """An entry is an object; its ``metadata`` an object; an answer's ``text`` a string."""
    if not isinstance(value, dict):
        raise serializers.ValidationError("An entry must be a JSON object.", code="invalid_entry")
    if "metadata" in value and not isinstance(value["metadata"], dict):
        raise serializers.ValidationError("metadata must be a JSON object.", code="invalid_entry")
    if lane == "answers" and not isinstance(value.get("text"), str):
        raise serializers.ValidationError("An answer needs a string 'text'.", code="invalid_entry")
    return value


@extend_schema_field(OpenApiTypes.OBJECT)
class EntryField(serializers.Field):
    """A pipeline entry: ``{"text": ..., "metadata": {...}, ...}``.

    Not a ``JSONField``, which serializes its data whole to check that it can: the
    body was parsed from JSON, so that check only costs time, most on large entries.
    """

    def __init__(self, *, lane: str, **kwargs: Any) -> None:
        self.lane = lane
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        return _entry(data, lane=self.lane)

    def to_representation(self, value: Any) -> Any:
        return value


class EnrichRequest(serializers.Serializer):
    question = EntryField(lane="questions")
    run_id = serializers.CharField(required=False, allow_null=True, trim_whitespace=False, max_length=128)


class StoreRequest(serializers.Serializer):
    answer = EntryField(lane="answers")
    run_id = serializers.CharField(required=False, allow_null=True, trim_whitespace=False, max_length=128)


def _plain_lane_body(field: str, lane: str) -> Callable[[Any], dict[str, Any] | None]:
    """What the lane request serializer with the entry ``field`` of ``lane`` makes of a
    body that is plainly valid (an object with the entry, and a run id that is absent,
    null or shaped like a session id), found without it; None for anything else, which
    the serializer then decides and words the error of.

    The serializer deep-copies its fields on every request, which cost a lane request a
    tenth of its time for two checks. The bodies accepted here are a subset of those it
    accepts, with the same result, so nothing it refuses gets through.
    """

    def plain(data: Any) -> dict[str, Any] | None:
        if type(data) is not dict or field not in data:
            return None
        try:
            body = {field: _entry(data[field], lane=lane)}
        except serializers.ValidationError:
            return None
        if "run_id" in data:
            run_id = body["run_id"] = data["run_id"]
            if run_id is not None and not (type(run_id) is str and SESSION_ID_PATTERN.fullmatch(run_id)):
                return None
        return body

    return plain


class MemoryOutcome(serializers.Serializer):
    status = serializers.ChoiceField(choices=["enriched", "unchanged", "stored", "skipped"])
    session_id = serializers.CharField(allow_null=True)
    keys = serializers.ListField(child=serializers.CharField(), required=False)
    answer_count = serializers.IntegerField(required=False)
    reason = serializers.CharField(required=False)


class EnrichResponse(serializers.Serializer):
    question = serializers.JSONField()
    memory = MemoryOutcome()


class StoreResponse(serializers.Serializer):
    answer = serializers.JSONField()
    memory = MemoryOutcome()


#: Request serializers -> their plain check (see _plain_lane_body), tried first.
PLAIN_CHECKS: dict[type[serializers.Serializer], Callable[[Any], dict[str, Any] | None]] = {
    EnrichRequest: _plain_lane_body("question", "questions"),
    StoreRequest: _plain_lane_body("answer", "answers"),
}


class BatchItem(serializers.Serializer):
    lane = serializers.ChoiceField(choices=LANES)
    entry = serializers.JSONField()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            _entry(attrs["entry"], lane=attrs["lane"])
        except serializers.ValidationError as exc:
            raise serializers.ValidationError({"entry": exc.detail}) from None
        return attrs


class ProcessRequest(serializers.Serializer):
    entries = BatchItem(many=True, allow_empty=True)

    def validate_entries(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        limit = memory_settings.MAX_BATCH
        if len(value) > limit:
            raise serializers.ValidationError(f"At most {limit} entries per call.", code="too_many_entries")
        return value


class ProcessedItem(serializers.Serializer):
    lane = serializers.ChoiceField(choices=LANES)
    entry = serializers.JSONField()
    memory = MemoryOutcome()


class ProcessResponse(serializers.Serializer):
    entries = ProcessedItem(many=True)


class SessionCreate(serializers.Serializer):
    session_id = serializers.CharField(trim_whitespace=False, max_length=128)
    ttl_hours = serializers.FloatField(required=False, allow_null=True, min_value=0, max_value=24 * 365 * 100)
    idle_ttl_seconds = serializers.FloatField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=3600 * 24 * 365 * 100,
        help_text="Also expire this long after the last write (null: SESSION_IDLE_TTL_SECONDS; 0: never).",
    )


class SessionInfo(serializers.Serializer):
    session_id = serializers.CharField()
    owner = serializers.CharField(help_text="The caller's owner, resolved by the server.")
    created_at = serializers.FloatField(help_text="Epoch seconds.")
    expires_at = serializers.FloatField(allow_null=True, help_text="Epoch seconds; null: never expires.")
    ttl_seconds = serializers.FloatField(allow_null=True)
    ttl_remaining_seconds = serializers.FloatField(allow_null=True)
    key_count = serializers.IntegerField()
    history_length = serializers.IntegerField()
    idle_ttl_seconds = serializers.FloatField(allow_null=True, help_text="null: no idle expiry.")
    expires_by = serializers.ChoiceField(
        choices=["ttl", "idle"], allow_null=True, help_text="Which expiry applies (null: never expires)."
    )


class SessionPage(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = SessionInfo(many=True)


class Cleared(serializers.Serializer):
    session_id = serializers.CharField()
    cleared = serializers.ListField(child=serializers.CharField())


class SessionValues(serializers.Serializer):
    session_id = serializers.CharField()
    values = serializers.DictField(child=serializers.JSONField())


class ValuePut(serializers.Serializer):
    value = serializers.JSONField(allow_null=True)


class KeyValue(serializers.Serializer):
    session_id = serializers.CharField()
    key = serializers.CharField()
    value = serializers.JSONField(allow_null=True)


class IncrementRequest(serializers.Serializer):
    amount = serializers.IntegerField(required=False, default=1, min_value=INT64_MIN, max_value=INT64_MAX)


class IncrementResponse(serializers.Serializer):
    value = serializers.IntegerField()


class HistoryQuery(serializers.Serializer):
    limit = serializers.IntegerField(required=False, default=50, min_value=0, max_value=1_000_000)


class History(serializers.Serializer):
    session_id = serializers.CharField()
    entries = serializers.ListField(child=serializers.DictField())


class SummarizeRequest(serializers.Serializer):
    max_history = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=INT64_MAX)


class SummarizeResponse(serializers.Serializer):
    session_id = serializers.CharField()
    summarized = serializers.BooleanField()


class PartHealth(serializers.Serializer):
    # Not a second enum: drf-spectacular would warn about one choice set in three components.
    status = serializers.CharField(help_text='"ok" or "unavailable".')
    latency_ms = serializers.FloatField(required=False, help_text="When it answered.")
    detail = serializers.CharField(required=False, help_text="Why not, when it did not.")
    code = serializers.CharField(required=False)


class BackendHealth(PartHealth):
    name = serializers.CharField()
    location = serializers.CharField(help_text="Where it keeps the data, never its credentials.")


class DatabaseHealth(PartHealth):
    alias = serializers.CharField()
    vendor = serializers.CharField()


class MirrorHealth(serializers.Serializer):
    status = serializers.CharField(help_text="unavailable while a restart waits for its database to restore.")
    mode = serializers.CharField()
    pending_sessions = serializers.IntegerField(
        required=False, allow_null=True, help_text="Sessions written since their last sync."
    )
    last_sync_at = serializers.DateTimeField(required=False, allow_null=True)
    last_error = serializers.CharField(required=False, allow_null=True)
    last_error_at = serializers.DateTimeField(required=False, allow_null=True)
    journal_bytes = serializers.IntegerField(
        required=False, allow_null=True, help_text="The memory backend's crash journal (null: none)."
    )
    idempotency_bytes = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="The idempotency records kept beside the journal, whatever the mirror's lag (null: none).",
    )


class SummarizerHealth(serializers.Serializer):
    status = serializers.CharField(help_text='"ok": windows never wait for a summarizer, whatever its state.')
    enabled = serializers.BooleanField(help_text="Whether conversations get rolling summaries.")
    worker = serializers.CharField(
        required=False, help_text='Where summaries are made here: "thread", "tasks" or "off".'
    )
    state = serializers.CharField(
        required=False, allow_null=True, help_text="healthy, retry, degraded or recovering (null: unknown)."
    )
    pending = serializers.IntegerField(
        required=False, allow_null=True, help_text="Conversations waiting for a summary."
    )
    failures = serializers.IntegerField(required=False, help_text="Failures in a row.")
    retry_at = serializers.DateTimeField(required=False, allow_null=True)
    last_error = serializers.CharField(required=False, allow_null=True)
    last_error_at = serializers.DateTimeField(required=False, allow_null=True)
    last_success_at = serializers.DateTimeField(required=False, allow_null=True)


class ExtractionHealth(serializers.Serializer):
    status = serializers.CharField(help_text='"ok": writes never wait for extraction.')
    enabled = serializers.BooleanField(
        help_text="Whether this process extracts in the background (MEMORY_EXTRACTION_WORKER and extractors)."
    )
    worker = serializers.CharField(
        required=False,
        help_text='"thread", "tasks" (TASK_BACKEND: Django\'s task framework) or "off" (stopped).',
    )
    queued = serializers.IntegerField(required=False, help_text="Writes whose messages wait in the queue.")
    queue_size = serializers.IntegerField(required=False, help_text="MEMORY_EXTRACTION_QUEUE_SIZE.")
    batches = serializers.IntegerField(required=False, help_text="Writes extracted from since it started.")
    messages = serializers.IntegerField(required=False, help_text="Messages extracted from.")
    written = serializers.IntegerField(required=False, help_text="Memories upserted.")
    dropped = serializers.IntegerField(
        required=False, help_text="Writes not queued (queue full): memory_extract catches up."
    )
    failures = serializers.IntegerField(required=False, help_text="Extractions that failed.")
    last_error = serializers.CharField(required=False, allow_null=True)
    last_error_at = serializers.DateTimeField(required=False, allow_null=True)
    last_success_at = serializers.DateTimeField(required=False, allow_null=True)


class TasksHealth(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=["ok"], help_text="Always ok: writes never wait for background work."
    )
    runner = serializers.ChoiceField(
        choices=["threads", "tasks"],
        help_text="Worker threads in each process, or TASK_BACKEND's task backend.",
    )
    backend = serializers.CharField(required=False, help_text="The TASKS alias (TASK_BACKEND).")
    backlog = serializers.IntegerField(
        required=False, allow_null=True, help_text="The app's tasks waiting (null: the backend cannot tell)."
    )
    error = serializers.CharField(required=False, help_text="Why the backend could not be asked.")


class Health(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok", "unavailable"], help_text="ok when every part is.")
    backend = BackendHealth(required=False, help_text="Staff only, as every part.")
    database = DatabaseHealth(required=False, help_text="The default database (users, tokens, the mirror).")
    mirror = MirrorHealth(required=False, help_text="The ORM mirror of the store.")
    summarizer = SummarizerHealth(required=False, help_text="The conversations' rolling summaries.")
    extraction = ExtractionHealth(required=False, help_text="This process's memory extraction worker.")
    tasks = TasksHealth(required=False, help_text="Where the background work runs, and its backlog.")


class Error(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField()
    errors = serializers.JSONField(required=False, help_text="Field errors, for validation failures.")
    request_id = serializers.CharField(
        required=False,
        help_text="Server-side errors (5xx): the id the server logged the details under (also X-Request-ID).",
    )
