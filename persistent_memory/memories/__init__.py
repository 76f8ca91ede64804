"""Long-term memories: facts about an owner kept in the project's database, searched
by recency, full text or meaning, and injected into the next request.

Everything goes through :func:`memories_for` (one owner's :class:`MemoryService`); the
REST API, the admin, the commands and the MCP tools never touch the model directly.

May import: ``conversations``, ``checkpoints``, ``mirror`` (its rows are the message
search's index), ``models`` and the layers below; the store for type checkers only. The
store builds the extraction worker; what the memories need from the layers above they
announce with signals (``signals``; the mirror's ``search_starting``).

The modules, top to bottom; each imports only those below it (``a | b``: side by side,
neither imports the other), checked by the ``memories`` contract of pyproject.toml:

* ``extraction/`` | ``jsonl`` | ``injection``: what is built on the service: memories
  found in conversations (the package's ``worker`` runs its functions; ``candidates`` is
  what an extractor returns), the JSON Lines export and import, the memories injected
  into a request.
* ``service``: :class:`MemoryService`, one owner's memories (add, read, change, delete,
  search).
* ``embedding_worker``: the background thread that gives memories and mirrored messages
  their vectors; writes queue onto it, and it receives the mirror's new messages.
* ``upkeep``: the work over stored memories of every owner (``embed_batch``, which the
  worker, the task and ``memory_embed`` run; consolidation; the forgetting policies).
* ``search``: the strategies ranking memories and messages in one list.
* ``message_search``: what was said, searchable (the mirror's message rows).
* ``lifecycle`` | ``records`` | ``vectors`` | ``embedders`` | ``fulltext`` |
  ``rendering``: what the rest shares: which rows a read sees and how versions are kept;
  a memory's fields and their checks; where vectors are compared; the embedder and its
  circuit; whether SQLite's full-text table is there; the chat message that lists
  memories (and how to know one again); ``signals``: ``vectors_wanted``, which the tasks
  receive with ``TASK_BACKEND``.

The mirror, below them all, tells the embedding worker about the messages it writes with a
signal (``messages_mirrored``) rather than importing it.
"""

from persistent_memory.memories.service import MemoryService, memories_for

__all__ = ["MemoryService", "memories_for"]
