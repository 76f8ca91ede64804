"""The PERSISTENT_MEMORY settings object, get_store() and the system checks."""

from __future__ import annotations

import threading

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from persistent_memory import get_store
from persistent_memory.backends.memory import MemoryBackend
from persistent_memory.backends.redis import RedisBackend
from persistent_memory.conf import MemorySettings, memory_settings
from persistent_memory.store import MemoryStore


def check_ids(deploy: bool = False) -> list[str]:
    # No databases: Django 6.1 would otherwise run the models' database checks too.
    messages = run_checks(include_deployment_checks=deploy, databases=[])
    return sorted(m.id for m in messages if m.id.startswith("persistent_memory"))


class TestSettingsObject:
    def test_defaults(self, settings):
        settings.PERSISTENT_MEMORY = {}
        assert memory_settings.BACKEND == "memory"
        assert memory_settings.MAX_HISTORY == 100
        assert memory_settings.AUTO_SUMMARIZE is True
        assert memory_settings.MAX_SESSIONS == 1000
        assert memory_settings.SESSION_TTL_HOURS == 0
        assert memory_settings.KEY_PREFIX == "rr:memory"
        assert memory_settings.MAX_VALUE_BYTES == 1024 * 1024
        assert memory_settings.MAX_JSON_DEPTH == 100

    def test_profile_presets_and_explicit_override(self):
        conf = MemorySettings({"PROFILE": "redis"})
        assert (conf.BACKEND, conf.REDIS_HOST, conf.REDIS_PORT, conf.SESSION_TTL_HOURS) == (
            "redis",
            "localhost",
            6379,
            24,
        )
        conf = MemorySettings({"PROFILE": "redis", "SESSION_TTL_HOURS": 2})
        assert conf.SESSION_TTL_HOURS == 2
        conf = MemorySettings({"PROFILE": "custom"})
        assert (conf.BACKEND, conf.REDIS_HOST, conf.SESSION_TTL_HOURS) == ("redis", "", 0)

    def test_unknown_attribute(self):
        with pytest.raises(AttributeError):
            memory_settings.NOT_A_SETTING  # noqa: B018

    def test_override_settings_rebuilds_the_store(self, settings):
        settings.PERSISTENT_MEMORY = {"MAX_HISTORY": 7, "MIRROR_MODE": "off"}
        first = get_store()
        assert first is get_store()
        assert first.backend.max_history == 7
        settings.PERSISTENT_MEMORY = {"MAX_HISTORY": 9, "MIRROR_MODE": "off"}
        second = get_store()
        assert second is not first and second.backend.max_history == 9

    def test_get_store_is_one_object_across_threads(self, settings):
        settings.PERSISTENT_MEMORY = {"MAX_SESSIONS": 5, "MIRROR_MODE": "off"}
        seen: list[MemoryStore] = []
        barrier = threading.Barrier(8)

        def grab() -> None:
            barrier.wait()
            seen.append(get_store())

        threads = [threading.Thread(target=grab) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len({id(s) for s in seen}) == 1

    def test_backend_by_import_string(self, settings):
        settings.PERSISTENT_MEMORY = {
            "BACKEND": "persistent_memory.backends.memory.MemoryBackend",
            "MIRROR_MODE": "off",
        }
        assert isinstance(get_store().backend, MemoryBackend)

    def test_bad_backend_is_improperly_configured(self, settings):
        settings.PERSISTENT_MEMORY = {"BACKEND": "nope"}
        with pytest.raises(ImproperlyConfigured):
            get_store()
        settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "localhost:6390"}
        with pytest.raises(ImproperlyConfigured):
            get_store()

    def test_redis_url_host_and_cache_alias(self, settings, redis_client, redis_url):
        settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": redis_url}
        assert get_store().backend.describe() == redis_url
        host, port = redis_url.split("//")[1].split("/")[0].split(":")
        settings.PERSISTENT_MEMORY = {"PROFILE": "redis", "REDIS_HOST": host, "REDIS_PORT": int(port)}
        store = get_store()
        assert isinstance(store.backend, RedisBackend) and store.create_session("via-host")
        assert store.default_ttl_seconds == 24 * 3600
        settings.CACHES = {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "memory": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url},
        }
        settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_CACHE_ALIAS": "memory"}
        from django_redis import get_redis_connection

        store = get_store()
        assert store.backend.client is get_redis_connection("memory")
        assert store.list_sessions() == ["via-host"]
        store.close()  # the cache's connection is the cache's: still usable
        assert get_redis_connection("memory").ping()


