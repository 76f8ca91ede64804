"""REST views: each validates its body, makes one store or lane call and shapes the answer.

Every view but ``health/`` needs an authenticated caller (unless
``API_PERMISSION_CLASSES`` says otherwise) and works on the caller's owner, resolved
on the server by ``OWNER_RESOLVER``: another owner's session answers exactly as one
that does not exist.

Every write takes an ``Idempotency-Key`` header: sent again under the same key, it gets
the first answer and is not applied again (see :mod:`persistent_memory.idempotency`).
Answers are built from the request and the store's result only, so a replayed result
gives the same answer.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import Error as DatabaseError
from django.http import HttpResponse
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from persistent_memory.api import serializers as s
from persistent_memory.api.bodies import read_unsized_body
from persistent_memory.api.errors import DATABASE_UNAVAILABLE, PayloadTooLarge, exception_handler
from persistent_memory.api.examples import COUNTER_KEY, KEY, QUESTION, SESSION, SESSION_ID, request_example
from persistent_memory.api.pagination import SessionPagination
from persistent_memory.api.parsers import MemoryJSONParser
from persistent_memory.api.rendering import parsed, render_json
from persistent_memory.backends.base import SessionInfo, remaining_seconds
from persistent_memory.conf import memory_settings
from persistent_memory.errors.database import drop_dead_connections
from persistent_memory.exceptions import InvalidOwner, PersistentMemoryError
from persistent_memory.health import OK, health_report
from persistent_memory.idempotency import HEADER as IDEMPOTENCY_HEADER
from persistent_memory.idempotency import KEY_PATTERN as IDEMPOTENCY_KEY_PATTERN
from persistent_memory.idempotency import Idempotency
from persistent_memory.owners.resolvers import resolve_owner
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MAX_PAGE_OFFSET, MemoryStore, get_store
from persistent_memory.validation import validate_run_id


def errors(*statuses: int) -> dict[int, type[Serializer]]:
    """Schema entries for the error statuses an endpoint can answer."""
    return dict.fromkeys((400, 401, 403, 411, 413, 429, 500, 503, *statuses), s.Error)


@functools.lru_cache(maxsize=32)
def _throttle_class(path: str, rates: tuple[tuple[str, str | None], ...]) -> type:
    """The throttle class at ``path``, with ``API_THROTTLE_RATES`` over the project's rates."""
    cls = import_string(path)
    if not rates or not hasattr(cls, "THROTTLE_RATES"):
        return cls
    return type(cls.__name__, (cls,), {"THROTTLE_RATES": {**cls.THROTTLE_RATES, **dict(rates)}})


class OwnerRequired(PermissionDenied):
    default_detail = "No owner could be resolved for this request, so it can reach no memory."
    default_code = "owner_required"


#: Where the WSGI/ASGI environ holds the ``Idempotency-Key`` header.
IDEMPOTENCY_META_KEY = "HTTP_" + IDEMPOTENCY_HEADER.upper().replace("-", "_")

SESSION_ERRORS = errors(404, 410)
#: A write's errors: its own, plus 422 for an idempotency key used for another request.
WRITE_ERRORS = errors(422, 404, 410)

IDEMPOTENCY_KEY = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    str,
    location=OpenApiParameter.HEADER,
    required=False,
    pattern=f"^{IDEMPOTENCY_KEY_PATTERN.pattern}$",
    description=(
        "Makes a retry safe: the same key again (same caller, same request) within "
        "IDEMPOTENCY_TTL_SECONDS gets the first answer and is not applied again; with another "
        "request, 422 `idempotency_key_reused`."
    ),
)


def with_remaining(info: SessionInfo) -> dict[str, Any]:
    """A session's info plus the seconds it has left (None: never expires)."""
    return {**info, "ttl_remaining_seconds": remaining_seconds(info)}


def as_created(info: SessionInfo) -> dict[str, Any]:
    """A new session's info with the seconds it had left when created (its whole TTL), so
    that the answer, replayed under an idempotency key, is the same."""
    return {**info, "ttl_remaining_seconds": info["ttl_seconds"]}


class EndpointSchema(AutoSchema):
    """drf-spectacular's schema, describing an operation by its own words only: a view
    class without a docstring does not inherit its base class's, which is about code."""

    def get_description(self) -> str:
        if "__doc__" not in vars(type(self.view)) or not type(self.view).__doc__:
            return ""
        return super().get_description()


