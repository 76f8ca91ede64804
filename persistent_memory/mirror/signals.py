"""Django signals of the mirror, so the parts above it act on its rows without the
mirror importing them.

``messages_mirrored``
    ``sender``: :func:`~persistent_memory.mirror.conversations.write_conversations`;
    ``messages``: ``(conversation row id, message id)`` of each message row it wrote, sent
    inside the sync's transaction (the memories' embedding worker queues them for their
    vectors once it commits). Sent with ``send``: a receiver that raises fails the sync
    like any other error of it, which is retried.
``search_starting``
    ``sender``: :func:`~persistent_memory.memories.message_search.catch_up`; ``owner``
    (None: no owner's sessions in particular). Sent before the mirror's messages are
    searched, so that the store (:mod:`persistent_memory.store`, which the memories sit
    below) first syncs what it marked dirty: :meth:`.sessions.Mirror.catch_up`. Sent with
    ``send``: the search logs a failure and goes on.
"""

from __future__ import annotations

from django.dispatch import Signal

messages_mirrored = Signal()
search_starting = Signal()
