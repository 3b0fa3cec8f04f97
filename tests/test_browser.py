"""The console in a real browser: log in, read the overview, replay a dead letter.

Playwright drives Debian's Chromium (it cannot download its own browsers here).
transaction=True: the live server thread, the qcluster subprocess and the test all
use their own connections and must see one another's commits.
"""

from __future__ import annotations

import os
import shutil

import pytest
from django.contrib.auth.models import User
from django_q.models import OrmQ

from cleanup.dispatch import dispatch
from cleanup.models import Chunk
from cleanup.worker import apply_chunk
from reservations.models import SeatHold
from tests.conftest import ROOT
from tests.factories import SeatHoldFactory
from tests.test_processes import qcluster  # noqa: F401  (fixture)

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
