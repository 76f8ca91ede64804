"""Conversations: a session's named chat threads (messages as a tree with a head),
their windows within a token budget and their rolling summaries.

What lives here: the store's conversation methods (``store``: mixed into
:class:`~persistent_memory.store.MemoryStore`), the rolling summaries' rules
(``summaries``), the summarizers and the work that runs them off the request
(``summarizers``, ``summarizing``, ``worker``, ``health``; the tasks of Django's task
framework are :mod:`persistent_memory.tasks`, above the store), and the signals
(``signals``). The chat format's rules that the backends share with this service
(messages, tokens, the window, records) are in :mod:`persistent_memory.chat`, below the
backends.

May import: ``backends`` (the contracts) and the layers below it (``chat``,
``idempotency``, ``validation``, ``owners``, ``conf``, ``exceptions``); the store only
for type checkers. What the work above needs (a task enqueued) is announced by signals.
"""
