"""Learners' transactions take their locks in one order (docs/waitlist.md, *One lock
order*): their section's row, then its waitlist entries, then its seat holds, then their
reminders. So no two of them deadlock; a deadlock still possible with a transaction of
another kind is tried again once, then refused with ``Busy``: a learner never sees a
database error.

transaction=True: each thread and each second connection works on a connection of its
own and must see what the others committed; a test transaction would hide it from them.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, connections
from django.utils import timezone
from structlog.testing import capture_logs

from cleanup.engine.dispatch import dispatch_in_process
from cleanup.outbox import publish
from reservations.exceptions import Busy, ReservationError, SectionFull
from reservations.models import SeatHold, Section, WaitlistEntry
from reservations.policies import EXPIRE_HOLDS
from reservations.services import (
    confirm_hold,
    hold_seat,
    learner_transaction,
    locked_sections,
    release_hold,
    renew_hold,
)
from reservations.waitlist import join_waitlist, leave_waitlist
from tests.conftest import database_url, wait_for
from tests.factories import SeatHoldFactory, SectionFactory

pytestmark = pytest.mark.django_db(transaction=True)

IN_LINE = ("waiting", "offered")
# Seats taken per section beyond its capacity, in one snapshot: a hold counts until its
# expiry by the clock read after the snapshot (as the soak's report counts them).
OVER_CAPACITY = f"""
SELECT coalesce(max(taken - capacity), 0) FROM (
    SELECT section.capacity, count(hold.id) FILTER (
        WHERE hold.status = 'confirmed' OR hold.expires_at > clock_timestamp()) AS taken
    FROM "{Section._meta.db_table}" AS section
    LEFT JOIN "{SeatHold._meta.db_table}" AS hold ON hold.section_id = section.id
    WHERE section.id = ANY(%s)
    GROUP BY section.id
) AS per_section
"""


class OnItsOwnConnection(threading.Thread):
    """Call ``action(*args)`` on a connection of its own; keep what it returned or
    raised, and the server process that ran it."""

    def __init__(self, action, *args):
        super().__init__(daemon=True)
        self.action, self.args = action, args
        self.pid: int | None = None
        self.result = self.error = None

    def run(self) -> None:
        try:
            connection.ensure_connection()
            self.pid = connection.connection.info.backend_pid
            self.result = self.action(*self.args)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            connections.close_all()


def waits_for_a_lock(thread: OnItsOwnConnection) -> bool:
    if thread.pid is None:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                       [thread.pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def retried(logs: list[dict]) -> list[dict]:
    return [line for line in logs if line["event"] == "learner transaction deadlocked"]


# The interleaving of the issue


def test_leaving_while_an_offer_arrives_and_its_learner_declines_it_never_deadlocks():
    """leave_waitlist once read the entry before its transaction: an offer committed in
    between made it lock the section, the entry, then the offer's hold, while the learner
    declining the offer (release_hold) held that hold and waited for the section."""
    section = SectionFactory(capacity=1)
    seated = hold_seat(section.pk, "ada")
    entry = join_waitlist(section.pk, "cy")
    with capture_logs() as logs, psycopg.connect(database_url()) as other_learner:
        # Another learner's transaction holds the section's lock a moment: the one
        # leaving waits for it, having read nothing of the entry yet.
        other_learner.execute("SELECT 1 FROM reservations_section WHERE id = %s "
                              "FOR NO KEY UPDATE", [section.pk])
        leaving = OnItsOwnConnection(leave_waitlist, entry.pk)
        leaving.start()
        wait_for(lambda: waits_for_a_lock(leaving), timeout=10, what="leave to wait")
        # Meanwhile ada's seat expires and its offer to cy commits (the handler's own
        # writes, made here: the handler would wait for the lock held above).
        SeatHold.objects.filter(pk=seated.pk).delete()
        offer = SeatHoldFactory(section=section, learner_ref="cy")
        WaitlistEntry.objects.filter(pk=entry.pk).update(
            state="offered", offer_hold_id=offer.pk, offered_at=timezone.now())
        # cy declines the offer at once.
        declining = OnItsOwnConnection(release_hold, offer.pk)
        declining.start()
        wait_for(lambda: waits_for_a_lock(declining), timeout=10, what="decline to wait")
        other_learner.commit()
        leaving.join(15)
        declining.join(15)
    assert (leaving.error, declining.error) == (None, None)
    # The leave came first (it waited first): the offer's hold went with the entry, and
    # the decline found it gone.
    assert (leaving.result.state, declining.result) == ("left", False)
    assert not SeatHold.objects.filter(section=section).exists()
    assert retried(logs) == []  # not one deadlock, not even one tried again


def test_a_renewal_that_waited_past_its_holds_expiry_counts_the_seat_anew():
    """A service reads the clock once its section's lock is granted: read before the
    wait, the renewal would count its hold as still held, and revive it beside the seat
    another learner took once it expired."""
    section = SectionFactory(capacity=1)
    expiring = SeatHoldFactory(section=section, learner_ref="ada",
                               expires_at=timezone.now() + timedelta(seconds=1.5))
    with psycopg.connect(database_url()) as other_learner:
        other_learner.execute("SELECT 1 FROM reservations_section WHERE id = %s "
                              "FOR NO KEY UPDATE", [section.pk])
        # bo asks for a seat first, ada renews next; both wait for the section.
        holding = OnItsOwnConnection(hold_seat, section.pk, "bo")
        holding.start()
        wait_for(lambda: waits_for_a_lock(holding), timeout=10, what="hold to wait")
        renewing = OnItsOwnConnection(renew_hold, expiring.pk)
        renewing.start()
        wait_for(lambda: waits_for_a_lock(renewing), timeout=10, what="renewal to wait")
        wait_for(lambda: timezone.now() > expiring.expires_at + timedelta(seconds=0.2),
                 timeout=10, what="ada's hold to expire")
        other_learner.commit()
        holding.join(15)
        renewing.join(15)
    # bo took the seat ada's hold no longer held; ada's renewal, counting it anew,
    # found none.
    assert holding.error is None and holding.result.learner_ref == "bo"
    assert isinstance(renewing.error, SectionFull)
    assert SeatHold.objects.get(pk=expiring.pk).expires_at == expiring.expires_at


# Everything at once

SECTIONS, CAPACITY, WAITING = 2, 4, 3
LEARNERS, SECONDS = 5, 12
# Each action and how often a learner picks it: declines need offers, which are rarer
# than the holds and entries the others find.
ACTIONS = {"hold": 2, "join": 2, "renew": 2, "confirm": 2, "release": 2, "decline": 4,
           "leave": 3}


def test_learners_doing_everything_at_once_never_see_a_database_error_nor_overfill(
        settings, chunk_size):
    # Seats expire while it runs (cleanup frees them), offers too.
    settings.RESERVATIONS_HOLD_MINUTES = 2 / 60
    settings.RESERVATIONS_OFFER_MINUTES = 5 / 60
    chunk_size(EXPIRE_HOLDS, 5)
    sections = [SectionFactory(capacity=CAPACITY) for _ in range(SECTIONS)]
    section_ids = [section.pk for section in sections]
    for section in sections:
        for n in range(CAPACITY):
            hold_seat(section.pk, f"s{section.pk}-seated-{n}")
        for n in range(WAITING):
            join_waitlist(section.pk, f"s{section.pk}-waiting-{n}")
    done, refused = Counter(), Counter()
    errors: list[tuple[str, BaseException]] = []
    over_capacity: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + SECONDS

    def held(section_id: int, *, offered: bool | None):
        holds = SeatHold.objects.filter(section_id=section_id, status="held")
        offers = WaitlistEntry.objects.filter(state="offered").values("offer_hold_id")
        if offered is not None:
            holds = holds.filter(pk__in=offers) if offered else holds.exclude(pk__in=offers)
        return holds.order_by("?").values_list("pk", flat=True).first()

    def act(rng: random.Random, n: int) -> None:
        section_id = rng.choice(section_ids)
        (action,) = rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))
        ref = f"s{section_id}-walk-in-{n}"
        if action == "hold":
            hold_seat(section_id, ref)
        elif action == "join":
            join_waitlist(section_id, ref)
        elif action == "leave":
            entry_id = (WaitlistEntry.objects.filter(section_id=section_id, state__in=IN_LINE)
                        .order_by("?").values_list("pk", flat=True).first())
            if entry_id is None:
                return
            leave_waitlist(entry_id)
        else:
            hold_id = held(section_id, offered={"decline": True, "release": False}.get(action))
            if hold_id is None:
                return
            {"renew": renew_hold, "confirm": confirm_hold, "release": release_hold,
             "decline": release_hold}[action](hold_id)
        with lock:
            done[action] += 1

    def learner(seed: int) -> None:
        rng, n = random.Random(seed), 0
        while time.monotonic() < deadline and not stop.is_set():
            n += 1
            try:
                act(rng, seed * 100_000 + n)
            except ReservationError as refusal:
                with lock:
                    refused[type(refusal).__name__] += 1
            time.sleep(rng.uniform(0, 0.002))

    def cleaner() -> None:
        while time.monotonic() < deadline and not stop.is_set():
            dispatch_in_process(EXPIRE_HOLDS)
            # Confirmed seats are given up at the registrar's desk, so seats keep freeing.
            SeatHold.objects.filter(section_id__in=section_ids, status="confirmed",
                                    updated_at__lt=timezone.now() - timedelta(seconds=1)
                                    ).delete()
            with connection.cursor() as cursor:
                cursor.execute(OVER_CAPACITY, [section_ids])
                over_capacity.append(cursor.fetchone()[0])
            time.sleep(0.2)

    def publisher() -> None:
        while time.monotonic() < deadline and not stop.is_set():
            if not publish(batch=10).handled:
                time.sleep(0.02)

    def start(target, *args) -> threading.Thread:
        def run():
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                with lock:
                    errors.append((target.__name__, exc))
            finally:
                connections.close_all()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    with capture_logs() as logs:
        threads = [start(learner, seed) for seed in range(1, LEARNERS + 1)]
        threads += [start(cleaner), start(publisher), start(publisher)]
        for thread in threads:
            thread.join(SECONDS + 60)
        stop.set()
        assert not any(thread.is_alive() for thread in threads), "a thread never finished"

    print(f"\ndone {dict(done)}, refused {dict(refused)}, "
          f"retried {len(retried(logs))}, capacity checks {len(over_capacity)}")
    assert errors == []  # no database error (nor any other) reached a learner
    assert retried(logs) == []  # not one deadlock among them, not even one tried again
    assert over_capacity and max(over_capacity) <= 0
    with connection.cursor() as cursor:
        cursor.execute(OVER_CAPACITY, [section_ids])
        assert cursor.fetchone()[0] <= 0
    # Every path ran, several times over.
    assert min(done[action] for action in ACTIONS) >= 5, done


# A deadlock all the same: tried once more, then refused

LOCK_SECTION = "SELECT 1 FROM reservations_section WHERE id = %s FOR UPDATE"


class Deadlocks:
    """Real deadlocks of the calling transaction with another connection, which the
    calling transaction loses; the other connections are closed at the end."""

    def __init__(self):
        self.others: list[tuple[threading.Thread, psycopg.Connection]] = []

    def settled(self) -> None:
        """Wait until the other connections of earlier attempts have let go: each takes
        section ``first`` once the lost transaction rolled back, then rolls back. The
        next attempt may lock ``first`` before one of them does (CI saw it); then the
        other holds ``second``, waits for this transaction, and the next ``lose_one``
        waits for it in this thread, which no server can see as a deadlock."""
        for waiter, _ in self.others:
            waiter.join(15)
            assert not waiter.is_alive(), "the other connection never took its lock"

    def lose_one(self, first: int, second: int) -> None:
        """Lock section ``first``, then ``second``, which another connection holds while
        it waits for ``first``. The server rolls this transaction back: the other looks
        for deadlocks only after 10 s of waiting, this one after the server's 1 s."""
        locked_sections().get(pk=first)
        other = psycopg.connect(database_url())
        other.execute("SET deadlock_timeout = '10s'")
        other.execute("SET lock_timeout = '30s'")  # a failure, never a hang
        other.execute(LOCK_SECTION, [second])

        def wait_for_first():
            other.execute(LOCK_SECTION, [first])
            other.rollback()

        waiter = threading.Thread(target=wait_for_first, daemon=True)
        waiter.start()
        self.others.append((waiter, other))
        mine = connection.connection.info.backend_pid
        wait_for(lambda: mine in blockers_of(other.info.backend_pid), timeout=10,
                 what="the other connection to wait for this one")
        locked_sections().get(pk=second)

    def close(self) -> None:
        for waiter, other in self.others:
            waiter.join(15)
            other.close()