class MemoryAPIView(APIView):
    """JSON in and out, the project's auth unless PERSISTENT_MEMORY overrides it."""

    renderer_classes = [JSONRenderer]
    # Refuses, before any store call, JSON the store could not hold exactly (see parsers).
    parser_classes = [MemoryJSONParser]
    schema = EndpointSchema()
    #: The caller's owner, resolved in :meth:`initial` (before any store call).
    owner: str | None = None

    def get_authenticators(self) -> list[Any]:
        paths = memory_settings.API_AUTHENTICATION_CLASSES
        return super().get_authenticators() if paths is None else [import_string(p)() for p in paths]

    def get_permissions(self) -> list[Any]:
        paths = memory_settings.API_PERMISSION_CLASSES
        if paths is None:
            # Closed by default, even where the project's default is AllowAny.
            return [*super().get_permissions(), IsAuthenticated()]
        return [import_string(p)() for p in paths]

    def get_throttles(self) -> list[Any]:
        paths = memory_settings.API_THROTTLE_CLASSES
        if paths is None:
            paths = [f"{cls.__module__}.{cls.__qualname__}" for cls in self.throttle_classes]
        rates = memory_settings.API_THROTTLE_RATES or {}
        return [_throttle_class(path, tuple(sorted(rates.items())))() for path in paths]

    def get_exception_handler(self) -> Any:
        return exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Refuse an oversized body before reading it.
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > memory_settings.MAX_REQUEST_BYTES:
            raise PayloadTooLarge(f"The request body is over {memory_settings.MAX_REQUEST_BYTES} bytes.")
        read_unsized_body(request._request, limit=memory_settings.MAX_REQUEST_BYTES)
        try:
            self._identify(request, *args, **kwargs)
        except DATABASE_UNAVAILABLE:
            # A pooled connection the database dropped fails its first query. What ran so
            # far only read (authentication, permissions, the owner): on a connection that
            # is dead, not busy or refused, read once more on a new one.
            if not drop_dead_connections():
                raise
            self._identify(request, *args, **kwargs)

    def _identify(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """DRF's checks (authentication, permissions, throttles), then the caller's owner."""
        super().initial(request, *args, **kwargs)
        try:
            self.owner = resolve_owner(request)
        except InvalidOwner as exc:
            raise OwnerRequired(f"The owner resolver gave an unusable owner: {exc}") from None
        if self.owner is None:
            raise OwnerRequired()

    @property
    def store(self) -> MemoryStore:
        """The process's store, scoped to the caller's owner."""
        if self.owner is None:  # initial() refuses such requests before any view method
            raise OwnerRequired()
        return get_store().for_owner(self.owner)

    def idempotency(self, *also: Any) -> Idempotency | None:
        """The request's ``Idempotency-Key`` with the fingerprint of what it asks (method,
        path, body, and ``also`` what a write takes from its query string); None without
        the header. A malformed key is a 400."""
        # META, not request.headers: that builds a dict of every header, for one.
        key = self.request.META.get(IDEMPOTENCY_META_KEY)
        if key is None:
            return None
        request = self.request
        return Idempotency.of(key, request.method, request.path, request.data, *also)

    def validated(self, serializer_class: type[Serializer], data: Any = None) -> dict[str, Any]:
        """``data`` (the body when not given) validated by ``serializer_class``: a 400 with
        the fields' errors when invalid."""
        if data is None:
            data = self.request.data
        plain = s.PLAIN_CHECKS.get(serializer_class)
        if plain is not None and (valid := plain(data)) is not None:
            return valid
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


def _run_id(data: dict[str, Any]) -> str | None:
    run_id = data.get("run_id")
    return None if run_id is None else validate_run_id(run_id)


# The pipeline lanes ---------------------------------------------------------

_JSON = JSONRenderer()


class LaneView(MemoryAPIView):
    """A lane: JSON whatever the ``Accept`` header says, as every answer of the API is
    (DRF's negotiation of one renderer only parsed the header per request), rendered once
    in a plain response, the window's messages as the store holds them (see
    :mod:`persistent_memory.api.rendering`)."""

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[Any, str]:
        return _JSON, _JSON.media_type

    def answer(self, body: dict[str, Any]) -> HttpResponse:
        """``body`` as the lane's answer."""
        return HttpResponse(render_json(body), content_type=_JSON.media_type)


class EnrichView(LaneView):
    @extend_schema(
        request=s.EnrichRequest,
        parameters=[IDEMPOTENCY_KEY],
        examples=[
            request_example(
                "A question in a session",
                {"question": QUESTION, "run_id": "run-1"},
                description="Creates the session on its first question; `run_id` lets `store/` find it.",
            )
        ],
        responses={200: s.EnrichResponse, **errors(422, 507)},
        operation_id="enrich",
        summary="Questions lane: attach the session's memory as metadata.memory_context",
    )
    def post(self, request: Request) -> HttpResponse:
        once = self.idempotency()
        data = self.validated(s.EnrichRequest)
        lanes = MemoryFilter(self.store)
        question, outcome = lanes.enrich(
            data["question"], run_id=_run_id(data), idempotency=once, window_as_json=True
        )
        return self.answer({"question": question, "memory": outcome})


class StoreView(LaneView):
    @extend_schema(
        request=s.StoreRequest,
        parameters=[IDEMPOTENCY_KEY],
        examples=[
            request_example(
                "The answer to a run",
                {"answer": {"text": "In Paris."}, "run_id": "run-1"},
                description="Stored in the session that `enrich/` saw with the same `run_id`.",
            ),
            request_example(
                "An answer in a named session",
                {"answer": {"text": "In Paris.", "metadata": {"session_id": SESSION}}},
            ),
        ],
        responses={200: s.StoreResponse, **errors(422, 507)},
        operation_id="store",
        summary="Answers lane: store the text as last_answer and count it in answer_count",
    )
    def post(self, request: Request) -> HttpResponse:
        once = self.idempotency()
        data = self.validated(s.StoreRequest)
        lanes = MemoryFilter(self.store)
        answer, outcome = lanes.store(data["answer"], run_id=_run_id(data), idempotency=once)
        return self.answer({"answer": answer, "memory": outcome})


class ProcessView(LaneView):
    @extend_schema(
        request=s.ProcessRequest,
        parameters=[IDEMPOTENCY_KEY],
        examples=[
            request_example(
                "A question and its answer",
                {
                    "entries": [
                        {"lane": "questions", "entry": QUESTION},
                        {"lane": "answers", "entry": {"text": "In Paris."}},
                    ]
                },
                description="The answer, with no session id, goes to the question's session.",
            )
        ],
        responses={200: s.ProcessResponse, **errors(422, 507)},
        operation_id="process",
        summary="Both lanes for a batch of entries, in order, as one pipeline item",
        description=(
            "Answers without a session id fall back to the last question's session in the batch. "
            "Each entry is atomic; the batch is not: on an error the body lists under `completed` "
            "the entries processed before it. Under an `Idempotency-Key` each entry is recorded "
            "as it is done, so a retry of the same batch applies only the entries not done yet "
            "and answers the whole batch."
        ),
    )
    def post(self, request: Request) -> HttpResponse:
        once = self.idempotency()
        items = self.validated(s.ProcessRequest)["entries"]
        lanes = MemoryFilter(self.store)
        lanes.open()
        results: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            once_here = once and once.entry(index)
            try:
                if item["lane"] == "questions":
                    entry, outcome = lanes.enrich(item["entry"], idempotency=once_here, window_as_json=True)
                else:
                    entry, outcome = lanes.store(item["entry"], idempotency=once_here)
            except PersistentMemoryError as exc:
                response = self.handle_exception(exc)
                response.data["completed"] = parsed(results)  # for DRF's renderer
                return response
            results.append({"lane": item["lane"], "entry": entry, "memory": outcome})
        return self.answer({"entries": results})


# Sessions, values and history -----------------------------------------------


class SessionListView(MemoryAPIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("search", str, description="Only sessions whose id starts with this."),
            OpenApiParameter(
                "cursor",
                str,
                description="The page after the one whose 'next' link gave it (any page costs the same).",
            ),
            OpenApiParameter(
                "page",
                int,
                description=f"A page within the first {MAX_PAGE_OFFSET:,} sessions.",
            ),
            OpenApiParameter("page_size", int),
        ],
        responses={200: s.SessionPage, **errors(404)},
        operation_id="sessions_list",
        summary="Live sessions, newest first",
    )
    def get(self, request: Request) -> Response:
        paginator = SessionPagination()
        page = paginator.paginate_sessions(self.store, request.query_params.get("search", ""), request, self)
        return paginator.get_paginated_response([with_remaining(info) for info in page])

    @extend_schema(
        request=s.SessionCreate,
        parameters=[IDEMPOTENCY_KEY],
        examples=[
            request_example(
                "A session that lives a day",
                {"session_id": "chat-43", "ttl_hours": 24},
                description="An id that exists already answers 409.",
            )
        ],
        responses={201: s.SessionInfo, **errors(409, 422, 507)},
        operation_id="sessions_create",
        summary="Create a session",
    )
    def post(self, request: Request) -> Response:
        once = self.idempotency()
        data = self.validated(s.SessionCreate)
        ttl_hours = data.get("ttl_hours")
        ttl = None if ttl_hours is None else ttl_hours * 3600
        info = self.store.create_session(
            data["session_id"], ttl, idle_ttl_seconds=data.get("idle_ttl_seconds"), idempotency=once
        )
        return Response(as_created(info), status=status.HTTP_201_CREATED)


