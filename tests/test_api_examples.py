"""Every request example in the OpenAPI schema works when sent as it is (as from the docs
page), on both backends.

Written against the schema, not a list of endpoints: an endpoint added later with
examples is sent too. The order is the one a person trying the API would follow (see
persistent_memory/api/examples.py): writes first, shortest path first (a resource before
what is inside it), then reads, then deletes, longest path first. An operation with no
request example is sent once with no body, with its path parameters' examples.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import get_store
from persistent_memory.models import LongTermMemory
from tests.test_admin_browser import ARTIFACTS, WAIT_SECONDS, browser  # noqa: F401 - a fixture

WRITES = ("post", "put", "patch")
METHODS = (*WRITES, "get", "delete")


#: Path parameters whose example is the id of what an earlier example creates: the id a
#: fresh database gives (1), which the docs page fills in. A database that has held rows
#: before gives another (PostgreSQL's sequences are not reset between tests), so the test
#: sends the id the create example was answered with: (collection created in, parameter).
CREATED_IDS = {"/api/memory/memories/": "memory_id"}


@dataclass
class Call:
    method: str
    template: str  # as in the schema
    example: str | None
    body: Any = None
    query: dict[str, Any] = field(default_factory=dict)
    path_values: dict[str, Any] = field(default_factory=dict)  # the path parameters' examples
    headers: dict[str, str] = field(default_factory=dict)  # the header parameters' examples

    @property
    def path(self) -> str:
        """The path with the path parameters' examples filled in (as the docs page does)."""
        return self.path_with({})

    def path_with(self, created: dict[str, Any]) -> str:
        """The path with the ids in ``created`` instead of those parameters' examples."""
        path = self.template
        for name, value in self.path_values.items():
            path = path.replace("{" + name + "}", str(created.get(name, value)))
        return path

    def order(self) -> tuple[int, int, int]:
        depth = self.template.count("/")
        if self.method in WRITES:  # at one depth, what creates before what changes
            return (0, depth, self.method != "post")
        return (1, 0, 0) if self.method == "get" else (2, -depth, 0)


@pytest.fixture(scope="module")
def schema(django_db_blocker) -> dict[str, Any]:
    with django_db_blocker.unblock():
        response = APIClient().get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def example_value(parameter: dict[str, Any]) -> Any:
    """The value the docs page fills in for a parameter (None: it has no example)."""
    if "example" in parameter:
        return parameter["example"]
    if parameter.get("examples"):
        return next(iter(parameter["examples"].values()))["value"]
    return parameter.get("schema", {}).get("example")


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def calls(schema: dict[str, Any]) -> list[Call]:
    """One call per request example (or one with no body), in the order described above."""
    found = []
    for method, template, operation in operations(schema):
        given: dict[str, dict[str, Any]] = {"path": {}, "query": {}, "header": {}}
        for parameter in operation.get("parameters", []):
            value = example_value(parameter)
            if parameter["in"] == "path" or value is not None:
                given[parameter["in"]][parameter["name"]] = value
        content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        examples = content.get("examples") or {None: {"value": None}}
        for name, example in examples.items():
            found.append(
                Call(method, template, name, example["value"], given["query"], given["path"], given["header"])
            )
    return sorted(found, key=Call.order)  # stable: the schema's order within a step


def test_bodies_and_path_parameters_have_examples(schema):
    for method, path, operation in operations(schema):
        for parameter in operation.get("parameters", []):
            if parameter["in"] == "path":
                assert example_value(parameter) is not None, (method, path, parameter["name"])
        body = operation.get("requestBody")
        if body and body.get("required"):
            examples = body["content"]["application/json"].get("examples")
            assert examples, f"{method.upper()} {path}: a required body and no example to send"


