"""The store service: the one way in for the API, the admin, the commands and Python code.

It validates every argument before a backend is touched, encodes values to JSON
(so what comes out is always a fresh copy) and raises exceptions from
:mod:`persistent_memory.exceptions`.

``get_store()`` is the operator's store: its session methods address the unowned
namespace (the node's sessions), and ``list_session_infos(all_owners=True)``, the
admin, the mirror and the commands see every owner's sessions. ``for_owner(owner)``
returns the same store scoped to one owner's namespace, which is what the API uses.

Every method that writes takes ``idempotency=`` (see :mod:`persistent_memory.idempotency`):
sent again under the same key, the write answers as the first time and is not applied
again.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connections
from django.dispatch import receiver

from persistent_memory.backends import backend_class
from persistent_memory.backends.base import (
    AnswerRecord,
    BaseBackend,
    IdempotencyRecord,
    RunBinding,
    SessionInfo,
)
from persistent_memory.backends.memory import MemoryBackend
from persistent_memory.chat.messages import DEFAULT_CONVERSATION, validate_message_id
from persistent_memory.checkpoints import CheckpointMethods
from persistent_memory.conf import RELOADED_BY, MemorySettings, memory_settings, mirror_mode, summaries_on
from persistent_memory.conversations.signals import messages_added
from persistent_memory.conversations.store import (
    Context,
    ConversationMethods,
    ConversationOptions,
    window_context,
)
from persistent_memory.conversations.worker import SummarizerWorker
from persistent_memory.cursors import decode_cursor, encode_cursor
from persistent_memory.exceptions import (
    BackendUnavailable,
    InvalidSessionId,
    InvalidValue,
    PageTooDeep,
    PersistentMemoryError,
)
from persistent_memory.idempotency import Idempotency, validate_idempotency
from persistent_memory.journal import journal_directory
from persistent_memory.mirror.sessions import Mirror
from persistent_memory.mirror.signals import search_starting
from persistent_memory.owners import (
    UNOWNED,
    idempotency_ref,
    owner_namespace,
    run_ref,
    split_storage_id,
    storage_id,
    validate_owner,
)
from persistent_memory.telemetry import instrument, watch_store
from persistent_memory.validation import (
    DEFAULT_MAX_DEPTH,
    SESSION_ID_PATTERN,
    decode_value,
    encode_value,
    validate_int,
    validate_key,
    validate_run_id,
    validate_session_id,
    validate_ttl,
)

if TYPE_CHECKING:
    from persistent_memory.memories.extraction.worker import ExtractionWorker

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Enrichment(NamedTuple):
    """What :meth:`MemoryStore.enrich_recording` returns."""

    values: dict[str, Any]
    #: The window before the question (None: no question was recorded).
    context: Context | None
    question_id: str | None


#: The furthest a listing page may start by ``offset``: deeper pages follow the cursor
#: (in the cluster layout, an offset reads the ids it skips).
MAX_PAGE_OFFSET = 1_000


class SessionPage(NamedTuple):
    """What :meth:`MemoryStore.session_page` returns."""

    #: The live sessions of the listing (of its search), all pages together.
    total: int
    sessions: list[SessionInfo]
    #: The cursor of the page after this one; None when this one is the last.
    next_cursor: str | None


@instrument
class MemoryStore(ConversationMethods, CheckpointMethods):
    """Cross-session memory keyed by ``session_id`` over one backend (conversations: see
    :class:`~persistent_memory.conversations.store.ConversationMethods`)."""

    #: The namespace this store reads and writes (``""``: unowned; see :mod:`persistent_memory.owners`).
    owner: str = UNOWNED
    #: Whether its background work goes to Django's task framework (built with
    #: ``TASK_BACKEND``): :mod:`persistent_memory.tasks` enqueues the work of its appends;
    #: False: its worker threads do it.
    hands_work_to_tasks: bool = False

    def __init__(
        self,
        backend: BaseBackend,
        *,
        default_ttl_seconds: float | None = None,
        max_value_bytes: int = 1024 * 1024,
        max_json_depth: int = DEFAULT_MAX_DEPTH,
        run_binding_ttl_seconds: float = 3600,
        idempotency_ttl_seconds: float = 86400,
        mirror_mode: str = "off",
        conversation_options: ConversationOptions | None = None,
    ) -> None:
        self.backend = backend
        self.conversation_options = conversation_options or ConversationOptions()
        self.default_ttl_seconds = validate_ttl(default_ttl_seconds)
        self.max_value_bytes = max_value_bytes
        self.max_json_depth = max_json_depth
        self.run_binding_ttl_seconds = validate_ttl(run_binding_ttl_seconds) or 3600
        self.idempotency_ttl_seconds = validate_ttl(idempotency_ttl_seconds) or 86400
        #: The ORM mirror of this store (see persistent_memory.mirror).
        self.mirror = Mirror(backend, mirror_mode)
        #: What makes the conversations' rolling summaries (see persistent_memory.conversations.worker).
        self.summarizer_worker = SummarizerWorker(self)

    @cached_property
    def extraction_worker(self) -> ExtractionWorker:
        """What extracts memories from new messages (see
        persistent_memory.memories.extraction.worker). Built at first use: the memories
        package needs the app registry, which a store used outside Django (a process of
        its own on Redis) never loads."""
        from persistent_memory.memories.extraction.worker import ExtractionWorker

        return ExtractionWorker(self)

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
                max_json_depth=conf.MAX_JSON_DEPTH,
                run_binding_ttl_seconds=conf.RUN_BINDING_TTL_SECONDS,
                idempotency_ttl_seconds=conf.IDEMPOTENCY_TTL_SECONDS,
                mirror_mode=mirror_mode(conf),
                conversation_options=ConversationOptions.from_settings(conf),
            )
        except InvalidValue as exc:
            backend.close()
            raise ImproperlyConfigured(f"PERSISTENT_MEMORY: {exc} (see `manage.py check`)") from exc
        if store.mirror.mode == "immediate":
            if isinstance(backend, MemoryBackend):
                directory = journal_directory(
                    conf.JOURNAL_DIR, connections.databases.get(DEFAULT_DB_ALIAS, {})
                )
                if directory is not None:
                    try:
                        backend.open_journal(directory)
                    except OSError as exc:
                        if conf.JOURNAL_DIR:  # asked for: a start without it would be a surprise
                            backend.close()
                            message = f"PERSISTENT_MEMORY: JOURNAL_DIR {directory}: {exc}"
                            raise ImproperlyConfigured(message) from exc
                        # The default folder (a read-only app filesystem, say): run as before
                        # the journal was on by default, rather than not start at all.
                        if backend.journal is not None:
                            backend.journal.close()
                            backend.journal = None
                        logger.error(
                            "persistent_memory: the memory backend's default journal folder %s "
                            "cannot be used (%s); running without a journal: set JOURNAL_DIR to "
                            "a writable folder, or JOURNAL_DIR False to say so",
                            directory,
                            exc,
                        )
                _off_the_event_loop(store.mirror.restore_safely)
            store.mirror.start()
        store.summarizer_worker = SummarizerWorker.from_settings(store, conf)
        store.extraction_worker = type(store.extraction_worker).from_settings(store, conf)
        if conf.TASK_BACKEND:  # the work goes to Django's task framework, not to threads
            # persistent_memory.tasks receives this store's appends (messages_added).
            store.hands_work_to_tasks = True
            return store
        if summaries_on(conf) and conf.SUMMARIZER_WORKER:
            store.summarizer_worker.start()
        if store.extraction_worker.enabled:
            store.extraction_worker.start()
        return store

    def _ttl(self, ttl_seconds: Any) -> float | None:
        return self.default_ttl_seconds if ttl_seconds is None else validate_ttl(ttl_seconds)

    # Owners -----------------------------------------------------------------

    def for_owner(self, owner: str) -> MemoryStore:
        """This store scoped to ``owner``'s namespace: the same methods and exceptions, and
        only that owner's sessions (``""`` is the unowned namespace)."""
        owner = validate_owner(owner)
        # A shallow copy, made by hand: the API scopes a store on every request, and
        # copy.copy's generic protocol (reduce, then rebuild) cost five times this.
        scoped = object.__new__(type(self))
        scoped.__dict__.update(self.__dict__)
        scoped.owner = owner
        return scoped

    def _session(self, session_id: str) -> _Session:
        """``with self._session(session_id) as sid:``, around the backend calls for
        ``session_id`` of this store's owner: ``sid`` is its storage id (checked first, and
        none while a restore is pending), and an error of those calls names the session by
        ``session_id``, not by the storage id."""
        return _Session(self, session_id)

    def _not_restored(self) -> None:
        # Writes made before the sessions are back would be overwritten or lost by the
        # restore, and reads would miss what the mirror holds: fail closed until then.
        raise BackendUnavailable(
            "The memory backend is waiting for its database to restore its sessions; try again shortly."
        )

    def _once(self, idempotency: Idempotency | None) -> dict[str, IdempotencyRecord]:
        """A backend write's options for ``idempotency``: its record in this owner's
        namespace, or none at all (so a backend written before keys still works without)."""
        if idempotency is None:
            return {}
        key, print_ = validate_idempotency(idempotency)
        return {
            "idempotency": IdempotencyRecord(
                idempotency_ref(self.owner, key), print_, self.idempotency_ttl_seconds
            )
        }

    @staticmethod
    def _info(info: SessionInfo) -> SessionInfo:
        """A backend's info with the session id and its owner apart."""
        owner, session_id = split_storage_id(info["session_id"])
        return {**info, "session_id": session_id, "owner": owner}

    # Sessions ---------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        ttl_seconds: float | None = None,
        *,
        idle_ttl_seconds: float | None = None,
        idempotency: Idempotency | None = None,
    ) -> SessionInfo:
        """Create a session; ``ttl_seconds=None`` uses ``SESSION_TTL_HOURS``, 0 means never expire.

        ``idle_ttl_seconds`` (None: ``SESSION_IDLE_TTL_SECONDS``; 0: none) makes it also expire
        that long after its last write, whichever comes first."""
        ttl = self._ttl(ttl_seconds)
        if idle_ttl_seconds is None:
            idle = self.backend.idle_ttl_seconds
        else:
            idle = validate_ttl(idle_ttl_seconds, name="idle_ttl_seconds")
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            return self._info(self.backend.create_session(sid, ttl, idle_ttl_seconds=idle, **once))

    def resume_session(self, session_id: str) -> SessionInfo:
        """A live session's info; ``SessionNotFound`` or ``SessionExpired`` otherwise."""
        with self._session(session_id) as sid:
            return self._info(self.backend.resume_session(sid))

    def session_info(self, session_id: str) -> SessionInfo:
        """Same dict as :meth:`resume_session`."""
        with self._session(session_id) as sid:
            return self._info(self.backend.session_info(sid))

    def list_sessions(self) -> list[str]:
        """Sorted ids of this owner's live sessions."""
        return sorted(info["session_id"] for info in self.list_session_infos())

    def list_session_infos(self, prefix: str = "", *, all_owners: bool = False) -> list[SessionInfo]:
        """Info of this owner's live sessions whose id starts with ``prefix``, newest first.

        ``all_owners=True`` (the operator's view) lists every owner's, each with its ``owner``.
        """
        if not isinstance(prefix, str):
            raise InvalidValue("The session id prefix must be a string.")
        if all_owners and prefix:
            raise InvalidValue("A prefix search is within one owner's sessions.")
        if self.mirror.restore_pending:
            self._not_restored()
        infos = [self._info(info) for info in self.backend.list_session_infos(self._prefix(prefix))]
        if not all_owners:  # the unowned prefix "" lists every owner's: keep this one's
            infos = [info for info in infos if info["owner"] == self.owner]
        return sorted(infos, key=lambda info: (-info["created_at"], info["owner"], info["session_id"]))

    def list_session_page(
        self, prefix: str = "", *, offset: int = 0, limit: int = 50, cursor: str | None = None
    ) -> tuple[int, list[SessionInfo]]:
        """How many of this owner's live sessions have an id starting with ``prefix``,
        and ``limit`` of them from ``offset``, newest first (equal creation times: the
        greater id first): :meth:`session_page` without the next page's cursor."""
        page = self.session_page(prefix, offset=offset, limit=limit, cursor=cursor)
        return page.total, page.sessions

    def session_page(
        self, prefix: str = "", *, cursor: str | None = None, offset: int = 0, limit: int = 50
    ) -> SessionPage:
        """One page of this owner's live sessions whose id starts with ``prefix``, newest
        first (equal creation times: the greater id first), with their count and the
        cursor of the page after (None after the last).

        ``cursor`` (the ``next_cursor`` of the page before, of this owner and search)
        starts the page after that page's last session, however deep, at the cost of
        the first page; a session created or deleted meanwhile moves no other one in or
        out of the pages still to come. ``offset`` (from the cursor, or from the top)
        skips that many places of the listing's index, up to :data:`MAX_PAGE_OFFSET`
        (``PageTooDeep`` past it): a session skipped as damaged, or gone and not yet
        met, still takes its place; in the cluster layout skipping reads the ids
        skipped. A malformed, altered or another listing's cursor is ``InvalidCursor``.

        Sessions that expired and that no page or sweep has met yet may still be
        counted (see the docs' Redis key layout). On the unscoped store this is the
        unowned namespace, the node's sessions included.
        """
        if not isinstance(prefix, str):
            raise InvalidValue("The session id prefix must be a string.")
        offset = validate_int(offset, name="offset", minimum=0)
        limit = validate_int(limit, name="limit", minimum=0)
        if offset > MAX_PAGE_OFFSET:
            raise PageTooDeep(
                f"Invalid offset {offset}: a page starts at most {MAX_PAGE_OFFSET} sessions in;"
                " follow the cursor of the page before (next_cursor) instead."
            )
        namespace = owner_namespace(self.owner)
        after = None
        if cursor is not None:  # it holds the caller's own session id, not the stored one
            created_at, session_id = decode_cursor(namespace, prefix, cursor)
            after = (created_at, namespace + session_id)
        if prefix and not SESSION_ID_PATTERN.fullmatch(prefix):
            # No session id starts with it (nor can it reach another namespace).
            return SessionPage(0, [], None)
        if self.mirror.restore_pending:
            self._not_restored()
        # One more than the page: whether a page follows.
        total, infos = self.backend.list_session_page(self._prefix(prefix), offset, limit + 1, after=after)
        following = None
        if len(infos) > limit > 0:
            last = infos[limit - 1]
            position = (last["created_at"], last["session_id"][len(namespace) :])
            following = encode_cursor(namespace, prefix, position)
        return SessionPage(total, [self._info(info) for info in infos[:limit]], following)

    def _prefix(self, prefix: str) -> str:
        return owner_namespace(self.owner) + prefix

    def delete_session(self, session_id: str, *, idempotency: Idempotency | None = None) -> list[str]:
        """Delete a session and everything in it; return the keys cleared, sorted."""
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            return self.backend.delete_session(sid, **once)

    # Values -----------------------------------------------------------------

    def put(self, session_id: str, key: str, value: Any, *, idempotency: Idempotency | None = None) -> None:
        """Store any JSON-serialisable ``value`` (a copy) under ``key``."""
        key = validate_key(key)
        value_json = encode_value(value, max_bytes=self.max_value_bytes, max_depth=self.max_json_depth)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            self.backend.put(sid, key, value_json, **once)

    def get(self, session_id: str, key: str) -> Any:
        """A fresh copy of the value under ``key``; ``KeyNotFound`` when absent."""
        key = validate_key(key)
        with self._session(session_id) as sid:
            return decode_value(self.backend.get(sid, key))

    def get_all(self, session_id: str) -> dict[str, Any]:
        """Every key and value of the session, in one backend call."""
        with self._session(session_id) as sid:
            return _sorted(decode_value(self.backend.get_all(sid)))

    def get_many(self, session_ids: list[str], key: str) -> dict[str, Any]:
        """A fresh copy of the value under ``key`` of each of ``session_ids`` (this owner's)
        that has one, by session id; in one backend call (one round trip per primary)."""
        key = validate_key(key)
        valid = [validate_session_id(session_id) for session_id in session_ids]
        if self.mirror.restore_pending:
            self._not_restored()
        storage = {
            storage_id(self.owner, session_id) if self.owner else session_id: session_id
            for session_id in valid
        }
        found = self.backend.get_many(list(storage), key) if storage else {}
        return {storage[sid]: decode_value(text) for sid, text in found.items()}

    def list_keys(self, session_id: str) -> list[str]:
        """The session's keys, sorted."""
        with self._session(session_id) as sid:
            return self.backend.list_keys(sid)

    def increment(
        self, session_id: str, key: str, amount: int = 1, *, idempotency: Idempotency | None = None
    ) -> int:
        """Atomically add ``amount`` to an integer value (missing counts as 0); return the result."""
        key, amount = validate_key(key), validate_int(amount, name="amount")
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            return self.backend.increment(sid, key, amount, **once)

    def clear(
        self, session_id: str, key: str | None = None, *, idempotency: Idempotency | None = None
    ) -> list[str]:
        """Remove ``key``, or every key when None; return the keys removed, sorted."""
        key = None if key is None else validate_key(key)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            return self.backend.clear(sid, key, **once)

    # History ----------------------------------------------------------------

    def get_history(self, session_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """The newest ``limit`` history entries, oldest first; ``limit=0`` for all."""
        limit = validate_int(limit, name="limit", minimum=0)
        with self._session(session_id) as sid:
            return self.backend.get_history(sid, limit)

    def summarize(
        self, session_id: str, max_entries: int | None = None, *, idempotency: Idempotency | None = None
    ) -> bool:
        """Summarize now down to ``max_entries`` (default ``MAX_HISTORY``); return whether it did."""
        return self.fold_history(session_id, max_entries, idempotency=idempotency) > 0

    def fold_history(
        self, session_id: str, max_entries: int | None = None, *, idempotency: Idempotency | None = None
    ) -> int:
        """:meth:`summarize`, returning how many entries were folded into the summary."""
        limit = self.backend.max_history if max_entries is None else max_entries
        limit = validate_int(limit, name="max_entries", minimum=1)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            return self.backend.summarize(sid, limit, **once)

    # The pipeline lanes -----------------------------------------------------

    def enrich(
        self, session_id: str, *, run_id: str | None = None, idempotency: Idempotency | None = None
    ) -> dict[str, Any]:
        """Resume or create the session and return all its values (one backend call).

        With ``run_id``, remember for ``RUN_BINDING_TTL_SECONDS`` that this run is on
        this session, so its answers can be stored without a session id.
        """
        session_id = validate_session_id(session_id)  # before the run id, as the lanes check them
        run = None
        if run_id is not None:
            run = RunBinding(run_ref(self.owner, validate_run_id(run_id)), self.run_binding_ttl_seconds)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            values = self.backend.enrich(sid, self.default_ttl_seconds, run, **once)
        return _sorted(decode_value(values))

    def enrich_recording(
        self,
        session_id: str,
        text: Any,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        run_id: str | None = None,
        idempotency: Idempotency | None = None,
        window_as_json: bool = False,
    ) -> Enrichment:
        """:meth:`enrich`, and with ``RECORD_CONVERSATION`` on and a question ``text``, the
        window of ``conversation`` before it and the question recorded as a user message
        (bound to ``run_id``, so its answer follows it), in the same backend call.
        The window and question id are None when nothing was recorded. With
        ``window_as_json`` the window's messages may come as their JSON (``ChatJSON``)."""
        session_id = validate_session_id(session_id)
        question = self.question(text, conversation)
        if question is None:
            return Enrichment(self.enrich(session_id, run_id=run_id, idempotency=idempotency), None, None)
        run = None
        if run_id is not None:
            run = RunBinding(run_ref(self.owner, validate_run_id(run_id)), self.run_binding_ttl_seconds)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            enriched = self.backend.enrich_recording(sid, self.default_ttl_seconds, run, question, **once)
        values = _sorted(decode_value(enriched.values))
        if messages_added.receivers:
            question_message = {"id": enriched.question_id, "role": "user", "content": text}
            self.messages_added(session_id, question.conversation, [question_message], "enrich")
        options = self.conversation_options
        context = window_context(
            question.conversation,
            enriched.window,
            max_tokens=question.max_tokens,
            overflow=options.overflow,
            tokenizer=options.tokenizer,
            as_json=window_as_json,
        )
        return Enrichment(values, context, enriched.question_id)

    def record_answer(
        self,
        session_id: str | None,
        text: str,
        *,
        run_id: str | None = None,
        conversation: str = DEFAULT_CONVERSATION,
        parent_id: str | None = None,
        idempotency: Idempotency | None = None,
    ) -> AnswerRecord | None:
        """Resume or create, store ``last_answer``, bump ``answer_count`` (one backend call).

        ``session_id=None`` uses the session ``run_id`` was enriched on; returns None,
        writing nothing, when there is none. With ``RECORD_CONVERSATION`` on, the text is
        also recorded as an assistant message of ``conversation`` after the question of
        ``run_id`` (else after ``parent_id``, else after the head), in the same call.
        """
        if session_id is None and run_id is None:
            raise InvalidSessionId("record_answer needs a session_id or a run_id.")
        if session_id is not None:
            session_id = validate_session_id(session_id)
        if not isinstance(text, str):
            raise InvalidValue(f"Invalid answer text {text!r}: must be a string.")
        answer_json = encode_value(text, max_bytes=self.max_value_bytes, max_depth=self.max_json_depth)
        ref = None if run_id is None else run_ref(self.owner, validate_run_id(run_id))
        if parent_id is not None:
            validate_message_id(parent_id, what="parent_id")
        message = self.answer(text, conversation, parent_id)
        ttl = self.default_ttl_seconds
        once = self._once(idempotency)
        if session_id is not None:
            with self._session(session_id) as sid:
                record = self.backend.record_answer(sid, answer_json, ttl, ref, message, **once)
        else:
            if self.mirror.restore_pending:
                self._not_restored()
            record = self.backend.record_answer(None, answer_json, ttl, ref, message, **once)
        if record is None:
            return record
        if self.owner:
            record = AnswerRecord(split_storage_id(record.session_id)[1], record.answer_count)
        if message is not None and messages_added.receivers:
            answer = {"id": message.message.id, "role": "assistant", "content": text}
            self.messages_added(record.session_id, message.conversation, [answer], "answer")
        return record

    # Health -----------------------------------------------------------------

    def ping(self) -> None:
        """Return if the backend answers; ``BackendUnavailable`` otherwise."""
        self.backend.ping()

    def close(self) -> None:
        """Stop the extraction and summarizer workers, flush and stop the mirror's, then
        release the backend's connections."""
        if "extraction_worker" in self.__dict__:  # built (never just to stop it)
            self.extraction_worker.stop()
        self.summarizer_worker.stop()
        self.hands_work_to_tasks = False  # a closed store's appends enqueue nothing more
        self.mirror.stop()
        self.backend.close()


class _Session:
    """What :meth:`MemoryStore._session` returns (a class: it runs on every call)."""

    __slots__ = ("session_id", "storage_id")

    def __init__(self, store: MemoryStore, session_id: str) -> None:
        self.session_id = validate_session_id(session_id)
        if store.mirror.restore_pending:
            store._not_restored()
        # The unowned namespace: the storage id is the session id.
        self.storage_id = storage_id(store.owner, self.session_id) if store.owner else self.session_id

    def __enter__(self) -> str:
        return self.storage_id

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, PersistentMemoryError) and self.storage_id != self.session_id:
            # The caller's id in the message, not the storage id.
            exc.args = (str(exc).replace(repr(self.storage_id), repr(self.session_id)),)


