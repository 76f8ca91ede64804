"""The demo site's settings with rolling summaries on and no worker thread (for commands
run as processes of their own)."""

from memory_site.settings import *  # noqa: F403
from memory_site.settings import PERSISTENT_MEMORY

PERSISTENT_MEMORY = {
    **PERSISTENT_MEMORY,
    "CONTEXT_STRATEGY": "rolling_summary",
    "SUMMARIZE_AFTER_TOKENS": 60,
    "SUMMARIZER_WORKER": False,
}
