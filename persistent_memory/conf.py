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
    # The preset the other keys start from: "memory", "redis" (localhost:6379, sessions expire after
    # 24 hours) or "custom" (Redis with no address: give one). Keys you set override the preset.
    "PROFILE": "memory",
    # Where sessions live: "memory" (inside each server process), "redis", or the import string of a
    # BaseBackend subclass. Anything else fails `manage.py check` (E001).
    "BACKEND": "memory",
    # The Redis server as a URL, redis://:password@host:6379/0 (or rediss://, unix://); when set it
    # wins over REDIS_HOST, REDIS_PORT, REDIS_PASSWORD and REDIS_DB. Behind Sentinel only its
    # password, database and TLS are used: the sentinels give the host.
    "REDIS_URL": None,
    # The Redis host, used when REDIS_URL is not set. A Redis backend with neither (and no
    # REDIS_CACHE_ALIAS) fails `manage.py check` (E003).
    "REDIS_HOST": None,
    # The Redis port, used with REDIS_HOST (1 to 65535).
    "REDIS_PORT": 6379,
    # The Redis password, used with REDIS_HOST and for the master behind Sentinel (None: none).
    # Django's error pages show it unless the app's exception reporter filter masks it (W005).
    "REDIS_PASSWORD": None,
    # The Redis database number, used with REDIS_HOST and behind Sentinel (0 or more). Redis
    # Cluster has database 0 only: another fails `manage.py check` (E015).
    "REDIS_DB": 0,
    # Alias of a django-redis cache in CACHES whose connection to reuse: it then replaces REDIS_URL,
    # REDIS_HOST and REDIS_TOPOLOGY. An alias that is not a django-redis cache fails the check (E004).
    "REDIS_CACHE_ALIAS": None,
    # Seconds a Redis connection or command may take (a positive number). Past it the call fails
    # and is not sent again (a write could run twice): the REST API answers 503 backend_unavailable.
    "REDIS_SOCKET_TIMEOUT": 5.0,
    # "single" (one server), "cluster" (Redis Cluster, seeded by REDIS_URL or REDIS_HOST)
    # or "sentinel" (the master that REDIS_SENTINELS name for REDIS_SENTINEL_SERVICE).
    "REDIS_TOPOLOGY": "single",
    # With REDIS_TOPOLOGY "sentinel": the sentinels, as "host:port" strings. An empty or malformed
    # list fails `manage.py check` (E016); `check --deploy` warns when none answers (W007).
    "REDIS_SENTINELS": [],
    # With REDIS_TOPOLOGY "sentinel": the master's name in the sentinels' configuration.
    "REDIS_SENTINEL_SERVICE": "mymaster",
    # The sentinels' own password (None: they have none). The master's is REDIS_PASSWORD or
    # REDIS_URL's.
    "REDIS_SENTINEL_PASSWORD": None,
    # Key layout: "node" (the RocketRide node's, byte for byte) or "cluster" (a session's keys in
    # one hash slot, sessions spread over 64 buckets). None: "cluster" on a cluster, else "node".
    # `memory_relayout` moves existing sessions from one to the other.
    "REDIS_LAYOUT": None,
    # Replicas each write waits for (Redis WAIT) before it is answered, so that a failover cannot
    # lose it; 0: none. Fewer confirm in time: 503 replicas_behind (the write may be applied).
    "REDIS_WAIT_REPLICAS": 0,
    # How long a write waits for REDIS_WAIT_REPLICAS, in milliseconds (positive: WAIT's 0 would
    # wait forever).
    "REDIS_WAIT_TIMEOUT_MS": 1000,
    # Reads that write nothing (FCALL_RO: get, get_all, get_context, get_messages, ...) go to a
    # replica: on a cluster each slot's replicas in turn, behind Sentinel the replicas it names
    # (the master when none); the master when a replica cannot answer. A replica lags: a read
    # right after a write may not see it. No effect on one server. Reads that move an idle
    # expiry (IDLE_TTL_REFRESH_ON_READ) write, and stay on the master.
    "REDIS_READ_FROM_REPLICAS": False,
    # Prefix of every Redis key the store uses (non-empty, no spaces; E006). The default is the
    # RocketRide node's, so that both read the same sessions.
    "KEY_PREFIX": "rr:memory",
    # How long a new session lives, in hours (fractions allowed), when its creator gives no TTL;
    # 0: sessions never expire.
    "SESSION_TTL_HOURS": 0,
    # Idle expiry: sessions expire this many seconds after their last write (0: off), and with
    # IDLE_TTL_REFRESH_ON_READ after their last read too; with a fixed TTL as well, whichever
    # comes first. Sessions created with their own idle_ttl_seconds keep it. None: 30 days on the
    # memory backend, so that chats nobody returns to free their place in MAX_SESSIONS while a
    # chat resumed within a month is still there; off on Redis, where memory is the server's.
    "SESSION_IDLE_TTL_SECONDS": None,
    # Whether reading a session's data also pushes back its idle expiry
    # (SESSION_IDLE_TTL_SECONDS); False: only writes do.
    "IDLE_TTL_REFRESH_ON_READ": False,
    # Entries a session's history keeps before it is folded: past it, the older entries become one
    # summary entry and the newest half stay. Also `memory_summarize`'s default limit.
    "MAX_HISTORY": 100,
    # Whether each write folds a history longer than MAX_HISTORY. False: it grows until
    # `memory_summarize --all` (or the summarize endpoint) folds it.
    "AUTO_SUMMARIZE": True,
    # Live sessions one process of the memory backend holds, every owner together (Redis ignores
    # it); every LangGraph thread and agent conversation is one. When full, a new session is
    # refused (507 capacity_exceeded) unless its owner holds fewer than its fair share
    # (MAX_SESSIONS divided by the owners holding sessions), so that owners who filled the
    # process cannot lock a newcomer out.
    "MAX_SESSIONS": 1000,
    # Live sessions one owner may hold; past it a new one is refused (507 capacity_exceeded). None:
    # no cap of its own: an owner alone may use every place of the memory backend, and the fair
    # share of a full process decides between owners.
    "MAX_SESSIONS_PER_OWNER": None,
    # The largest value (or answer stored by the answers lane), in bytes of its JSON; a larger one
    # is refused with 413 value_too_large and nothing is written.
    "MAX_VALUE_BYTES": 1024 * 1024,
    # How deep a value, a memory's metadata or an API request body may nest, 1 to 500: parsing
    # recurses once per level and must stay far from Python's limit (about 1000 frames, shared
    # with the request). Deeper JSON is refused (400 json_too_deep) before anything is written.
    "MAX_JSON_DEPTH": 100,
    # Bytes one session may hold: its keys, values and conversation messages, as JSON, and its
    # LangGraph checkpoints (None: no cap). A write that would go over is refused with 507
    # capacity_exceeded.
    "MAX_SESSION_BYTES": 16 * 1024 * 1024,
    # The admin's copy in the ORM: "immediate" (a worker thread syncs about twice a second; the
    # memory backend also restores its sessions from it at start), "deferred" (synced when staff
    # open the admin or `memory_mirror` runs) or "off". None: immediate on memory, deferred on Redis.
    "MIRROR_MODE": None,
    # Folder of the memory backend's crash journal (with MIRROR_MODE "immediate"). None: a folder
    # of the default database's own, beside an SQLite file, else in `BASE_DIR/memory-journal/`
    # (none for an in-memory SQLite, nor in tests); False: no journal.
    "JOURNAL_DIR": None,
    # How many dirty sessions the admin syncs into the mirror before showing a page, so that a
    # page load stays short after many writes; the rest wait for the next one.
    "ADMIN_SYNC_LIMIT": 500,
    # Seconds a pipeline run_id stays bound to the session its enrich call used, so that its
    # answer can be stored with the run_id alone (the binding also ends with the session).
    "RUN_BINDING_TTL_SECONDS": 3600,
    # Seconds a write's Idempotency-Key and its recorded answer are kept: the same request sent
    # again within them gets the first answer and is not applied twice (default: a day).
    "IDEMPOTENCY_TTL_SECONDS": 86400,
    # REST API permission classes, as import strings. None: the project's REST_FRAMEWORK defaults
    # plus IsAuthenticated, so that anonymous callers are refused even where the project allows any.
    "API_PERMISSION_CLASSES": None,
    # REST API authentication classes, as import strings. None: the project's REST_FRAMEWORK
    # DEFAULT_AUTHENTICATION_CLASSES.
    "API_AUTHENTICATION_CLASSES": None,
    # REST API throttle classes, as import strings (over the rate: 429 throttled). None: the
    # project's DEFAULT_THROTTLE_CLASSES.
    "API_THROTTLE_CLASSES": None,
    # Rates by scope, such as `{"persistent_memory": "600/min"}`, laid over REST_FRAMEWORK's
    # DEFAULT_THROTTLE_RATES for the API's throttles. None: those alone.
    "API_THROTTLE_RATES": None,
    # Import string of a callable (request) -> owner string, which decides whose sessions a REST
    # API or MCP request reaches; None from it refuses the request (403 owner_required).
    "OWNER_RESOLVER": "persistent_memory.owners.resolvers.user_owner",
    # At most this many entries per process/ call (400 invalid, the reason under
    # errors.entries), and messages per append (400 invalid_message).
    "MAX_BATCH": 100,
    # How tokens are counted, once per message as it is appended: "o200k_base" or "cl100k_base"
    # (OpenAI's tokenizers, offline), "chars" (four characters a token), or the import string of
    # a callable (text) -> int.
    "TOKENIZER": "o200k_base",
    # Tokens a conversation's context window may hold when the call sets no budget: the newest
    # whole turns that fit (None: no limit of that kind).
    "CONTEXT_MAX_TOKENS": 8000,
    # Messages a conversation's context window may hold when the call sets no limit (None: no
    # limit of that kind).
    "CONTEXT_MAX_MESSAGES": 100,
    # Messages one conversation keeps (2 or more): past it, the oldest of the current thread are
    # removed in the same write (pinned system messages stay).
    "MAX_MESSAGES": 1000,
    # The largest message, in bytes of its JSON; a larger one is refused with 400 invalid_message
    # and nothing of its call is written.
    "MAX_MESSAGE_BYTES": 1024 * 1024,
    # Whether the pipeline lanes record each question (enrich) and answer (answers) as messages of
    # the session's conversation.
    "RECORD_CONVERSATION": True,
    # The default strategy of context windows: "truncation" (the newest messages that fit) or
    # "rolling_summary" (a summary of the older turns, then the newest; this turns summaries on).
    "CONTEXT_STRATEGY": "truncation",
    # Tokens a rolling summary may cost in a window: a summarizer's longer answer is cut at a word
    # to fit.
    "SUMMARY_MAX_TOKENS": 1000,
    # What gives when a window's summary and messages do not fit its budget: "truncate_oldest"
    # (the oldest messages go), "truncate_summary" (the summary is shortened) or "error" (422
    # context_overflow).
    "CONTEXT_OVERFLOW": "truncate_oldest",
    # With summaries on, a conversation holding more than this many tokens after its summary is
    # sent to the summarizer, which folds all but the newest half of them into the summary.
    "SUMMARIZE_AFTER_TOKENS": 4000,
    # Import string of the summarizer class, built with SUMMARIZER_OPTIONS; setting one turns
    # summaries on. None: the extractive one (no model) when summaries are on.
    "SUMMARIZER": None,
    # Keyword arguments the summarizer is built with, such as the chat-completions one's model,
    # base_url, api_key_env and timeout (which the chat-completions memory extractor uses too).
    "SUMMARIZER_OPTIONS": {},
    # Whether a worker thread in this process makes the summaries, when summaries are on. False:
    # run `memory_summarize --conversations` on a schedule instead.
    "SUMMARIZER_WORKER": True,
    # Seconds one summary may take; a slower one counts as a failure of the summarizers.
    "SUMMARIZER_TIMEOUT_SECONDS": 30,
    # Failed summaries in a row before the summarizers are "degraded"; windows keep the last
    # summary and the messages after it meanwhile.
    "SUMMARIZER_RETRY_ATTEMPTS": 3,
    # Seconds before the first retry after a failed summary, doubled at each failure in a row.
    "SUMMARIZER_BACKOFF_SECONDS": 1.0,
    # Seconds the "degraded" summarizers wait before trying one summary again.
    "SUMMARIZER_DEGRADED_SECONDS": 300,
    # Whether the worker thread enqueues a task on Django's task framework (TASKS) instead of
    # summarizing itself; needs django.tasks or django-tasks and a TASKS setting (else E014).
    "SUMMARIZER_TASKS": False,
    # The alias in Django's TASKS whose backend runs the app's background work (extraction,
    # summaries, embedding: see docs/background-work.md); None: worker threads in this process,
    # fed by in-memory queues, as before (and no task framework needed).
    "TASK_BACKEND": None,
    # Seconds a task for a conversation waits after its first new message, so a burst of
    # appends gives one extraction and one summary (on backends that support run_after).
    "TASK_DEBOUNCE_SECONDS": 2.0,
    # The longest content of a long-term memory, in characters (longer: 400 invalid_memory); also
    # the longest search query.
    "MEMORY_MAX_CONTENT_CHARS": 4000,
    # The largest metadata of a long-term memory, in bytes of JSON (larger: 400 invalid_memory).
    "MEMORY_MAX_METADATA_BYTES": 16 * 1024,
    # Days after its last update a long-term memory expires (hidden at once, deleted by
    # `memory_sweep`). None: kept until its own expires_at.
    "MEMORY_RETENTION_DAYS": None,
    # What embeds memories for semantic search: "openai" (the OpenAI embeddings API or any server
    # that speaks it: Ollama, vLLM, LM Studio, llama.cpp, LiteLLM; see EMBEDDER_OPTIONS), or the
    # import string of a callable (list of texts) -> list of vectors. None: no semantic search,
    # and "hybrid" fuses keyword matches with recency instead.
    "EMBEDDER": None,
    # Options of the "openai" embedder: model ("text-embedding-3-small"), base_url (None: OpenAI's;
    # "http://localhost:11434/v1" for Ollama), dimensions, api_key_env ("OPENAI_API_KEY"; None for
    # none), timeout (10 seconds), batch_size (64 texts a request), max_retries (2, with backoff).
    "EMBEDDER_OPTIONS": {},
    # Seconds a request (a write, a search) waits for the embedder: one try, no retries (the
    # embedder's own timeout if shorter). A write whose vector did not come is stored without one
    # and embedded in the background; a search answers by keyword.
    "EMBEDDER_REQUEST_TIMEOUT": 0.8,
    # Failures in a row (timeouts count) after which requests stop calling the embedder for
    # EMBEDDER_CIRCUIT_SECONDS; a failure of the background worker (which used the full timeout
    # and retries) stops them at once.
    "EMBEDDER_CIRCUIT_FAILURES": 3,
    # Seconds requests do not call an embedder found failing; then one call tries again and
    # its answer lets them all call it again (per process).
    "EMBEDDER_CIRCUIT_SECONDS": 30,
    # The longest vector stored or searched with; a longer one is refused (the memory is stored
    # without it). Vectors must also have the model's length: EMBEDDER_OPTIONS["dimensions"], or
    # that of the model's vectors already stored.
    "EMBEDDER_MAX_DIMENSIONS": 4096,
    # Whether a worker thread in this process embeds, with the embedder's own timeout and
    # retries, what a write stored without a vector. False: only `memory_embed` does.
    "EMBEDDER_WORKER": True,
    # Memories the background embedding queue holds; beyond it, a memory waits for
    # `memory_embed`. The queue is lost with the process.
    "EMBEDDER_QUEUE_SIZE": 10_000,
    # Where no database compares vectors (neither pgvector nor sqlite-vec), the most recently
    # updated vectors of an owner that one semantic search compares, in memory.
    "MEMORY_VECTOR_SCAN_LIMIT": 50_000,
    # Cosine distance within which a new memory (written without a key) of the same owner and type
    # as an existing one updates it instead of adding a row. None: never merged.
    "MEMORY_DEDUP_DISTANCE": 0.05,
    # Whether a write that replaces a memory's content (the same key again, a near-duplicate
    # merged) keeps the old content as a superseded version, true until the new said_at (else
    # the write's time), for searches `as_of` a past moment. False: overwritten in place.
    "MEMORY_KEEP_SUPERSEDED": True,
    # How much the semantic list weighs in "hybrid" search, from 0 to 1: its scores are scaled to
    # 0..1 and weigh this; each keyword match adds (1 - this) times the share of the question's
    # information it holds (words weighed by their rarity), when the matches together hold at least
    # half of it. 1: meaning alone.
    "MEMORY_HYBRID_ALPHA": 0.5,
    # Days after which a memory's search score halves since its last use (update or access).
    # None: no decay.
    "MEMORY_HALF_LIFE_DAYS": None,
    # How much a memory's access count raises its search score: times 1 + weight * ln(1 + count).
    "MEMORY_ACCESS_WEIGHT": 0.0,
    # Days without an update or an access after which `memory_sweep` deletes a memory. None: never.
    "MEMORY_INACTIVE_DAYS": None,
    # Memories one owner may keep: `memory_sweep` deletes the least recently used beyond it. None:
    # no budget.
    "MEMORY_MAX_PER_OWNER": None,
    # The memory extractors, import strings of callables (messages) -> candidate memories ([]:
    # none). The default finds English statements of preference, decision and habit by rules.
    "MEMORY_EXTRACTORS": ["persistent_memory.memories.extraction.rules.extract"],
    # Whether a worker thread in this process extracts memories from new messages as they are
    # written (when there are extractors). False: run `memory_extract` instead.
    "MEMORY_EXTRACTION_WORKER": True,
    # Writes whose messages the extraction queue holds; when it is full, a write's messages are
    # dropped with a warning (`memory_extract` catches up). The queue is lost with the process.
    "MEMORY_EXTRACTION_QUEUE_SIZE": 1000,
    # Options of the chat-completions extractor (prompt, max_memories...), laid over the model,
    # base_url, api_key_env and timeout it takes from SUMMARIZER_OPTIONS.
    "MEMORY_EXTRACTOR_OPTIONS": {},
    # Whether the enrich lane attaches the owner's memories relevant to the question, as
    # metadata.memories.
    "INJECT_MEMORIES": False,
    # Tokens the memories the enrich lane attaches may add up to (at least one is attached
    # when any matched).
    "MEMORY_MAX_TOKENS": 500,
    # How the enrich lane searches the memories it attaches (INJECT_MEMORIES): "recent",
    # "keyword", "semantic" (needs an EMBEDDER, else E012) or "hybrid".
    "MEMORY_SEARCH_STRATEGY": "hybrid",
    # What a search finds when the caller does not say (the API, MCP, injection, Python):
    # "memory" (long-term memories) and "message" (what was said in the owner's
    # conversations, as the mirror holds it: see persistent_memory.memories.message_search).
    "MEMORY_SEARCH_KINDS": ["memory", "message"],
    # Whether conversation messages get vectors from the EMBEDDER (one embedder input per
    # message, in the background), so semantic and hybrid search compare them by meaning.
    # None: whenever an EMBEDDER is set; False: messages are found by their words only.
    "MESSAGE_EMBEDDINGS": None,
    # The MCP endpoint over streamable HTTP keeps one server per owner: at most this many, a new
    # owner evicting the least recently used.
    "MCP_MAX_SERVERS": 100,
    # Seconds an owner's MCP server may stay unused before it is evicted (None: only
    # MCP_MAX_SERVERS evicts).
    "MCP_SERVER_IDLE_SECONDS": 900,
    # The largest REST API or MCP request body, in bytes (default 2 MiB and 64 KiB); a larger one
    # is refused with 413 payload_too_large, before it is read when its length is sent.
    "MAX_REQUEST_BYTES": 2 * 1024 * 1024 + 64 * 1024,
    # Seconds the Retry-After header of a 503 answer (backend or database unavailable, health/ not
    # "ok") asks the caller to wait.
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

    Without one, an owner alone in a memory backend's process may take all its
    MAX_SESSIONS places (a chat app with one user, or one service account, needs them):
    between several owners, a full process admits only those below their fair share
    (see ``MemoryBackend._admit``).
    """
    cap = conf.MAX_SESSIONS_PER_OWNER
    if conf.BACKEND == "memory" and cap is not None:
        return min(cap, conf.MAX_SESSIONS)
    return cap


#: SESSION_IDLE_TTL_SECONDS's default on the memory backend: 30 days.
MEMORY_IDLE_TTL_SECONDS = 30 * 24 * 3600


def memory_idle_ttl(conf: MemorySettings) -> float | None:
    """The memory backend's idle expiry of new sessions, in seconds (None: none).

    Unset, 30 days: its MAX_SESSIONS places are taken by every LangGraph thread and agent
    conversation, and would otherwise never come back. Redis has no such default (its
    backend reads SESSION_IDLE_TTL_SECONDS as it is): its memory is the server's
    (maxmemory), the RocketRide node's sessions have no idle expiry, and deployments that
    count on sessions lasting must not start losing them with an upgrade.
    """
    seconds = conf.SESSION_IDLE_TTL_SECONDS
    return MEMORY_IDLE_TTL_SECONDS if seconds is None else seconds or None


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