def blockers_of(pid: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_blocking_pids(%s)", [pid])
        return cursor.fetchone()[0]


def test_a_learner_transaction_that_deadlocks_is_tried_again_once_and_goes_through():
    first, second = SectionFactory(), SectionFactory()
    deadlocks, attempts = Deadlocks(), []

    @learner_transaction
    def rename(section_id: int, title: str) -> str:
        deadlocks.settled()
        attempts.append(section_id)
        Section.objects.filter(pk=section_id).update(title=title)
        if len(attempts) == 1:
            deadlocks.lose_one(first.pk, second.pk)
        return title

    try:
        with capture_logs() as logs:
            assert rename(first.pk, "renamed") == "renamed"
    finally:
        deadlocks.close()
    assert attempts == [first.pk, first.pk]
    assert [(line["service"], line["attempt"]) for line in retried(logs)] == [("rename", 1)]
    assert Section.objects.get(pk=first.pk).title == "renamed"


def test_a_learner_transaction_that_deadlocks_twice_is_refused_busy_with_nothing_changed():
    first, second = SectionFactory(title="before"), SectionFactory()
    deadlocks, attempts = Deadlocks(), []

    @learner_transaction
    def rename(section_id: int, title: str) -> str:
        deadlocks.settled()
        attempts.append(section_id)
        Section.objects.filter(pk=section_id).update(title=title)
        deadlocks.lose_one(first.pk, second.pk)
        return title

    try:
        with capture_logs() as logs, pytest.raises(Busy) as refused:
            rename(first.pk, "renamed")
    finally:
        deadlocks.close()
    assert str(refused.value) == ("rename could not finish: other changes to the same "
                                  "section got in its way twice. Nothing changed; try "
                                  "again in a moment")
    assert isinstance(refused.value.__cause__.__cause__, psycopg.errors.DeadlockDetected)
    assert attempts == [first.pk, first.pk]  # tried once more, not again
    assert [line["attempt"] for line in retried(logs)] == [1, 2]
    assert Section.objects.get(pk=first.pk).title == "before"
