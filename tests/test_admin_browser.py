"""The admin end to end in a real browser: headless Chromium driven by Selenium.

The store runs with MIRROR_MODE "deferred", so the mirror tables stay empty until an
admin page load syncs them: the sessions appear in the changelist only because
opening it synced the store. Then the "Summarize history of selected sessions now"
action is run from the changelist and its effect checked in the store and on the
session page. The window is 1,280 pixels wide, a common laptop screen: the sessions
list must fit it. Screenshots go to test-artifacts/ at the repository root; with
UPDATE_DOCS_SCREENSHOTS=1 the two the docs show are written to docs/images/ too (not by
default: a test run would otherwise leave the checkout modified).

Chromium and chromedriver are Debian's (/usr/bin). Without them the test is skipped,
except under CI=true, where that is a failure. Selenium Manager is never asked for a
driver: the driver and browser paths are always given.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from persistent_memory import get_store
from persistent_memory.models import MemorySession

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
DOCS = ROOT / "docs" / "images"
WIDTH = 1280
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_SECONDS = 60  # polled: a loaded machine gets there later, not never

USERNAME = "admin"
PASSWORD = "browser-test-password"
CHANGELIST = "/admin/persistent_memory/memorysession/"

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={WIDTH},1000",
]


def _no_browser(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs Chromium and chromedriver for the browser test: {reason}")
    pytest.skip(f"no browser for the browser test: {reason}")


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium on a fresh profile, always quit at teardown."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        _no_browser(f"{', '.join(missing)} missing (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        _no_browser(f"selenium is not installed ({exc})")

    profile = tempfile.mkdtemp(prefix="pm-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = None
    try:
        # An explicit driver path: Selenium Manager (which would download one) never runs.
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        driver.set_page_load_timeout(WAIT_SECONDS * 2)
        yield driver
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: Any, name: str, *, docs: str | None = None) -> Path:
    """Save the whole page (not just the window), WIDTH pixels wide, as
    test-artifacts/<name>.png; and as docs/images/<docs>.png when UPDATE_DOCS_SCREENSHOTS=1."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    height = driver.execute_script(
        "const e = document.documentElement; return Math.max(e.scrollHeight, e.clientHeight);"
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": WIDTH, "height": min(height, 8000), "scale": 1},
        },
    )
    image = base64.b64decode(shot["data"])
    path.write_bytes(image)
    if docs and os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
        (DOCS / f"{docs}.png").write_bytes(image)
    return path


def body_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def fill_store() -> None:
    """Four sessions; "browser-alpha" has 30 history entries, more than MAX_HISTORY (10);
    "browser-delta" belongs to an owner and expires in a day."""
    store = get_store()
    store.create_session("browser-alpha")
    store.put("browser-alpha", "topic", {"city": "Paris"})
    for _ in range(20):
        store.increment("browser-alpha", "turns")
    for i in range(9):
        store.put("browser-alpha", "note", f"note {i}")
    store.create_session("browser-beta")
    store.put("browser-beta", "language", "fr")
    store.increment("browser-beta", "answers", 3)
    store.create_session("browser-gamma")
    store.put("browser-gamma", "flag", True)
    owned = store.for_owner("user:42")
    owned.create_session("browser-delta", ttl_seconds=86400)
    owned.put("browser-delta", "last_answer", "In Paris.")
    owned.increment("browser-delta", "answer_count")
    assert len(store.get_history("browser-alpha", limit=0)) == 30


#: Where the sessions list's columns end, against the width of the window.
COLUMNS_IN_VIEW = """
const page = document.documentElement;
const results = document.querySelector("#changelist-form .results");
// What shows of the table: its scrolling container, within the window.
const view = Math.min(page.clientWidth, results.getBoundingClientRect().right);
const right = (selector) => Math.max(
    ...[...document.querySelectorAll(selector)].map((e) => e.getBoundingClientRect().right));
return {
    inner_width: window.innerWidth,
    view: view,
    state_header: right("#result_list th.column-state_display"),
    state_cells: right("#result_list td.field-state_display"),
    last_header: right("#result_list thead th:last-child"),
    table_overflow: results.scrollWidth - results.clientWidth,
    page_overflow: page.scrollWidth - page.clientWidth,
};
"""


