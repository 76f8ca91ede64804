"""The demo site's settings with room for two owners' MCP servers (for the eviction test)."""

from memory_site.settings import *  # noqa: F403
from memory_site.settings import PERSISTENT_MEMORY

PERSISTENT_MEMORY = {**PERSISTENT_MEMORY, "MCP_MAX_SERVERS": 2}
