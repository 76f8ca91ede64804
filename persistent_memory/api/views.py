"""REST views: each validates its body, makes one store or lane call and shapes the answer.

Every view but ``health/`` needs an authenticated caller (unless
``API_PERMISSION_CLASSES`` says otherwise) and works on the caller's owner, resolved
on the server by ``OWNER_RESOLVER``: another owner's session answers exactly as one
that does not exist.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from persistent_memory.api import serializers as s
from persistent_memory.api.errors import PayloadTooLarge, exception_handler
from persistent_memory.api.parsers import MemoryJSONParser
from persistent_memory.backends.base import SessionInfo, remaining_seconds
from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import BackendUnavailable, InvalidOwner, PersistentMemoryError
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.resolvers import resolve_owner
from persistent_memory.store import MemoryStore, get_store
from persistent_memory.validation import validate_run_id


def errors(*statuses: int) -> dict[int, type[Serializer]]:
    """Schema entries for the error statuses an endpoint can answer."""
    return dict.fromkeys((400, 401, 403, 413, 429, 503, *statuses), s.Error)


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


SESSION_ERRORS = errors(404, 410)


def with_remaining(info: SessionInfo) -> dict[str, Any]:
    """A session's info plus the seconds it has left (None: never expires)."""
    return {**info, "ttl_remaining_seconds": remaining_seconds(info)}


class MemoryAPIView(APIView):
    """JSON in and out, the project's auth unless PERSISTENT_MEMORY overrides it."""

    renderer_classes = [JSONRenderer]
    # Refuses, before any store call, JSON the store could not hold exactly (see parsers).
    parser_classes = [MemoryJSONParser]
    schema = AutoSchema()
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

    def validated(self, serializer_class: type[Serializer], data: Any = None) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data if data is None else data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


def _run_id(data: dict[str, Any]) -> str | None:
    run_id = data.get("run_id")
    return None if run_id is None else validate_run_id(run_id)


# The pipeline lanes ---------------------------------------------------------


class EnrichView(MemoryAPIView):
    @extend_schema(
        request=s.EnrichRequest,
        responses={200: s.EnrichResponse, **errors(507)},
        operation_id="enrich",
        summary="Questions lane: attach the session's memory as metadata.memory_context",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.EnrichRequest)
        question, outcome = MemoryFilter(self.store).enrich(data["question"], run_id=_run_id(data))
        return Response({"question": question, "memory": outcome})


class StoreView(MemoryAPIView):
    @extend_schema(
        request=s.StoreRequest,
        responses={200: s.StoreResponse, **errors(507)},
        operation_id="store",
        summary="Answers lane: store the text as last_answer and count it in answer_count",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.StoreRequest)
        answer, outcome = MemoryFilter(self.store).store(data["answer"], run_id=_run_id(data))
        return Response({"answer": answer, "memory": outcome})


class ProcessView(MemoryAPIView):
    @extend_schema(
        request=s.ProcessRequest,
        responses={200: s.ProcessResponse, **errors(507)},
        operation_id="process",
        summary="Both lanes for a batch of entries, in order, as one pipeline item",
        description=(
            "Answers without a session id fall back to the last question's session in the batch. "
            "Each entry is atomic; the batch is not: on an error the body lists under `completed` "
            "the entries processed before it."
        ),
    )
    def post(self, request: Request) -> Response:
        items = self.validated(s.ProcessRequest)["entries"]
        lanes = MemoryFilter(self.store)
        lanes.open()
        results: list[dict[str, Any]] = []
        for item in items:
            lane = lanes.enrich if item["lane"] == "questions" else lanes.store
            try:
                entry, outcome = lane(item["entry"])
            except PersistentMemoryError as exc:
                response = self.handle_exception(exc)
                response.data["completed"] = results
                return response
            results.append({"lane": item["lane"], "entry": entry, "memory": outcome})
        return Response({"entries": results})


# Sessions, values and history -----------------------------------------------


class SessionPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class SessionListView(MemoryAPIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("search", str, description="Only sessions whose id starts with this."),
            OpenApiParameter("page", int),
            OpenApiParameter("page_size", int),
        ],
        responses={200: s.SessionPage, **errors(404)},
        operation_id="sessions_list",
        summary="Live sessions, newest first",
    )
    def get(self, request: Request) -> Response:
        infos = self.store.list_session_infos(request.query_params.get("search", ""))
        paginator = SessionPagination()
        page = paginator.paginate_queryset(infos, request, view=self)
        return paginator.get_paginated_response([with_remaining(info) for info in page or []])

    @extend_schema(
        request=s.SessionCreate,
        responses={201: s.SessionInfo, **errors(409, 507)},
        operation_id="sessions_create",
        summary="Create a session",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.SessionCreate)
        ttl_hours = data.get("ttl_hours")
        info = self.store.create_session(data["session_id"], None if ttl_hours is None else ttl_hours * 3600)
        return Response(with_remaining(info), status=status.HTTP_201_CREATED)


