"""Operations that walk every session, in batches: sweeps, export and import, summaries
of many sessions (``maintenance``), forgetting an owner everywhere (``forget``: sessions,
records, mirror rows, memories), and the copy of every session from one Redis key layout
to the other (``relayout``). The admin actions and the management commands call
them.

May import: the store and the services (``conversations``, ``memories``), the backends,
``models``, ``owners``, ``conf``; nothing below the store imports them.
"""
