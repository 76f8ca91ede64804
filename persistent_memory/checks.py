"""System checks for ``PERSISTENT_MEMORY`` (ids ``persistent_memory.E00x`` / ``W00x``)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from django.utils.module_loading import import_string

from persistent_memory.backends import backend_class
from persistent_memory.chat.tokens import TIKTOKEN_ENCODINGS
from persistent_memory.conf import (
    DEFAULTS,
    MIRROR_MODES,
    PROFILES,
    REDIS_LAYOUTS,
    SETTING_NAME,
    MemorySettings,
    redis_layout,
)
from persistent_memory.conversations.summaries import OVERFLOWS, STRATEGIES
from persistent_memory.errors.debug import SafeExceptionReporterFilter, secret_passwords
from persistent_memory.memories.embedders import OPENAI_OPTIONS


def _is_int(value: Any, low: int, high: int | None = None) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= low
        and (high is None or value <= high)
    )


def _is_number(value: Any, *, positive: bool = False) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


def _class_list(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, list | tuple):
        return False
    try:
        for path in value:
            import_string(path)
    except (ImportError, TypeError):
        return False
    return True


POSITIVE_INTEGER = "Use a positive integer."
#: Parsing, checking and answering JSON recurse once per level, on top of the frames
#: serving the request: well under Python's default recursion limit of 1000.
MAX_JSON_DEPTH_CEILING = 500
OPTIONAL_POSITIVE_INTEGER = "Use a positive integer, or None for no cap."


def _import_string(value: Any) -> bool:
    try:
        return isinstance(value, str) and callable(import_string(value))
    except ImportError:
        return False


def _tokenizer(value: Any) -> bool:
    return isinstance(value, str) and (value in (*TIKTOKEN_ENCODINGS, "chars") or _import_string(value))


def _rates(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in value.items())
    )


#: The long-term memory search strategies (persistent_memory.memories.search.STRATEGIES).
MEMORY_STRATEGIES = ("recent", "keyword", "semantic", "hybrid")


#: (setting, whether a value is valid, hint, check id)
RULES: list[tuple[str, Callable[[Any], bool], str, str]] = [
    *(
        (name, lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002")
        for name in (
            "MAX_HISTORY",
            "MAX_SESSIONS",
            "MAX_VALUE_BYTES",
            "MAX_BATCH",
            "MAX_REQUEST_BYTES",
            "RETRY_AFTER_SECONDS",
            "ADMIN_SYNC_LIMIT",
            "MAX_MESSAGE_BYTES",
        )
    ),
    (
        "MAX_MESSAGES",
        lambda v: _is_int(v, 2),
        "Use an integer of 2 or more (a trim keeps the newest message and what it needs).",
        "E002",
    ),
    *(
        (name, lambda v: v is None or _is_int(v, 1), "Use a positive integer, or None for no limit.", "E002")
        for name in ("CONTEXT_MAX_TOKENS", "CONTEXT_MAX_MESSAGES")
    ),
    ("RECORD_CONVERSATION", lambda v: isinstance(v, bool), "Use True or False.", "E002"),
    (
        "CONTEXT_STRATEGY",
        lambda v: v in STRATEGIES,
        f"Use one of {', '.join(STRATEGIES)}.",
        "E002",
    ),
    (
        "CONTEXT_OVERFLOW",
        lambda v: v in OVERFLOWS,
        f"Use one of {', '.join(OVERFLOWS)}.",
        "E002",
    ),
    *(
        (name, lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002")
        for name in ("SUMMARY_MAX_TOKENS", "SUMMARIZE_AFTER_TOKENS")
    ),
    (
        "SESSION_IDLE_TTL_SECONDS",
        lambda v: v is None or _is_number(v),
        "Use a number of seconds that is 0 or more, or None (0 and None: no idle expiry).",
        "E002",
    ),
    ("IDLE_TTL_REFRESH_ON_READ", lambda v: isinstance(v, bool), "Use True or False.", "E002"),
    (
        "TOKENIZER",
        _tokenizer,
        "Use 'o200k_base', 'cl100k_base', 'chars', or the import string of a callable (text) -> int.",
        "E011",
    ),
    *(
        (name, lambda v: v is None or _is_int(v, 1), OPTIONAL_POSITIVE_INTEGER, "E002")
        for name in ("MAX_SESSIONS_PER_OWNER", "MAX_SESSION_BYTES")
    ),
    (
        "MAX_JSON_DEPTH",
        lambda v: _is_int(v, 1, MAX_JSON_DEPTH_CEILING),
        f"Use an integer from 1 to {MAX_JSON_DEPTH_CEILING} (deeper JSON nears Python's recursion limit).",
        "E002",
    ),
    ("SESSION_TTL_HOURS", _is_number, "Use a number that is 0 or more.", "E002"),
    (
        "REDIS_SOCKET_TIMEOUT",
        lambda v: _is_number(v, positive=True),
        "Use a positive number of seconds.",
        "E002",
    ),
    ("REDIS_DB", lambda v: _is_int(v, 0), "Use a database number of 0 or more.", "E002"),
    ("AUTO_SUMMARIZE", lambda v: isinstance(v, bool), "Use True or False.", "E002"),
    (
        "REDIS_URL",
        lambda v: v is None or (isinstance(v, str) and v.startswith(("redis://", "rediss://", "unix://"))),
        "Use a URL such as redis://host:6379/0 (or rediss://, unix://).",
        "E003",
    ),
    (
        "RUN_BINDING_TTL_SECONDS",
        lambda v: _is_number(v, positive=True),
        "Use a positive number of seconds.",
        "E002",
    ),
    (
        "IDEMPOTENCY_TTL_SECONDS",
        lambda v: _is_number(v, positive=True),
        "Use a positive number of seconds.",
        "E002",
    ),
    ("REDIS_PORT", lambda v: _is_int(v, 1, 65535), "Use a port from 1 to 65535.", "E002"),
    (
        "KEY_PREFIX",
        lambda v: isinstance(v, str) and bool(v) and not any(c.isspace() for c in v),
        "Use a non-empty string without spaces, such as 'rr:memory'.",
        "E006",
    ),
    (
        "API_PERMISSION_CLASSES",
        _class_list,
        "Use a list of import strings of DRF classes, or None for the project's defaults.",
        "E007",
    ),
    (
        "API_AUTHENTICATION_CLASSES",
        _class_list,
        "Use a list of import strings of DRF classes, or None for the project's defaults.",
        "E007",
    ),
    (
        "API_THROTTLE_CLASSES",
        _class_list,
        "Use a list of import strings of DRF throttle classes, or None for the project's defaults.",
        "E007",
    ),
    (
        "API_THROTTLE_RATES",
        _rates,
        "Use a dict of scope to rate, such as {'persistent_memory': '600/min'}, or None.",
        "E007",
    ),
    (
        "OWNER_RESOLVER",
        _import_string,
        "Use the import string of a callable (request) -> owner or None, such as "
        "'persistent_memory.owners.resolvers.user_owner'.",
        "E009",
    ),
    (
        "JOURNAL_DIR",
        lambda v: v is None or v is False or (isinstance(v, str | os.PathLike) and bool(str(v))),
        "Use a folder path, None (a folder of the database's own, see JOURNAL_DIR) or False (no journal).",
        "E010",
    ),
    *(
        (name, lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002")
        for name in ("MEMORY_MAX_CONTENT_CHARS", "MEMORY_MAX_METADATA_BYTES", "MEMORY_MAX_TOKENS")
    ),
    (
        "MEMORY_RETENTION_DAYS",
        lambda v: v is None or _is_number(v, positive=True),
        "Use a positive number of days, or None to keep memories until their own expires_at.",
        "E002",
    ),
    ("INJECT_MEMORIES", lambda v: isinstance(v, bool), "Use True or False.", "E002"),
    ("MEMORY_KEEP_SUPERSEDED", lambda v: isinstance(v, bool), "Use True or False.", "E002"),
    ("MCP_MAX_SERVERS", lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002"),
    (
        "MCP_SERVER_IDLE_SECONDS",
        lambda v: v is None or _is_number(v, positive=True),
        "Use a positive number of seconds, or None to evict only by MCP_MAX_SERVERS.",
        "E002",
    ),
    (
        "MEMORY_SEARCH_STRATEGY",
        lambda v: v in MEMORY_STRATEGIES,
        f"Use one of {', '.join(MEMORY_STRATEGIES)} (semantic needs an EMBEDDER).",
        "E012",
    ),
    (
        "MEMORY_SEARCH_KINDS",
        lambda v: (
            isinstance(v, list | tuple) and bool(v) and all(kind in ("memory", "message") for kind in v)
        ),
        'Use a non-empty list of "memory" and "message".',
        "E012",
    ),
    ("MESSAGE_EMBEDDINGS", lambda v: v is None or isinstance(v, bool), "Use None, True or False.", "E012"),
    (
        "EMBEDDER",
        lambda v: v is None or (v == "openai" and _import_string("openai.OpenAI")) or _import_string(v),
        'Use None, "openai" (with the openai package: pip install "django-persistent-memory[openai]"), '
        "or the import string of a callable (list of texts) -> list of vectors.",
        "E012",
    ),
    (
        "EMBEDDER_OPTIONS",
        lambda v: isinstance(v, dict) and set(v) <= set(OPENAI_OPTIONS),
        f"Use a dict of the openai embedder's options: {', '.join(OPENAI_OPTIONS)}.",
        "E012",
    ),
    *(
        (name, lambda v: _is_number(v, positive=True), "Use a positive number of seconds.", "E002")
        for name in ("EMBEDDER_REQUEST_TIMEOUT", "EMBEDDER_CIRCUIT_SECONDS")
    ),
    *(
        (name, lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002")
        for name in ("EMBEDDER_CIRCUIT_FAILURES", "EMBEDDER_MAX_DIMENSIONS", "EMBEDDER_QUEUE_SIZE")
    ),
    ("EMBEDDER_WORKER", lambda v: isinstance(v, bool), "Use True or False.", "E002"),
    ("MEMORY_VECTOR_SCAN_LIMIT", lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002"),
    (
        "MEMORY_DEDUP_DISTANCE",
        lambda v: v is None or (_is_number(v) and v < 2),
        "Use a cosine distance from 0 to 2 (0.05: near-identical), or None to never merge.",
        "E002",
    ),
    *(
        (
            name,
            lambda v: v is None or _is_number(v, positive=True),
            "Use a positive number of days, or None.",
            "E002",
        )
        for name in ("MEMORY_HALF_LIFE_DAYS", "MEMORY_INACTIVE_DAYS")
    ),
    ("MEMORY_HYBRID_ALPHA", lambda v: _is_number(v) and v <= 1, "Use a number from 0 to 1.", "E002"),
    (
        "MEMORY_ACCESS_WEIGHT",
        lambda v: _is_number(v),
        "Use a number, 0 or more (0: access counts do not count).",
        "E002",
    ),
    (
        "MEMORY_MAX_PER_OWNER",
        lambda v: v is None or _is_int(v, 1),
        "Use a positive integer, or None.",
        "E002",
    ),
    (
        "MEMORY_EXTRACTORS",
        lambda v: isinstance(v, list | tuple) and all(_import_string(item) for item in v),
        "Use a list of import strings of callables (messages) -> candidates, such as "
        "['persistent_memory.memories.extraction.rules.extract'], or [] for none.",
        "E012",
    ),
    ("MEMORY_EXTRACTION_WORKER", lambda v: isinstance(v, bool), "Use True or False.", "E002"),
    ("MEMORY_EXTRACTION_QUEUE_SIZE", lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002"),
    (
        "MEMORY_EXTRACTOR_OPTIONS",
        lambda v: isinstance(v, dict),
        "Use a dict of the chat-completions extractor's keyword arguments.",
        "E002",
    ),
    (
        "MIRROR_MODE",
        lambda v: v is None or v in MIRROR_MODES,
        f"Use one of {', '.join(MIRROR_MODES)}, or None for the backend's default.",
        "E008",
    ),
    (
        "SUMMARIZER",
        lambda v: v is None or _import_string(v),
        "Use None (the extractive summarizer) or the import string of a summarizer class, such as "
        "'persistent_memory.conversations.chat_completions.ChatCompletionsSummarizer'.",
        "E013",
    ),
    ("SUMMARIZER_OPTIONS", lambda v: isinstance(v, dict), "Use a dict of keyword arguments.", "E002"),
    *(
        (name, lambda v: isinstance(v, bool), "Use True or False.", "E002")
        for name in ("SUMMARIZER_WORKER", "SUMMARIZER_TASKS")
    ),
    ("SUMMARIZER_RETRY_ATTEMPTS", lambda v: _is_int(v, 1), POSITIVE_INTEGER, "E002"),
    ("TASK_DEBOUNCE_SECONDS", _is_number, "Use a number of seconds, 0 or more.", "E002"),
    *(
        (name, lambda v: _is_number(v, positive=True), "Use a positive number of seconds.", "E002")
        for name in (
            "SUMMARIZER_TIMEOUT_SECONDS",
            "SUMMARIZER_BACKOFF_SECONDS",
            "SUMMARIZER_DEGRADED_SECONDS",
        )
    ),
]


def _check_memories(conf: MemorySettings) -> list[CheckMessage]:
    if conf.MEMORY_SEARCH_STRATEGY == "semantic" and not conf.EMBEDDER:
        return [
            Error(
                f"{SETTING_NAME}['MEMORY_SEARCH_STRATEGY'] is 'semantic' but no EMBEDDER is configured.",
                hint="Configure an EMBEDDER, or use 'hybrid' (keyword and recency without one).",
                id="persistent_memory.E012",
            )
        ]
    options, cap = conf.EMBEDDER_OPTIONS, conf.EMBEDDER_MAX_DIMENSIONS
    dimensions = options.get("dimensions") if isinstance(options, dict) else None
    if _is_int(dimensions, 1) and _is_int(cap, 1) and dimensions > cap:
        return [
            Error(
                f"{SETTING_NAME}['EMBEDDER_OPTIONS']['dimensions'] is {dimensions}, more than "
                f"EMBEDDER_MAX_DIMENSIONS ({conf.EMBEDDER_MAX_DIMENSIONS}): every vector would be refused.",
                hint="Raise EMBEDDER_MAX_DIMENSIONS, or ask the model for shorter vectors.",
                id="persistent_memory.E012",
            )
        ]
    return []


def _bad(name: str, value: Any, hint: str, code: str, reason: str = "") -> Error:
    return Error(f"{SETTING_NAME}['{name}'] is {value!r}{reason}.", hint=hint, id=f"persistent_memory.{code}")


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
    profile = user.get("PROFILE", DEFAULTS["PROFILE"])
    if profile not in PROFILES:
        errors.append(_bad("PROFILE", profile, f"Use one of {', '.join(sorted(PROFILES))}.", "E005"))
    return errors


def _check_backend(conf: MemorySettings) -> list[CheckMessage]:
    try:
        cls = backend_class(conf.BACKEND)
    except (ImportError, TypeError, ValueError) as exc:
        hint = "Use 'memory', 'redis' or an import string to a BaseBackend subclass."
        return [_bad("BACKEND", conf.BACKEND, hint, "E001", f": {exc}")]
    from persistent_memory.backends.redis import RedisBackend

    if not issubclass(cls, RedisBackend):
        return []
    errors = _check_redis(conf)
    alias = conf.REDIS_CACHE_ALIAS
    if alias:
        cache = getattr(settings, "CACHES", {}).get(alias)
        if not cache or not str(cache.get("BACKEND", "")).startswith("django_redis."):
            hint = "Name a CACHES entry whose BACKEND is django_redis.cache.RedisCache."
            errors.append(
                _bad("REDIS_CACHE_ALIAS", alias, hint, "E004", ": not a django-redis cache in CACHES")
            )
        return errors
    if errors:
        return errors
    return _check_topology(conf)


def _check_redis(conf: MemorySettings) -> list[CheckMessage]:
    """The Redis backend's layout and replication settings (whatever gives its connection)."""
    from persistent_memory.backends.redis.topology import TOPOLOGIES

    errors: list[CheckMessage] = []
    if conf.REDIS_TOPOLOGY not in TOPOLOGIES:
        hint = f"Use one of {', '.join(TOPOLOGIES)}."
        errors.append(_bad("REDIS_TOPOLOGY", conf.REDIS_TOPOLOGY, hint, "E015"))
    if conf.REDIS_LAYOUT is not None and conf.REDIS_LAYOUT not in REDIS_LAYOUTS:
        hint = f"Use one of {', '.join(REDIS_LAYOUTS)}, or None for the topology's default."
        errors.append(_bad("REDIS_LAYOUT", conf.REDIS_LAYOUT, hint, "E015"))
    elif conf.REDIS_TOPOLOGY == "cluster" and redis_layout(conf) != "cluster":
        hint = "Use 'cluster' (or None): on Redis Cluster every key an operation touches must share a slot."
        errors.append(_bad("REDIS_LAYOUT", conf.REDIS_LAYOUT, hint, "E015", " with REDIS_TOPOLOGY 'cluster'"))
    if not _is_int(conf.REDIS_WAIT_REPLICAS, 0):
        hint = "Use the number of replicas a write waits for: an integer of 0 (none) or more."
        errors.append(_bad("REDIS_WAIT_REPLICAS", conf.REDIS_WAIT_REPLICAS, hint, "E017"))
    if not _is_int(conf.REDIS_WAIT_TIMEOUT_MS, 1):
        hint = "Use a positive number of milliseconds (WAIT's 0 would wait forever)."
        errors.append(_bad("REDIS_WAIT_TIMEOUT_MS", conf.REDIS_WAIT_TIMEOUT_MS, hint, "E017"))
    if not isinstance(conf.REDIS_READ_FROM_REPLICAS, bool):
        hint = "Use True (reads on replicas) or False (every call on the primary)."
        errors.append(_bad("REDIS_READ_FROM_REPLICAS", conf.REDIS_READ_FROM_REPLICAS, hint, "E017"))
    return errors


