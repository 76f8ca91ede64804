"""How the API answers errors: ``{"detail": "...", "code": "..."}`` with the right status.

Store exceptions become DRF ``APIException`` s; every error body then carries a
machine ``code`` (validation errors add their field ``errors``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings

from persistent_memory import exceptions as memory_errors
from persistent_memory.conf import memory_settings

#: Store exception -> HTTP status (subclasses before their bases).
STATUS_BY_ERROR: list[tuple[type[memory_errors.PersistentMemoryError], int]] = [
    (memory_errors.SessionExpired, status.HTTP_410_GONE),
    (memory_errors.SessionNotFound, status.HTTP_404_NOT_FOUND),
    (memory_errors.KeyNotFound, status.HTTP_404_NOT_FOUND),
    (memory_errors.SessionExists, status.HTTP_409_CONFLICT),
    (memory_errors.IdempotencyKeyReused, status.HTTP_422_UNPROCESSABLE_ENTITY),
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


def translate(exc: Exception) -> Exception:
    """The API exception for ``exc`` (unchanged when it is not the store's)."""
    if isinstance(exc, memory_errors.PersistentMemoryError):
        for error_class, status_code in STATUS_BY_ERROR:
            if isinstance(exc, error_class):
                return MemoryAPIError(exc, status_code)
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge()
    return exc


def error_body(exc: exceptions.APIException) -> dict[str, Any]:
    """``{"detail", "code"}``, plus ``errors`` for field validation errors."""
    if isinstance(exc.detail, dict | list):
        return {"detail": "Invalid input.", "code": "invalid", "errors": exc.detail}
    return {"detail": str(exc.detail), "code": getattr(exc.detail, "code", None) or exc.default_code}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The project's DRF exception handler, fed translated exceptions, with our body shape."""
    exc = translate(exc)
    response = api_settings.EXCEPTION_HANDLER(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    response.data = error_body(exc)
    if response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE:
        response["Retry-After"] = str(memory_settings.RETRY_AFTER_SECONDS)
    return response
