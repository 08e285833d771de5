"""``replay --html`` in a real browser: Debian's headless Chromium through Selenium.

The page must render without a console error, list every session with its trips, open the
detail of a call where something was detected on a click and from the keyboard, list the
sessions worst first and sort them by any column. Skipped when chromium or chromedriver is
missing, except in CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.command import Command
from selenium.webdriver.remote.webelement import WebElement

from otel_loopguard._guard import LoopGuard
from otel_loopguard.config import PRESETS, Mode
from otel_loopguard.replay import run_replay

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OPTIONS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
SESSIONS = 200
#: The worst session: many stops, its calls last in the input.
WORST = "s150"
ACTION_COLUMNS = {"remind": "reminders", "deny": "denials", "rescue": "rescues", "stop": "stops"}


def require_browser() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        message = f"{', '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must install it (.ci/install)")
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # with the driver's path: Selenium Manager never runs
    for option in OPTIONS:
        options.add_argument(option)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def call(session: str, tool: str, arguments: object) -> str:
    record = {
        "session": session,
        "tool": tool,
        "arguments": arguments,
        "error": False,
        "result": "no match",
    }
    return json.dumps(record)


def input_lines() -> list[str]:
    """200 sessions in the replay's JSON-lines format: every tenth loops on one call, the rest
    read distinct files, and the worst loops long enough for many stops, last in the input."""
    lines: list[str] = []
    for n in range(SESSIONS):
        session = f"s{n:03d}"
        if session == WORST:
            continue
        if n % 10 == 3:
            lines += [call(session, "grep", {"q": "todo"})] * (6 + n % 7)
        else:
            lines += [call(session, "read", {"path": f"f{k}"}) for k in range(1 + n % 4)]
    lines += [call(WORST, "bash", {"command": "make test"})] * 40
    return lines


def render(
    tmp_path: Path, mode: Mode | None = None
) -> tuple[Path, list[dict[str, Any]], list[str]]:
    """Replay the input with --json and --html; return the page, the JSON lines, the input."""
    lines = input_lines()
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    page = tmp_path / "report.html"
    out = io.StringIO()
    status = run_replay(
        [str(path)],
        PRESETS["default"],
        json_output=True,
        mode=mode,
        stdout=out,
        stderr=io.StringIO(),
        html_path=str(page),
    )
    assert status == 0
    return page, [json.loads(line) for line in out.getvalue().splitlines()], lines


def browser_log(browser: WebDriver) -> list[dict[str, Any]]:
    """The console messages since the last call (what ``get_log("browser")`` returns; that
    method has no type annotations)."""
    entries: list[dict[str, Any]] = browser.execute(Command.GET_LOG, {"type": "browser"})["value"]
    return entries


def open_page(browser: WebDriver, page: Path) -> None:
    browser_log(browser)  # drop what an earlier page logged
    browser.get(page.as_uri())
    assert browser.title == "otel-loopguard replay"


def console_errors(browser: WebDriver) -> list[dict[str, Any]]:
    return [entry for entry in browser_log(browser) if entry["level"] == "SEVERE"]


def index_rows(browser: WebDriver) -> list[dict[str, str]]:
    """The index as shown: one dict per row, header text to cell text (and to its sort value
    under ``'<header> value'`` where the cell has one)."""
    rows: list[dict[str, str]] = browser.execute_script(
        """
        const table = document.querySelector("table.index");
        const heads = Array.from(table.tHead.rows[0].cells, th => th.textContent.trim()
            .replace(/[\\u25B4\\u25BE]$/, "").trim());
        return Array.from(table.tBodies[0].rows, row => {
          const found = {};
          Array.from(row.cells).forEach((cell, i) => {
            found[heads[i]] = cell.textContent;
            if (cell.hasAttribute("data-v")) found[heads[i] + " value"] = cell.dataset.v;
          });
          return found;
        });
        """
    )
    return rows


def trips(rows: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    found: dict[str, Counter[str]] = {}
    for row in rows:
        counter = found.setdefault(row["session"], Counter())
        if row["action"] != "allow":
            counter[row["action"]] += 1
    return found


# -- rendering and content --------------------------------------------------------------------


@pytest.mark.slow
def test_the_page_renders_without_console_errors_and_lists_every_session(
    browser: WebDriver, tmp_path: Path
) -> None:
    page, rows, _ = render(tmp_path)
    open_page(browser, page)
    assert console_errors(browser) == []
    shown = {row["session"]: row for row in index_rows(browser)}
    expected = trips(rows)
    assert set(shown) == set(expected) and len(shown) == SESSIONS
    calls = Counter(row["session"] for row in rows if row.get("phase") != "post")
    for session, counts in expected.items():
        row = shown[session]
        assert int(row["calls"]) == calls[session]
        for action, header in ACTION_COLUMNS.items():
            assert int(row[header]) == counts[action], (session, action)
    assert sum(1 for counts in expected.values() if counts["stop"]) >= 10
    # 100 sessions have a timeline, the worst ones: the worst of all, last in the input, too.
    sections = browser.find_elements(By.CSS_SELECTOR, "section.session")
    assert len(sections) == 100
    drawn = {section.get_attribute("data-session") for section in sections}
    assert WORST in drawn
    assert all(f"s{n:03d}" in drawn for n in range(3, SESSIONS, 10))  # every looping session


@pytest.mark.slow
def test_the_index_lists_the_worst_session_first(browser: WebDriver, tmp_path: Path) -> None:
    page, rows, _ = render(tmp_path)
    open_page(browser, page)
    shown = index_rows(browser)
    expected = trips(rows)
    assert shown[0]["session"] == WORST
    assert expected[WORST]["stop"] == max(counts["stop"] for counts in expected.values()) > 10
    worst = [int(row["worst detected value"]) for row in shown]
    assert worst == sorted(worst, reverse=True)  # strongest detection first, then how often
    assert shown[-1]["worst detected"] == "-"


@pytest.mark.slow
def test_every_column_sorts_the_index(browser: WebDriver, tmp_path: Path) -> None:
    page, _, _ = render(tmp_path)
    open_page(browser, page)
    headers = browser.find_elements(By.CSS_SELECTOR, "table.index thead th")
    assert len(headers) == 10
    for number, header in enumerate(headers):
        name = header.text.strip()
        numeric = header.get_attribute("data-sort") == "number"
        for click in range(2):
            before = [row["session"] for row in index_rows(browser)]
            header.find_element(By.TAG_NAME, "button").click()
            direction = header.get_attribute("aria-sort")
            first = "descending" if numeric else "ascending"
            other = "ascending" if numeric else "descending"
            assert direction == (first if click == 0 else other), name
            values = column_values(browser, number, numeric)
            assert len(values) == SESSIONS
            assert values == sorted(values, reverse=direction == "descending"), name
            if len(set(values)) > 1:  # (no session had a rescue: that column is all 0)
                assert [row["session"] for row in index_rows(browser)] != before, name
            others = browser.find_elements(By.CSS_SELECTOR, "table.index thead th[aria-sort]")
            assert [h.text for h in others] == [header.text]
    assert console_errors(browser) == []


def column_values(browser: WebDriver, column: int, numeric: bool) -> list[Any]:
    values: list[str] = browser.execute_script(
        """
        const rows = document.querySelector("table.index").tBodies[0].rows;
        return Array.from(rows, row => {
          const cell = row.cells[arguments[0]];
          return cell.hasAttribute("data-v") ? cell.dataset.v : cell.textContent;
        });
        """,
        column,
    )
    if numeric:
        return [float(value.replace(",", "")) for value in values]
    return [value.lower() for value in values]


# -- a call's detail --------------------------------------------------------------------------


def first_decision(session: str, lines: list[str], mode: Mode) -> tuple[int, Any]:
    """The index and decision of the session's first call where something was detected, from a
    guard fed the session's calls as the replay feeds them."""
    guard = LoopGuard(PRESETS["default"].replace(mode=mode))
    index = 0
    for line in lines:
        record = json.loads(line)
        if record["session"] != session:
            continue
        index += 1
        decision = guard.before_tool(record["tool"], record["arguments"], session=session)
        if decision.detected.value != "allow":
            return index, decision
        guard.after_tool(
            record["tool"],
            record["arguments"],
            session=session,
            error=record["error"],
            result=record["result"],
        )
    raise AssertionError(f"nothing detected in {session}")