def _url_database(conf: MemorySettings) -> Any:
    """The database the connection would select: REDIS_URL's (path or ?db=), else REDIS_DB."""
    from redis.connection import parse_url

    if not conf.REDIS_URL:
        return conf.REDIS_DB
    try:
        return parse_url(conf.REDIS_URL).get("db", 0)
    except ValueError:
        return 0  # E003 reports the URL


def _check_topology(conf: MemorySettings) -> list[CheckMessage]:
    """The address each REDIS_TOPOLOGY needs (REDIS_CACHE_ALIAS replaces all of them)."""
    from persistent_memory.backends.redis.topology import parse_sentinels

    if conf.REDIS_TOPOLOGY == "sentinel":
        try:
            sentinels = parse_sentinels(conf.REDIS_SENTINELS)
        except ValueError as exc:
            hint = "Use a list of 'host:port' strings, such as ['sentinel-1:26379', 'sentinel-2:26379']."
            return [_bad("REDIS_SENTINELS", conf.REDIS_SENTINELS, hint, "E016", f": {exc}")]
        errors: list[CheckMessage] = []
        if not sentinels:
            hint = "List the sentinels as 'host:port' strings, such as ['sentinel-1:26379']."
            errors.append(
                _bad("REDIS_SENTINELS", conf.REDIS_SENTINELS, hint, "E016", " with REDIS_TOPOLOGY 'sentinel'")
            )
        service = conf.REDIS_SENTINEL_SERVICE
        if not isinstance(service, str) or not service:
            hint = "Use the master's name in the sentinels' configuration, such as 'mymaster'."
            errors.append(_bad("REDIS_SENTINEL_SERVICE", service, hint, "E016"))
        return errors
    if not conf.REDIS_URL and not conf.REDIS_HOST:
        return [
            Error(
                "The redis backend has no address.",
                hint=f"Set {SETTING_NAME}['REDIS_URL'], REDIS_HOST or REDIS_CACHE_ALIAS.",
                id="persistent_memory.E003",
            )
        ]
    database = _url_database(conf)
    if conf.REDIS_TOPOLOGY == "cluster" and database != 0:
        hint = "Redis Cluster has database 0 only: drop the URL's /db (or ?db=) and REDIS_DB."
        return [
            Error(
                f"{SETTING_NAME} selects database {database!r} on REDIS_TOPOLOGY 'cluster'.",
                hint=hint,
                id="persistent_memory.E015",
            )
        ]
    return []


