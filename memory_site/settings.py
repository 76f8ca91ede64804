"""Settings of the demo site.

The environment picks the parts a newcomer may want to switch:
``MEMORY_BACKEND`` (memory | redis), ``REDIS_URL``, ``SESSION_TTL_HOURS``,
``DATABASE_URL`` (SQLite in the project folder by default), ``MEMORY_JOURNAL_DIR``
(the memory backend's crash journal: a folder of the database's own by default, beside
the SQLite file or in ``memory-journal/`` here; a path moves it, ``off`` turns it off),
``EMBEDDER_BASE_URL`` and ``EMBEDDER_MODEL`` (semantic search of long-term memories with
any server speaking OpenAI's embeddings API, e.g. Ollama's ``http://localhost:11434/v1``
and ``nomic-embed-text``; none by default) and ``DJANGO_DEBUG=1`` (Django's debug pages;
off by default).
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

# A demo: the key only has to be secret in a real deployment.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-insecure-key-change-me")
# Off unless asked for: debug pages show settings, the environment and local variables.
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "persistent_memory",
]

MIDDLEWARE = [
    # JSON errors on the API's paths with DEBUG on too (see docs/install.md).
    "persistent_memory.api.error_views.APIErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's and the API docs' static files, with DEBUG off too.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "memory_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "memory_site.wsgi.application"
ASGI_APPLICATION = "memory_site.asgi.application"

DATABASES = {
    # Health checks: a pooled connection the database dropped (a restart, a network cut)
    # is replaced at the next request's start, not answered with a 503.
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}", conn_max_age=60, conn_health_checks=True
    ),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A threaded server writes from several threads (requests and the mirror worker):
    # take the write lock up front and wait for it, and let readers go on (WAL).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
    }

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Django's staticfiles serves only with DEBUG on: WhiteNoise serves the apps' own static
# folders (the finders, read once at start), so the demo needs no `collectstatic` and
# no STATIC_ROOT (set one to collect them for another web server).
WHITENOISE_USE_FINDERS = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "django-persistent-memory",
    "DESCRIPTION": "Cross-session memory for LLM pipelines, keyed by session_id.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from the sidecar package's static files: the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The schema and the docs are public: no authentication, so no database lookup of a
    # token or a session (they answer while the database is down).
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
}

PERSISTENT_MEMORY = {
    "BACKEND": os.environ.get("MEMORY_BACKEND", "memory"),
    "SESSION_TTL_HOURS": float(os.environ.get("SESSION_TTL_HOURS", "0")),
    # Sessions unused this long expire (0: never), so that sessions nobody comes back to
    # free their place: a week by default.
    "SESSION_IDLE_TTL_SECONDS": float(os.environ.get("SESSION_IDLE_TTL_SECONDS", str(7 * 24 * 3600))),
}
if os.environ.get("REDIS_URL"):
    PERSISTENT_MEMORY["REDIS_URL"] = os.environ["REDIS_URL"]
if os.environ.get("EMBEDDER_BASE_URL"):
    PERSISTENT_MEMORY["EMBEDDER"] = "openai"
    PERSISTENT_MEMORY["EMBEDDER_OPTIONS"] = {
        "base_url": os.environ["EMBEDDER_BASE_URL"],
        "model": os.environ.get("EMBEDDER_MODEL", "nomic-embed-text"),
        "api_key_env": "EMBEDDER_API_KEY" if os.environ.get("EMBEDDER_API_KEY") else None,
    }
if os.environ.get("MEMORY_JOURNAL_DIR"):
    journal_dir = os.environ["MEMORY_JOURNAL_DIR"]
    PERSISTENT_MEMORY["JOURNAL_DIR"] = False if journal_dir.lower() in ("off", "false", "0") else journal_dir

# The debug page (DJANGO_DEBUG=1) and error reports mask the Redis password (REDIS_URL).
DEFAULT_EXCEPTION_REPORTER_FILTER = "persistent_memory.errors.debug.SafeExceptionReporterFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "persistent_memory": {"handlers": ["console"], "level": os.environ.get("MEMORY_LOG_LEVEL", "INFO")},
        # Server errors of every page (Django sends them to the console only with DEBUG on).
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
