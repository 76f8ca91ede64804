"""Errors as callers and operators see them: what a caller is told of a server-side error
and what the log keeps (``reporting``), passwords kept out of Django's error reports
(``debug``), and connections the database dropped (``database``). The exceptions
themselves are :mod:`persistent_memory.exceptions`; the project's error views are
:mod:`persistent_memory.api.error_views`.

May import: ``exceptions`` and ``conf``; never the store or the services.
"""
