"""How the API answers errors: ``{"detail": "...", "code": "..."}`` with the right status.

Store exceptions become DRF ``APIException`` s; every error body then carries a
machine ``code`` (validation errors add their field ``errors``). A database that cannot
be reached is a 503 like a store backend that cannot; any other exception nothing
handled is logged with its traceback and answered as a JSON 500, never an HTML page.

A server-side error (5xx, 507 included) also carries a ``request_id`` (and the
``X-Request-ID`` header) and a plain message: its details (a backend's address, a
script hash, a traceback) go to the ``persistent_memory.api`` logger under that id,
never to the caller (see :mod:`persistent_memory.errors.reporting`).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import DisallowedHost, RequestDataTooBig, SuspiciousOperation
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings

from persistent_memory import exceptions as memory_errors
from persistent_memory.conf import memory_settings
from persistent_memory.errors.reporting import REQUEST_ID_HEADER, caller_detail, new_request_id

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
        super().__init__(detail=caller_detail(error), code=error.code)


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class DisallowedHostError(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request's Host header names no host this site serves."
    default_code = "disallowed_host"


class MalformedBody(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request body could not be read: its chunked encoding is malformed."
    default_code = "malformed_body"


class BadRequest(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "Bad request."
    default_code = "bad_request"


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
    if isinstance(exc, DisallowedHost):
        return DisallowedHostError()
    if isinstance(exc, SuspiciousOperation):  # too many fields, a malformed header...
        return BadRequest()
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return DatabaseUnavailable()
    return exc


def error_body(exc: exceptions.APIException) -> dict[str, Any]:
    """``{"detail", "code"}``, plus ``errors`` for field validation errors."""
    if isinstance(exc.detail, dict | list):
        return {"detail": "Invalid input.", "code": "invalid", "errors": exc.detail}
    return {"detail": str(exc.detail), "code": getattr(exc.detail, "code", None) or exc.default_code}


def error_answer(
    error: exceptions.APIException, cause: BaseException | None, *, method: str, path: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The body and the headers of the answer to ``error`` (translated from ``cause``).

    A server-side error gets a request id, in the body and a header, and ``cause``'s
    details are logged under it: callers see a plain message only.
    """
    body = error_body(error)
    headers: dict[str, str] = {}
    if error.status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
        headers["Retry-After"] = str(memory_settings.RETRY_AFTER_SECONDS)
    if error.status_code < status.HTTP_500_INTERNAL_SERVER_ERROR:
        return body, headers
    request_id = body["request_id"] = headers[REQUEST_ID_HEADER] = new_request_id()
    if isinstance(error, ServerError):
        logger.error(
            "persistent_memory: unhandled exception in %s %s (request %s)",
            method,
            path,
            request_id,
            exc_info=None if cause is None else (type(cause), cause, cause.__traceback__),
        )
    elif isinstance(error, DatabaseUnavailable):
        logger.warning(
            "persistent_memory: the database is unavailable: %s (%s %s, request %s)",
            cause,
            method,
            path,
            request_id,
        )
    else:
        logger.warning(
            "persistent_memory: %s %s answered %s %s (request %s): %s",
            method,
            path,
            error.status_code,
            body["code"],
            request_id,
            cause,
        )
    return body, headers


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The project's DRF exception handler, fed translated exceptions, with our body shape.

    An exception nothing handled is answered as a JSON 500; ``got_request_exception`` is
    sent as Django sends it for exceptions that leave a view, so error trackers and the
    test client still see the exception.
    """
    api_error = translate(exc)
    response = api_settings.EXCEPTION_HANDLER(api_error, context)
    request = context.get("request")
    if response is None:
        got_request_exception.send(sender=None, request=getattr(request, "_request", request))
        api_error = ServerError()
        response = Response(status=api_error.status_code)
    if not isinstance(api_error, exceptions.APIException):
        return response  # the project's handler answered an exception of its own
    body, headers = error_answer(
        api_error, exc, method=getattr(request, "method", "?"), path=getattr(request, "path", "?")
    )
    response.data = body
    for name, value in headers.items():
        response[name] = value
    return response
