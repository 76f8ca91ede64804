"""The store service: the one way in for the API, the admin, the commands and Python code.

It validates every argument before a backend is touched, encodes values to JSON
(so what comes out is always a fresh copy) and raises exceptions from
:mod:`persistent_memory.exceptions`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from persistent_memory.backends import backend_class
from persistent_memory.backends.base import AnswerRecord, BaseBackend, RunBinding, SessionInfo
from persistent_memory.backends.memory import MemoryBackend
from persistent_memory.conf import MemorySettings, memory_settings, mirror_mode
from persistent_memory.exceptions import InvalidSessionId, InvalidValue
from persistent_memory.mirror import Mirror
from persistent_memory.validation import (
    decode_value,
    encode_value,
    validate_int,
    validate_key,
    validate_run_id,
    validate_session_id,
    validate_ttl,
)

logger = logging.getLogger(__name__)


class MemoryStore:
    """Cross-session memory keyed by ``session_id`` over one backend."""

    def __init__(
        self,
        backend: BaseBackend,
        *,
        default_ttl_seconds: float | None = None,
        max_value_bytes: int = 1024 * 1024,
        run_binding_ttl_seconds: float = 3600,
        mirror_mode: str = "off",
    ) -> None:
        self.backend = backend
        self.default_ttl_seconds = validate_ttl(default_ttl_seconds)
        self.max_value_bytes = max_value_bytes
        self.run_binding_ttl_seconds = validate_ttl(run_binding_ttl_seconds) or 3600
        #: The ORM mirror of this store (see persistent_memory.mirror).
        self.mirror = Mirror(self, mirror_mode)

    @classmethod
    def from_settings(cls, conf: MemorySettings = memory_settings) -> MemoryStore:
        """Build the store ``PERSISTENT_MEMORY`` describes."""
        try:
            backend = backend_class(conf.BACKEND).from_settings(conf)
        except (ImportError, TypeError, ValueError) as exc:  # ValueError: redis-py on a bad URL
            raise ImproperlyConfigured(f"PERSISTENT_MEMORY: {exc} (see `manage.py check`)") from exc
        try:
            store = cls(
                backend,
                default_ttl_seconds=(conf.SESSION_TTL_HOURS or 0) * 3600,
                max_value_bytes=conf.MAX_VALUE_BYTES,
                run_binding_ttl_seconds=conf.RUN_BINDING_TTL_SECONDS,
                mirror_mode=mirror_mode(conf),
            )
        except InvalidValue as exc:
            backend.close()
            raise ImproperlyConfigured(f"PERSISTENT_MEMORY: {exc} (see `manage.py check`)") from exc
        if store.mirror.mode == "immediate":
            if isinstance(backend, MemoryBackend):
                store.mirror.restore_safely()
            store.mirror.start()
        return store

    def _ttl(self, ttl_seconds: Any) -> float | None:
        return self.default_ttl_seconds if ttl_seconds is None else validate_ttl(ttl_seconds)

    # Sessions ---------------------------------------------------------------

    def create_session(self, session_id: str, ttl_seconds: float | None = None) -> SessionInfo:
        """Create a session; ``ttl_seconds=None`` uses ``SESSION_TTL_HOURS``, 0 means never expire."""
        session_id = validate_session_id(session_id)
        return self.backend.create_session(session_id, self._ttl(ttl_seconds))

    def resume_session(self, session_id: str) -> SessionInfo:
        """A live session's info; ``SessionNotFound`` or ``SessionExpired`` otherwise."""
        return self.backend.resume_session(validate_session_id(session_id))

    def session_info(self, session_id: str) -> SessionInfo:
        """Same dict as :meth:`resume_session`."""
        return self.backend.session_info(validate_session_id(session_id))

    def list_sessions(self) -> list[str]:
        """Sorted ids of live sessions."""
        return self.backend.list_sessions()

    def list_session_infos(self, prefix: str = "") -> list[SessionInfo]:
        """Info of every live session whose id starts with ``prefix``, newest first."""
        if not isinstance(prefix, str):
            raise InvalidValue("The session id prefix must be a string.")
        infos = self.backend.list_session_infos(prefix)
        return sorted(infos, key=lambda info: (-info["created_at"], info["session_id"]))

    def delete_session(self, session_id: str) -> list[str]:
        """Delete a session and everything in it; return the keys cleared, sorted."""
        return self.backend.delete_session(validate_session_id(session_id))

    # Values -----------------------------------------------------------------

    def put(self, session_id: str, key: str, value: Any) -> None:
        """Store any JSON-serialisable ``value`` (a copy) under ``key``."""
        session_id, key = validate_session_id(session_id), validate_key(key)
        self.backend.put(session_id, key, encode_value(value, max_bytes=self.max_value_bytes))

    def get(self, session_id: str, key: str) -> Any:
        """A fresh copy of the value under ``key``; ``KeyNotFound`` when absent."""
        session_id, key = validate_session_id(session_id), validate_key(key)
        return decode_value(self.backend.get(session_id, key))

    def get_all(self, session_id: str) -> dict[str, Any]:
        """Every key and value of the session, in one backend call."""
        return _sorted(decode_value(self.backend.get_all(validate_session_id(session_id))))

    def list_keys(self, session_id: str) -> list[str]:
        """The session's keys, sorted."""
        return self.backend.list_keys(validate_session_id(session_id))

    def increment(self, session_id: str, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to an integer value (missing counts as 0); return the result."""
        session_id, key = validate_session_id(session_id), validate_key(key)
        return self.backend.increment(session_id, key, validate_int(amount, name="amount"))

    def clear(self, session_id: str, key: str | None = None) -> list[str]:
        """Remove ``key``, or every key when None; return the keys removed, sorted."""
        session_id = validate_session_id(session_id)
        return self.backend.clear(session_id, None if key is None else validate_key(key))

    # History ----------------------------------------------------------------

    def get_history(self, session_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """The newest ``limit`` history entries, oldest first; ``limit=0`` for all."""
        session_id = validate_session_id(session_id)
        return self.backend.get_history(session_id, validate_int(limit, name="limit", minimum=0))

    def summarize(self, session_id: str, max_entries: int | None = None) -> bool:
        """Summarize now down to ``max_entries`` (default ``MAX_HISTORY``); return whether it did."""
        return self.fold_history(session_id, max_entries) > 0

    def fold_history(self, session_id: str, max_entries: int | None = None) -> int:
        """:meth:`summarize`, returning how many entries were folded into the summary."""
        session_id = validate_session_id(session_id)
        limit = self.backend.max_history if max_entries is None else max_entries
        return self.backend.summarize(session_id, validate_int(limit, name="max_entries", minimum=1))

    # The pipeline lanes -----------------------------------------------------

    def enrich(self, session_id: str, *, run_id: str | None = None) -> dict[str, Any]:
        """Resume or create the session and return all its values (one backend call).

        With ``run_id``, remember for ``RUN_BINDING_TTL_SECONDS`` that this run is on
        this session, so its answers can be stored without a session id.
        """
        session_id = validate_session_id(session_id)
        run = None if run_id is None else RunBinding(validate_run_id(run_id), self.run_binding_ttl_seconds)
        return _sorted(decode_value(self.backend.enrich(session_id, self.default_ttl_seconds, run)))

    def record_answer(
        self, session_id: str | None, text: str, *, run_id: str | None = None
    ) -> AnswerRecord | None:
        """Resume or create, store ``last_answer``, bump ``answer_count`` (one backend call).

        ``session_id=None`` uses the session ``run_id`` was enriched on; returns None,
        writing nothing, when there is none.
        """
        if session_id is None:
            if run_id is None:
                raise InvalidSessionId("record_answer needs a session_id or a run_id.")
            run_id = validate_run_id(run_id)
        else:
            session_id, run_id = validate_session_id(session_id), None
        if not isinstance(text, str):
            raise InvalidValue(f"Invalid answer text {text!r}: must be a string.")
        answer_json = encode_value(text, max_bytes=self.max_value_bytes)
        return self.backend.record_answer(session_id, answer_json, self.default_ttl_seconds, run_id)

    # Health -----------------------------------------------------------------

    def ping(self) -> None:
        """Return if the backend answers; ``BackendUnavailable`` otherwise."""
        self.backend.ping()

    def close(self) -> None:
        """Flush and stop the mirror worker, then release the backend's connections."""
        self.mirror.stop()
        self.backend.close()


def _sorted(values: dict[str, Any]) -> dict[str, Any]:
    return {key: values[key] for key in sorted(values)}


_store: MemoryStore | None = None
_store_lock = threading.Lock()


def get_store() -> MemoryStore:
    """The process's store, built from settings on first use (thread-safe)."""
    global _store
    store = _store
    if store is None:
        with _store_lock:
            if _store is None:
                _store = MemoryStore.from_settings()
            store = _store
    return store


def reset_store() -> None:
    """Close the store; the next :func:`get_store` builds one from current settings."""
    global _store
    with _store_lock:
        store, _store = _store, None
    if store is not None:
        store.close()


atexit.register(reset_store)
