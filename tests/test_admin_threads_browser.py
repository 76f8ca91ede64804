"""A LangGraph thread's page and the long-term memories list in headless Chromium at
1,280 × 800 (see test_admin_browser.py for the browser): the thread's chat, read from its
latest checkpoint, reads as the conversations' transcripts do, its tool call folded with
its result, beside its checkpoints; the memories list fits the window.

Screenshots go to test-artifacts/; the docs' (docs/images/admin-graph-thread.png and
admin-memories.png) are written when UPDATE_DOCS_SCREENSHOTS=1, the thread's also when
it is missing.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
from django.contrib.auth import get_user_model

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402

from persistent_memory import get_store  # noqa: E402
from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver, thread_session  # noqa: E402
from persistent_memory.memories import memories_for  # noqa: E402
from persistent_memory.models import MemorySession  # noqa: E402
from tests.test_admin_browser import (  # noqa: E402, F401  (browser is a fixture)
    ARTIFACTS,
    DOCS,
    PASSWORD,
    USERNAME,
    WAIT_SECONDS,
    WIDTH,
    browser,
    screenshot,
)
from tests.test_admin_conversations_browser import element_screenshot  # noqa: E402

HEIGHT = 800
OWNER = "user:7"
THREAD = "trip-42"


def docs_screenshot(driver: Any, element: Any, name: str) -> None:
    element_screenshot(driver, element, ARTIFACTS / f"{name}.png")
    if not (DOCS / f"{name}.png").exists() or os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
        element_screenshot(driver, element, DOCS / f"{name}.png")


def run_graph() -> None:
    """A two-turn chat through a real StateGraph on the checkpointer: the model's stand-in
    calls a weather tool, the tool answers, the model answers with it."""

    def model(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage) and "weather" in last.content:
            call = {"name": "weather", "args": {"city": "Lisbon"}, "id": "call_w1"}
            return {"messages": [AIMessage("", tool_calls=[call], id="ai-1")]}
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage("Sunny and 24 °C in Lisbon: take a hat.", id="ai-2")]}
        return {"messages": [AIMessage("You're welcome, enjoy the trip!", id="ai-3")]}

    def tools(state: MessagesState) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        results = [
            ToolMessage('{"celsius": 24, "sky": "sunny"}', tool_call_id=c["id"], id="tool-1") for c in calls
        ]
        return {"messages": results}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else "__end__"

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route)
    graph.add_edge("tools", "model")
    app = graph.compile(checkpointer=PersistentMemorySaver.for_owner(OWNER))
    config = {"configurable": {"thread_id": THREAD}}
    system = SystemMessage("You plan trips. Use the weather tool.", id="sys-1")
    app.invoke({"messages": [system, HumanMessage("What's the weather in Lisbon?", id="human-1")]}, config)
    app.invoke({"messages": [HumanMessage("Thanks!", id="human-2")]}, config)


#: (owner, key, type, content): what users tell an assistant, and names as long as they come.
MEMORIES = [
    ("user:42", "home.city", "factual", "Lives in Lisbon, near the Alfama."),
    ("user:42", "travel.seat", "factual", "Prefers window seats, except on night trains."),
    ("user:42", "diet", "factual", "Vegetarian; eats fish when travelling in Portugal."),
    (
        "user:42",
        "trip.2026-05.porto",
        "episodic",
        "Went to Porto in May 2026 for a wedding and stayed three days.",
    ),
    (
        "user:42",
        "answers.style",
        "procedural",
        "Wants short answers first, details after, and prices in euros.",
    ),
    ("user:7", "ui.theme", "factual", "Uses the dark theme."),
    ("user:7", "work.languages", "semantic", "Writes Python at work and Rust for fun; reads Go."),
    (
        "team:customer-success-emea-north",
        "escalation.policy.enterprise_customers_priority_one",
        "procedural",
        "Escalate priority-one tickets of enterprise customers to the on-call engineer within "
        "fifteen minutes, then write to the account manager with the ticket's number and a summary.",
    ),
]


def fill_memories() -> None:
    for owner, key, kind, content in MEMORIES:
        memories_for(owner).add(content, key=key, type=kind)


#: How far the memories list reaches beyond the window (0: it fits).
OVERFLOW = """
const page = document.documentElement;
const results = document.querySelector("#changelist-form .results");
const right = Math.max(...[...document.querySelectorAll("#result_list th, #result_list td")]
    .map((e) => e.getBoundingClientRect().right));
