"""Settings for persistent_memory, read from one ``PERSISTENT_MEMORY`` dict.

Works the way DRF reads ``REST_FRAMEWORK``: ``memory_settings.MAX_HISTORY`` looks the
name up in the project's dict, then in the chosen ``PROFILE`` preset, then in
``DEFAULTS``. Values are read on first access and cached; Django's
``setting_changed`` signal (sent by ``override_settings``) clears the cache and
rebuilds the store, so tests never patch module attributes.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

SETTING_NAME = "PERSISTENT_MEMORY"

DEFAULTS: dict[str, Any] = {
    "PROFILE": "memory",
    # "memory", "redis", or an import string to a BaseBackend subclass.
    "BACKEND": "memory",
    "REDIS_URL": None,
    "REDIS_HOST": None,
    "REDIS_PORT": 6379,
    "REDIS_PASSWORD": None,
    "REDIS_DB": 0,
    # Alias of a django-redis cache in CACHES whose connection to reuse.
    "REDIS_CACHE_ALIAS": None,
    "REDIS_SOCKET_TIMEOUT": 5.0,
    # "single" (one server), "cluster" (Redis Cluster, seeded by REDIS_URL or REDIS_HOST)
    # or "sentinel" (the master that REDIS_SENTINELS name for REDIS_SENTINEL_SERVICE).
    "REDIS_TOPOLOGY": "single",
    # Sentinels as "host:port" strings, the master's service name, the sentinels' password.
    "REDIS_SENTINELS": [],
    "REDIS_SENTINEL_SERVICE": "mymaster",
    "REDIS_SENTINEL_PASSWORD": None,
    # Key layout: "node" or "cluster" (a session's keys in one hash slot); None: "cluster" on a
    # cluster, else "node".
    "REDIS_LAYOUT": None,
    # Replicas a write waits for (Redis WAIT; 0: none), and for at most how many milliseconds.
    "REDIS_WAIT_REPLICAS": 0,
    "REDIS_WAIT_TIMEOUT_MS": 1000,
    "KEY_PREFIX": "rr:memory",
    "SESSION_TTL_HOURS": 0,
    # Idle expiry: sessions expire this long after their last write (None/0: off), and
    # with IDLE_TTL_REFRESH_ON_READ after their last read too; with a fixed TTL as well,
    # whichever comes first. Sessions created with their own idle_ttl_seconds keep it.
    "SESSION_IDLE_TTL_SECONDS": None,
    "IDLE_TTL_REFRESH_ON_READ": False,
    "MAX_HISTORY": 100,
    "AUTO_SUMMARIZE": True,
    "MAX_SESSIONS": 1000,
    # Sessions one owner may hold (None: no cap but, on the memory backend, a tenth of
    # MAX_SESSIONS, so that one owner cannot take every place).
    "MAX_SESSIONS_PER_OWNER": None,
    "MAX_VALUE_BYTES": 1024 * 1024,
    # How deep a value, or an API request body, may nest (lists and objects). Deeper JSON
    # is refused before anything is written; Python's own limit (about 1000 frames,
    # shared with the stack serving the request) must stay far away.
    "MAX_JSON_DEPTH": 100,
    # Keys plus values of one session, in bytes of JSON (None: no cap).
    "MAX_SESSION_BYTES": 16 * 1024 * 1024,
    # ORM mirror: "immediate" (write-behind worker), "deferred" (admin page loads and
    # `memory_mirror`), "off"; None picks immediate for memory and deferred for Redis.
    "MIRROR_MODE": None,
    # The memory backend's write-ahead journal (a directory) and its idempotency records:
    # None gives the default database a folder of its own (beside an SQLite file, else
    # BASE_DIR/memory-journal/<server-and-name>); False turns it off. See journal.py.
    "JOURNAL_DIR": None,
    # How many dirty sessions the admin syncs before showing a page.
    "ADMIN_SYNC_LIMIT": 500,
    # How long the REST API remembers which session a pipeline run_id enriched.
    "RUN_BINDING_TTL_SECONDS": 3600,
    # How long a write's Idempotency-Key (and its recorded answer) is remembered.
    "IDEMPOTENCY_TTL_SECONDS": 86400,
    # REST API: import strings; None uses the project's REST_FRAMEWORK defaults.
    # None: the project's defaults plus IsAuthenticated (closed to anonymous callers).
    "API_PERMISSION_CLASSES": None,
    "API_AUTHENTICATION_CLASSES": None,
    # None: the project's DEFAULT_THROTTLE_CLASSES; rates: None uses REST_FRAMEWORK's.
    "API_THROTTLE_CLASSES": None,
    "API_THROTTLE_RATES": None,
    # Import string of a callable (request) -> owner string, or None to refuse (403).
    "OWNER_RESOLVER": "persistent_memory.resolvers.user_owner",
    # At most this many entries per process/ call, and messages per append.
    "MAX_BATCH": 100,
    # Conversations (see persistent_memory.conversations): how tokens are counted
    # ("o200k_base", "cl100k_base", "chars", or an import string), the default window
    # (None: no limit of that kind), the messages one conversation keeps, the largest
    # message (bytes of JSON), and whether the lanes record questions and answers.
    "TOKENIZER": "o200k_base",
    "CONTEXT_MAX_TOKENS": 8000,
    "CONTEXT_MAX_MESSAGES": 100,
    "MAX_MESSAGES": 1000,
    "MAX_MESSAGE_BYTES": 1024 * 1024,
    "RECORD_CONVERSATION": True,
    # Rolling summaries (persistent_memory.conversations.summaries): the default strategy
    # of windows ("truncation" or "rolling_summary"), the summary's budget, what to do when
    # summary and messages do not fit ("truncate_oldest", "truncate_summary", "error"),
    # the pending tokens that send a conversation to the summarizer, the summarizer (an
    # import string; None: the extractive one when summaries are on) and its options,
    # whether a worker thread in this process summarizes, and how long a summary may take.
    "CONTEXT_STRATEGY": "truncation",
    "SUMMARY_MAX_TOKENS": 1000,
    "CONTEXT_OVERFLOW": "truncate_oldest",
    "SUMMARIZE_AFTER_TOKENS": 4000,
    "SUMMARIZER": None,
    "SUMMARIZER_OPTIONS": {},
    "SUMMARIZER_WORKER": True,
    "SUMMARIZER_TIMEOUT_SECONDS": 30,
    # The summarizers' health (persistent_memory.conversations.health): failures in a row
    # before they are "degraded", the first retry's wait (doubled at each failure), and
    # how long "degraded" waits before trying again. With SUMMARIZER_TASKS the worker
    # thread enqueues a task on Django's task framework (TASKS) instead of summarizing.
    "SUMMARIZER_RETRY_ATTEMPTS": 3,
    "SUMMARIZER_BACKOFF_SECONDS": 1.0,
    "SUMMARIZER_DEGRADED_SECONDS": 300,
    "SUMMARIZER_TASKS": False,
    # Long-term memories (persistent_memory.memories, in the project's database): the
    # largest content (characters) and metadata (bytes of JSON); days after its last
    # update a memory is deleted by memory_sweep (None: kept until its own expires_at);
    # an import string of a callable (list of texts) -> list of vectors for semantic
    # search (None: no semantic search; hybrid fuses keyword and recency); the memory
    # extractors (import strings of callables (messages) -> candidate memories); whether
    # a worker thread in this process extracts from new messages as they are written
    # (on when there are extractors), and how many writes' messages its queue holds
    # before it drops them (memory_extract catches up); the chat-completions extractor's
    # options (over SUMMARIZER_OPTIONS' model, base_url, api_key_env and timeout); whether
    # the enrich lane attaches the memories relevant to the question, within how many
    # tokens, found by which strategy.
    "MEMORY_MAX_CONTENT_CHARS": 4000,
    "MEMORY_MAX_METADATA_BYTES": 16 * 1024,
    "MEMORY_RETENTION_DAYS": None,
    "EMBEDDER": None,
    "MEMORY_EXTRACTORS": ["persistent_memory.memories.extraction.rules.extract"],
    "MEMORY_EXTRACTION_WORKER": True,
    "MEMORY_EXTRACTION_QUEUE_SIZE": 1000,
    "MEMORY_EXTRACTOR_OPTIONS": {},
    "INJECT_MEMORIES": False,
    "MEMORY_MAX_TOKENS": 500,
    "MEMORY_SEARCH_STRATEGY": "hybrid",
    # The MCP endpoint over streamable HTTP (persistent_memory.mcp.http) keeps one server
    # per owner: at most this many (a new owner evicts the least recently used), each
    # evicted after this many seconds unused (None: only the bound evicts).
    "MCP_MAX_SERVERS": 100,
    "MCP_SERVER_IDLE_SECONDS": 900,
    "MAX_REQUEST_BYTES": 2 * 1024 * 1024 + 64 * 1024,
    "RETRY_AFTER_SECONDS": 5,
}

#: The seed node's profiles. Keys the project sets explicitly override these.
PROFILES: dict[str, dict[str, Any]] = {
    "memory": {"BACKEND": "memory", "SESSION_TTL_HOURS": 0},
    "redis": {"BACKEND": "redis", "REDIS_HOST": "localhost", "REDIS_PORT": 6379, "SESSION_TTL_HOURS": 24},
    "custom": {"BACKEND": "redis", "REDIS_HOST": "", "SESSION_TTL_HOURS": 0},
}


class MemorySettings:
    """Lazy view of ``settings.PERSISTENT_MEMORY`` over the profile and defaults."""

    def __init__(self, user_settings: dict[str, Any] | None = None) -> None:
        self._explicit = user_settings
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict[str, Any]:
        """The project's own dict (empty when unset or not a dict; checks report that)."""
        if self._explicit is not None:
            return self._explicit
        value = getattr(settings, SETTING_NAME, None)
        return value if isinstance(value, dict) else {}

    def profile(self) -> dict[str, Any]:
        """The preset named by ``PROFILE`` (empty for an unknown name; checks report it)."""
        name = self.user_settings.get("PROFILE", DEFAULTS["PROFILE"])
        return PROFILES.get(name, {}) if isinstance(name, str) else {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Invalid persistent_memory setting: {name!r}")
        try:
            return self._cache[name]
        except KeyError:
            pass
        user = self.user_settings
        value = user[name] if name in user else self.profile().get(name, DEFAULTS[name])
        self._cache[name] = value
        return value

    def reload(self) -> None:
        """Forget cached values so the next access reads the settings again."""
        self._cache.clear()


memory_settings = MemorySettings()

MIRROR_MODES = ("immediate", "deferred", "off")


def owner_session_cap(conf: MemorySettings) -> int | None:
    """Sessions one owner may hold on this backend (None: no cap).

    On the memory backend every owner shares MAX_SESSIONS places in one process, so an
    owner without an explicit cap gets at most a tenth of them (at least one). Ten owners
    at that cap fill the process but lock nobody out: a full process still admits an owner
    below its fair share (see ``MemoryBackend._admit``).
    """
    cap = conf.MAX_SESSIONS_PER_OWNER
    if conf.BACKEND == "memory":
        share = max(1, conf.MAX_SESSIONS // 10)
        return share if cap is None else min(cap, conf.MAX_SESSIONS)
    return cap


def summaries_on(conf: MemorySettings) -> bool:
    """Whether conversations get rolling summaries: the strategy asks for them, or a
    summarizer is configured."""
    return conf.CONTEXT_STRATEGY == "rolling_summary" or conf.SUMMARIZER is not None


def summarize_after_tokens(conf: MemorySettings) -> int | None:
    """The backend's marking threshold: SUMMARIZE_AFTER_TOKENS when summaries are on."""
    return conf.SUMMARIZE_AFTER_TOKENS if summaries_on(conf) else None


#: The values of REDIS_LAYOUT (besides None).
REDIS_LAYOUTS = ("node", "cluster")


def redis_layout(conf: MemorySettings) -> str:
    """The effective REDIS_LAYOUT: "cluster" on REDIS_TOPOLOGY "cluster" unless set."""
    if conf.REDIS_LAYOUT is not None:
        return conf.REDIS_LAYOUT
    return "cluster" if conf.REDIS_TOPOLOGY == "cluster" else "node"


def mirror_mode(conf: MemorySettings) -> str:
    """The effective MIRROR_MODE (its default depends on the backend)."""
    if conf.MIRROR_MODE is not None:
        return conf.MIRROR_MODE
    return "immediate" if conf.BACKEND == "memory" else "deferred"


#: Settings whose change reaches the store (CACHES too: REDIS_CACHE_ALIAS borrows a
#: cache's connection). The store module's own receiver rebuilds the store on them.
RELOADED_BY = (SETTING_NAME, "CACHES")


@receiver(setting_changed)
def _reload_settings(*, setting: str, **kwargs: Any) -> None:
    if setting in RELOADED_BY:
        memory_settings.reload()
