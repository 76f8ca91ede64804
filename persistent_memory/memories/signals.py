"""Django signals of the long-term memories, so the parts above them act for them without
the memories importing them.

``vectors_wanted``
    ``sender``: the function that wrote rows without a vector; ``kind``: ``"memory"`` or
    ``"message"`` (mirrored messages) and ``ids``, their row ids. Sent with
    ``TASK_BACKEND`` (and ``EMBEDDER_WORKER``) instead of handing the ids to this process's
    embedding worker: :mod:`persistent_memory.tasks` enqueues its ``embed`` task once the
    write commits. Sent with ``send``: a failure to enqueue is logged by the transaction's
    ``on_commit``, and ``memory_embed`` catches up.
"""

from __future__ import annotations

from django.dispatch import Signal

vectors_wanted = Signal()
