"""REST views of long-term memories: each validates its input, makes one call to the
caller's :class:`~persistent_memory.memories.MemoryService` and shapes the answer.

Every call works on the caller's owner: another owner's memory answers 404
``memory_not_found``, exactly as one that does not exist. Times are ISO 8601.

The request examples work as they are, in the order the examples test sends them: the
create example writes the memory ``ui.theme`` (id 1 in a fresh database, which the
detail examples use; where the database has held memories before, its id is another,
and the examples test sends that one), the search example finds it.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from persistent_memory.api import memory_serializers as m
from persistent_memory.api.examples import request_example
from persistent_memory.api.views import MemoryAPIView, errors
from persistent_memory.memories import MemoryService, memories_for

TAG = "memories"

MEMORY_ID = OpenApiParameter(
    "memory_id",
    int,
    location=OpenApiParameter.PATH,
    description="The memory's id (another owner's answers 404).",
    examples=[OpenApiExample("1", value=1)],
)


def memory_id_of(text: str) -> int | str:
    """The id in the path: an int when it is one (ASCII digits), else the text, which the
    service answers as ``memory_not_found`` (so a bad id is a JSON 404, never HTML)."""
    return int(text) if text.isascii() and text.isdigit() else text


class MemoryView(MemoryAPIView):
    """A view on the caller's memories."""

    @property
    def memories(self) -> MemoryService:
        return memories_for(self.owner or "")


class MemoryListView(MemoryView):
    @extend_schema(
        parameters=[m.MemoryListQuery],
        responses={200: m.MemoryPage, **errors()},
        operation_id="memories_list",
        tags=[TAG],
        summary="The caller's memories, newest update first",
    )
    def get(self, request: Request) -> Response:
        query = self.validated(m.MemoryListQuery, request.query_params)
        types = [query.pop("type")] if "type" in query else None
        count, results = self.memories.list(types=types, **query)
        return Response({"count": count, "results": results})

    @extend_schema(
        request=m.MemoryCreate,
        examples=[
            request_example(
                "A preference",
                {"content": "Prefers dark mode in every app.", "key": "ui.theme", "metadata": {"via": "api"}},
                description="Sent again with the same key, it updates that memory (200 then, not 201).",
            ),
            request_example(
                "A habit, key derived",
                {"content": "Runs the test suite before every commit.", "type": "procedural"},
                description="No key: one is derived from type and content (the same fact stays one).",
            ),
        ],
        responses={201: m.Memory, 200: m.Memory, **errors()},
        operation_id="memories_create",
        tags=[TAG],
        summary="Add a memory (or update the one with its key)",
        description="400 `invalid_memory`: content empty or over MEMORY_MAX_CONTENT_CHARS, metadata "
        "not a JSON object within MEMORY_MAX_METADATA_BYTES, a bad key or session id.",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(m.MemoryCreate)
        content = data.pop("content")
        memory = self.memories.add(content, source="api", **data)
        created = memory["created_at"] == memory["updated_at"]
        return Response(memory, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class MemoryDetailView(MemoryView):
    @extend_schema(
        parameters=[MEMORY_ID],
        responses={200: m.Memory, **errors(404)},
        operation_id="memories_read",
        tags=[TAG],
        summary="One memory",
    )
    def get(self, request: Request, memory_id: str) -> Response:
        return Response(self.memories.get(memory_id_of(memory_id)))

    @extend_schema(
        request=m.MemoryUpdate,
        parameters=[MEMORY_ID],
        examples=[
            request_example(
                "New content and metadata",
                {"content": "Prefers dark mode, except in the terminal.", "metadata": {"via": "docs"}},
            )
        ],
        responses={200: m.Memory, **errors(404, 409)},
        operation_id="memories_update",
        tags=[TAG],
        summary="Change some fields of a memory",
        description="409 `memory_key_exists`: another memory of the caller has that key.",
    )
    def patch(self, request: Request, memory_id: str) -> Response:
        data = self.validated(m.MemoryUpdate)
        return Response(self.memories.update(memory_id_of(memory_id), **data))

    @extend_schema(
        parameters=[MEMORY_ID],
        responses={200: m.Memory, **errors(404)},
        operation_id="memories_delete",
        tags=[TAG],
        summary="Delete a memory (answers it as it was)",
    )
    def delete(self, request: Request, memory_id: str) -> Response:
        memory = self.memories.get(memory_id_of(memory_id))
        self.memories.delete(memory_id_of(memory_id))
        return Response(memory)


class MemorySearchView(MemoryView):
    @extend_schema(
        request=m.MemorySearch,
        examples=[
            request_example(
                "Within a token budget",
                {"query": "Which theme does the user prefer?", "strategy": "hybrid", "max_tokens": 200},
                description="Best first; each result has its `score`.",
            )
        ],
        responses={200: m.MemorySearchResults, **errors()},
        operation_id="memories_search",
        tags=[TAG],
        summary="Search the caller's memories and what was said in their conversations",
        description="Each result's `kind` says what it is: a long-term `memory`, or a conversation "
        "`message` with its session, conversation, speaker and time (`kinds` chooses). "
        "`keyword` is full-text search (PostgreSQL's, SQLite's FTS5); `semantic` needs "
        "an EMBEDDER (400 `invalid_memory` otherwise); `hybrid` fuses keyword with semantic, or "
        "ranks as keyword without one (recency breaking ties); `recent` ignores the query. When "
        "the embedder does not answer within EMBEDDER_REQUEST_TIMEOUT (or is known to be failing), "
        "`semantic` and `hybrid` answer by keyword and `strategy` says `keyword`.",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(m.MemorySearch)
        query = data.pop("query")
        found = self.memories.search_results(query, **data)
        return Response({"results": found.results, "strategy": found.strategy})


class MemorySimilarView(MemoryView):
    @extend_schema(
        parameters=[MEMORY_ID, m.SimilarQuery],
        responses={200: m.MemoryResults, **errors(404)},
        operation_id="memories_similar",
        tags=[TAG],
        summary="The caller's memories nearest this one in meaning",
        description="Nearest vectors first, each with its cosine similarity as `score`; empty when the "
        "memory has no vector of the EMBEDDER's current model (no embedder, or not embedded yet).",
    )
    def get(self, request: Request, memory_id: str) -> Response:
        query = self.validated(m.SimilarQuery, request.query_params)
        return Response({"results": self.memories.similar(memory_id_of(memory_id), **query)})


class MemoryStatsView(MemoryView):
    @extend_schema(
        responses={200: m.MemoryStats, **errors()},
        operation_id="memories_stats",
        tags=[TAG],
        summary="How many memories and tokens, by type and source",
    )
    def get(self, request: Request) -> Response:
        return Response(self.memories.stats())
