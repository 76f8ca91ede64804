"""ASGI entry point of the demo site: Django, and the MCP endpoint at ``/mcp/`` when the
``mcp`` extra is installed (serve it with ``uvicorn memory_site.asgi:application``)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memory_site.settings")

application = get_asgi_application()

try:
    from persistent_memory.mcp.http import with_mcp
except ImportError:  # no 'mcp' extra: the site without MCP
    pass
else:
    application = with_mcp(application)
