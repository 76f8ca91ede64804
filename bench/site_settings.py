"""The demo site's settings, with the framework floor's URL added and DEBUG off."""

from memory_site.settings import *  # noqa: F403

DEBUG = False
ROOT_URLCONF = "site_urls"
LOGGING = {"version": 1, "disable_existing_loggers": False}
# The requests' own work: the extraction worker's check that a batch's session is still
# there is one more script call per write, made in the background (memories_bench.py
# measures extraction).
PERSISTENT_MEMORY = {**PERSISTENT_MEMORY, "MEMORY_EXTRACTION_WORKER": False}  # noqa: F405