def call_cell(browser: WebDriver, session: str, index: int) -> WebElement:
    """The timeline cell of call ``index`` (1-based) of ``session``."""
    section = browser.find_element(By.CSS_SELECTOR, f'section.session[data-session="{session}"]')
    return browser.find_element(By.ID, f"{section.get_attribute('id')}c{index}")


def detail_panel(browser: WebDriver, cell: WebElement) -> WebElement:
    panel_id = cell.get_attribute("aria-controls")
    assert panel_id
    return browser.find_element(By.ID, panel_id)


@pytest.mark.slow
def test_a_click_opens_and_closes_a_calls_detail(browser: WebDriver, tmp_path: Path) -> None:
    page, _, lines = render(tmp_path)
    open_page(browser, page)
    index, decision = first_decision("s003", lines, Mode.ENFORCE)
    cell = call_cell(browser, "s003", index)
    assert cell.get_attribute("role") == "button" and cell.get_attribute("tabindex") == "0"
    assert cell.get_attribute("aria-expanded") == "false"
    panel = detail_panel(browser, cell)
    assert not panel.is_displayed()
    cell.click()
    assert cell.get_attribute("aria-expanded") == "true"
    assert panel.is_displayed()
    action = decision.action.value
    assert f"call #{index} grep" in panel.text
    assert f"applied {action}, detected {action}" in panel.text
    assert f"count {decision.count}, threshold {decision.threshold}" in panel.text
    assert decision.threshold > 0
    cell.click()
    assert cell.get_attribute("aria-expanded") == "false" and not panel.is_displayed()
    # A call without a detection is no button and opens nothing.
    section = browser.find_element(By.CSS_SELECTOR, 'section.session[data-session="s003"]')
    plain = section.find_element(By.CSS_SELECTOR, ".c:not([data-detail])")
    assert plain.get_attribute("tabindex") is None
    plain.click()
    assert not panel.is_displayed()
    # The worst session, last in the input, opens too (its timeline was kept).
    index, decision = first_decision(WORST, lines, Mode.ENFORCE)
    worst = call_cell(browser, WORST, index)
    worst.click()
    assert worst.get_attribute("aria-expanded") == "true"
    assert f"call #{index} bash" in detail_panel(browser, worst).text
    assert console_errors(browser) == []


