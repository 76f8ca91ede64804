"""The demo site's settings with the PERSISTENT_MEMORY of a test (JSON in the environment's
PM_TEST_PERSISTENT_MEMORY): a server process on the test's own Redis Cluster."""

import json
import os

from memory_site.settings import *  # noqa: F403
from memory_site.settings import PERSISTENT_MEMORY

PERSISTENT_MEMORY = {**PERSISTENT_MEMORY, **json.loads(os.environ["PM_TEST_PERSISTENT_MEMORY"])}
