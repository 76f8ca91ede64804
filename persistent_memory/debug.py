"""Keeping the Redis password out of Django's error reports (the DEBUG page, error mails).

Django hides a setting whose *name* looks secret (``REDIS_PASSWORD``), not a password
inside a URL: ``PERSISTENT_MEMORY["REDIS_URL"]``, the ``LOCATION`` of the django-redis
cache named by ``REDIS_CACHE_ALIAS``, a ``REDIS_URL`` environment variable (runserver
copies the environment into ``request.META``), or a local variable holding the URL.
:class:`SafeExceptionReporterFilter` masks the configured password wherever the report
shows a value (settings, request META and cookies, every frame's local variables),
with DEBUG on or off::

    DEFAULT_EXCEPTION_REPORTER_FILTER = "persistent_memory.debug.SafeExceptionReporterFilter"
"""

from __future__ import annotations

import pprint
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit

from django.conf import settings
from django.http import HttpRequest
from django.views import debug

from persistent_memory.conf import memory_settings


def _url_passwords(url: Any) -> set[str]:
    """The password of a Redis URL, as written and decoded (userinfo or ``?password=``)."""
    if not isinstance(url, str):
        return set()
    try:
        parts = urlsplit(url)
        found = {parts.password} if parts.password else set()
    except ValueError:  # not a URL (checks report it); nothing to find in it
        return set()
    for pair in parts.query.split("&"):
        name, _, value = pair.partition("=")
        if unquote_plus(name) == "password" and value:
            found |= {value, unquote_plus(value)}
    return found | {unquote(password) for password in found}


def _cache_passwords(alias: Any) -> set[str]:
    """The passwords in the django-redis cache ``alias`` (its LOCATION and OPTIONS)."""
    caches = getattr(settings, "CACHES", None)
    cache = caches.get(alias) if isinstance(caches, dict) and isinstance(alias, str) else None
    if not isinstance(cache, dict):
        return set()
    location = cache.get("LOCATION")
    urls = location.split(",") if isinstance(location, str) else location
    found = set().union(*(_url_passwords(url) for url in urls)) if isinstance(urls, list | tuple) else set()
    options = cache.get("OPTIONS")
    password = options.get("PASSWORD") if isinstance(options, dict) else None
    return found | ({password} if isinstance(password, str) and password else set())


def redis_passwords() -> set[str]:
    """Every Redis password the settings configure, in each form a report could show it."""
    password = memory_settings.REDIS_PASSWORD
    found = {password} if isinstance(password, str) and password else set()
    return (
        found
        | _url_passwords(memory_settings.REDIS_URL)
        | _cache_passwords(memory_settings.REDIS_CACHE_ALIAS)
    )


class _Masked:
    """A value shown as its masked text (the report prints values with ``repr``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class SafeExceptionReporterFilter(debug.SafeExceptionReporterFilter):
    """Django's filter, plus the configured Redis password masked in every value shown."""

    def mask(self, value: Any, passwords: Iterable[str]) -> Any:
        """``value``, or what the report should show instead when it contains a password."""
        passwords = sorted(passwords, key=len, reverse=True)  # a longer one may contain a shorter
        if not passwords:
            return value
        if isinstance(value, str):
            text = value
        else:
            try:
                text = pprint.pformat(value)
            except Exception:  # the report prints its own "Error in formatting"
                return value
        if not any(password in text for password in passwords):
            return value
        for password in passwords:
            text = text.replace(password, self.cleansed_substitute)
        return text if isinstance(value, str) else _Masked(text)

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        # Settings, request META and cookies all go through here.
        return self.mask(super().cleanse_setting(key, value), redis_passwords())

    def get_traceback_frame_variables(self, request: HttpRequest | None, tb_frame: Any) -> Any:
        passwords = redis_passwords()
        variables = super().get_traceback_frame_variables(request, tb_frame)
        return [(name, self.mask(value, passwords)) for name, value in variables]
