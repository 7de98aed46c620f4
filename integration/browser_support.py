"""The browser the UI tests drive: Debian's chromium + chromedriver through selenium
(headless, a throwaway profile), and `Page`, which waits on visible text instead of
sleeping. Shared by test_ui_browser.py and test_drift.py; a missing tool fails the
test (scripts/setup-test-deps.sh installs them), it is never skipped.

`Page.check(name)` is what every page gets: at desktop width and at 390 px (a phone)
it asserts nothing scrolls sideways, runs axe-core (npm, pinned by
integration/axe/package-lock.json, injected into the same session) and fails on any
serious or critical violation, and saves a screenshot of each width into
`$STATEGATE_ARTIFACTS` (default: a new temp dir) — never into the repo.
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
DESKTOP = (1280, 1000)
PHONE = (390, 844)
AXE_JS = Path(os.environ.get("STATEGATE_TEST_AXE_DIR", Path.home() / ".cache" / "stategate" / "axe")) \
    / "node_modules" / "axe-core" / "axe.min.js"
# Runs axe on the whole page and hands back its serious and critical violations, each
# with the first few elements it names.
AXE_RUN = """
const done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations
    .filter(v => v.impact === 'serious' || v.impact === 'critical')
    .map(v => ({id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ') + ' :: ' + n.failureSummary)}))))
  .catch(e => done('axe failed: ' + e));
"""


def artifacts_dir(test: str) -> Path:
    """Where a test's screenshots go: `$STATEGATE_ARTIFACTS/<test>` (scripts/test-all.sh
    sets it and prints it; CI keeps it), else a new temp dir. Never the repo."""
    root = os.environ.get("STATEGATE_ARTIFACTS") or tempfile.mkdtemp(prefix="stategate-artifacts-")
    path = Path(root) / test
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    driver.set_script_timeout(WAIT * 2)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


# Words (split at whitespace and after `-` and `/`, where a line may break) in headings, header cells, fact names and values,
# badges and the code in table cells that are split across lines although the word
# fits in its element's width (its pieces' widths added up): `word-break: break-all` or a column `overflow-wrap:
# anywhere` squeezed (`ver / sion`, `tf/prod / - / network`). At most 5, as text.
BROKEN_WORDS = """
const found = [];
for (const el of document.querySelectorAll('h1, th, dt, dd, .badge, td code, label')) {
  const width = el.getBoundingClientRect().width;
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node && found.length < 5; node = walker.nextNode()) {
    const re = /[^\\s\\/-]+[\\/-]?/g;
    for (let m = re.exec(node.data); m; m = re.exec(node.data)) {
      const r = document.createRange();
      r.setStart(node, m.index);
      r.setEnd(node, m.index + m[0].length);
      const rects = [...r.getClientRects()];
      const tops = new Set(rects.map(q => Math.round(q.top)));
      const long = rects.reduce((sum, q) => sum + q.width, 0);
      if (tops.size > 1 && long < width - 1) found.push(m[0] + ' in <' + el.tagName.toLowerCase() + '>');
    }
  }
}
return found;
"""


def ui_page_routes() -> list[dict]:
    """Every web UI page: the `GET` routes of the `ui` surface in the binary's own route
    table (`stategate routes`, `http::router::ROUTES`), but the stylesheet and the icon
    (files, not pages). A page added to the table is walked without anyone listing it."""
    import json
    import subprocess

    from harness import stategate_bin
    out = subprocess.run([str(stategate_bin()), "routes"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    pages = [r for r in json.loads(out) if r["surface"] == "ui" and r["method"] == "GET"
             and not r["path"].startswith("/ui/static/") and r["path"].startswith("/ui")]
    assert len(pages) >= 10, f"the route table has too few UI pages: {pages}"
    return pages


def fill_route(route: dict, values: dict) -> str:
    """The route's path and required query with each `{name}` replaced by `values[name]`
    (as `Route::fill` does); a name without a value fails, naming it."""
    import re

    def fill(template: str) -> str:
        def value(m):
            assert m.group(1) in values, f"no fixture for {{{m.group(1)}}} in {route}"
            return str(values[m.group(1)])
        return re.sub(r"\{([a-z_]+)\}", value, template)
    path = fill(route["path"])
    return path + ("?" + fill(route["query"]) if route["query"] else "")

# The innermost elements whose right edge is past the window's width (at most 5).
OVERFLOWING = """
const inner = arguments[0], out = [];
for (const el of document.body.querySelectorAll('*')) {
  const r = el.getBoundingClientRect();
  if (r.right > inner + 0.5 && ![...el.children].some(c => c.getBoundingClientRect().right > inner + 0.5)) {
    out.push('<' + el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') + '> ' +
             Math.round(r.right) + 'px: ' + el.textContent.trim().slice(0, 60));
    if (out.length >= 5) break;
  }
}
return out;
"""


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
        # Chromium reports the same race during a navigation as an inspector error
        # ("Node with given id does not belong to the document").
        from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
        for _ in range(20):
            try:
                return self.d.find_element(self.By.TAG_NAME, "body").text
            except StaleElementReferenceException:
                continue
            except WebDriverException as e:
                if "does not belong to the document" not in str(e):
                    raise
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

    def axe(self) -> list:
        """axe-core's serious and critical violations on the current page."""
        if not self.d.execute_script("return typeof window.axe === 'object'"):
            if not AXE_JS.is_file():
                pytest.fail(f"{AXE_JS} is missing; run scripts/setup-test-deps.sh (npm axe-core)")
            self.d.execute_script(AXE_JS.read_text())
        found = self.d.execute_async_script(AXE_RUN)
        assert not isinstance(found, str), found
        return found

    def check(self, name: str) -> dict:
        # (also: no word of a heading, header cell, label, badge, fact or table name
        # is split across lines when it would fit on one: see BROKEN_WORDS)
        """The checks every page gets, at desktop and phone width: no sideways
        scrolling, no serious or critical axe-core violation, a screenshot of each
        (`<name>-desktop.png`, `<name>-phone.png`). Ends at desktop width."""
        shots = {}
        try:
            for label, (width, height) in (("desktop", DESKTOP), ("phone", PHONE)):
                self.d.set_window_size(width, height)
                inner = self.d.execute_script("return window.innerWidth")
                if label == "phone":
                    assert inner <= PHONE[0] + 10, f"the window did not shrink to a phone ({inner}px)"
                wide = self.d.execute_script("return document.documentElement.scrollWidth")
                if wide > inner:
                    # Name what sticks out, so the failure says what to fix.
                    out = self.d.execute_script(OVERFLOWING, inner)
                    raise AssertionError(f"{name} at {label}: {wide}px wide in a {inner}px window: {out}")
                broken = self.d.execute_script(BROKEN_WORDS)
                assert not broken, f"{name} at {label}: words broken mid-word though they fit a line: {broken}"
                shots[label] = self.shot(f"{name}-{label}")
                violations = self.axe()
                assert not violations, f"{name} at {label}: axe-core found\n" + "\n".join(
                    f"  {v['impact']} {v['id']}: {v['help']}\n    " + "\n    ".join(v["nodes"])
                    for v in violations)
        finally:
            self.d.set_window_size(*DESKTOP)
        return shots

    # Keyboard only: TAB moves the focus, typing and ENTER go to the focused element.
    def active(self):
        return self.d.switch_to.active_element

    def tab_to(self, selector: str, limit: int = 80):
        """Presses TAB until the focused element matches `selector`; every element the
        focus lands on on the way must show where it is (a visible outline)."""
        from selenium.webdriver.common.keys import Keys
        for _ in range(limit):
            self.press(Keys.TAB)
            focus = self.d.execute_script(
                "const e = document.activeElement, s = getComputedStyle(e);"
                "return [e.matches(arguments[0]), e === document.body || "
                "(s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2), e.outerHTML.slice(0, 200)]",
                selector)
            assert focus[1], f"the focus is not visible on {focus[2]}"
            if focus[0]:
                return self.active()
        raise AssertionError(f"TAB never reached {selector}")

    def press(self, *keys: str):
        """Types `keys` into whatever has the focus (as a keyboard does)."""
        from selenium.webdriver.common.action_chains import ActionChains
        ActionChains(self.d).send_keys(*keys).perform()