class TestChecks:
    def test_default_configuration_is_clean(self, settings):
        settings.PERSISTENT_MEMORY = {}
        assert check_ids() == []

    def test_deploy_warns_about_memory_backend(self, settings, tmp_path):
        # A journal folder set: whether the default finds an SQLite file to put it beside
        # depends on the test database (test_journal.py checks W006).
        settings.PERSISTENT_MEMORY = {"JOURNAL_DIR": str(tmp_path)}
        assert check_ids(deploy=True) == ["persistent_memory.W001"]
        settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://127.0.0.1:1/0"}
        assert check_ids(deploy=True) == []

    @pytest.mark.parametrize(
        ("engine", "options", "warned"),
        [
            ("django.db.backends.sqlite3", {}, True),
            ("django.db.backends.sqlite3", {"transaction_mode": "DEFERRED", "timeout": 20}, True),
            ("django.db.backends.sqlite3", {"transaction_mode": "IMMEDIATE"}, False),
            ("django.db.backends.sqlite3", {"transaction_mode": "immediate"}, False),
            ("django.db.backends.postgresql", {}, False),
        ],
    )
    def test_deploy_warns_about_sqlite_without_immediate_transactions(
        self, settings, monkeypatch, engine, options, warned
    ):
        settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://127.0.0.1:1/0"}
        database = {**connections.databases["default"], "ENGINE": engine, "OPTIONS": options}
        monkeypatch.setitem(connections.databases, "default", database)
        assert check_ids(deploy=True) == (["persistent_memory.W009"] if warned else [])
        assert check_ids() == []  # a deployment's concern: `check` alone stays quiet

    @pytest.mark.parametrize(
        ("conf", "expected"),
        [
            ({"BACKEND": "cassandra"}, "persistent_memory.E001"),
            ({"BACKEND": "django.db.models.Model"}, "persistent_memory.E001"),
            ({"MAX_HISTORY": -1}, "persistent_memory.E002"),
            ({"MAX_SESSIONS": 0}, "persistent_memory.E002"),
            ({"MAX_VALUE_BYTES": "big"}, "persistent_memory.E002"),
            ({"SESSION_TTL_HOURS": -2}, "persistent_memory.E002"),
            ({"REDIS_PORT": 70000}, "persistent_memory.E002"),
            ({"BACKEND": "redis"}, "persistent_memory.E003"),
            ({"PROFILE": "custom"}, "persistent_memory.E003"),
            ({"BACKEND": "redis", "REDIS_CACHE_ALIAS": "default"}, "persistent_memory.E004"),
            ({"BACKEND": "redis", "REDIS_CACHE_ALIAS": "missing"}, "persistent_memory.E004"),
            ({"MAX_HISTROY": 5}, "persistent_memory.E005"),
            ({"PROFILE": "fast"}, "persistent_memory.E005"),
            ({"KEY_PREFIX": ""}, "persistent_memory.E006"),
            ({"API_PERMISSION_CLASSES": ["no.such.Class"]}, "persistent_memory.E007"),
            (
                {"API_AUTHENTICATION_CLASSES": "rest_framework.authentication.TokenAuthentication"},
                "persistent_memory.E007",
            ),
            ({"MIRROR_MODE": "sometimes"}, "persistent_memory.E008"),
            ({"TOKENIZER": "gpt2-ish"}, "persistent_memory.E011"),
            ({"TOKENIZER": "no.such.counter"}, "persistent_memory.E011"),
            ({"MAX_MESSAGES": 1}, "persistent_memory.E002"),
            ({"CONTEXT_STRATEGY": "summarize"}, "persistent_memory.E002"),
            ({"CONTEXT_OVERFLOW": "bogus"}, "persistent_memory.E002"),
            ({"SUMMARY_MAX_TOKENS": -1}, "persistent_memory.E002"),
            ({"SUMMARIZE_AFTER_TOKENS": 0}, "persistent_memory.E002"),
            ({"SESSION_IDLE_TTL_SECONDS": -5}, "persistent_memory.E002"),
            ({"IDLE_TTL_REFRESH_ON_READ": "yes"}, "persistent_memory.E002"),
            ({"CONTEXT_MAX_TOKENS": 0}, "persistent_memory.E002"),
            ({"CONTEXT_MAX_MESSAGES": "20"}, "persistent_memory.E002"),
            ({"RECORD_CONVERSATION": "yes"}, "persistent_memory.E002"),
            ({"MAX_MESSAGE_BYTES": 0}, "persistent_memory.E002"),
            ({"BACKEND": "redis", "REDIS_URL": "localhost:6390"}, "persistent_memory.E003"),
            ({"REDIS_SOCKET_TIMEOUT": 0}, "persistent_memory.E002"),
            ({"REDIS_DB": -1}, "persistent_memory.E002"),
            ({"AUTO_SUMMARIZE": "yes"}, "persistent_memory.E002"),
            ({"ADMIN_SYNC_LIMIT": 0}, "persistent_memory.E002"),
            ({"RUN_BINDING_TTL_SECONDS": 0}, "persistent_memory.E002"),
            ({"IDEMPOTENCY_TTL_SECONDS": 0}, "persistent_memory.E002"),
            ({"IDEMPOTENCY_TTL_SECONDS": "a day"}, "persistent_memory.E002"),
            ({"MAX_JSON_DEPTH": 0}, "persistent_memory.E002"),
            ({"MAX_JSON_DEPTH": 990}, "persistent_memory.E002"),
            ({"MAX_JSON_DEPTH": 10.0}, "persistent_memory.E002"),
            ({"MCP_MAX_SERVERS": 0}, "persistent_memory.E002"),
            ({"MCP_MAX_SERVERS": "100"}, "persistent_memory.E002"),
            ({"MCP_SERVER_IDLE_SECONDS": 0}, "persistent_memory.E002"),
        ],
    )
    def test_bad_configuration_is_an_error(self, settings, conf, expected):
        settings.PERSISTENT_MEMORY = conf
        assert check_ids() == [expected]

    def test_not_a_dict(self, settings):
        settings.PERSISTENT_MEMORY = ["BACKEND", "memory"]
        assert check_ids() == ["persistent_memory.E005"]