class SessionDetailView(MemoryAPIView):
    @extend_schema(
        parameters=[SESSION_ID],
        responses={200: s.SessionInfo, **SESSION_ERRORS},
        operation_id="session_info",
        summary="A session's info",
    )
    def get(self, request: Request, session_id: str) -> Response:
        return Response(with_remaining(self.store.session_info(session_id)))

    @extend_schema(
        parameters=[SESSION_ID, IDEMPOTENCY_KEY],
        responses={200: s.Cleared, **WRITE_ERRORS},
        operation_id="session_delete",
        summary="Delete a session and all it holds",
    )
    def delete(self, request: Request, session_id: str) -> Response:
        cleared = self.store.delete_session(session_id, idempotency=self.idempotency())
        return Response({"session_id": session_id, "cleared": cleared})


class SessionMemoryView(MemoryAPIView):
    @extend_schema(
        parameters=[SESSION_ID],
        responses={200: s.SessionValues, **SESSION_ERRORS},
        operation_id="memory_get_all",
        summary="Every key and value",
    )
    def get(self, request: Request, session_id: str) -> Response:
        return Response({"session_id": session_id, "values": self.store.get_all(session_id)})

    @extend_schema(
        parameters=[SESSION_ID, IDEMPOTENCY_KEY],
        responses={200: s.Cleared, **WRITE_ERRORS},
        operation_id="memory_clear",
        summary="Clear every key",
    )
    def delete(self, request: Request, session_id: str) -> Response:
        cleared = self.store.clear(session_id, idempotency=self.idempotency())
        return Response({"session_id": session_id, "cleared": cleared})


