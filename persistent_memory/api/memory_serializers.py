"""Request and response shapes of the long-term memory endpoints.

They check shapes only; what a memory may hold (sizes, JSON rules, key and session id
patterns) is checked by :mod:`persistent_memory.memories.records`, the same for Python
callers and the API, and answered as 400 ``invalid_memory``.
"""

from __future__ import annotations

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from persistent_memory.memories.records import SOURCES, TYPES
from persistent_memory.memories.search import KINDS, STRATEGIES
from persistent_memory.memories.service import MAX_LIMIT

KEY_HELP = (
    "Stable per owner: writing the same key again updates that memory (new content keeps the old "
    "as a superseded version). 1-256 of letters, "
    "digits, '_', '.', '-' and ':'; omitted: derived from type and content."
)


TYPE_SCHEMA = {
    "type": "string",
    "pattern": f"^({'|'.join(TYPES)})$",
    "description": f"The kind of memory: {', '.join(TYPES)}.",
}


@extend_schema_field(TYPE_SCHEMA)
class TypeField(serializers.ChoiceField):
    """A memory type. In the schema a pattern, not an enum: drf-spectacular names enums by
    field name, and "type" names other choice sets of the API too (a project would need
    ENUM_NAME_OVERRIDES to keep the schema free of warnings)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(choices=TYPES, **kwargs)


class MemoryFields(serializers.Serializer):
    content = serializers.CharField(trim_whitespace=False, help_text="The fact, in a sentence or two.")
    type = TypeField(default="factual")
    key = serializers.CharField(required=False, allow_null=True, help_text=KEY_HELP)
    session_id = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    metadata = serializers.JSONField(required=False, allow_null=True, help_text="A JSON object.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, help_text="Empty: never.")
    said_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="When what it says was said. Empty: unknown."
    )
    happened_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="When what it describes happened. Empty: unknown."
    )


AS_OF_HELP = (
    "What was true at this moment: the memories and superseded versions said by then (said_at, "
    "else created_at) and not superseded by then, one version a memory."
)


class MemoryCreate(MemoryFields):
    """A memory to add (or to update, by its key)."""


class MemoryUpdate(MemoryFields):
    """Some fields of a memory to change."""

    content = serializers.CharField(trim_whitespace=False, required=False)
    type = TypeField(required=False)
    key = serializers.CharField(required=False)


class MemoryListQuery(serializers.Serializer):
    type = TypeField(required=False)
    session_id = serializers.CharField(required=False)
    source = serializers.ChoiceField(choices=SOURCES, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=50)
    offset = serializers.IntegerField(min_value=0, max_value=2**31, default=0)
    as_of = serializers.DateTimeField(required=False, help_text=AS_OF_HELP)


class MemorySearch(serializers.Serializer):
    query = serializers.CharField(allow_blank=True, trim_whitespace=False, help_text="Text to look for.")
    strategy = serializers.ChoiceField(
        choices=STRATEGIES,
        default="hybrid",
        help_text="recent | keyword | semantic (needs an EMBEDDER) | hybrid.",
    )
    types = serializers.ListField(child=TypeField(), required=False, max_length=4)
    session_id = serializers.CharField(required=False)
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=10)
    max_tokens = serializers.IntegerField(
        min_value=0,
        max_value=2**31,
        required=False,
        allow_null=True,
        help_text="Results are accepted best first while their tokens fit; at least one when any matched.",
    )
    said_after = serializers.DateTimeField(
        required=False, help_text="Only memories said at or after this moment (said_at, else created_at)."
    )
    said_before = serializers.DateTimeField(
        required=False, help_text="Only memories said before this moment (said_at, else created_at)."
    )
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=KINDS),
        required=False,
        min_length=1,
        max_length=2,
        help_text="What to look through: `memory` (long-term memories) and `message` (what was said in "
        "the caller's conversations). Default: MEMORY_SEARCH_KINDS (both), or memories alone with `types`.",
    )
    as_of = serializers.DateTimeField(required=False, help_text=AS_OF_HELP)


class SimilarQuery(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=10)


class Memory(serializers.Serializer):
    id = serializers.IntegerField()
    owner = serializers.CharField()
    session_id = serializers.CharField(help_text="Empty: not tied to a session.")
    type = TypeField()
    key = serializers.CharField()
    content = serializers.CharField()
    metadata = serializers.JSONField()
    source = serializers.ChoiceField(choices=SOURCES)
    source_messages = serializers.ListField(child=serializers.CharField())
    said_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When what it says was said (an extracted memory: its newest source message's time); "
        "null: unknown.",
    )
    happened_at = serializers.DateTimeField(
        allow_null=True, help_text="When what it describes happened; null: unknown."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    access_count = serializers.IntegerField()
    last_accessed_at = serializers.DateTimeField(allow_null=True)
    tokens = serializers.IntegerField()
    history = serializers.ListField(
        child=serializers.DictField(),
        help_text="What the memory said before merges changed it, oldest first: content, key, at, reason "
        "(the superseded versions are the full record).",
    )
    valid_until = serializers.DateTimeField(
        allow_null=True, help_text="A superseded version: when it stopped being true; null: current."
    )
    superseded_by = serializers.IntegerField(
        allow_null=True,
        help_text="A superseded version: the id of the memory that replaced it (which kept its id); "
        "null: current.",
    )


class Scored(serializers.Serializer):
    score = serializers.FloatField(help_text="The strategy's score: higher is better.")
    score_parts = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        help_text="What the score is made of: keyword and semantic (their own scores, null when not "
        "found that way), relevance (their fusion), recency and frequency (its weights by use); "
        "recent for the recent strategy.",
    )


class FoundMemory(Memory, Scored):
    pass


class SearchedMemory(FoundMemory):
    kind = serializers.ChoiceField(choices=["memory"])


class SearchedMessage(Scored):
    kind = serializers.ChoiceField(choices=["message"])
    id = serializers.CharField(help_text="The message's id in its conversation.")
    owner = serializers.CharField()
    session_id = serializers.CharField()
    conversation = serializers.CharField()
    role = serializers.CharField()
    name = serializers.CharField(help_text="The speaker's name; empty: none given.")
    content = serializers.CharField(help_text="The message's text.")
    said_at = serializers.DateTimeField(help_text="When it was said (the message's created_at).")
    seq = serializers.IntegerField()
    tokens = serializers.IntegerField()


Found = PolymorphicProxySerializer(
    component_name="Found",
    serializers={"memory": SearchedMemory, "message": SearchedMessage},
    resource_type_field_name="kind",
    many=True,
)


class MemoryPage(serializers.Serializer):
    count = serializers.IntegerField()
    results = Memory(many=True)


class MemoryResults(serializers.Serializer):
    results = FoundMemory(many=True)


class MemorySearchResults(serializers.Serializer):
    results = Found
    strategy = serializers.ChoiceField(
        choices=["recent", "keyword", "semantic", "hybrid"],
        help_text="The strategy that ranked the results: the one asked for, or `keyword` when a "
        "semantic or hybrid search got no query vector in time (the embedder failing, or its "
        "circuit open).",
    )


class TypeStats(serializers.Serializer):
    count = serializers.IntegerField()
    tokens = serializers.IntegerField()


class MemoryStats(serializers.Serializer):
    count = serializers.IntegerField()
    tokens = serializers.IntegerField()
    by_type = serializers.DictField(child=TypeStats())
    by_source = serializers.DictField(child=serializers.IntegerField())