def _off_the_event_loop(call: Callable[[], T]) -> T:
    """``call()`` here, or in a thread of its own when this thread runs an event loop.

    The memory backend's restore reads the database, which Django refuses inside an event
    loop (``SynchronousOnlyOperation``): the first store use of an async view, or of an
    Agents SDK session or Pydantic AI store under ``asyncio.run``, would then fail closed
    until the mirror's worker retried it. The store must not answer before its sessions
    are back, so the loop waits for that thread, once per process (a sync caller waits as
    long). Not in ``AppConfig.ready``: Django warns against queries there (``migrate``
    runs before the tables exist), and processes that never use the store would pay it.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()

    def in_thread() -> T:
        try:
            return call()
        finally:
            connections.close_all()  # this thread's own, which nothing else will close

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="persistent-memory-restore") as pool:
        return pool.submit(in_thread).result()


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


@receiver(search_starting, dispatch_uid="persistent_memory.store.search_starting")
def _catch_up_before_search(sender: Any, *, owner: str | None = None, **kwargs: Any) -> None:
    """Messages are about to be searched in the mirror: sync what this process's store
    marked dirty first (the memories sit below the store and never import it)."""
    get_store().mirror.catch_up(owner, limit=memory_settings.ADMIN_SYNC_LIMIT)


def reset_store() -> None:
    """Close the store; the next :func:`get_store` builds one from current settings."""
    global _store
    with _store_lock:
        store, _store = _store, None
    if store is not None:
        store.close()


atexit.register(reset_store)


@receiver(setting_changed)
def _rebuild_on_settings_change(*, setting: str, **kwargs: Any) -> None:
    # Here, not in conf: the settings module must not import the store (and every
    # service with it). conf's own receiver clears the cached values.
    if setting in RELOADED_BY:
        reset_store()


# The gauges of the telemetry read the process's store, if one was built.
watch_store(lambda: _store)