def _unreachable_sentinels(conf: MemorySettings) -> str | None:
    """Why no sentinel of REDIS_SENTINELS answers PING within REDIS_SOCKET_TIMEOUT (None: one does)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from persistent_memory.backends.redis.topology import parse_sentinels

    reasons = []
    for host, port in parse_sentinels(conf.REDIS_SENTINELS):
        client = redis.Redis(
            host=host,
            port=port,
            password=conf.REDIS_SENTINEL_PASSWORD or None,
            socket_timeout=conf.REDIS_SOCKET_TIMEOUT,
            socket_connect_timeout=conf.REDIS_SOCKET_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            client.ping()
            return None
        except redis.RedisError as exc:
            reasons.append(f"{host}:{port}: {exc}")
        finally:
            client.close()
    return "; ".join(reasons)


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report a configuration the store could not be built from."""
    user = getattr(settings, SETTING_NAME, {})
    errors = _check_names(user)
    if errors:
        return errors
    conf = MemorySettings(user)
    values = [
        _bad(name, getattr(conf, name), hint, code)
        for name, valid, hint, code in RULES
        if not valid(getattr(conf, name))
    ]
    return values + _check_backend(conf) + _check_memories(conf) + _check_tasks(conf)


def _check_task_backend(conf: MemorySettings) -> list[CheckMessage]:
    """TASK_BACKEND names an alias of TASKS, with a task framework installed."""
    alias = conf.TASK_BACKEND
    if alias is None:
        return []
    from persistent_memory.tasks import task_framework

    hint = "Use None (worker threads in this process) or an alias of TASKS, with django-tasks on Django 5.2."
    if not isinstance(alias, str) or not alias:
        return [_bad("TASK_BACKEND", alias, hint, "E018")]
    framework = task_framework()
    if framework is None:
        reason = ": neither django.tasks (Django 6) nor the django-tasks package is installed"
        return [_bad("TASK_BACKEND", alias, hint, "E018", reason)]
    tasks_setting = getattr(settings, "TASKS", None) or {framework.DEFAULT_TASK_BACKEND_ALIAS: {}}
    if alias not in tasks_setting:
        return [_bad("TASK_BACKEND", alias, hint, "E018", f": TASKS has no {alias!r}")]
    return []


