"""The OpenAPI schema and the offline docs page."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from drf_spectacular.validation import validate_schema

ENDPOINTS = {
    ("/api/memory/enrich/", "post"),
    ("/api/memory/store/", "post"),
    ("/api/memory/process/", "post"),
    ("/api/memory/health/", "get"),
    ("/api/memory/sessions/", "get"),
    ("/api/memory/sessions/", "post"),
    ("/api/memory/sessions/{session_id}/", "get"),
    ("/api/memory/sessions/{session_id}/", "delete"),
    ("/api/memory/sessions/{session_id}/memory/", "get"),
    ("/api/memory/sessions/{session_id}/memory/", "delete"),
    ("/api/memory/sessions/{session_id}/memory/{key}/", "get"),
    ("/api/memory/sessions/{session_id}/memory/{key}/", "put"),
    ("/api/memory/sessions/{session_id}/memory/{key}/", "delete"),
    ("/api/memory/sessions/{session_id}/memory/{key}/increment/", "post"),
    ("/api/memory/sessions/{session_id}/history/", "get"),
    ("/api/memory/sessions/{session_id}/summarize/", "post"),
    ("/api/memory/sessions/{session_id}/messages/", "get"),
    ("/api/memory/sessions/{session_id}/messages/", "post"),
    ("/api/memory/sessions/{session_id}/messages/", "delete"),
    ("/api/memory/sessions/{session_id}/context/", "get"),
    ("/api/memory/sessions/{session_id}/conversations/", "get"),
    ("/api/memory/sessions/{session_id}/head/", "put"),
    ("/api/memory/memories/", "get"),
    ("/api/memory/memories/", "post"),
    ("/api/memory/memories/{memory_id}/", "get"),
    ("/api/memory/memories/{memory_id}/", "patch"),
    ("/api/memory/memories/{memory_id}/", "delete"),
    ("/api/memory/memories/{memory_id}/similar/", "get"),
    ("/api/memory/memories/search/", "post"),
    ("/api/memory/memories/stats/", "get"),
    ("/api/memory/owner/", "get"),
    ("/api/memory/owner/", "delete"),
}


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    with django_db_blocker.unblock():
        from rest_framework.test import APIClient

        response = APIClient().get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def test_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate_schema(schema)  # raises on an invalid document


def test_schema_generation_has_no_warnings():
    # --fail-on-warn turns any warning (a view it cannot describe) into an error.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_every_endpoint_is_documented(schema):
    documented = {(path, method) for path, ops in schema["paths"].items() for method in ops}
    assert documented == ENDPOINTS


def test_bodies_and_error_codes_are_documented(schema):
    for path, method in ENDPOINTS:
        operation = schema["paths"][path][method]
        responses = operation["responses"]
        success = [code for code in responses if code.startswith("2")]
        assert success, (path, method)
        assert "content" in responses[success[0]], (path, method)
        if method in ("post", "put") and not path.endswith(("summarize/", "increment/")):
            assert "requestBody" in operation, (path, method)
        assert "503" in responses, (path, method)
        if path != "/api/memory/health/":
            assert {"400", "401", "403", "413"} <= set(responses), (path, method)
        if "{session_id}" in path:
            assert {"404", "410"} <= set(responses), (path, method)
    assert "409" in schema["paths"]["/api/memory/sessions/"]["post"]["responses"]
    assert "409" in schema["paths"]["/api/memory/sessions/{session_id}/messages/"]["post"]["responses"]
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"detail", "code"}


WRITES = {
    ("/api/memory/enrich/", "post"),
    ("/api/memory/store/", "post"),
    ("/api/memory/process/", "post"),
    ("/api/memory/sessions/", "post"),
    ("/api/memory/sessions/{session_id}/", "delete"),
    ("/api/memory/sessions/{session_id}/memory/", "delete"),
    ("/api/memory/sessions/{session_id}/memory/{key}/", "put"),
    ("/api/memory/sessions/{session_id}/memory/{key}/", "delete"),
    ("/api/memory/sessions/{session_id}/memory/{key}/increment/", "post"),
    ("/api/memory/sessions/{session_id}/summarize/", "post"),
    ("/api/memory/sessions/{session_id}/messages/", "post"),
    ("/api/memory/sessions/{session_id}/messages/", "delete"),
    ("/api/memory/sessions/{session_id}/head/", "put"),
}


def test_writes_document_the_idempotency_key(schema):
    for path, method in ENDPOINTS:
        operation = schema["paths"][path][method]
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        if (path, method) in WRITES:
            assert headers == {"Idempotency-Key"}, (path, method)
            assert "422" in operation["responses"], (path, method)
        elif (path, method) == ("/api/memory/owner/", "delete"):
            # Idempotent as it is; what it needs is a confirmation.
            assert headers == {"Confirm-Forget"}, (path, method)
        else:
            assert not headers, (path, method)


def test_docs_page_works_offline(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html.lower()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets
    for asset in assets:
        assert not asset.startswith(("http://", "https://", "//")), asset
    static = [a for a in assets if a.startswith("/static/")]
    assert any(a.endswith("swagger-ui-bundle.js") for a in static)
    for asset in static:
        assert finders.find(asset.removeprefix("/static/")), asset
