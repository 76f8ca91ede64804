"""A conversation's transcript in the admin, in headless Chromium (see test_admin_browser.py
for the browser): a chat with a system message, a tool call and a regenerated answer
reads as a transcript on its session's page, the tool result folded under its call,
and the first answer is one click away in its own thread.

Screenshots go to test-artifacts/; the admin page's (docs/images/admin-conversation.png) is
written when it is missing or when UPDATE_DOCS_SCREENSHOTS=1.
"""

from __future__ import annotations

import base64
import contextlib
import os
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model

from persistent_memory import get_store
from tests.test_admin_browser import (  # noqa: F401  (browser is a fixture)
    ARTIFACTS,
    PASSWORD,
    ROOT,
    USERNAME,
    WAIT_SECONDS,
    browser,
    screenshot,
)
from tests.test_conversations_mirror import WEATHER_CALL

DOCS_SCREENSHOT = ROOT / "docs" / "images" / "admin-conversation.png"
SESSION_ID = "trip-planner"


def fill_chat() -> None:
    """A chat with a pinned system message, a tool call and its result, a regenerated
    answer, and one more turn after it."""
    store = get_store()
    store.add_messages(
        SESSION_ID,
        [
            {"id": "sys", "role": "system", "content": "You are a travel assistant. Answer in one sentence."},
            {"id": "u1", "role": "user", "content": "What's the weather in Paris right now?"},
            {"id": "a1", "role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
            {
                "id": "t1",
                "role": "tool",
                "tool_call_id": "call_1",
                "content": '{"celsius": 21, "sky": "clear", "wind_kmh": 9}',
            },
            {"id": "a2", "role": "assistant", "content": "21 degrees."},
        ],
    )
    store.add_messages(  # the answer regenerated: a branch from the tool result
        SESSION_ID,
        [
            {
                "id": "a2b",
                "role": "assistant",
                "content": "It is 21 °C and clear in Paris, with a light breeze: a good day for a walk.",
                "metadata": {"model": "gpt-4o", "regenerated": True},
            },
            {"id": "u2", "role": "user", "content": "Great, and what should I pack for tomorrow?"},
            {
                "id": "a3",
                "role": "assistant",
                "content": "A light jacket and sunglasses: tomorrow stays dry, between 15 and 23 °C.",
            },
        ],
        parent_id="t1",
    )


def element_screenshot(driver: Any, element: Any, path: Path) -> Path:
    """Save ``element`` (and a margin around it) as a PNG, however tall it is."""
    x, y, width, height = driver.execute_script(
        "const r = arguments[0].getBoundingClientRect();"
        "return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height];",
        element,
    )
    margin = 8
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {
                "x": max(0, x - margin),
                "y": max(0, y - margin),
                "width": width + 2 * margin,
                "height": min(height + 2 * margin, 4000),
                "scale": 1,
            },
        },
    )
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def test_the_transcript_reads_as_a_chat(live_server, transactional_db, settings, browser):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    get_user_model().objects.create_superuser(USERNAME, "admin@example.com", PASSWORD)
    fill_chat()
    driver = browser
    wait = WebDriverWait(driver, WAIT_SECONDS)

    def messages_shown() -> list[tuple[str, str]]:
        return [
            (element.get_attribute("data-role"), element.get_attribute("data-id"))
            for element in driver.find_elements(By.CSS_SELECTOR, ".pm-transcript .pm-msg")
        ]

    try:
        driver.get(live_server.url + "/admin/login/?next=/admin/persistent_memory/memorysession/")
        driver.find_element(By.ID, "id_username").send_keys(USERNAME)
        driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        wait.until(ec.presence_of_element_located((By.ID, "result_list")))  # this load synced the mirror
        driver.find_element(By.LINK_TEXT, SESSION_ID).click()
        transcript = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".pm-transcript")))

        # The current thread, in order, the tool result inside its call's fold.
        assert messages_shown() == [
            ("system", "sys"),
            ("user", "u1"),
            ("assistant", "a1"),
            ("tool", "t1"),
            ("assistant", "a2b"),
            ("user", "u2"),
            ("assistant", "a3"),
        ]
        system = driver.find_element(By.ID, "message-sys")
        assert "pinned system message" in system.text
        # Roles are told apart at a glance: each has its own colour.
        colours = {
            role: driver.find_element(By.CSS_SELECTOR, f".pm-msg.pm-{role} .pm-role").value_of_css_property(
                "background-color"
            )
            for role in ("system", "user", "assistant", "tool")
        }
        assert len(set(colours.values())) == 4, colours
        result = driver.find_element(By.ID, "message-t1")
        fold = driver.find_element(By.CSS_SELECTOR, "details.pm-call[data-call='call_1']")
        assert not result.is_displayed()  # folded until opened
        summary = fold.find_element(By.TAG_NAME, "summary")
        assert "weather" in summary.text and '"celsius": 21' in summary.text
        summary.click()
        wait.until(lambda _: result.is_displayed())
        assert '"sky": "clear"' in result.text
        assert '"city": "Paris"' in fold.text  # the arguments, indented
        answer = driver.find_element(By.ID, "message-a2b")
        assert "It is 21 °C and clear in Paris" in answer.text
        assert "version 2 of 2" in answer.text
        assert "21 degrees." not in transcript.text.replace("“21 degrees.”", "")  # only in the thread link
        screenshot(driver, "admin-conversation-session")
        conversations = driver.find_element(By.ID, "conversations-group")
        element_screenshot(driver, conversations, ARTIFACTS / "admin-conversation.png")
        if not DOCS_SCREENSHOT.exists() or os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
            element_screenshot(driver, conversations, DOCS_SCREENSHOT)

        # The first answer, one click away: its own thread on the conversation's page.
        answer.find_element(By.CSS_SELECTOR, ".pm-versions a[data-leaf='a2']").click()
        wait.until(ec.url_contains("leaf=a2"))
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".pm-transcript")))
        assert messages_shown() == [
            ("system", "sys"),
            ("user", "u1"),
            ("assistant", "a1"),
            ("tool", "t1"),
            ("assistant", "a2"),
        ]
        assert "Thread ending at a2" in driver.find_element(By.ID, "content-main").text
        assert "version 1 of 2" in driver.find_element(By.ID, "message-a2").text
        shown = driver.find_element(By.CSS_SELECTOR, ".pm-thread.pm-shown")
        assert shown.get_attribute("data-leaf") == "a2"
        screenshot(driver, "admin-conversation-branch")

        # And back to the current thread from the threads' links.
        driver.find_element(By.CSS_SELECTOR, ".pm-thread[data-leaf='a3']").click()
        wait.until(ec.url_contains("leaf=a3"))
        wait.until(ec.presence_of_element_located((By.ID, "message-a3")))
        assert [message_id for _, message_id in messages_shown()][-3:] == ["a2b", "u2", "a3"]
    except Exception:
        with contextlib.suppress(Exception):
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "admin-conversation-failure.html").write_text(
                f"<!-- {driver.current_url} -->\n{driver.page_source}"
            )
            driver.save_screenshot(str(ARTIFACTS / "admin-conversation-failure.png"))
        raise