class SessionDetailView(MemoryAPIView):
    @extend_schema(
        responses={200: s.SessionInfo, **SESSION_ERRORS},
        operation_id="session_info",
        summary="A session's info",
    )
    def get(self, request: Request, session_id: str) -> Response:
        return Response(with_remaining(self.store.session_info(session_id)))

    @extend_schema(
        responses={200: s.Cleared, **SESSION_ERRORS},
        operation_id="session_delete",
        summary="Delete a session and all it holds",
    )
    def delete(self, request: Request, session_id: str) -> Response:
        return Response({"session_id": session_id, "cleared": self.store.delete_session(session_id)})


class SessionMemoryView(MemoryAPIView):
    @extend_schema(
        responses={200: s.SessionValues, **SESSION_ERRORS},
        operation_id="memory_get_all",
        summary="Every key and value",
    )
    def get(self, request: Request, session_id: str) -> Response:
        return Response({"session_id": session_id, "values": self.store.get_all(session_id)})

    @extend_schema(
        responses={200: s.Cleared, **SESSION_ERRORS}, operation_id="memory_clear", summary="Clear every key"
    )
    def delete(self, request: Request, session_id: str) -> Response:
        return Response({"session_id": session_id, "cleared": self.store.clear(session_id)})


class KeyView(MemoryAPIView):
    @extend_schema(
        responses={200: s.KeyValue, **SESSION_ERRORS}, operation_id="memory_get", summary="One value"
    )
    def get(self, request: Request, session_id: str, key: str) -> Response:
        return Response({"session_id": session_id, "key": key, "value": self.store.get(session_id, key)})

    @extend_schema(
        request=s.ValuePut,
        responses={200: s.KeyValue, **SESSION_ERRORS},
        operation_id="memory_put",
        summary="Store a value",
    )
    def put(self, request: Request, session_id: str, key: str) -> Response:
        value = self.validated(s.ValuePut)["value"]
        self.store.put(session_id, key, value)
        return Response({"session_id": session_id, "key": key, "value": value})

    @extend_schema(
        responses={200: s.Cleared, **SESSION_ERRORS},
        operation_id="memory_delete",
        summary="Remove a value",
        description="Idempotent: `cleared` is empty when the key was not there.",
    )
    def delete(self, request: Request, session_id: str, key: str) -> Response:
        return Response({"session_id": session_id, "cleared": self.store.clear(session_id, key)})


class IncrementView(MemoryAPIView):
    @extend_schema(
        request=s.IncrementRequest,
        responses={200: s.IncrementResponse, **SESSION_ERRORS},
        operation_id="memory_increment",
        summary="Atomically add to an integer (a missing key counts as 0)",
    )
    def post(self, request: Request, session_id: str, key: str) -> Response:
        amount = self.validated(s.IncrementRequest)["amount"]
        return Response({"value": self.store.increment(session_id, key, amount)})


class HistoryView(MemoryAPIView):
    @extend_schema(
        parameters=[OpenApiParameter("limit", int, description="Newest N entries, oldest first; 0 for all.")],
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
        responses={200: s.SummarizeResponse, **SESSION_ERRORS},
        operation_id="summarize",
        summary="Summarize the history now",
    )
    def post(self, request: Request, session_id: str) -> Response:
        max_history = self.validated(s.SummarizeRequest).get("max_history")
        summarized = self.store.summarize(session_id, max_history)
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
    except APIException:  # bad credentials: answered as to anyone
        return False
    return bool(getattr(user, "is_staff", False))


class HealthView(OpenView):
    """Load balancers and uptime checks call it without credentials; they learn only the status."""

    @extend_schema(
        operation_id="health",
        responses={200: s.Health, 503: s.Health},
        auth=[],
        summary="Whether the backend answers",
        description="Anyone gets `status`; staff also get the backend, its latency and any error.",
    )
    def get(self, request: Request) -> Response:
        store = get_store()
        body: dict[str, Any] = {"backend": store.backend.describe()}
        started = time.perf_counter()
        code = status.HTTP_200_OK
        try:
            store.ping()
        except BackendUnavailable as exc:
            body.update(status="unavailable", detail=str(exc), code=exc.code)
            code = status.HTTP_503_SERVICE_UNAVAILABLE
        else:
            body.update(status="ok", latency_ms=round((time.perf_counter() - started) * 1000, 3))
        if not _is_staff(request):
            body = {"status": body["status"]}
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
