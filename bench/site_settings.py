"""The demo site's settings, with the framework floor's URL added and DEBUG off."""

from memory_site.settings import *  # noqa: F403

DEBUG = False
ROOT_URLCONF = "site_urls"
LOGGING = {"version": 1, "disable_existing_loggers": False}
