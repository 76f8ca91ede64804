"""Error handlers for the project's URLconf: JSON on the API's paths, Django's pages elsewhere.

Django answers some errors before any view runs, with its own HTML pages: a ``Host``
header not in ``ALLOWED_HOSTS``, a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``, an
exception in a middleware (a database that went away while the session or the user
is read). These handlers answer them as the API answers every error, ``{"detail",
"code"}`` (plus ``request_id`` for server-side ones), on every path that resolves into
the API's URLconf, wherever the project mounts it. Elsewhere (the admin, the site)
they answer as Django's defaults do, except that a database that cannot be reached
is a 503 page that says so, not a bare "Server Error (500)". In the project's root
URLconf::

    handler400 = "persistent_memory.api.error_views.bad_request"
    handler403 = "persistent_memory.api.error_views.permission_denied"
    handler404 = "persistent_memory.api.error_views.page_not_found"
    handler500 = "persistent_memory.api.error_views.server_error"

(DRF's ``rest_framework.exceptions.bad_request``/``server_error`` answer JSON on every
path, with no code and no request id: the admin would then answer JSON too.)

With ``DEBUG`` on, Django calls none of these for an exception raised before a view (a
bad ``Host``, a body too big, a middleware's exception): it renders its debug page
itself. :class:`APIErrorsMiddleware`, first in ``MIDDLEWARE``, answers those as JSON on
the API's paths too, so that the API's errors do not change with ``DEBUG``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import TemplateDoesNotExist, loader
from django.urls import Resolver404, resolve
from django.utils.html import escape
from django.views import defaults
from django.views.debug import ExceptionReporter
from rest_framework import exceptions
from rest_framework.response import Response

from persistent_memory.api.errors import (
    DATABASE_UNAVAILABLE,
    BadRequest,
    DatabaseUnavailable,
    ServerError,
    error_answer,
    translate,
)
from persistent_memory.api.urls import app_name as API_APP_NAME

#: The page a database outage shows outside the API.
UNAVAILABLE_TEMPLATE = "persistent_memory/503.html"


def is_api_request(request: HttpRequest) -> bool:
    """Whether the request's path resolves into the API's URLconf (where it is mounted)."""
    try:
        match = resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return False
    return API_APP_NAME in match.app_names


def _json(request: HttpRequest, error: exceptions.APIException, cause: BaseException | None) -> JsonResponse:
    body, headers = error_answer(error, cause, method=request.method or "?", path=request.path)
    return JsonResponse(body, status=error.status_code, headers=headers)


def _as_api_error(
    exception: BaseException | None, fallback: exceptions.APIException
) -> exceptions.APIException:
    """The API's error for ``exception`` (a bad host, a body too big...), else ``fallback``."""
    translated = translate(exception) if isinstance(exception, Exception) else None
    return translated if isinstance(translated, exceptions.APIException) else fallback


def bad_request(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    """400 (413 for a body too big): a bad host, an unreadable body, too many fields."""
    if not is_api_request(request):
        return defaults.bad_request(request, exception)
    return _json(request, _as_api_error(exception, BadRequest()), exception)


def permission_denied(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    """403 raised outside the API's views."""
    if not is_api_request(request):
        return defaults.permission_denied(request, exception)
    return _json(request, exceptions.PermissionDenied(), exception)


def page_not_found(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    """404 raised outside the API's views."""
    if not is_api_request(request):
        return defaults.page_not_found(request, exception)
    return _json(request, exceptions.NotFound(), exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """500 for an exception nothing handled; 503 when it is the database being unreachable."""
    cause = sys.exc_info()[1]  # Django calls handler500 while handling the exception
    database_down = isinstance(cause, DATABASE_UNAVAILABLE)
    if is_api_request(request):
        return _json(request, DatabaseUnavailable() if database_down else ServerError(), cause)
    if not database_down:
        return defaults.server_error(request)
    error = DatabaseUnavailable()
    body, headers = error_answer(error, cause, method=request.method or "?", path=request.path)
    try:
        page = loader.get_template(UNAVAILABLE_TEMPLATE).render(body)  # no request: no context processors
    except TemplateDoesNotExist:  # a project without APP_DIRS: still a page that says it
        page = f"<h1>Service unavailable (503)</h1><p>{escape(body['detail'])}</p>"
    return HttpResponse(page, status=error.status_code, headers=headers)


#: The request attribute where :class:`APIErrorsMiddleware` finds the exception Django's
#: debug page was rendered for.
_DEBUG_CAUSE = "_persistent_memory_debug_cause"


class _NotingReporter(ExceptionReporter):
    """Django's exception reporter, noting on the request the exception it reports."""

    def __init__(
        self,
        request: HttpRequest | None,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if request is not None:
            setattr(request, _DEBUG_CAUSE, exc_value)
        super().__init__(request, exc_type, exc_value, tb, *args, **kwargs)


class APIErrorsMiddleware:
    """JSON errors on the API's paths with ``DEBUG`` on, as with it off.

    With ``DEBUG`` on, Django answers an exception raised before a view with its debug
    page (HTML, with the request's headers and the settings), not with the project's
    handlers. This middleware, first in ``MIDDLEWARE``, replaces such a page on an API
    path by the handlers' answer: a bad ``Host`` is 400 ``disallowed_host``, a body too
    big 413, the database down 503, anything else 500, none of them showing a host or an
    address. It learns which exception the page was for from the exception reporter
    Django renders the page with (set on API requests here). With ``DEBUG`` off it does
    nothing: Django calls the handlers then.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not settings.DEBUG or not is_api_request(request):
            return self.get_response(request)
        request.exception_reporter_class = _NotingReporter  # type: ignore[attr-defined]
        response = self.get_response(request)
        if response.status_code < 400 or isinstance(response, Response | JsonResponse):
            return response  # the API's own answers, and the handlers'
        cause = getattr(request, _DEBUG_CAUSE, None)
        if response.status_code == 404:  # Django's debug 404 page
            return page_not_found(request, cause)
        if response.status_code < 500:
            return _json(request, _as_api_error(cause, BadRequest()), cause)
        database_down = isinstance(cause, DATABASE_UNAVAILABLE)
        return _json(request, DatabaseUnavailable() if database_down else ServerError(), cause)