return {
    inner_width: window.innerWidth,
    table_overflow: results.scrollWidth - results.clientWidth,
    page_overflow: page.scrollWidth - page.clientWidth,
    last_cell_right: right,
    view: Math.min(page.clientWidth, results.getBoundingClientRect().right),
    widths: [...document.querySelectorAll("#result_list thead th")].map(
        (e) => [e.className, Math.round(e.getBoundingClientRect().width)]),
};
"""


def test_a_graph_threads_chat_and_the_memories_list(live_server, transactional_db, settings, browser):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    get_user_model().objects.create_superuser(USERNAME, "admin@example.com", PASSWORD)
    run_graph()
    fill_memories()
    get_store().mirror.sync_dirty()
    driver = browser
    driver.set_window_size(WIDTH, HEIGHT)
    wait = WebDriverWait(driver, WAIT_SECONDS)

    try:
        driver.get(live_server.url + "/admin/login/?next=/admin/")
        driver.find_element(By.ID, "id_username").send_keys(USERNAME)
        driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        wait.until(ec.presence_of_element_located((By.ID, "user-tools")))
        assert driver.execute_script("return window.innerWidth") == WIDTH

        # The thread's page: its chat from the latest checkpoint, then its checkpoints.
        pk = MemorySession.objects.get(owner=OWNER, session_id=thread_session(THREAD)).pk
        driver.get(f"{live_server.url}/admin/persistent_memory/memorysession/{pk}/change/")
        transcript = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".pm-graph-messages")))
        shown = [
            (element.get_attribute("data-role"), element.get_attribute("data-id"))
            for element in driver.find_elements(By.CSS_SELECTOR, ".pm-graph-messages .pm-msg")
        ]
        assert shown == [
            ("system", "sys-1"),
            ("user", "human-1"),
            ("assistant", "ai-1"),
            ("tool", "tool-1"),
            ("assistant", "ai-2"),
            ("user", "human-2"),
            ("assistant", "ai-3"),
        ], shown
        assert "7 messages of channel messages in the latest checkpoint" in transcript.text, transcript.text
        fold = driver.find_element(By.CSS_SELECTOR, ".pm-graph-messages details.pm-call[data-call='call_w1']")
        result = driver.find_element(By.ID, "message-tool-1")
        assert "weather" in fold.text and not result.is_displayed()  # folded until opened
        fold.find_element(By.TAG_NAME, "summary").click()
        wait.until(lambda _: result.is_displayed())
        assert '"sky": "sunny"' in result.text and '"city": "Lisbon"' in fold.text
        assert "Sunny and 24 °C in Lisbon" in driver.find_element(By.ID, "message-ai-2").text
        headings = [h.text.upper() for h in driver.find_elements(By.CSS_SELECTOR, "fieldset.module h2")]
        messages_at, checkpoints_at = (
            headings.index("GRAPH MESSAGES (THE LATEST CHECKPOINT'S)"),
            headings.index("GRAPH CHECKPOINTS"),
        )
        assert messages_at + 1 == checkpoints_at, headings
        checkpoints = driver.find_elements(By.CSS_SELECTOR, "table.pm-checkpoints tbody tr")
        assert len(checkpoints) == len(list(PersistentMemorySaver.for_owner(OWNER).list(None)))
        assert driver.execute_script("return document.documentElement.scrollWidth") <= WIDTH
        docs_screenshot(driver, driver.find_element(By.ID, "content-main"), "admin-graph-thread")

        # The memories list: every column within the 1,280 px window, no scrolling sideways.
        driver.get(live_server.url + "/admin/persistent_memory/longtermmemory/")
        wait.until(ec.presence_of_element_located((By.ID, "result_list")))
        assert len(driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == len(MEMORIES)
        layout = driver.execute_script(OVERFLOW)
        assert layout["inner_width"] == WIDTH, layout
        assert layout["table_overflow"] <= 0 and layout["page_overflow"] <= 0, str(layout)
        assert layout["last_cell_right"] <= layout["view"], layout
        screenshot(driver, "admin-memories", docs="admin-memories")
    except Exception:
        with contextlib.suppress(Exception):
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "admin-threads-failure.html").write_text(
                f"<!-- {driver.current_url} -->\n{driver.page_source}"
            )
            driver.save_screenshot(str(ARTIFACTS / "admin-threads-failure.png"))
        raise