class KeyView(MemoryAPIView):
    @extend_schema(
        parameters=[SESSION_ID, KEY],
        responses={200: s.KeyValue, **SESSION_ERRORS},
        operation_id="memory_get",
        summary="One value",
    )
    def get(self, request: Request, session_id: str, key: str) -> Response:
        return Response({"session_id": session_id, "key": key, "value": self.store.get(session_id, key)})

    @extend_schema(
        request=s.ValuePut,
        parameters=[SESSION_ID, KEY, IDEMPOTENCY_KEY],
        examples=[request_example("Any JSON value", {"value": {"city": "Paris", "visits": 2}})],
        responses={200: s.KeyValue, **WRITE_ERRORS},
        operation_id="memory_put",
        summary="Store a value",
    )
    def put(self, request: Request, session_id: str, key: str) -> Response:
        once = self.idempotency()
        value = self.validated(s.ValuePut)["value"]
        self.store.put(session_id, key, value, idempotency=once)
        return Response({"session_id": session_id, "key": key, "value": value})

    @extend_schema(
        parameters=[SESSION_ID, KEY, IDEMPOTENCY_KEY],
        responses={200: s.Cleared, **WRITE_ERRORS},
        operation_id="memory_delete",
        summary="Remove a value",
        description="Idempotent: `cleared` is empty when the key was not there.",
    )
    def delete(self, request: Request, session_id: str, key: str) -> Response:
        cleared = self.store.clear(session_id, key, idempotency=self.idempotency())
        return Response({"session_id": session_id, "cleared": cleared})


