"""The REST API (Django REST framework): views, serializers, errors as JSON with a code,
throttling, and the project's error views (``error_views``).

May import: the store and the services below it (``pipeline``, ``health``, ``memories``,
``conversations``, ``operations``), ``owners`` and the layers below them; never the
admin (the two stand side by side). The MCP tools import its errors.
"""
