"""Django signals of conversations and their summaries (seed 003's callbacks, the Django way).

Each but ``summaries_due`` is sent best-effort with ``send_robust`` after the write it
reports has been made:
a receiver that raises is logged (by Django, on the ``django.dispatch`` logger, and
here) and can never fail or undo the write. Receivers run in the thread that made the
write (a request, the summarizer's worker), so keep them short and hand slow work on.

``messages_added``
    ``sender``: the store's class; ``store``: the store that wrote, scoped to the owner
    (the memories' extraction worker takes its own store's writes only). ``session_id``
    and ``owner`` (the caller's id and its namespace, ``""``: unowned), ``conversation``,
    ``messages`` (each with at least ``id``, ``role`` and ``content``; ``add_messages``
    sends them as stored) and ``source``: ``"add_messages"``, ``"enrich"`` (the question
    the enrich lane recorded) or ``"answer"`` (the answer the store lane recorded).
``summary_updated``
    ``sender``: :func:`~persistent_memory.conversations.summarizing.summarize_conversation`.
    ``session_id``, ``owner``, ``conversation``, ``previous`` (the summary text before,
    None: none) and ``summary`` (the committed
    :class:`~persistent_memory.backends.conversations.Summary`).
``summaries_due``
    ``sender``: :class:`~persistent_memory.conversations.worker.SummarizerWorker`. Sent by
    the summarizer thread with ``SUMMARIZER_TASKS`` when conversations are marked and no
    task it enqueued is waiting: :mod:`persistent_memory.tasks` answers with the task it
    enqueued (the thread does not summarize; the layer of the tasks is above this one).
    Sent with ``send``, not ``send_robust``: a failure to enqueue is the thread's to log.
``summarizer_health_changed``
    ``sender``: :class:`~persistent_memory.conversations.health.SummarizerHealth`.
    ``previous`` and ``state`` (see ``HEALTH_STATES``) and ``health``, the whole record.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

messages_added = Signal()
summary_updated = Signal()
summaries_due = Signal()
summarizer_health_changed = Signal()


def send_safely(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to every receiver, logging (never raising) what a receiver raises."""
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.warning(
                "persistent_memory: a signal receiver (%s) raised %s; the write it reports stands",
                getattr(receiver, "__qualname__", receiver),
                type(result).__name__,
            )