def _check_tasks(conf: MemorySettings) -> list[CheckMessage]:
    """SUMMARIZER_TASKS needs a task framework, and a TASKS setting to enqueue on."""
    if conf.SUMMARIZER_TASKS is not True:
        return _check_task_backend(conf)
    from persistent_memory.tasks import task_framework

    if task_framework() is None:
        reason = ": neither django.tasks (Django 6) nor the django-tasks package is installed"
    elif not settings.is_overridden("TASKS"):
        reason = ": the project sets no TASKS (the default backend would run the task inline)"
    else:
        return _check_task_backend(conf)
    hint = "Install django-tasks (Django 5.2) and configure TASKS, or set SUMMARIZER_TASKS to False."
    return [_bad("SUMMARIZER_TASKS", True, hint, "E014", reason), *_check_task_backend(conf)]


@register(Tags.compatibility)
def check_task_backend_inline(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when TASK_BACKEND's backend runs tasks inline (ImmediateBackend) with DEBUG off:
    extraction, summaries and embedding would run inside the requests that write."""
    user = getattr(settings, SETTING_NAME, {})
    if settings.DEBUG or not isinstance(user, dict) or check_settings():
        return []
    alias = MemorySettings(user).TASK_BACKEND
    backend = ((getattr(settings, "TASKS", None) or {}).get(alias) or {}).get("BACKEND", "")
    if not str(backend).endswith(".ImmediateBackend"):
        return []
    return [
        Warning(
            f"{SETTING_NAME}['TASK_BACKEND'] is {alias!r}, whose ImmediateBackend runs memory "
            "extraction, summaries and embedding inside the requests that write (a model call "
            "in the request's time).",
            hint="Use a backend with a worker (django-tasks-db's db_worker, RQ, Celery), or None "
            "for the app's worker threads.",
            id="persistent_memory.W010",
        )
    ]


def _anonymous_let_in() -> bool:
    """Whether the API's effective permissions let an anonymous request through."""
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory
    from rest_framework.request import Request

    from persistent_memory.api.views import SessionListView

    view = SessionListView()
    request = Request(RequestFactory().get("/"), authenticators=[])
    request.user = AnonymousUser()
    view.request = request
    try:
        permissions = view.get_permissions()
    except (ImportError, TypeError):
        return False  # E007 reports it
    return all(permission.has_permission(request, view) for permission in permissions)


def _unjournaled(conf: MemorySettings) -> bool:
    """Whether a memory backend that restores from its mirror runs without a journal: by
    default it has one on every database but an in-memory SQLite; False is a choice."""
    from django.db import DEFAULT_DB_ALIAS, connections

    from persistent_memory.conf import mirror_mode
    from persistent_memory.journal import journal_directory

    if conf.BACKEND != "memory" or mirror_mode(conf) != "immediate" or conf.JOURNAL_DIR is False:
        return False
    # As deployed: a test environment's own default (no journal) is not the deployment's.
    database = connections.databases.get(DEFAULT_DB_ALIAS, {})
    return journal_directory(conf.JOURNAL_DIR, database, testing=False) is None


def _sqlite_deferred() -> str | None:
    """The alias of the database the memories are written to when it is SQLite without
    ``"transaction_mode": "IMMEDIATE"``: there a background thread's write (the mirror,
    extraction, embedding) that meets a request's fails at once with "database is locked"
    (a deferred transaction that read first cannot wait for the write lock)."""
    from django.db import connections, router

    from persistent_memory.models import LongTermMemory

    alias = router.db_for_write(LongTermMemory)
    database = connections.databases.get(alias, {})
    options = database.get("OPTIONS") or {}
    sqlite = database.get("ENGINE") == "django.db.backends.sqlite3"
    return alias if sqlite and str(options.get("transaction_mode", "")).upper() != "IMMEDIATE" else None


@register(Tags.security, deploy=True)
def check_deploy(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn about deployments that share memory between processes or callers they should not."""
    user = getattr(settings, SETTING_NAME, {})
    if not isinstance(user, dict) or check_settings():
        return []  # the errors come first
    conf = MemorySettings(user)
    warnings: list[CheckMessage] = []
    if conf.BACKEND == "memory":
        warnings.append(
            Warning(
                "The memory backend keeps sessions inside each process: several server workers "
                "would each see their own sessions.",
                hint=f"Use {SETTING_NAME}['BACKEND'] = 'redis' (or PROFILE 'redis') in production.",
                id="persistent_memory.W001",
            )
        )
    if _anonymous_let_in():
        warnings.append(
            Warning(
                "The memory API's permissions let anonymous callers in.",
                hint=(
                    f"Remove {SETTING_NAME}['API_PERMISSION_CLASSES'] (the default needs an authenticated "
                    "caller) or list classes that refuse anonymous requests."
                ),
                id="persistent_memory.W002",
            )
        )
    if conf.OWNER_RESOLVER in (
        "persistent_memory.owners.resolvers.shared_owner",
        "persistent_memory.resolvers.shared_owner",  # its path before 0.1 (deprecated)
    ):
        warnings.append(
            Warning(
                "OWNER_RESOLVER puts every API caller in one shared namespace: each can read, change "
                "and delete every other caller's sessions.",
                hint=(
                    "Use the default, 'persistent_memory.owners.resolvers.user_owner', "
                    "or one per user or tenant."
                ),
                id="persistent_memory.W003",
            )
        )
    if _unjournaled(conf):
        warnings.append(
            Warning(
                "The memory backend has no crash journal (the default database is in memory): "
                "writes the mirror has not synced yet (about half a second of them) are lost if "
                "the process is killed.",
                hint=f"Use a database on disk, or set {SETTING_NAME}['JOURNAL_DIR'] to a local folder.",
                id="persistent_memory.W006",
            )
        )
    cap = conf.MAX_SESSIONS_PER_OWNER
    if conf.BACKEND == "memory" and cap is not None and cap >= conf.MAX_SESSIONS:
        warnings.append(
            Warning(
                "MAX_SESSIONS_PER_OWNER is not below MAX_SESSIONS: on the memory backend a full "
                "process then gives each owner all of its fair share, so that a few owners can take "
                "it to twice MAX_SESSIONS, where even a newcomer is refused.",
                hint="Unset MAX_SESSIONS_PER_OWNER: an owner alone may still use every place, and "
                "past MAX_SESSIONS the others get at most a tenth of it each.",
                id="persistent_memory.W004",
            )
        )
    alias = _sqlite_deferred()
    if alias is not None:
        warnings.append(
            Warning(
                f"The database {alias!r} is SQLite with deferred transactions: a background write "
                "(the mirror, extraction, embedding) that meets a request's fails at once with "
                '"database is locked" and is left to a later catch-up.',
                hint=f'Set DATABASES[{alias!r}]["OPTIONS"] = {{"transaction_mode": "IMMEDIATE", '
                '"timeout": 20, "init_command": "PRAGMA journal_mode=WAL"}, as the demo site does.',
                id="persistent_memory.W009",
            )
        )
    return warnings


@register(Tags.compatibility, deploy=True)
def check_sentinels(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when no sentinel answers (a deployment check: the only one that opens a
    connection, so that `check` stays offline; `check --deploy` asks the network)."""
    user = getattr(settings, SETTING_NAME, {})
    if not isinstance(user, dict) or check_settings():
        return []  # the errors come first
    conf = MemorySettings(user)
    from persistent_memory.backends.redis import RedisBackend

    if (
        not issubclass(backend_class(conf.BACKEND), RedisBackend)
        or conf.REDIS_CACHE_ALIAS
        or conf.REDIS_TOPOLOGY != "sentinel"
    ):
        return []
    reason = _unreachable_sentinels(conf)
    if reason is None:
        return []
    return [
        Warning(
            f"None of REDIS_SENTINELS answers PING within REDIS_SOCKET_TIMEOUT: {reason}.",
            hint=(
                f"Check {SETTING_NAME}['REDIS_SENTINELS'] and REDIS_SENTINEL_PASSWORD, and that the "
                "sentinels run and this host reaches them: without one the store cannot find the master."
            ),
            id="persistent_memory.W007",
        )
    ]


@register(Tags.security)
def check_debug_reports(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when DEBUG pages would show a Redis or database password (in a URL, a
    conninfo string, a driver's local variables)."""
    if not settings.DEBUG or not secret_passwords():
        return []
    try:
        filter_class = import_string(settings.DEFAULT_EXCEPTION_REPORTER_FILTER)
    except ImportError:
        filter_class = None
    if isinstance(filter_class, type) and issubclass(filter_class, SafeExceptionReporterFilter):
        return []
    return [
        Warning(
            "DEBUG is on and a Redis or database password is configured: Django's error pages "
            "would show it (in REDIS_URL, the cache's LOCATION, request.META, and the local "
            "variables of the Redis client or the database driver).",
            hint=(
                "Set DEFAULT_EXCEPTION_REPORTER_FILTER = "
                "'persistent_memory.errors.debug.SafeExceptionReporterFilter' (or a subclass), "
                "or turn DEBUG off."
            ),
            id="persistent_memory.W005",
        )
    ]


@register(Tags.database)
def check_vectors(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """With an EMBEDDER: where semantic search compares vectors, what would compare them
    in the database instead, and vectors another model made (`check --database default`:
    it asks the database)."""
    user = getattr(settings, SETTING_NAME, {})
    if not databases or not isinstance(user, dict) or check_settings():
        return []
    conf = MemorySettings(user)
    if not conf.EMBEDDER:
        return []
    from django.db import DatabaseError, connection

    from persistent_memory.memories import vectors
    from persistent_memory.memories.embedders import model_name
    from persistent_memory.models import LongTermMemory

    try:
        kind = vectors.backend()
        stale = (
            LongTermMemory.objects.filter(embedding__isnull=False)
            .exclude(embedding_model=model_name(conf.EMBEDDER, dict(conf.EMBEDDER_OPTIONS or {})))
            .count()
        )
        offered = vectors.pgvector_available()
    except DatabaseError:
        return []  # the database's own checks say why
    hint = None
    if kind == vectors.NUMPY and connection.vendor == "postgresql":
        hint = (
            "The server has the vector extension: run manage.py memory_embed to add the vector table."
            if offered
            else "Install pgvector on the PostgreSQL server, then run manage.py memory_embed."
        )
    elif kind == vectors.NUMPY and connection.vendor == "sqlite":
        hint = "pip install sqlite-vec, on a Python whose sqlite3 can load extensions."
    messages: list[CheckMessage] = [
        Info(
            f"Semantic search compares vectors with {kind}"
            + (
                f" (at most MEMORY_VECTOR_SCAN_LIMIT={conf.MEMORY_VECTOR_SCAN_LIMIT} per search)."
                if kind == vectors.NUMPY
                else "."
            ),
            hint=hint,
            id="persistent_memory.I001",
        )
    ]
    if stale:
        messages.append(
            Warning(
                f"{stale} memories have vectors of another model than the EMBEDDER's: "
                "semantic search leaves them out.",
                hint="Run manage.py memory_embed to embed them again with the current model.",
                id="persistent_memory.W008",
            )
        )
    return messages
