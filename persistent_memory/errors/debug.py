"""Keeping the Redis and database passwords out of Django's error reports (the DEBUG
page, error mails).

Django hides a setting whose *name* looks secret (``REDIS_PASSWORD``, ``DATABASES``'
``PASSWORD``), not a password inside a value: ``PERSISTENT_MEMORY["REDIS_URL"]``, the
``LOCATION`` of the django-redis cache named by ``REDIS_CACHE_ALIAS``, a ``REDIS_URL``
or ``DATABASE_URL`` environment variable (runserver copies the environment into
``request.META``), or a frame's local variables: a URL, or psycopg's ``conninfo``,
``params`` and ``kwargs`` when PostgreSQL cannot be reached.
:class:`SafeExceptionReporterFilter` masks every configured password (Redis and each
of ``DATABASES``) wherever the report shows a value (settings, request META and
cookies, every frame's local variables), and the password of any URL
(``scheme://user:password@``) or ``password=...`` pair it shows, with DEBUG on or off::

    DEFAULT_EXCEPTION_REPORTER_FILTER = "persistent_memory.errors.debug.SafeExceptionReporterFilter"
"""

from __future__ import annotations

import pprint
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

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
    given = (memory_settings.REDIS_PASSWORD, memory_settings.REDIS_SENTINEL_PASSWORD)
    found = {password for password in given if isinstance(password, str) and password}
    return (
        found
        | _url_passwords(memory_settings.REDIS_URL)
        | _cache_passwords(memory_settings.REDIS_CACHE_ALIAS)
    )


def database_passwords() -> set[str]:
    """Every database password the settings configure (``PASSWORD``, or ``password`` in
    ``OPTIONS``), in each form a report could show it: as is, URL-encoded, and quoted as
    in a libpq conninfo string."""
    databases = getattr(settings, "DATABASES", None)
    found: set[str] = set()
    for database in databases.values() if isinstance(databases, dict) else ():
        if not isinstance(database, dict):
            continue
        options = database.get("OPTIONS")
        in_options = options.get("password") if isinstance(options, dict) else None
        for password in (database.get("PASSWORD"), in_options):
            if isinstance(password, str) and password:
                found |= {password, quote(password, safe=""), quote_plus(password)}
                found.add(password.replace("\\", "\\\\").replace("'", "\\'"))  # conninfo's escapes
    return found


def secret_passwords() -> set[str]:
    """The Redis and database passwords a report must never show."""
    return redis_passwords() | database_passwords()


#: A password wherever a value spells one out, configured or not: a URL's userinfo
#: (``postgres://user:pw@host``), and ``password=pw`` or ``'password': 'pw'`` (a
#: conninfo string, a query string, a dict's repr).
#: A scheme starts where no scheme character stands before it (else every position of a
#: long run of letters would be a start to try: quadratic on a large body in a frame).
_URL_PASSWORD = re.compile(
    r"(?P<head>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://[^/@\s:'\"]*:)[^@\s'\"]+(?=@)"
)
_PAIR_PASSWORD = re.compile(
    r"(?P<head>\b(?:password|passwd)['\"]?\s*[:=]\s*)"
    r"(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&'\",)}]+)",
    re.IGNORECASE,
)


class _Masked:
    """A value shown as its masked text (the report prints values with ``repr``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class SafeExceptionReporterFilter(debug.SafeExceptionReporterFilter):
    """Django's filter, plus every configured Redis and database password, and any
    password a URL or a ``password=`` pair spells out, masked in every value shown."""

    def mask(self, value: Any, passwords: Iterable[str]) -> Any:
        """``value``, or what the report should show instead when it contains a password."""
        passwords = sorted(passwords, key=len, reverse=True)  # a longer one may contain a shorter
        if isinstance(value, str):
            text = value
        else:
            try:
                text = pprint.pformat(value)
            except Exception:  # the report prints its own "Error in formatting"
                return value
        masked = text
        for password in passwords:
            # As is, and as a repr shows it inside quotes (backslashes and quotes escaped).
            for form in (password, repr(password)[1:-1]):
                masked = masked.replace(form, self.cleansed_substitute)
        substitute = rf"\g<head>{self.cleansed_substitute}"
        masked = _PAIR_PASSWORD.sub(substitute, _URL_PASSWORD.sub(substitute, masked))
        if masked == text:
            return value
        return masked if isinstance(value, str) else _Masked(masked)

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        # Settings, request META and cookies all go through here.
        return self.mask(super().cleanse_setting(key, value), secret_passwords())

    def get_traceback_frame_variables(self, request: HttpRequest | None, tb_frame: Any) -> Any:
        passwords = secret_passwords()
        variables = super().get_traceback_frame_variables(request, tb_frame)
        return [(name, self.mask(value, passwords)) for name, value in variables]