def test_every_request_example_answers_2xx(schema, store, db):
    user = get_user_model().objects.create_user("trying", password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    planned = calls(schema)
    examples = sum(1 for call in planned if call.example)
    assert len(planned) >= len(operations(schema)) >= 16 and examples >= 8
    # Forgetting the owner, the broadest delete, comes last.
    assert (planned[-1].method, planned[-1].template) == ("delete", "/api/memory/owner/")
    failures = []
    created: dict[str, Any] = {}
    answers = {}
    for call in planned:
        data = None if call.body is None else json.dumps(call.body)
        url = call.path_with(created)
        if call.query:
            url += "?" + "&".join(f"{k}={v}" for k, v in call.query.items())
        headers = {"HTTP_" + name.upper().replace("-", "_"): value for name, value in call.headers.items()}
        response = client.generic(
            call.method.upper(), url, data or "", content_type="application/json", **headers
        )
        if not 200 <= response.status_code < 300:
            failures.append((call.method.upper(), url, call.example, response.status_code, response.content))
            continue
        answers[call.method, call.template] = response.json()
        if call.method == "post" and call.template in CREATED_IDS:
            created.setdefault(CREATED_IDS[call.template], response.json()["id"])
    assert failures == []
    # The examples did what they say: one session from the lanes, one created, then that
    # of the lanes deleted; two memories created, one deleted; then the owner forgotten.
    forgotten = answers["delete", "/api/memory/owner/"]
    assert (forgotten["owner"], forgotten["sessions"], forgotten["memories"]) == (f"user:{user.pk}", 1, 1)
    assert get_store().for_owner(f"user:{user.pk}").list_sessions() == []
    assert not LongTermMemory.objects.filter(owner=f"user:{user.pk}").exists()


def test_the_docs_page_sends_each_operations_example(
    live_server, django_db_reset_sequences, settings, schema, request
):
    """On /api/docs/, logged in through the admin: each operation's "Try it out", with
    what Swagger UI fills in (the first example, the path and header parameters'
    examples), then "Execute", answers 2xx, in the same order as above. The database's
    sequences start again, as in a fresh database, so the memory the create example
    makes has the id the detail examples name, on PostgreSQL too."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    # One backend is enough: what is checked here is what the page fills in and sends.
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off"}
    user = get_user_model().objects.create_superuser("docs", "docs@example.com", "pw-for-tests")
    driver = request.getfixturevalue("browser")  # tests/test_admin_browser.py's headless Chromium
    wait = WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.05)
    driver.get(live_server.url + "/admin/login/?next=/admin/")
    driver.find_element(By.ID, "id_username").send_keys("docs")
    driver.find_element(By.ID, "id_password").send_keys("pw-for-tests")
    driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "user-tools")))
    driver.get(live_server.url + "/api/docs/")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".opblock")))

    def send(block: Any) -> str:
        """Open the operation, "Try it out", "Execute": the status it shows."""
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", block)
        if "is-open" not in block.get_attribute("class"):
            block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
        wait.until(lambda _: block.find_elements(By.CSS_SELECTOR, "button.try-out__btn"))
        block.find_element(By.CSS_SELECTOR, "button.try-out__btn").click()
        wait.until(lambda _: block.find_elements(By.CSS_SELECTOR, "button.execute"))
        block.find_element(By.CSS_SELECTOR, "button.execute").click()
        cells = wait.until(
            lambda _: block.find_elements(By.CSS_SELECTOR, ".live-responses-table tbody .response-col_status")
        )
        status = cells[0].text
        # Closed again: Swagger UI redraws every open operation on each click.
        block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
        return status

    statuses = {}
    try:
        for call in calls(schema):
            operation_id = schema["paths"][call.template][call.method]["operationId"]
            key = (call.method.upper(), call.template)
            if key not in statuses:  # the page sends the first example; the test above sends each
                statuses[key] = send(
                    driver.find_element(By.CSS_SELECTOR, f"div.opblock[id$='-{operation_id}']")
                )
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "docs-failure.png"))
        raise
    assert len(statuses) == len(operations(schema))
    assert {key: status for key, status in statuses.items() if not status.startswith("2")} == {}
    # The last one forgot the owner.
    assert get_store().for_owner(f"user:{user.pk}").list_sessions() == []
    assert not LongTermMemory.objects.filter(owner=f"user:{user.pk}").exists()
