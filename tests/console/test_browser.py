"""The console in a real browser: log in, read the overview, replay a dead letter.

Playwright drives Debian's Chromium (it cannot download its own browsers here).
transaction=True: the live server thread, the qcluster subprocess and the test all
use their own connections and must see one another's commits.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone
from django_q.models import OrmQ

from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk
from cleanup.scheduling.schedules import install_schedules
from reservations.models import SeatHold
from reservations.services import hold_seat
from tests import console_data
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.engine.test_processes import qcluster  # noqa: F401  (fixture)
from tests.factories import SeatHoldFactory, SectionFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

ARTIFACTS = ROOT / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync"]


@pytest.fixture
def browser_page(monkeypatch):
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium on PATH; CI must install the Debian package chromium")
        pytest.skip("no chromium on PATH (apt-get install chromium to run this test)")
    playwright_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test
    # makes between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        yield page
        browser.close()
        # Inside Playwright the test ran in a context of its own, with database
        # connections of its own: close them, or dropping the test database fails
        # ("being accessed by other users").
        connections.close_all()


def test_staff_replays_a_dead_letter_and_sees_it_acknowledged(browser_page, live_server,
                                                              qcluster):  # noqa: F811
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    SeatHoldFactory.create_batch(3, expired=True)
    chunk = dispatch("expire-holds").run.chunks.get()
    apply_chunk({**chunk.message, "version": 99})
    OrmQ.objects.all().delete()
    qcluster()
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.click("text=Cleanup overview")
    assert page.locator("#overview").inner_text().count("expire-holds") == 1
    page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/cleanup/chunk/?state=dead_lettered")
    page.check(f"input[name=_selected_action][value='{chunk.pk}']")
    page.select_option("select[name=action]", "replay_chunks")
    page.click("button[name=index]")
    assert "Replay chunks" in page.inner_text("#content")
    page.click("input[value=\"Yes, I'm sure\"]")
    assert "1 chunk re-sent." in page.inner_text(".messagelist")

    page.goto(f"{live_server.url}/admin/cleanup/chunk/{chunk.pk}/change/")
    for _ in range(60):
        if "Acknowledged" in page.inner_text("#content"):
            break
        page.wait_for_timeout(1000)
        page.reload()
    assert "Acknowledged" in page.inner_text("#content")
    assert Chunk.objects.get(pk=chunk.pk).state == Chunk.State.ACKNOWLEDGED
    assert SeatHold.objects.count() == 0

    page.goto(f"{live_server.url}/admin/cleanup/run/{chunk.run_id}/change/")
    assert "Completed" in page.inner_text("#content")
    page.screenshot(path=str(ARTIFACTS / "run.png"), full_page=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def served(tmp_path):
    """The console as docs/operations.md starts it: `make serve` (collectstatic, then
    gunicorn with WhiteNoise), on the test database; pytest's live server would serve
    static files by itself and prove nothing about them."""
    address = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        ["make", "--no-print-directory", "serve", f"SERVE_ADDRESS={address}"], cwd=ROOT,
        env=subprocess_env(DJANGO_STATIC_ROOT=str(tmp_path / "static")), stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://{address}"
    try:
        wait_for(lambda: _answers(f"{url}/admin/login/"), timeout=60, interval=0.3,
                 what="make serve to answer")
        yield url
    finally:
        stop_group(process)
        log.close()


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM make and gunicorn's processes, and wait until every one is gone (their
    connections must close before the test database is dropped)."""
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(30)
    for _ in range(150):
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)


def _answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False


def log_in(page, url: str) -> None:
    page.goto(f"{url}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")


def fits(page) -> dict:
    """Widths of the page and of the results table against the room it has."""
    return page.evaluate("""() => ({
        page: document.documentElement.scrollWidth, window: window.innerWidth,
        table: document.querySelector('#result_list').scrollWidth,
        room: document.querySelector('#changelist .results').clientWidth})""")


