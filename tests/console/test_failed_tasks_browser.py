"""django-q2's Failed tasks page as an operator reads it in Chromium at laptop width:
each task's error line whole, its row no taller than that line needs, its instant as
the console shows one."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from tests.console.test_browser import ARTIFACTS, browser_page, log_in  # noqa: F401  (fixture)
from tests.console.test_console_task_pages import REFUSAL, failed_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

# Cells by their column's heading ("short result" and "stopped at" are django-q2's own
# columns); a cell's content measured by its text's box, not by the row it stretches.
MEASURE = """() => {
    const headings = [...document.querySelectorAll('#result_list thead th')]
        .map(th => th.textContent.trim().toLowerCase());
    const rows = [...document.querySelectorAll('#result_list tbody tr')];
    const column = names => {
        const index = headings.findIndex(heading => names.includes(heading));
        return index < 0 ? [] : rows.map(row => row.children[index]);
    };
    const contentHeight = cell => {
        const range = document.createRange();
        range.selectNodeContents(cell);
        return range.getBoundingClientRect().height;
    };
    const results = column(['error', 'short result']);
    return {
        page: document.documentElement.scrollWidth, window: window.innerWidth,
        table: document.querySelector('#result_list').scrollWidth,
        room: document.querySelector('#changelist .results').clientWidth,
        sidebar_open: document.querySelector('#main').classList.contains('shifted'),
        rows: rows.map(row => row.getBoundingClientRect().height),
        tallest_other: rows.map(row => Math.max(...[...row.children]
            .filter(cell => !results.includes(cell)).map(contentHeight))),
        result_height: results.map(contentHeight),
        clipped: [...document.querySelectorAll('#result_list th, #result_list td')]
            .filter(cell => cell.scrollWidth > cell.clientWidth)
            .map(cell => `${cell.className}: ${cell.scrollWidth} > ${cell.clientWidth}`),
        results: results.map(cell => cell.innerText),
        whole: results.map(cell => (cell.querySelector('[title]') || {}).title || ''),
        instants: column(['failed at', 'stopped at']).map(cell => cell.innerText.split('\\n')[0]),
    };
}"""
# The console's instants: 24-hour UTC to the second (cleanup.display.utc_text).
CONSOLE_INSTANT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
# Four lines of the admin's text and the cell's padding: the error's line of 160
# characters takes four at laptop width. django-q2's own row was 100 px, its name and
# group wrapped into four lines beside a result cut to one.
ROW_BOUND_PX = 85


def test_a_failed_tasks_error_reads_whole_at_laptop_width(browser_page,  # noqa: F811
                                                             live_server):
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    failure = failed_task()
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page, live_server.url)

    page.goto(f"{live_server.url}/admin/django_q/failure/")
    measured = page.evaluate(MEASURE)
    page.screenshot(path=str(ARTIFACTS / "failed-tasks-1366.png"), full_page=True)

    # Every check at once, so a page that fails shows each way it does.
    error = "IntegrityError: " + REFUSAL.splitlines()[0]
    misreads = {
        "error line not whole": measured["results"] != [error],
        "traceback not on hover": measured["whole"] != [failure.result.strip()],
        "cells clipped": measured["clipped"] != [],
        "wider than its room": measured["table"] > measured["room"],
        "wider than the window": measured["page"] > measured["window"],
        # Nothing but the error's line makes the row taller.
        "row taller than its error": (measured["tallest_other"][0]
                                      > measured["result_height"][0]),
        "row too tall": measured["rows"][0] > ROW_BOUND_PX,
        "instant not the console's": not (len(measured["instants"]) == 1
                                          and CONSOLE_INSTANT.match(measured["instants"][0])),
    }
    assert measured["sidebar_open"], measured
    misread = [name for name, wrong in misreads.items() if wrong]
    assert not misread, (misread, measured)
