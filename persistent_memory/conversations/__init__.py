"""Conversations: a session's named chat threads (messages as a tree with a head),
their windows within a token budget and their rolling summaries.

What lives here: the store's conversation methods (``store``: mixed into
:class:`~persistent_memory.store.MemoryStore`), the rules the backends share (``messages``,
``window``, ``tokens``, ``summaries``, ``records``), the summarizers and the work that
runs them off the request (``summarizers``, ``summarizing``, ``worker``, ``tasks``,
``health``), and the signals (``signals``).

May import: ``backends.base`` and the layers below it (``idempotency``, ``validation``,
``owners``, ``conf``, ``exceptions``); the store only for type checkers, and the Django
task (``tasks``) the process's store when it runs.
"""