def test_the_console_as_make_serve_serves_it_fits_a_laptop(browser_page, served):
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    section = SectionFactory(capacity=100)
    SeatHoldFactory.create_batch(3, section=section, expired=True)
    finished = dispatch_in_process("expire-holds", key="finished").run
    dispatch_in_process("expire-holds", key="nothing")  # found nothing: hidden by default
    SeatHoldFactory.create_batch(3, section=section, expired=True)
    dead = dispatch("expire-holds", key="dead").run.chunks.get()
    apply_chunk({**dead.message, "version": 99})
    ARTIFACTS.mkdir(exist_ok=True)

    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, served)
    # Static files: the stylesheet is served and applied.
    assert page.request.get(f"{served}/static/admin/css/base.css").status == 200
    header = page.evaluate("getComputedStyle(document.querySelector('#header')).display")
    assert header == "flex"  # base.css lays the header out; unstyled it is a block

    for width in (1366, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{served}/admin/cleanup/run/")
        measured = fits(page)
        assert measured["table"] <= measured["room"], (width, measured)
        assert measured["page"] <= measured["window"], (width, measured)
        if width == 1366:
            page.screenshot(path=str(ARTIFACTS / "runs-1366.png"), full_page=True)
            rows = page.locator("#result_list tbody tr")
            assert rows.count() == 2  # the run that found nothing is filtered out
        page.goto(f"{served}/admin/cleanup/chunk/")
        measured = fits(page)
        assert measured["table"] <= measured["room"], (width, measured)
        if width == 1366:
            assert page.locator("#result_list").inner_text().count("#1") == 2
            page.screenshot(path=str(ARTIFACTS / "chunks-1366.png"), full_page=True)
    page.set_viewport_size({"width": 1366, "height": 900})

    page.goto(f"{served}/admin/cleanup/cleanupoverview/")
    assert "expire-holds" in page.inner_text("#overview")
    page.screenshot(path=str(ARTIFACTS / "overview-1366.png"), full_page=True)

    page.goto(f"{served}/admin/cleanup/run/{finished.pk}/change/")
    totals = page.inner_text("#run-totals")
    assert "1 of 1 chunk done" in totals and "3" in totals
    assert page.locator("#run-totals progress").get_attribute("value") == "1"
    page.screenshot(path=str(ARTIFACTS / "run-1366.png"), full_page=True)

    page.goto(f"{served}/admin/cleanup/chunk/{dead.pk}/change/")
    content = page.inner_text("#content")
    assert content.index("Malformed") < content.index("Rows deleted")  # failure first
    assert "unknown message version 99" in content
    # As sent, collapsed; as received (version 99), shown beside it.
    assert not page.locator("details.message").first.evaluate("d => d.open")
    assert "Differs from the message as sent" in content and '"version": 99' in content
    page.screenshot(path=str(ARTIFACTS / "dead-letter-1366.png"), full_page=True)
    page.click("#discard-chunk")
    assert "Discard chunks" in page.inner_text("#content")
    page.fill("textarea[name=reason], input[name=reason]", "forged in a browser test")
    page.click("input[value=\"Yes, I'm sure\"]")
    assert "1 chunk discarded." in page.inner_text(".messagelist")
    assert Chunk.objects.get(pk=dead.pk).state == Chunk.State.DISCARDED

    # An update policy's run speaks of rows updated; the reminders it marked are listed.
    for n in range(3):
        hold_seat(section.pk, f"learner-{n}", now=timezone.now() - timedelta(minutes=11))
    hold_seat(section.pk, "not-due-yet")
    marked = dispatch_in_process("mark-reminders-ready").run
    page.goto(f"{served}/admin/cleanup/run/{marked.pk}/change/")
    totals = page.inner_text("#run-totals").lower()  # the admin's CSS capitalises headers
    assert "rows updated" in totals and "rows deleted" not in totals
    page.screenshot(path=str(ARTIFACTS / "reminder-run-1366.png"), full_page=True)
    page.goto(f"{served}/admin/reservations/reminder/")
    measured = fits(page)
    assert measured["table"] <= measured["room"], measured
    listed = page.inner_text("#result_list")
    assert listed.count("ready to send") == 3 and listed.count("pending") == 1
    page.screenshot(path=str(ARTIFACTS / "reminders-1366.png"), full_page=True)


def test_a_long_traceback_scrolls_inside_its_box_at_laptop_width(browser_page, live_server):
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    SeatHoldFactory.create_batch(2, expired=True)
    chunk = dispatch("expire-holds").run.chunks.get()
    # A worker's traceback as the ledger keeps it: its longest line is a Django path and
    # PostgreSQL's context, far wider than the page.
    traceback = console_data.traceback_text(console_data.FK_VIOLATION)
    Chunk.objects.filter(pk=chunk.pk).update(
        state=Chunk.State.DEAD_LETTERED, failure_class=Chunk.FailureClass.ERROR,
        last_error=traceback, cause=console_data.FK_VIOLATION)
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, live_server.url)

    page.goto(f"{live_server.url}/admin/cleanup/chunk/{chunk.pk}/change/")
    box = page.locator("pre.traceback")
    measured = box.evaluate("""pre => ({
        page: document.documentElement.scrollWidth, window: window.innerWidth,
        box: pre.clientWidth, text: pre.scrollWidth,
        right: pre.getBoundingClientRect().right,
        overflow: getComputedStyle(pre).overflowX})""")
    scrolled = box.evaluate("pre => { pre.scrollLeft = 200; return pre.scrollLeft; }")
    page.screenshot(path=str(ARTIFACTS / "traceback-1366.png"), full_page=True)

    assert "violates foreign key" in box.inner_text()
    assert measured["page"] <= measured["window"], measured  # no sideways page scroll
    assert measured["right"] <= measured["window"], measured  # the box fits the page
    assert measured["text"] > measured["box"], measured  # the lines are wider than it
    assert measured["overflow"] == "auto" and scrolled > 0, (measured, scrolled)


def test_the_overview_keeps_a_schedules_brackets_with_their_text(browser_page, live_server):
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    console_data.build()
    install_schedules()
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/cleanup/cleanupoverview/")
    page.uncheck("#overview-refresh")  # the page must not reload while it is measured

    # As narrow as the column gets beside long backlog and stalled-work lines: each ")"
    # of it on the line of the character before it.
    lone = {width: page.evaluate(LONE_CLOSING_BRACKETS, width) for width in (90, 120, 176)}
    page.screenshot(path=str(ARTIFACTS / "overview-schedules-1366.png"), full_page=True)

    assert "On time: " in page.inner_text("#overview")
    assert lone == {90: [], 120: [], 176: []}


LONE_CLOSING_BRACKETS = """(width) => {
    const lone = [];
    for (const cell of document.querySelectorAll('#overview td.schedule')) {
        cell.style.width = cell.style.maxWidth = `${width}px`;
    }
    for (const cell of document.querySelectorAll('#overview td.schedule')) {
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        const chars = [];
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (let i = 0; i < node.length; i++) {
                if (node.data[i].trim()) chars.push([node, i]);
            }
        }
        const top = ([node, i]) => {
            const range = document.createRange();
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            return range.getBoundingClientRect().top;
        };
        chars.forEach(([node, i], n) => {
            if (node.data[i] === ')' && n > 0 && Math.abs(top(chars[n]) - top(chars[n - 1])) > 2) {
                lone.push(cell.innerText);
            }
        });
    }
    return lone;
}"""
