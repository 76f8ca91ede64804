"""The memory_persistent node's two lanes, for Python callers (the REST API wraps this).

Entries are dicts shaped ``{"text": ..., "metadata": {"session_id": ...}, ...}``. The
originals are never mutated: each lane returns a new entry dict with a new
``metadata`` dict; values nested deeper are shared with the original, as with
``dict.copy()`` (a deep copy would cost more than the lane's own work).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, TypedDict

from persistent_memory.chat.messages import DEFAULT_CONVERSATION
from persistent_memory.exceptions import InvalidSessionId
from persistent_memory.idempotency import Idempotency
from persistent_memory.store import MemoryStore, get_store
from persistent_memory.validation import validate_session_id

logger = logging.getLogger(__name__)

MEMORY_CONTEXT = "memory_context"
#: Where enrich attaches the conversation's window, and the entry's conversation name.
CONVERSATION = "conversation"
CONVERSATION_NAME = "conversation_name"
NO_SESSION_ID = "no session_id in metadata"


class Outcome(TypedDict, total=False):
    """What a lane did with an entry."""

    status: Literal["enriched", "unchanged", "stored", "skipped"]
    session_id: str | None
    keys: list[str]
    answer_count: int
    reason: str


def _copy(entry: dict[str, Any]) -> dict[str, Any]:
    entry = dict(entry)
    if isinstance(entry.get("metadata"), dict):
        entry["metadata"] = dict(entry["metadata"])
    return entry


def _session_id_of(entry: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(session_id, None)``, or ``(None, reason)`` when there is no usable one."""
    metadata = entry.get("metadata")
    session_id = metadata.get("session_id") if isinstance(metadata, dict) else None
    if session_id is None or session_id == "":
        return None, NO_SESSION_ID
    try:
        return validate_session_id(session_id), None
    except InvalidSessionId as exc:
        # The node's rule: a malformed id must not fail the pipeline.
        logger.debug("memory: passing entry through: %s", exc)
        return None, str(exc)


def _conversation_of(entry: dict[str, Any]) -> str:
    """The conversation an entry names in ``metadata.conversation_name`` (else "default")."""
    metadata = entry.get("metadata")
    name = metadata.get(CONVERSATION_NAME) if isinstance(metadata, dict) else None
    return DEFAULT_CONVERSATION if name is None else name


class MemoryFilter:
    """Per-pipeline state of the node: the session of the last question since :meth:`open`."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        self._store = store
        self.current_session_id: str | None = None
        #: The last question recorded since :meth:`open`: (session id, conversation, message id).
        self.current_question: tuple[str, str, str] | None = None

    @property
    def memory_store(self) -> MemoryStore:
        """The store given, or the process's store."""
        return self._store or get_store()

    def open(self) -> None:
        """Start a new pipeline item: forget the last question's session."""
        self.current_session_id = None
        self.current_question = None

    def enrich(
        self,
        question: dict[str, Any],
        *,
        run_id: str | None = None,
        idempotency: Idempotency | None = None,
        window_as_json: bool = False,
    ) -> tuple[dict[str, Any], Outcome]:
        """Attach every stored key as ``metadata["memory_context"]`` (when there is one).

        ``run_id`` (a pipeline run that calls once per lane) is remembered in the backend
        so that :meth:`store` with the same ``run_id`` finds this session. ``idempotency``
        goes to the store call (see :mod:`persistent_memory.idempotency`).
        ``window_as_json``: the window's messages may come as their JSON, for a caller
        that only writes them out (see :meth:`MemoryStore.enrich_recording`).
        """
        question = _copy(question)
        session_id, reason = _session_id_of(question)
        if session_id is None:
            return question, {"status": "skipped", "session_id": None, "reason": reason or ""}
        self.current_session_id = session_id
        conversation = _conversation_of(question)
        context, window, question_id = self.memory_store.enrich_recording(
            session_id,
            question.get("text"),
            conversation=conversation,
            run_id=run_id,
            idempotency=idempotency,
            window_as_json=window_as_json,
        )
        if window is not None and question_id is not None:
            self.current_question = (session_id, conversation, question_id)
            # The window as get_context answers it, but for the conversation's name.
            question["metadata"][CONVERSATION] = {
                key: v for key, v in window.items() if key != "conversation"
            }
        # Imported here: the models behind it need Django's apps, the pipeline does not.
        from persistent_memory.memories.injection import MEMORIES, relevant_memories

        memories = relevant_memories(self.memory_store.owner, question.get("text"), session_id)
        if memories is not None:
            question["metadata"][MEMORIES] = memories
        if not context:
            return question, {"status": "unchanged", "session_id": session_id, "keys": []}
        question["metadata"][MEMORY_CONTEXT] = context
        logger.debug("memory: attached %d keys for session %s", len(context), session_id)
        return question, {"status": "enriched", "session_id": session_id, "keys": list(context)}

    def store(
        self, answer: dict[str, Any], *, run_id: str | None = None, idempotency: Idempotency | None = None
    ) -> tuple[dict[str, Any], Outcome]:
        """Save the answer's text as ``last_answer`` and count it in ``answer_count``.

        An answer with no session id falls back to the last question's session since
        :meth:`open`, else to the session ``run_id`` was enriched on.
        """
        answer = _copy(answer)
        session_id, reason = _session_id_of(answer)
        conversation = _conversation_of(answer)
        text = answer.get("text")
        if session_id is None and reason == NO_SESSION_ID:
            session_id = self.current_session_id
            if session_id is None and run_id is not None:
                record = self.memory_store.record_answer(
                    None, text, run_id=run_id, conversation=conversation, idempotency=idempotency
                )
                if record is not None:
                    return answer, {"status": "stored", **record._asdict()}
                reason = f"{NO_SESSION_ID}, and no question was enriched with run_id {run_id!r}"
        if session_id is None:
            return answer, {"status": "skipped", "session_id": None, "reason": reason or ""}
        asked = self.current_question
        parent_id = asked[2] if asked and asked[:2] == (session_id, conversation) else None
        record = self.memory_store.record_answer(
            session_id,
            text,
            run_id=run_id,
            conversation=conversation,
            parent_id=parent_id,
            idempotency=idempotency,
        )
        return answer, {"status": "stored", **record._asdict()}
