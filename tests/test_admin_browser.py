"""The admin end to end in a real browser: headless Chromium driven by Selenium.

The store runs with MIRROR_MODE "deferred", so the mirror tables stay empty until an
admin page load syncs them: the sessions appear in the changelist only because
opening it synced the store. Then the "Summarize history of selected sessions now"
action is run from the changelist and its effect checked in the store and on the
session page. Screenshots go to test-artifacts/ at the repository root.

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
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_SECONDS = 20

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
    "--window-size=1400,1000",
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


def screenshot(driver: Any, name: str) -> Path:
    """Save the whole page (not just the window) as test-artifacts/<name>.png."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    width, height = driver.execute_script(
        "const e = document.documentElement;"
        "return [Math.max(e.scrollWidth, e.clientWidth), Math.max(e.scrollHeight, e.clientHeight)];"
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 8000), "scale": 1},
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def body_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def fill_store() -> None:
    """Three sessions; "browser-alpha" has 30 history entries, more than MAX_HISTORY (10)."""
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
    assert len(store.get_history("browser-alpha", limit=0)) == 30


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
        for session_id in ("browser-alpha", "browser-beta", "browser-gamma"):
            assert session_id in text, text
        assert "mirror deferred" in text, text
        assert set(MemorySession.objects.values_list("session_id", flat=True)) == {
            "browser-alpha",
            "browser-beta",
            "browser-gamma",
        }
        alpha_row = driver.find_element(By.XPATH, "//tr[.//a[normalize-space()='browser-alpha']]")
        assert alpha_row.find_element(By.CSS_SELECTOR, "td.field-history_length").text == "30"
        assert alpha_row.find_element(By.CSS_SELECTOR, "td.field-key_count").text == "3"
        screenshot(driver, "admin-01-changelist")

        # One session's page: its keys, values and history.
        alpha_row.find_element(By.LINK_TEXT, "browser-alpha").click()
        wait.until(ec.url_contains("/change/"))
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "td.field-entry")))
        session_url = driver.current_url
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
        entries = [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "td.field-entry")]
        assert len(entries) == 30, entries
        assert entries[0] == "put note"  # newest first
        assert entries[-1] == "put topic"
        assert entries.count("increment turns") == 20
        assert not any(entry.startswith("summary of") for entry in entries)
        screenshot(driver, "admin-02-session")

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
        screenshot(driver, "admin-03-after-summarize")

        history = get_store().get_history("browser-alpha", limit=0)
        assert history[0]["op"] == "summary", history[0]
        assert history[0]["summarized_count"] == 25
        assert [(e["op"], e["key"]) for e in history[1:]] == [("put", "note")] * 5
        assert get_store().get_history("browser-beta", limit=0)[0]["op"] != "summary"

        # The session page shows the summary line.
        driver.get(session_url)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "td.field-entry")))
        entries = [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "td.field-entry")]
        summaries = [entry for entry in entries if entry.startswith("summary of")]
        assert summaries == ["summary of 25 operations: increment 20, put 5; keys: note, topic, turns"], (
            entries
        )
        assert len(entries) == 6, entries
        screenshot(driver, "admin-04-session-summarized")
    except Exception:
        # Leave what the browser saw for whoever reads the failure.
        with contextlib.suppress(Exception):
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "admin-failure.html").write_text(
                f"<!-- {driver.current_url} -->\n{driver.page_source}"
            )
            driver.save_screenshot(str(ARTIFACTS / "admin-failure.png"))
        raise
