"""The browser the UI tests drive: Debian's chromium + chromedriver through selenium
(headless, a throwaway profile), and `Page`, which waits on visible text instead of
sleeping. Shared by test_ui_browser.py and test_drift.py; a missing tool fails the
test (scripts/setup-test-deps.sh installs them), it is never skipped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 30


def _selenium():
    try:
        from selenium import webdriver
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError as e:  # a missing tool fails: the setup script installs it
        pytest.fail(f"selenium is not installed ({e}); run scripts/setup-test-deps.sh")
    return webdriver, By, WebDriverWait


@pytest.fixture
def browser(tmp_path):
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} is missing; run scripts/setup-test-deps.sh (apt chromium chromium-driver)")
    webdriver, _, _ = _selenium()
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,1000"):
        opts.add_argument(arg)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


class Page:
    """The browser, with waits on visible text (never fixed sleeps)."""

    def __init__(self, driver, base: str, shots: Path):
        self.d = driver
        self.base = base
        self.shots = shots
        _, self.By, self.Wait = _selenium()

    def open(self, path: str):
        self.d.get(self.base + path)

    def text(self) -> str:
        # A page that reloads itself (a drift run still going) can replace the body
        # between finding it and reading it: read again.
        from selenium.common.exceptions import StaleElementReferenceException
        for _ in range(20):
            try:
                return self.d.find_element(self.By.TAG_NAME, "body").text
            except StaleElementReferenceException:
                continue
        return self.d.find_element(self.By.TAG_NAME, "body").text

    def wait_text(self, *needles: str) -> str:
        try:
            # A navigation may replace <body> between finding it and reading its text.
            from selenium.common.exceptions import StaleElementReferenceException
            self.Wait(self.d, WAIT, ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: all(n in self.text() for n in needles))
        except Exception:
            self.shot("failed-wait")
            raise AssertionError(f"page never showed {needles}; it shows:\n{self.text()}")
        return self.text()

    def css(self, selector: str):
        return self.d.find_element(self.By.CSS_SELECTOR, selector)

    def fill(self, selector: str, value: str):
        field = self.css(selector)
        field.clear()
        field.send_keys(value)

    def submit(self, form: str):
        self.css(f"{form} button[type=submit]").click()

    def login(self, token: str):
        """Sends `token` through the login form on the current page."""
        self.fill("input[name=token]", token)
        self.submit("form[action='/ui/login']")

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.d.save_screenshot(str(path))
        return path