def test_admin_lists_shows_and_summarizes_sessions(live_server, transactional_db, settings, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    # The memory backend is enough here: the live server runs in this process.
    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "deferred",
        "AUTO_SUMMARIZE": False,
        "MAX_HISTORY": 10,
    }
    get_user_model().objects.create_superuser(USERNAME, "admin@example.com", PASSWORD)
    fill_store()
    assert get_store().mirror.mode == "deferred"
    assert not MemorySession.objects.exists()  # nothing synced yet

    driver = browser
    wait = WebDriverWait(driver, WAIT_SECONDS)

    def open_page(path: str) -> None:
        driver.get(live_server.url + path)

    def texts(selector: str) -> list[str]:
        return [element.text for element in driver.find_elements(By.CSS_SELECTOR, selector)]

    try:
        # Log in with the admin's login form.
        open_page("/admin/login/?next=/admin/")
        driver.find_element(By.ID, "id_username").send_keys(USERNAME)
        driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        wait.until(ec.presence_of_element_located((By.ID, "user-tools")))
        assert "Site administration" in driver.title, driver.title

        # The changelist: this page load syncs the mirror.
        open_page(CHANGELIST)
        wait.until(ec.presence_of_element_located((By.ID, "result_list")))
        text = body_text(driver)
        for session_id in ("browser-alpha", "browser-beta", "browser-gamma", "browser-delta"):
            assert session_id in text, text
        assert "mirror deferred" in text, text
        assert set(MemorySession.objects.values_list("session_id", flat=True)) == {
            "browser-alpha",
            "browser-beta",
            "browser-gamma",
            "browser-delta",
        }
        headers = [h.upper() for h in texts("#result_list thead th")[1:]]  # after the checkbox
        assert headers == [
            "SESSION ID",
            "STATE",
            "OWNER",
            "KEYS",
            "HISTORY",
            "EXPIRES",
            "LAST ACTIVITY",
            "SYNCED",
        ], headers
        alpha_row = driver.find_element(By.XPATH, "//tr[.//a[normalize-space()='browser-alpha']]")
        assert alpha_row.find_element(By.CSS_SELECTOR, "td.field-history").text == "30"
        assert alpha_row.find_element(By.CSS_SELECTOR, "td.field-keys").text == "3"
        assert alpha_row.find_element(By.CSS_SELECTOR, "td.field-state_display").text == "live"
        delta_row = driver.find_element(By.XPATH, "//tr[.//a[normalize-space()='browser-delta']]")
        assert delta_row.find_element(By.CSS_SELECTOR, "td.field-owner_display").text == "user:42"
        assert delta_row.find_element(By.CSS_SELECTOR, "td.field-expires").text == "in 23 hours"
        # No TTL of their own: the memory backend's default idle expiry (30 days).
        alpha_expires = alpha_row.find_element(By.CSS_SELECTOR, "td.field-expires").text
        assert alpha_expires in ("in 4 weeks if idle", "in 1 month if idle"), alpha_expires  # by the calendar

        # At 1,280 pixels the whole table fits, State included: no scrolling sideways.
        layout = driver.execute_script(COLUMNS_IN_VIEW)
        assert layout["inner_width"] == WIDTH, layout
        assert layout["state_header"] <= layout["view"] and layout["state_cells"] <= layout["view"], layout
        assert layout["last_header"] <= layout["view"], layout
        assert layout["table_overflow"] <= 0 and layout["page_overflow"] <= 0, layout
        screenshot(driver, "admin-01-changelist")

        # One session's page: clear labels, no bookkeeping, its keys, values and history.
        alpha_row.find_element(By.LINK_TEXT, "browser-alpha").click()
        wait.until(ec.url_contains("/change/"))
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "td.field-entry")))
        session_url = driver.current_url
        labels = [
            label.rstrip(":") for label in texts("fieldset .form-row label, fieldset .flex-container label")
        ]
        assert labels == [
            "Session ID",
            "Owner",
            "State",
            "Created",
            "Expires",
            "Time to live",
            "Idle expiry",
            "Last activity",
            "Keys",
            "History entries",
            "Last sync",
        ], labels
        page = body_text(driver)
        for internal in ("Ttl seconds", "History digest", "Journal seq", "Synced at", "Gone at"):
            assert internal.lower() not in page.lower(), internal
        assert "none: the session never expires" in page
        values = {
            row.find_element(By.CSS_SELECTOR, "td.field-key").text: row.find_element(
                By.CSS_SELECTOR, "td.field-pretty_value"
            ).text
            for row in driver.find_elements(By.XPATH, "//tr[td[contains(@class, 'field-pretty_value')]]")
        }
        assert set(values) == {"note", "topic", "turns"}, values
        assert values["turns"] == "20"
        assert values["note"] == '"note 8"'
        assert '"city": "Paris"' in values["topic"]
        # Each inline row shows its key (or its entry) once: Django's label above it is hidden.
        rows = driver.find_elements(By.CSS_SELECTOR, ".inline-group tr.has_original")
        assert len(rows) == 3 + 30
        for row in rows:
            first, *rest = row.text.split("\n")
            assert rest and rest[0] != first and first not in rest[1:2], row.text
        assert not any(p.is_displayed() for p in driver.find_elements(By.CSS_SELECTOR, "td.original p"))
        entries = texts("td.field-entry")
        assert len(entries) == 30, entries
        assert entries[0] == "put note"  # newest first
        assert entries[-1] == "put topic"
        assert entries.count("increment turns") == 20
        assert not any(entry.startswith("summary of") for entry in entries)
        assert [h.upper() for h in texts(".inline-group h2")] == ["VALUES", "SESSION HISTORY (NEWEST FIRST)"]

        # The buttons at the top lead to the session's own history, not Django's change log.
        tools = driver.find_elements(By.CSS_SELECTOR, ".object-tools a")
        assert [a.text.upper() for a in tools] == ["SESSION HISTORY (30)", "IN THE HISTORY LIST"]
        assert not any(a.get_attribute("href").endswith("/history/") for a in tools)
        screenshot(driver, "admin-02-session")
        tools[0].click()
        wait.until(ec.url_contains("#history-group"))
        top, scrolled = driver.execute_script(
            "return [document.getElementById('history-group').getBoundingClientRect().top, window.scrollY];"
        )
        assert scrolled > 0 and abs(top) < 2, (top, scrolled)  # scrolled to the history
        driver.find_element(By.CSS_SELECTOR, ".object-tools a.session-history-list-link").click()
        wait.until(ec.url_contains("/historyentry/"))
        wait.until(ec.presence_of_element_located((By.ID, "result_list")))
        listed = texts("#result_list td.field-session_link")
        assert listed == ["browser-alpha"] * 30, listed

        # Back to the list: tick the session, run the action.
        open_page(CHANGELIST)
        wait.until(ec.presence_of_element_located((By.ID, "result_list")))
        checkbox = driver.find_element(
            By.XPATH, "//tr[.//a[normalize-space()='browser-alpha']]//input[@name='_selected_action']"
        )
        checkbox.click()
        assert checkbox.is_selected()
        Select(driver.find_element(By.NAME, "action")).select_by_value("summarize_now")
        go = driver.find_element(By.CSS_SELECTOR, "#changelist-form button[name=index]")
        go.click()
        wait.until(ec.staleness_of(go))
        message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li")))
        assert "success" in message.get_attribute("class"), message.text
        assert message.text.startswith("Summarized 1 of 1 sessions"), message.text
        assert "(25 entries folded)" in message.text, message.text
        screenshot(driver, "admin-03-after-summarize", docs="admin-sessions")

        history = get_store().get_history("browser-alpha", limit=0)
        assert history[0]["op"] == "summary", history[0]
        assert history[0]["summarized_count"] == 25
        assert [(e["op"], e["key"]) for e in history[1:]] == [("put", "note")] * 5
        assert get_store().get_history("browser-beta", limit=0)[0]["op"] != "summary"

        # The session page shows the summary line.
        driver.get(session_url)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "td.field-entry")))
        entries = texts("td.field-entry")
        summaries = [entry for entry in entries if entry.startswith("summary of")]
        assert summaries == ["summary of 25 operations: increment 20, put 5; keys: note, topic, turns"], (
            entries
        )
        assert len(entries) == 6, entries
        screenshot(driver, "admin-04-session-summarized", docs="admin-session")
    except Exception:
        # Leave what the browser saw for whoever reads the failure.
        with contextlib.suppress(Exception):
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "admin-failure.html").write_text(
                f"<!-- {driver.current_url} -->\n{driver.page_source}"
            )
            driver.save_screenshot(str(ARTIFACTS / "admin-failure.png"))
        raise
