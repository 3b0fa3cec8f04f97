"""The overview's live view: queue depth per policy, the workers busy and their chunks,
rows changed per minute over the last hour, in a few queries, refreshed in place."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run
from cleanup.observability.live import live_view
from cleanup.policies import all_policies
from reservations.models import SeatHold
from tests.console.test_browser import ARTIFACTS, browser_page, log_in  # noqa: F401
from tests.factories import SeatHoldFactory, SectionFactory

OVERVIEW = reverse("admin:cleanup_cleanupoverview_changelist")
NOW = datetime(2026, 12, 3, 14, 37, 20, tzinfo=UTC)
WORKER = "web-7:4242:abcd1234"


def a_run(policy: str = "expire-leases", **fields) -> Run:
    return Run.objects.create(policy=policy, dispatch_key=f"{policy}:{Run.objects.count()}",
                              cutoff=NOW, scheme="range", trigger="command", **fields)


def chunks(run: Run, *states: str, **fields) -> list[Chunk]:
    first = run.chunks.count() + 1
    return Chunk.objects.bulk_create(
        Chunk(run=run, chunk_id=first + n, state=state, message={"chunk_id": first + n},
              **fields) for n, state in enumerate(states))


def committed(run: Run, at: datetime, *, deleted: int = 0, updated: int = 0) -> Chunk:
    return chunks(run, Chunk.State.ACKNOWLEDGED, committed_at=at, rows_deleted=deleted,
                  rows_updated=updated)[0]


def delivery(started: datetime, n: int = 1, **ended) -> dict:
    return {"n": n, "at": started.isoformat(), "worker": WORKER, **ended}


def queue(view) -> dict[str, tuple[int, int, int]]:
    return {p.policy: (p.waiting, p.retrying, p.applying) for p in view.policies}


@pytest.mark.django_db
def test_queue_depth_counts_enqueued_and_retrying_chunks_per_policy_and_zero_for_an_idle_policy():
    chunks(a_run(), "enqueued", "enqueued", "retrying", "planned", "acknowledged",
           "dead_lettered")
    chunks(a_run("purge-cleanup-runs"), "enqueued")

    depth = queue(live_view(NOW))

    assert list(depth) == [policy.name for policy in all_policies()]
    assert depth["expire-leases"] == (3, 1, 0)
    assert depth["purge-cleanup-runs"] == (1, 0, 0)
    assert depth["flag-leases"] == (0, 0, 0)


@pytest.mark.django_db
def test_the_broker_queue_length_is_one_total_of_its_messages(expired_leases):
    dispatch("expire-leases")

    assert live_view(timezone.now()).broker_messages == OrmQ.objects.count() > 0


@pytest.mark.django_db
def test_a_delivery_in_progress_shows_as_a_busy_worker_with_its_chunk(admin_client):
    started = timezone.now() - timedelta(seconds=12)
    earlier = delivery(started - timedelta(minutes=1), ended_at=started.isoformat(),
                       outcome="left for redelivery")
    busy, waiting = chunks(a_run(), "retrying", "enqueued")
    Chunk.objects.filter(pk=busy.pk).update(history=[earlier, delivery(started, n=2)])

    view = live_view(timezone.now())
    page = admin_client.get(OVERVIEW).content.decode()

    [worker] = view.busy
    assert (worker.worker, worker.policy, worker.chunk_pk, worker.number) == (
        "web-7:4242", "expire-leases", busy.pk, 2)
    assert timedelta(seconds=12) <= worker.age < timedelta(seconds=20)
    # Being applied, so no longer waiting for a worker (nor for its redelivery).
    assert queue(view)["expire-leases"] == (1, 0, 1)
    assert view.silent == ()
    href = reverse("admin:cleanup_chunk_change", args=[busy.pk])
    assert (f'<a href="{href}">#{busy.chunk_id}</a> of run <span class="short-id" '
            f'title="{busy.run_id}">{str(busy.run_id)[:8]}</span>') in page
    assert "<code>web-7:4242</code>" in page and "(delivery 2)" in page


@pytest.mark.django_db
def test_a_delivery_without_outcome_older_than_the_retry_is_not_busy(admin_client):
    started = timezone.now() - timedelta(seconds=Conf.RETRY + 1)
    [chunk] = chunks(a_run(), "enqueued", history=[delivery(started)])

    view = live_view(timezone.now())
    page = admin_client.get(OVERVIEW).content.decode()

    assert view.busy == ()
    assert [d.chunk_pk for d in view.silent] == [chunk.pk]
    assert queue(view)["expire-leases"] == (1, 0, 0)
    assert "No worker is applying a chunk now." in page
    assert "No outcome: the worker may have died" in page


@pytest.mark.django_db
def test_a_finished_chunk_with_a_delivery_left_open_has_no_busy_worker():
    chunks(a_run(), "acknowledged", history=[delivery(NOW - timedelta(seconds=5))])

    view = live_view(NOW)

    assert (view.busy, view.silent) == ((), ())


@pytest.mark.django_db
def test_rows_per_minute_sums_the_right_minute_buckets_and_leaves_out_chunks_older_than_an_hour():
    run = a_run()
    committed(run, NOW.replace(minute=5, second=10), deleted=1_000)
    committed(run, NOW.replace(minute=5, second=50), deleted=234)
    committed(a_run(), NOW.replace(minute=5, second=59), updated=100)  # another run
    committed(run, NOW.replace(minute=36, second=59), deleted=40)  # the last whole minute
    committed(run, NOW.replace(minute=37, second=2), updated=7)  # the minute going on
    committed(run, NOW.replace(hour=13, minute=37, second=59), deleted=5_000)  # 60 min ago
    committed(run, NOW - timedelta(days=1), deleted=9_000)

    view = live_view(NOW)
    [chart] = [p.chart for p in view.policies if p.policy == "expire-leases"]

    assert len(chart.bars) == 60
    assert (chart.bars[0].minute, chart.bars[-1].minute) == (
        NOW.replace(hour=13, minute=38, second=0), NOW.replace(second=0))
    assert {f"{bar.minute:%H:%M}": bar.rows for bar in chart.bars if bar.rows} == {
        "14:05": 1_334, "14:36": 40, "14:37": 7}
    assert (chart.total, chart.now.rows) == (1_381, 40)
    assert chart.peak.title == "14:05 UTC: 1,334 rows"
    assert chart.bars[-1].title == "14:37 UTC so far: 7 rows"
    assert chart.summary == ("expire-leases: 1,381 rows changed in the last hour; "
                             "40 a minute now (14:36 UTC)")
    assert {p.chart for p in view.policies if p.policy != "expire-leases"} == {None}


@pytest.mark.django_db
def test_bars_are_scaled_to_their_policys_own_peak_and_an_empty_minute_has_none():
    committed(a_run(), NOW - timedelta(minutes=3), deleted=10_000)
    committed(a_run(), NOW - timedelta(minutes=2), deleted=1)
    committed(a_run("purge-cleanup-runs"), NOW - timedelta(minutes=3), deleted=3)

    charts = {p.policy: p.chart for p in live_view(NOW).policies}

    heights = [bar.height for bar in charts["expire-leases"].bars]
    assert heights[-4:] == [40, 2, 0, 0]  # a single row still shows above the line
    assert [bar.height for bar in charts["purge-cleanup-runs"].bars][-4] == 40


@pytest.mark.django_db
def test_the_page_draws_sixty_titled_bars_with_a_text_alternative_or_says_nothing_changed(
        admin_client):
    now = timezone.now()
    committed(a_run(), now - timedelta(minutes=20), deleted=2_500)

    page = admin_client.get(OVERVIEW).content.decode()
    live = page[page.index('id="live-view"'):]

    assert live.count('<rect class="bar') == 60
    minute = (now - timedelta(minutes=20)).astimezone(UTC)
    assert f"<title>{minute:%H:%M} UTC: 2,500 rows</title>" in live
    assert re.search(r'aria-label="expire-leases: 2,500 rows changed in the last hour; '
                     r'0 a minute now \(\d\d:\d\d UTC\)"', live)
    assert f">peak 2,500 at {minute:%H:%M}</text>" in live
    assert live.count("nothing changed in the last hour") == len(all_policies()) - 1


@pytest.mark.django_db
def test_the_live_view_reads_in_four_queries_whatever_the_number_of_chunks():
    def queries() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            live_view(NOW)
        return [query["sql"] for query in captured.captured_queries]

    chunks(a_run(), "enqueued", history=[delivery(NOW)])
    few = queries()
    for minutes_ago in range(0, 60, 3):
        run = a_run("purge-cleanup-runs" if minutes_ago % 2 else "expire-leases")
        chunks(run, *["enqueued", "retrying"] * 5, history=[delivery(NOW)])
        for n in range(10):
            committed(run, NOW - timedelta(minutes=minutes_ago, seconds=n), deleted=n)
    many = queries()

    assert len(few) == len(many) == 4


# The browser test: transaction=True, since the live server thread reads the rows this
# test writes through connections of its own.
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_an_operator_reads_the_live_view_at_1366_px_and_sees_it_refresh(
        browser_page, live_server):  # noqa: F811
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    section = SectionFactory(capacity=5_000)
    SeatHold.objects.bulk_create(SeatHoldFactory.build_batch(2_400, section=section,
                                                             expired=True))
    run = dispatch("expire-holds").run  # chunks of 500 rows: 4 of them, then one of 400
    for _ in range(4):
        apply_chunk(run.chunks.filter(state=Chunk.State.ENQUEUED).earliest("chunk_id").message)
    now = timezone.now()
    done = list(run.chunks.filter(state__in=Chunk.DONE).order_by("chunk_id"))
    peak_at = now - timedelta(minutes=40)
    for chunk, at in zip(done, [peak_at, peak_at, now - timedelta(minutes=25),
                                now - timedelta(minutes=10)], strict=True):
        Chunk.objects.filter(pk=chunk.pk).update(committed_at=at)
    last = run.chunks.get(state=Chunk.State.ENQUEUED)
    Chunk.objects.filter(pk=last.pk).update(
        history=[delivery(now - timedelta(seconds=20))], deliveries=1)

    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}{OVERVIEW}")
    page.uncheck("#overview-refresh")  # the page must not change while it is measured
    chart = page.locator("#live-queue tr", has_text="expire-holds").locator("svg.rate-chart")
    titles = chart.locator("rect.bar").evaluate_all(
        "bars => bars.map(bar => [bar.getBBox().height, bar.parentNode.textContent])")
    tallest = max(titles, key=lambda bar: bar[0])
    workers = page.inner_text("#live-workers")
    scrolls = page.evaluate("document.documentElement.scrollWidth > window.innerWidth")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#live-view").screenshot(path=str(ARTIFACTS / "live-view-1366.png"))

    assert len(titles) == 60
    assert tallest[1] == f"{peak_at.astimezone(UTC):%H:%M} UTC: 1,000 rows"
    assert chart.get_attribute("aria-label").startswith(
        "expire-holds: 2,000 rows changed in the last hour; ")
    assert f"web-7:4242\texpire-holds\t#{last.chunk_id} of run {str(run.pk)[:8]}" in workers
    assert not scrolls

    page.check("#overview-refresh")
    apply_chunk(last.message)
    page.wait_for_function(
        """() => document.querySelector('#live-view').innerText
                   .includes('2,400 in the hour')""", timeout=8_000)
    assert "No worker is applying a chunk now." in page.inner_text("#live-workers")


@pytest.mark.django_db
def test_a_history_edited_by_hand_is_left_out_not_an_error_on_the_overview(admin_client):
    started = timezone.now() - timedelta(seconds=5)
    [chunk] = chunks(a_run(), "enqueued", history=[
        7, {"n": 2, "at": "not a time", "worker": None}, {"worker": WORKER},
        delivery(started, n=3)])

    view = live_view(timezone.now())
    page = admin_client.get(OVERVIEW)

    assert page.status_code == 200
    assert [(d.chunk_pk, d.number, d.worker) for d in view.busy] == [
        (chunk.pk, 3, "web-7:4242")]
