"""How the API answers errors: ``{"detail": "...", "code": "..."}`` with the right status.

Store exceptions become DRF ``APIException`` s; every error body then carries a
machine ``code`` (validation errors add their field ``errors``). A database that cannot
be reached is a 503 like a store backend that cannot; any other exception nothing
handled is logged with its traceback and answered as a JSON 500, never an HTML page.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings

from persistent_memory import exceptions as memory_errors
from persistent_memory.conf import memory_settings

logger = logging.getLogger("persistent_memory.api")

#: Database errors that mean the database cannot be used now (down, unreachable,
#: restarting, out of connections, locked), rather than a wrong query.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)

#: Store exception -> HTTP status (subclasses before their bases).
STATUS_BY_ERROR: list[tuple[type[memory_errors.PersistentMemoryError], int]] = [
    (memory_errors.SessionExpired, status.HTTP_410_GONE),
    (memory_errors.SessionNotFound, status.HTTP_404_NOT_FOUND),
    (memory_errors.KeyNotFound, status.HTTP_404_NOT_FOUND),
    (memory_errors.MessageNotFound, status.HTTP_404_NOT_FOUND),
    (memory_errors.MemoryNotFound, status.HTTP_404_NOT_FOUND),
    (memory_errors.MemoryKeyExists, status.HTTP_409_CONFLICT),
    (memory_errors.MessageConflict, status.HTTP_409_CONFLICT),
    (memory_errors.SessionExists, status.HTTP_409_CONFLICT),
    (memory_errors.IdempotencyKeyReused, status.HTTP_422_UNPROCESSABLE_ENTITY),
    (memory_errors.ContextOverflow, status.HTTP_422_UNPROCESSABLE_ENTITY),
    (memory_errors.CapacityExceeded, status.HTTP_507_INSUFFICIENT_STORAGE),
    (memory_errors.ValueTooLarge, status.HTTP_413_REQUEST_ENTITY_TOO_LARGE),
    (memory_errors.BackendUnavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
    (memory_errors.PersistentMemoryError, status.HTTP_400_BAD_REQUEST),
]


class MemoryAPIError(exceptions.APIException):
    """A store exception as an API error."""

    def __init__(self, error: memory_errors.PersistentMemoryError, status_code: int) -> None:
        self.status_code = status_code
        super().__init__(detail=str(error), code=error.code)


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class LengthRequired(exceptions.APIException):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_detail = "This server cannot read a body sent without Content-Length (chunked): send its length."
    default_code = "length_required"


class DatabaseUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The database is unavailable; try again later."
    default_code = "database_unavailable"


class ServerError(exceptions.APIException):
    status_code = status.HTTP_500_INTERNAL_SERVER_ERROR
    default_detail = "A server error occurred."
    default_code = "server_error"


def translate(exc: Exception) -> Exception:
    """The API exception for ``exc`` (unchanged when it is not the store's)."""
    if isinstance(exc, memory_errors.PersistentMemoryError):
        for error_class, status_code in STATUS_BY_ERROR:
            if isinstance(exc, error_class):
                return MemoryAPIError(exc, status_code)
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge()
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return DatabaseUnavailable()
    return exc


def error_body(exc: exceptions.APIException) -> dict[str, Any]:
    """``{"detail", "code"}``, plus ``errors`` for field validation errors."""
    if isinstance(exc.detail, dict | list):
        return {"detail": "Invalid input.", "code": "invalid", "errors": exc.detail}
    return {"detail": str(exc.detail), "code": getattr(exc.detail, "code", None) or exc.default_code}


def server_error(exc: Exception, context: dict[str, Any]) -> Response:
    """Log an exception nothing handled, with its traceback, and answer a JSON 500.

    ``got_request_exception`` is sent as Django sends it for exceptions that leave a
    view, so error trackers and the test client still see the exception.
    """
    request = context.get("request")
    django_request = getattr(request, "_request", request)
    logger.error(
        "persistent_memory: unhandled exception in %s %s",
        getattr(request, "method", "?"),
        getattr(request, "path", "?"),
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    got_request_exception.send(sender=None, request=django_request)
    error = ServerError()
    return Response(error_body(error), status=error.status_code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The project's DRF exception handler, fed translated exceptions, with our body shape."""
    if isinstance(exc, DATABASE_UNAVAILABLE):
        logger.warning("persistent_memory: the database is unavailable: %s", exc)
    api_error = translate(exc)
    response = api_settings.EXCEPTION_HANDLER(api_error, context)
    if response is None:
        return server_error(exc, context)
    if not isinstance(api_error, exceptions.APIException):
        return response
    response.data = error_body(api_error)
    if response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
        response["Retry-After"] = str(memory_settings.RETRY_AFTER_SECONDS)
    return response