@pytest.mark.slow
def test_the_keyboard_opens_a_calls_detail_with_both_actions(
    browser: WebDriver, tmp_path: Path
) -> None:
    page, rows, lines = render(tmp_path, mode=Mode.ADVISE)
    open_page(browser, page)
    softened = [row for row in rows if row["session"] == "s013" and "detected" in row]
    assert softened, "advise mode softened nothing"
    row = softened[-1]
    assert row["action"] == "remind" and row["detected"] in ("deny", "stop")
    cell = call_cell(browser, "s013", row["index"])
    browser.execute_script("arguments[0].focus()", cell)
    assert browser.switch_to.active_element == cell
    panel = detail_panel(browser, cell)
    assert not panel.is_displayed()
    cell.send_keys(Keys.ENTER)
    assert cell.get_attribute("aria-expanded") == "true" and panel.is_displayed()
    assert f"applied remind, detected {row['detected']}" in panel.text
    assert f"count {row['count']}, threshold " in panel.text
    cell.send_keys(Keys.SPACE)
    assert cell.get_attribute("aria-expanded") == "false" and not panel.is_displayed()
    # The detail of an earlier call replaces it; the later one closes.
    earlier = call_cell(browser, "s013", softened[0]["index"])
    earlier.send_keys(Keys.ENTER)
    cell.send_keys(Keys.ENTER)
    assert earlier.get_attribute("aria-expanded") == "false"
    assert f"call #{row['index']} grep" in panel.text
    assert console_errors(browser) == []
