"""The sessions that keep a chunk waiting, shown where an operator meets the chunk: on
its page, on its run's page, and behind the overview's "Stalled work".

transaction=True: the locks are held from second real connections, which must see the
rows and chunks the test wrote.
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from cleanup.engine import operations
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk
from cleanup.observability import blockers
from cleanup.observability.blockers import Blocker, Blockers, Session, query_line
from tests.conftest import database_url, wait_for
from tests.console.test_browser import ARTIFACTS, browser_page, log_in  # noqa: F401
from tests.engine.test_concurrency import Worker
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Account, Lease

pytestmark = pytest.mark.django_db(transaction=True)

LEASES = Lease._meta.db_table
LOCK_TIMEOUT = "OperationalError: canceling statement due to lock timeout"


def other_session(application_name: str = "learner-renewal") -> psycopg.Connection:
    """A second real connection; its first statement opens its transaction."""
    return psycopg.connect(database_url(), application_name=application_name)


@contextmanager
def rows_locked(pks, *, mode: str = "UPDATE", application_name: str = "learner-renewal"):
    """Hold these leases locked (FOR ``mode``) from another session; yield its pid."""
    with other_session(application_name) as other:
        other.execute(f'SELECT id FROM "{LEASES}" WHERE id = ANY(%s) FOR {mode}', [list(pks)])
        try:
            yield other.info.backend_pid
        finally:
            other.rollback()


def stuck(chunk: Chunk) -> Chunk:
    """The chunk as a worker leaves it after its lock waits ran out: retrying."""
    Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.RETRYING, cause=LOCK_TIMEOUT,
                                             last_error=LOCK_TIMEOUT, failures=3)
    return Chunk.objects.select_related("run").get(pk=chunk.pk)


@pytest.fixture
def stuck_chunk(db) -> Chunk:
    LeaseFactory.create_batch(5, expired=True)
    return stuck(dispatch("expire-leases").run.chunks.get())


def chunk_page(client, chunk: Chunk) -> str:
    return client.get(reverse("admin:cleanup_chunk_change", args=[chunk.pk])).content.decode()


def items_of(chunk: Chunk) -> list[int]:
    """The ids of the rows an items chunk names."""
    return sorted(pk for pk, _ in chunk.message["items"])


def test_a_chunk_shows_exactly_the_session_that_keeps_its_rows_locked(admin_client,
                                                                      stuck_chunk):
    with rows_locked(items_of(stuck_chunk)[:3]) as pid:
        time.sleep(0.3)
        found = blockers.for_chunk(stuck_chunk)
        page = chunk_page(admin_client, stuck_chunk)

    assert [b.session.pid for b in found.blockers] == [pid]
    blocker = found.blockers[0]
    assert blocker.session.application_name == "learner-renewal"
    assert blocker.session.user and blocker.session.state == "idle in transaction"
    assert blocker.session.transaction_seconds >= 0.3
    assert blocker.session.query.startswith(f'SELECT id FROM "{LEASES}"')
    assert blocker.holds == ["3 rows of #1 (locked, or changed and not committed)"]
    assert found.notes == []
    assert 'id="blockers"' in page and f'data-pid="{pid}"' in page
    assert "learner-renewal" in page and "idle in transaction" in page
    assert "3 rows of #1 (locked" in page


def test_a_chunk_no_session_locks_shows_no_blockers(admin_client, stuck_chunk):
    assert not blockers.for_chunk(stuck_chunk)
    assert 'id="blockers"' not in chunk_page(admin_client, stuck_chunk)


def test_a_committed_chunk_shows_no_blockers_whatever_locks_its_rows(admin_client,
                                                                      stuck_chunk):
    Chunk.objects.filter(pk=stuck_chunk.pk).update(state=Chunk.State.COMMITTED)
    chunk = Chunk.objects.get(pk=stuck_chunk.pk)
    with rows_locked(items_of(chunk)):
        assert blockers.for_chunk(chunk) is None
        assert 'id="blockers"' not in chunk_page(admin_client, chunk)


def test_a_transaction_that_committed_its_lock_holds_nothing(stuck_chunk):
    # Its id stays in the rows' xmax, but no open transaction has it.
    with other_session() as other:
        other.execute(f'SELECT id FROM "{LEASES}" FOR UPDATE')
        other.commit()
        assert not blockers.for_chunk(stuck_chunk)


def test_shared_lockers_are_each_shown(stuck_chunk):
    # Two FOR SHARE lockers of the same rows leave a multixact in their xmax.
    shared = items_of(stuck_chunk)[:2]
    with rows_locked(shared, mode="SHARE", application_name="reader-a") as first, \
            rows_locked(shared, mode="SHARE", application_name="reader-b") as second:
        found = blockers.for_chunk(stuck_chunk)

    assert sorted(b.session.pid for b in found.blockers) == sorted([first, second])
    assert {tuple(b.holds) for b in found.blockers} == {
        ("2 rows of #1 (locked with others: FOR SHARE)",)}


def test_a_table_locked_access_exclusive_shows_its_holder_and_the_page_answers(
        admin_client, stuck_chunk):
    with other_session("schema-change") as other:
        other.execute(f'LOCK TABLE "{LEASES}" IN ACCESS EXCLUSIVE MODE')
        started = time.monotonic()
        page = chunk_page(admin_client, stuck_chunk)
        took = time.monotonic() - started
        found = blockers.for_chunk(stuck_chunk)
        pid = other.info.backend_pid
        other.rollback()

    assert took < 1.0
    assert [b.session.pid for b in found.blockers] == [pid]
    assert found.blockers[0].holds == [f"AccessExclusiveLock on {LEASES}"]
    assert found.notes == [f"The chunks' rows were not read: {LEASES} is locked "
                           "AccessExclusiveLock, so their row locks are unknown until it "
                           "is released."]
    assert f'data-pid="{pid}"' in page and "schema-change" in page


def test_rows_that_cannot_be_read_in_time_are_unknown_never_unblocked(stuck_chunk):
    # A row locker, and an ALTER TABLE queued behind it: the console's SELECT of the rows
    # would queue behind the ALTER TABLE, so it gives up after its lock timeout.
    with other_session("migrate") as migrate:
        with rows_locked(items_of(stuck_chunk)[:1]):
            queued = threading.Thread(target=migrate.execute, args=[
                f'LOCK TABLE "{LEASES}" IN ACCESS EXCLUSIVE MODE'])
            queued.start()
            wait_for(lambda: waiting_for_lock(migrate.info.backend_pid), timeout=5,
                     what="the LOCK TABLE to queue")
            started = time.monotonic()
            found = blockers.for_chunk(stuck_chunk)
            took = time.monotonic() - started
        queued.join(5)  # granted once the row locker rolled back
        migrate.rollback()

    assert took < 1.0
    assert found and [b.session.application_name for b in found.blockers] == ["migrate"]
    assert "a queued request for AccessExclusiveLock" in found.blockers[0].holds[0]
    assert len(found.notes) == 1
    assert found.notes[0].startswith("Who holds the rows of #1 is unknown: reading them ran "
                                     "out of time (canceling statement due to lock timeout")


def waiting_for_lock(pid: int) -> bool:
    with other_session("probe") as probe:
        return probe.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted",
                             [pid]).fetchone()[0] > 0


def test_a_chunk_waiting_now_on_a_row_outside_its_table_shows_who_holds_it(settings,
                                                                          account):
    """The chunk's hook logs each lease it deletes; each log's foreign key is checked as
    the chunk commits (Django makes it deferred), which locks the lease's account FOR KEY
    SHARE. Neither the leases' table nor their rows are locked, the account's row is."""
    settings.CLEANUP_ROW_LOCK_WAIT_MS = settings.CLEANUP_LOCK_TIMEOUT_MS = 5000
    LeaseFactory.create_batch(5, account=account, expired=True)
    stuck_chunk = stuck(dispatch("expire-leases-range").run.chunks.get())
    with other_session("account-admin") as admin:
        admin.execute(f'SELECT id FROM "{Account._meta.db_table}" WHERE id = %s FOR UPDATE',
                      [account.pk])
        admin_pid = admin.info.backend_pid
        applying = Worker(apply_chunk, stuck_chunk.message)
        applying.start()
        found = wait_for(lambda: blockers.for_chunk(stuck_chunk), timeout=5,
                         what="the chunk to wait on the account")
        admin.rollback()
        assert applying.outcome() == "deleted"

    assert [b.session.pid for b in found.blockers] == [admin_pid]
    holds, = found.blockers[0].holds
    assert holds.startswith("a lock #1's session (pid ") and holds.endswith(") waits for now")


def test_the_run_page_lists_each_blocker_once_with_the_chunks_waiting_on_it(admin_client,
                                                                            chunk_size):
    chunk_size("expire-leases", 2)
    LeaseFactory.create_batch(4, expired=True)
    run = dispatch("expire-leases").run
    # Sent and not yet taken (unfinished as retrying ones are): what the run waits on.
    chunks = list(run.chunks.select_related("run").order_by("chunk_id"))
    assert len(chunks) == 2
    with rows_locked([items_of(chunk)[0] for chunk in chunks]) as pid:
        found = blockers.for_run(run)
        page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk]))

    blocker, = found.blockers
    assert blocker.session.pid == pid and blocker.chunks == chunks
    assert blocker.holds == ["1 row of #1 (locked, or changed and not committed)",
                             "1 row of #2 (locked, or changed and not committed)"]
    text = page.content.decode()
    assert text.count(f'data-pid="{pid}"') == 1
    for chunk in chunks:
        assert f'href="{reverse("admin:cleanup_chunk_change", args=[chunk.pk])}"' in text


def test_stalled_work_links_to_the_policys_blockers_and_on_to_its_waiting_chunks(
        admin_client, stuck_chunk):
    Chunk.objects.filter(pk=stuck_chunk.pk).update(
        enqueued_at=timezone.now() - timedelta(hours=1))
    overview = admin_client.get(reverse("admin:cleanup_cleanupoverview_changelist"))
    url = reverse("admin:cleanup_policy_blockers", args=["expire-leases"])
    assert f'<a class="stalled-link" href="{url}"' in overview.content.decode()

    with rows_locked(items_of(stuck_chunk)[:3]) as pid:
        page = admin_client.get(url).content.decode()

    assert f'data-pid="{pid}"' in page and "3 rows of #1 (locked" in page
    waiting = page.split(f'data-pid="{pid}"')[1].split("</tr>")[0]
    assert f'href="{reverse("admin:cleanup_chunk_change", args=[stuck_chunk.pk])}"' in waiting


def test_the_policy_page_says_plainly_that_nothing_blocks_it(admin_client, stuck_chunk):
    page = admin_client.get(reverse("admin:cleanup_policy_blockers", args=["expire-leases"]))
    text = page.content.decode()
    assert page.status_code == 200 and 'id="blockers"' not in text
    assert "Nothing blocks <strong class=\"policy-name\">expire-leases</strong> now" in text


def test_a_query_hidden_from_the_consoles_role_is_said_so_with_the_grant():
    assert query_line("<insufficient privilege>") == ("", True)
    assert query_line("\n  UPDATE leases SET x = 1\n WHERE id = 2") == (
        "UPDATE leases SET x = 1", False)
    assert query_line(None) == ("", False)
    line, hidden = query_line("SELECT " + "x, " * 100)
    assert len(line) == blockers.QUERY_LINE and line.endswith("…") and not hidden

    hidden_session = Session(4242, "learner-renewal", "app", "", None, None, "", True)
    shown = Blockers("chunk", timezone.now(), [Blocker(hidden_session, ["x"], [])],
                     role="console")
    page = render_to_string("admin/cleanup/includes/blockers.html", {"blockers": shown})
    assert "hidden from the console's role" in page
    assert "GRANT pg_read_all_stats TO console;" in page


@pytest.mark.browser
def test_an_operator_follows_stalled_work_to_who_blocks_a_stuck_chunk_at_laptop_width(
        browser_page, live_server):  # noqa: F811
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    LeaseFactory.create_batch(5, expired=True)
    chunk = stuck(dispatch("expire-leases").run.chunks.get())
    Chunk.objects.filter(pk=chunk.pk).update(enqueued_at=timezone.now() - timedelta(hours=1))
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, live_server.url)
    ARTIFACTS.mkdir(exist_ok=True)
    fits = """() => ({page: document.documentElement.scrollWidth, window: window.innerWidth})"""

    with rows_locked(items_of(chunk)[:3]) as pid:
        time.sleep(1.2)  # its transaction has been open a while
        page.goto(f"{live_server.url}/admin/cleanup/cleanupoverview/")
        page.uncheck("#overview-refresh")
        page.click("#overview a.stalled-link")
        on_policy_page = page.inner_text("#blockers")
        policy_fits = page.evaluate(fits)
        page.screenshot(path=str(ARTIFACTS / "blocker-policy-1366.png"), full_page=True)
        page.click(f"#blockers tr[data-pid='{pid}'] td.waiting a")
        shown = page.inner_text("#blockers")
        chunk_fits = page.evaluate(fits)
        page.screenshot(path=str(ARTIFACTS / "blocker-chunk-1366.png"), full_page=True)

    assert str(pid) in on_policy_page and "#1" in on_policy_page
    assert page.url.endswith(f"/admin/cleanup/chunk/{chunk.pk}/change/")
    assert str(pid) in shown and "learner-renewal" in shown
    assert "3 rows of #1 (locked" in shown and "idle in transaction" in shown
    # Open since before the sleep: as long as that at least.
    assert float(re.search(r"\t(\d+\.\d) s\n", shown)[1]) >= 1.2, shown
    assert chunk_fits["page"] <= chunk_fits["window"], chunk_fits
    assert policy_fits["page"] <= policy_fits["window"], policy_fits


@pytest.mark.django_db
def test_the_blockers_page_of_a_paused_policy_says_the_pause_first(admin_client):
    page = admin_client.get("/admin/cleanup/cleanupoverview/blockers/expire-leases/")
    assert "Nothing blocks" in page.content.decode()

    operations.pause_policy("expire-leases", "nightly maintenance", actor="alice")
    text = re.sub(r"<[^>]+>", "", admin_client.get(
        "/admin/cleanup/cleanupoverview/blockers/expire-leases/").content.decode())

    assert "expire-leases plans nothing new while it is paused just now by alice: " \
           "nightly maintenance" in text
    assert "Nothing blocks" not in text
    assert "Besides that, no lock blocks it" in text