class IncrementView(MemoryAPIView):
    @extend_schema(
        request=s.IncrementRequest,
        parameters=[SESSION_ID, COUNTER_KEY, IDEMPOTENCY_KEY],
        examples=[request_example("Add one", {"amount": 1})],
        responses={200: s.IncrementResponse, **WRITE_ERRORS},
        operation_id="memory_increment",
        summary="Atomically add to an integer (a missing key counts as 0)",
    )
    def post(self, request: Request, session_id: str, key: str) -> Response:
        once = self.idempotency()
        amount = self.validated(s.IncrementRequest)["amount"]
        return Response({"value": self.store.increment(session_id, key, amount, idempotency=once)})


class HistoryView(MemoryAPIView):
    @extend_schema(
        parameters=[
            SESSION_ID,
            OpenApiParameter("limit", int, description="Newest N entries, oldest first; 0 for all."),
        ],
        responses={200: s.History, **SESSION_ERRORS},
        operation_id="history",
        summary="A session's history",
    )
    def get(self, request: Request, session_id: str) -> Response:
        limit = self.validated(s.HistoryQuery, request.query_params)["limit"]
        return Response({"session_id": session_id, "entries": self.store.get_history(session_id, limit)})


class SummarizeView(MemoryAPIView):
    @extend_schema(
        request=s.SummarizeRequest,
        parameters=[SESSION_ID, IDEMPOTENCY_KEY],
        examples=[
            request_example(
                "Keep the 10 newest entries",
                {"max_history": 10},
                description="Folds older entries into one summary entry; `{}` uses MAX_HISTORY.",
            )
        ],
        responses={200: s.SummarizeResponse, **WRITE_ERRORS},
        operation_id="summarize",
        summary="Summarize the history now",
    )
    def post(self, request: Request, session_id: str) -> Response:
        once = self.idempotency()
        max_history = self.validated(s.SummarizeRequest).get("max_history")
        summarized = self.store.summarize(session_id, max_history, idempotency=once)
        return Response({"session_id": session_id, "summarized": summarized})


# Health and unknown paths ---------------------------------------------------


class OpenView(MemoryAPIView):
    """Open to all, whatever the API's auth; no owner, no throttle."""

    def get_permissions(self) -> list[Any]:
        return [AllowAny()]

    def get_throttles(self) -> list[Any]:
        return []

    def perform_authentication(self, request: Request) -> None:
        pass  # lazily, when a view asks: bad credentials must not turn a health check into a 401

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        APIView.initial(self, request, *args, **kwargs)  # no owner needed


def _is_staff(request: Request) -> bool:
    try:
        user = request.user
    except (APIException, DatabaseError):  # bad credentials, or no database to check them
        return False
    return bool(getattr(user, "is_staff", False))


class HealthView(OpenView):
    """Load balancers and uptime checks call it without credentials; they learn only the status."""

    @extend_schema(
        operation_id="health",
        responses={200: s.Health, 503: s.Health},
        auth=[],
        summary="Whether the backend and the database answer",
        description=(
            "Anyone gets `status`; staff also get each part (the store backend, the database) "
            "with its own status, latency and any error. With database-backed authentication no "
            "caller is recognised as staff while the database is down: everyone then gets `status`."
        ),
    )
    def get(self, request: Request) -> Response:
        report = health_report(get_store())
        code = status.HTTP_200_OK if report["status"] == OK else status.HTTP_503_SERVICE_UNAVAILABLE
        body = report if _is_staff(request) else {"status": report["status"]}
        headers = {"Retry-After": str(memory_settings.RETRY_AFTER_SECONDS)} if code != 200 else None
        return Response(body, status=code, headers=headers)


class NotFoundView(OpenView):
    """JSON 404 for any other path under the API, never an HTML page."""

    schema = None  # not an endpoint

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        path = request.path
        try:
            with_slash = resolve(path + "/").url_name != "not-found"
        except Resolver404:
            with_slash = False
        raise NotFound(f"Not found. API paths end with '/': try {path}/" if with_slash else None)
