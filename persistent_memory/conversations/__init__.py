"""Conversations: the store's side of a session's named chat threads (messages as a tree
with a head, read as a window within a token budget) and their rolling summaries.

What lives here: the store's conversation methods (``store``: mixed into
:class:`~persistent_memory.store.MemoryStore`), the rolling summaries' rules
(``summaries``), the summarizers and the work that runs them off the request
(``summarizers`` with ``chat_completions`` and ``extractive``, ``summarizing``,
``worker``, ``health``; the tasks of Django's task
framework are :mod:`persistent_memory.tasks`, above the store), and the signals
(``signals``). The chat format's rules that the backends share with this service
(messages, tokens, the window, records) are in :mod:`persistent_memory.chat`, below the
backends.

May import: ``mirror``, ``models``, ``backends`` (the contracts) and the layers below
them (``chat``, ``idempotency``, ``validation``, ``owners``, ``conf``, ``exceptions``,
``telemetry``); the store only for type checkers. What the work above needs (a task
enqueued) is announced by signals.
"""
