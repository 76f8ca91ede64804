"""System checks for ``PERSISTENT_MEMORY`` (ids ``persistent_memory.E00x`` / ``W00x``)."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string

from persistent_memory.backends import backend_class
from persistent_memory.conf import DEFAULTS, MIRROR_MODES, PROFILES, SETTING_NAME, MemorySettings

_POSITIVE_INTS = (
    "MAX_HISTORY",
    "MAX_SESSIONS",
    "MAX_VALUE_BYTES",
    "MAX_BATCH",
    "MAX_REQUEST_BYTES",
    "RETRY_AFTER_SECONDS",
    "ADMIN_SYNC_LIMIT",
)
_CLASS_LISTS = ("API_PERMISSION_CLASSES", "API_AUTHENTICATION_CLASSES")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_names(user: Any) -> list[CheckMessage]:
    if not isinstance(user, dict):
        return [Error(f"{SETTING_NAME} must be a dict.", id="persistent_memory.E005")]
    errors: list[CheckMessage] = []
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        errors.append(
            Error(
                f"{SETTING_NAME} has unknown keys: {', '.join(map(str, unknown))}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="persistent_memory.E005",
            )
        )
    if user.get("PROFILE", DEFAULTS["PROFILE"]) not in PROFILES:
        errors.append(
            Error(
                f"{SETTING_NAME}['PROFILE'] is {user['PROFILE']!r}.",
                hint=f"Use one of {', '.join(sorted(PROFILES))}.",
                id="persistent_memory.E005",
            )
        )
    return errors


def _check_numbers(conf: MemorySettings) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name in _POSITIVE_INTS:
        value = getattr(conf, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                Error(
                    f"{SETTING_NAME}['{name}'] is {value!r}.",
                    hint="Use a positive integer.",
                    id="persistent_memory.E002",
                )
            )
    for name in ("SESSION_TTL_HOURS", "REDIS_SOCKET_TIMEOUT"):
        value = getattr(conf, name)
        if not _is_number(value) or value < 0:
            errors.append(
                Error(
                    f"{SETTING_NAME}['{name}'] is {value!r}.",
                    hint="Use a number that is 0 or more.",
                    id="persistent_memory.E002",
                )
            )
    if not _is_number(conf.RUN_BINDING_TTL_SECONDS) or conf.RUN_BINDING_TTL_SECONDS <= 0:
        errors.append(
            Error(
                f"{SETTING_NAME}['RUN_BINDING_TTL_SECONDS'] is {conf.RUN_BINDING_TTL_SECONDS!r}.",
                hint="Use a positive number of seconds.",
                id="persistent_memory.E002",
            )
        )
    if conf.MIRROR_MODE is not None and conf.MIRROR_MODE not in MIRROR_MODES:
        errors.append(
            Error(
                f"{SETTING_NAME}['MIRROR_MODE'] is {conf.MIRROR_MODE!r}.",
                hint=f"Use one of {', '.join(MIRROR_MODES)}, or None for the backend's default.",
                id="persistent_memory.E008",
            )
        )
    port = conf.REDIS_PORT
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        errors.append(
            Error(
                f"{SETTING_NAME}['REDIS_PORT'] is {port!r}.",
                hint="Use a port from 1 to 65535.",
                id="persistent_memory.E002",
            )
        )
    prefix = conf.KEY_PREFIX
    if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
        errors.append(
            Error(
                f"{SETTING_NAME}['KEY_PREFIX'] is {prefix!r}.",
                hint="Use a non-empty string without spaces, such as 'rr:memory'.",
                id="persistent_memory.E006",
            )
        )
    return errors


def _check_api_classes(conf: MemorySettings) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name in _CLASS_LISTS:
        value = getattr(conf, name)
        if value is None:
            continue
        try:
            if not isinstance(value, list | tuple):
                raise TypeError("not a list of import strings")
            for path in value:
                import_string(path)
        except (ImportError, TypeError) as exc:
            errors.append(
                Error(
                    f"{SETTING_NAME}['{name}'] is {value!r}: {exc}",
                    hint="Use a list of import strings of DRF classes, or None for the project's defaults.",
                    id="persistent_memory.E007",
                )
            )
    return errors


def _check_backend(conf: MemorySettings) -> list[CheckMessage]:
    try:
        cls = backend_class(conf.BACKEND)
    except (ImportError, TypeError, ValueError) as exc:
        return [
            Error(
                f"{SETTING_NAME}['BACKEND'] is {conf.BACKEND!r}: {exc}",
                hint="Use 'memory', 'redis' or an import string to a BaseBackend subclass.",
                id="persistent_memory.E001",
            )
        ]
    from persistent_memory.backends.redis import RedisBackend

    if not issubclass(cls, RedisBackend):
        return []
    alias = conf.REDIS_CACHE_ALIAS
    if alias:
        cache = getattr(settings, "CACHES", {}).get(alias)
        if not cache or not str(cache.get("BACKEND", "")).startswith("django_redis."):
            return [
                Error(
                    f"{SETTING_NAME}['REDIS_CACHE_ALIAS'] is {alias!r}: not a django-redis cache in CACHES.",
                    hint="Name a CACHES entry whose BACKEND is django_redis.cache.RedisCache.",
                    id="persistent_memory.E004",
                )
            ]
        return []
    if not conf.REDIS_URL and not conf.REDIS_HOST:
        return [
            Error(
                "The redis backend has no address.",
                hint=f"Set {SETTING_NAME}['REDIS_URL'], REDIS_HOST or REDIS_CACHE_ALIAS.",
                id="persistent_memory.E003",
            )
        ]
    return []


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report a configuration the store could not be built from."""
    user = getattr(settings, SETTING_NAME, {})
    errors = _check_names(user)
    if errors:
        return errors
    conf = MemorySettings(user)
    return _check_numbers(conf) + _check_backend(conf) + _check_api_classes(conf)


@register(Tags.compatibility, deploy=True)
def check_deploy(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn that the memory backend is private to each server process."""
    user = getattr(settings, SETTING_NAME, {})
    conf = MemorySettings(user if isinstance(user, dict) else {})
    if conf.BACKEND != "memory":
        return []
    return [
        Warning(
            "The memory backend keeps sessions inside each process: several server workers "
            "would each see their own sessions.",
            hint=f"Use {SETTING_NAME}['BACKEND'] = 'redis' (or PROFILE 'redis') in production.",
            id="persistent_memory.W001",
        )
    ]
