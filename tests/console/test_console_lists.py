"""Every console list, with production-sized data, fits a 1366 px laptop with the sidebar
open; a run or chunk whose state the code does not know shows as unknown instead of an
error. (The product's lists, measured the same way: tests/product/test_product_admin.py.)

The browser test measures the pages as `make serve` serves them (gunicorn, WhiteNoise,
collected static files): the stylesheet that makes them fit must reach the browser.
transaction=True there: the served processes read the data through their own
connections.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from cleanup.models import Chunk
from tests import console_data
from tests.console.test_browser import ARTIFACTS, browser_page, log_in, served  # noqa: F401
from tests.engine_app.factories import LeaseFactory

# Each list, the table to measure on it, and text it must show with the data. The runs
# console_data writes are the product's policies' (mark-reminders-ready the longest
# name, which must not wrap): its rows stand in for any host's.
LISTS = [
    ("runs", "/admin/cleanup/run/", "#result_list",
     ["mark-reminders-ready", "312,500", "of 184,233", "2.3 h", "42 min", "4 dead",
      "Replay of run", "Dead letters", "Cancelled", "Running"]),
    ("runs-all", "/admin/cleanup/run/?work=all", "#result_list", ["0.2 s"]),
    ("chunks", "/admin/cleanup/chunk/", "#result_list", []),
    ("dead-letters", "/admin/cleanup/chunk/?state=dead_lettered", "#result_list",
     ["canceling statement due to lock timeout", "IntegrityError: update or delete",
      "5 deliveries started without completing"]),
    ("slots", "/admin/cleanup/slot/", "#result_list",
     ["coalesced", "fired, not dispatched", "1.3 s after firing"]),
    ("orphans", "/admin/cleanup/orphanmessage/", "#result_list", ["no chunk #12044"]),
    ("overview", "/admin/cleanup/cleanupoverview/", "#overview", ["mark-reminders-ready"]),
]

MEASURE = """(selector) => {
    const table = document.querySelector(selector);
    const room = document.querySelector('#changelist .results') || table.parentElement;
    const clipped = [...table.querySelectorAll('th, td')]
        .filter(cell => cell.scrollWidth > cell.clientWidth)
        .map(cell => `${cell.className || cell.tagName}: ${cell.scrollWidth} > ${cell.clientWidth}`
                     + ` (${cell.innerText.slice(0, 30)})`);
    // The narrowest the table can be: its columns' min-content.
    const width = table.style.width;
    table.style.width = 'min-content';
    const needs = table.offsetWidth;
    table.style.width = width;
    const broken = [...table.querySelectorAll('.policy-name')]
        .filter(name => name.getClientRects().length > 1).map(name => name.innerText);
    return {table: table.scrollWidth, room: room.clientWidth, needs,
            page: document.documentElement.scrollWidth, window: window.innerWidth,
            sidebar_open: document.querySelector('#main').classList.contains('shifted'),
            styled: !!document.querySelector('link[href*="cleanup/console.css"]'),
            clipped: [...new Set(clipped)], broken_policy_names: [...new Set(broken)]};
}"""


def measure(page, selector: str) -> dict:
    return page.evaluate(MEASURE, selector)


def misfits(page, base_url: str, lists) -> dict:
    """The lists that do not fit, measured at a laptop's size and a desktop's."""
    found = {}
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        for name, url, selector, shown in lists:
            response = page.goto(base_url + url)
            assert response.status == 200, (name, response.status)
            text = page.inner_text(selector)
            for expected in shown:
                assert expected in text, (name, expected)
            measured = measure(page, selector)
            print(width, name, measured)  # the widths, for the report (pytest -s)
            # The first screen, as the operator sees it (the measures cover every row).
            page.screenshot(path=str(ARTIFACTS / f"list-{name}-{width}.png"))
            assert measured["sidebar_open"], (name, width)
            if (measured["table"] > measured["room"] or measured["clipped"]
                    or measured["page"] > measured["window"]
                    or measured["broken_policy_names"] or not measured["styled"]):
                found[f"{name} at {width}"] = measured
    return found


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_every_list_fits_a_laptop_with_the_sidebar_open(browser_page, served):  # noqa: F811
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    console_data.build()
    ARTIFACTS.mkdir(exist_ok=True)
    log_in(page, served)
    assert page.request.get(f"{served}/static/cleanup/console.css").status == 200

    assert misfits(page, served, LISTS) == {}


def unknown_state(table: str, column: str, value: str, pk: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [value, pk])


@pytest.mark.django_db
def test_runs_and_chunks_with_states_written_by_hand_show_as_unknown(admin_client, account):
    from cleanup.engine.dispatch import dispatch

    LeaseFactory.create_batch(2, account=account, expired=True)
    run = dispatch("expire-leases").run
    unknown_state("cleanup_run", "state", "paused", run.pk)
    unknown_state("cleanup_chunk", "state", "lost", run.chunks.get().pk)

    runs = admin_client.get(reverse("admin:cleanup_run_changelist"))
    chunks = admin_client.get(reverse("admin:cleanup_chunk_changelist"))

    assert (runs.status_code, chunks.status_code) == (200, 200)
    assert ">unknown: paused</span>" in runs.content.decode()
    assert ">unknown: lost</span>" in chunks.content.decode()
    assert Chunk.objects.get().state == "lost"  # shown as it is, not repaired


def test_every_badge_state_has_a_colour_in_the_stylesheet():
    from cleanup.console.badges import SLOT_OUTCOMES, STATE_COLOURS
    from cleanup.models import Run, Slot

    classes = {*STATE_COLOURS.values(), *(f"state-{s}" for s in SLOT_OUTCOMES),
               "state-unknown"}
    assert missing_colours(classes) == set()
    assert set(STATE_COLOURS) == {*Run.State.values, *Chunk.State.values}
    assert set(SLOT_OUTCOMES) == set(Slot.Outcome.values)


def missing_colours(classes: set[str]) -> set[str]:
    """The badge classes console.css gives no rule."""
    from tests.conftest import ROOT

    css = (ROOT / "cleanup" / "static" / "cleanup" / "console.css").read_text()
    return {name for name in classes if f".{name} " not in css and f".{name}," not in css}
