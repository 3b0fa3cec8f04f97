"""A chunk's deliveries and why its run waits, as an operator reads them in Chromium
at laptop width."""

from __future__ import annotations

import contextlib

import pytest
from django.contrib.auth.models import User
from django.db import OperationalError

from cleanup import faults
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from tests.console.test_browser import ARTIFACTS, browser_page, log_in  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
LOCK_TIMEOUT = "OperationalError: canceling statement due to lock timeout"

FITS = """() => ({page: document.documentElement.scrollWidth, window: window.innerWidth})"""


def lock_timeout():
    raise OperationalError("canceling statement due to lock timeout")


def test_a_stuck_chunks_deliveries_and_its_runs_wait_read_at_laptop_width(
        browser_page, live_server, settings, chunk_size, expired_leases):  # noqa: F811
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 2
    settings.CLEANUP_TRANSIENT_RETRIES = 1
    settings.CLEANUP_TRANSIENT_BACKOFF = 0
    run = dispatch("expire-leases").run
    first, second = run.chunks.order_by("chunk_id")
    apply_chunk(first.message)  # one committed; the next planned takes its place
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout):
        for _ in range(3):
            with contextlib.suppress(OperationalError):
                apply_chunk(second.message)
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, live_server.url)

    page.goto(f"{live_server.url}/admin/cleanup/chunk/{second.pk}/change/")
    rows = page.locator("#chunk-history tbody tr").count()
    history_text = page.inner_text("#chunk-history")
    chunk_fits = page.evaluate(FITS)
    page.screenshot(path=str(ARTIFACTS / "chunk-history-1366.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/cleanup/run/{run.pk}/change/")
    waits_text = page.inner_text(".run-waits")
    run_fits = page.evaluate(FITS)
    page.screenshot(path=str(ARTIFACTS / "run-waits-1366.png"), full_page=True)

    assert rows == 3
    assert "Deliveries (3)" in history_text
    assert history_text.count("left for redelivery") == 3
    assert LOCK_TIMEOUT in history_text
    assert chunk_fits["page"] <= chunk_fits["window"], chunk_fits
    # Two in flight (the window), one of them retrying; the other waits for a worker.
    assert f"window full: 1 of 2 chunks in flight retrying on {LOCK_TIMEOUT} since " \
        in waits_text
    assert "1 chunk queued, the oldest sent " in waits_text
    assert "next redelivery at about " in waits_text
    assert run_fits["page"] <= run_fits["window"], run_fits
