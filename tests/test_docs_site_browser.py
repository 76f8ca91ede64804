"""The built documentation site opened from disk (file://, no server) in headless Chromium
at 1,280 × 800 (see test_admin_browser.py for the browser): search finds a setting, no
setting's name in the settings reference breaks over two lines, and the quickstart's
Python example is read without scrolling sideways."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_admin_browser import WAIT_SECONDS, WIDTH, browser  # noqa: F401  (a fixture)
from tests.test_docs import build_site

HEIGHT = 800


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(tmp_path_factory.mktemp("site"))


def test_search_works_from_disk_and_setting_names_stay_whole(site: Path, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    driver.set_window_size(WIDTH, HEIGHT)
    wait = WebDriverWait(driver, WAIT_SECONDS)
    driver.get((site / "settings.html").as_uri())
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "table")))

    # Every setting's name on one line, however narrow its column (the page scrolls the table).
    lines = driver.execute_script(
        "return [...document.querySelectorAll('td:first-child > a[id] + code')]"
        ".map((code) => [code.textContent, code.getClientRects().length]);"
    )
    assert len(lines) > 80, lines
    broken = [name for name, count in lines if count != 1]
    assert broken == [], broken

    # Search, with no server: the index ships as a script beside the pages.
    box = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.click()
    box.send_keys("MAX_SESSION_BYTES")
    wait.until(lambda _: driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item"))
    found = [item.text for item in driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item")]
    assert any("MAX_SESSION_BYTES" in text for text in found), found
    meta = driver.find_element(By.CSS_SELECTOR, ".md-search-result__meta").text
    assert "matching" in meta.lower() and "no matching" not in meta.lower(), meta


def test_the_quickstarts_python_example_fits_its_box(site: Path, browser: Any) -> None:  # noqa: F811
    browser.set_window_size(WIDTH, HEIGHT)
    browser.get((site / "quickstart.html").as_uri())
    widths = browser.execute_script(
        "const code = [...document.querySelectorAll('pre > code')]"
        ".find((c) => c.textContent.startsWith('from persistent_memory import get_store'));"
        "return [code.scrollWidth, code.clientWidth];"
    )
    assert widths[0] <= widths[1], widths
