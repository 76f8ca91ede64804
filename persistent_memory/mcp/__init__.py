"""Memory over the Model Context Protocol (the optional ``mcp`` extra).

:func:`~persistent_memory.mcp.server.build_server` builds one owner's server (its tools
read and write only that owner's conversations and memories); ``manage.py memory_mcp``
serves it over stdio, and :mod:`persistent_memory.mcp.http` over streamable HTTP with
the API's tokens.

May import: the REST API (its errors and tokens), the store, the services and the
layers below them.
"""
