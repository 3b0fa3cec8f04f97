from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection
from django_q.conf import Conf

from cleanup.models import Chunk, Run
from tests.engine_app.factories import AccountFactory, LeaseFactory

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_pressure_read_before(settings):
    """Each test reads the database's pressure afresh (the engine caches it per policy
    and process)."""
    from cleanup.engine import pressure

    pressure.forget()
    yield
    pressure.forget()


@pytest.fixture(autouse=True)
def _totals_counted_at_each_statement(request):
    """The database adds a change to the totals as its transaction commits; a test
    wrapped in one transaction that never commits has them counted at each statement
    instead (a transaction=True test commits, and counts, as production does)."""
    marker = request.node.get_closest_marker("django_db")
    wrapped = ("db" in request.fixturenames or marker is not None) and not (
        "transactional_db" in request.fixturenames
        or (marker is not None and (marker.kwargs.get("transaction")
                                    or (marker.args and marker.args[0]))))
    if wrapped:
        request.getfixturevalue("db")
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS cleanup_count_new_chunk_v1, "
                           "cleanup_count_chunk_change_v1, cleanup_count_new_run_v1, "
                           "cleanup_count_run_change_v1 IMMEDIATE")


@pytest.fixture(autouse=True)
def _fast_retries_and_fixed_chunk_sizes(settings):
    settings.CLEANUP_TRANSIENT_BACKOFF = 0.01
    # Chunks hold the policy's chunk_size; tests/engine/test_sizing.py turns learning on.
    settings.CLEANUP_CHUNK_BUDGET_MS = 0


@pytest.fixture
def row_locks_waited(settings):
    """A chunk's statement waits for a learner's row lock as long as the lock timeout
    (5 s), so a test can watch it wait; by default it gives up after 50 ms and goes on
    without the row (tests/engine/test_locked_rows.py)."""
    settings.CLEANUP_ROW_LOCK_WAIT_MS = settings.CLEANUP_LOCK_TIMEOUT_MS = 5000


# The product's factories are imported where used: the engine's tests also run without
# the product installed (tests/engine_settings.py).
@pytest.fixture
def section(db):
    from tests.factories import SectionFactory

    return SectionFactory(capacity=1000)


@pytest.fixture
def expired_holds(section):
    from tests.factories import SeatHoldFactory

    return SeatHoldFactory.create_batch(5, section=section, expired=True)


@pytest.fixture
def account(db):
    return AccountFactory()


@pytest.fixture
def expired_leases(account):
    """Five leases of one account that expired an hour ago (the engine's own tests)."""
    return LeaseFactory.create_batch(5, account=account, expired=True)


@pytest.fixture
def expire_leases_scheduled():
    """expire-leases fired by the scheduler each minute (the engine app's policies run
    on demand), for what only a scheduled policy has: its slots, lag and missed slots."""
    from dataclasses import replace

    from cleanup import policies

    with policies.registered(replace(policies.get_policy("expire-leases"),
                                     schedule="* * * * *")):
        yield


@pytest.fixture
def dead_letter(expired_leases) -> Chunk:
    """A chunk of expire-leases dead-lettered for its message's unknown version, as the
    worker leaves it, with the queue emptied."""
    from django_q.models import OrmQ

    from cleanup.engine.dispatch import dispatch
    from cleanup.engine.worker import apply_chunk

    chunk = dispatch("expire-leases").run.chunks.get()
    apply_chunk({**chunk.message, "version": 99})
    OrmQ.objects.all().delete()
    chunk = Chunk.objects.get(pk=chunk.pk)
    assert chunk.state == Chunk.State.DEAD_LETTERED
    return chunk


def chunks_of(run: Run) -> list[Chunk]:
    return list(run.chunks.order_by("chunk_id"))


# A Redis index tests may empty: CI runs two suites at once, each with its own.
SCRATCH_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def database_url() -> str:
    """The URL of the database the tests use (the test database), for subprocesses."""
    s = connection.settings_dict
    host = quote(s["HOST"] or "localhost", safe="")
    port = f":{s['PORT']}" if s.get("PORT") else ""
    user = quote(s.get("USER") or "", safe="")
    return f"postgres://{user}@{host}{port}/{s['NAME']}"


def subprocess_env(**extra: str) -> dict:
    """The environment of a subprocess on the test database. Its DJANGO_SETTINGS_MODULE
    is the tests' own (pytest-django puts it in the environment: tests.settings, or
    tests.engine_settings where only the engine is installed) unless ``extra`` names
    another."""
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", **extra}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


def manage(*args: str, **extra_env: str) -> subprocess.Popen:
    """Start ``manage.py`` with the test database in a real subprocess."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=subprocess_env(**extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, timeout: float = 30, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def q_sync(monkeypatch):
    """Run django-q2 tasks inline (its Conf is read at import, so patch it)."""
    monkeypatch.setattr(Conf, "SYNC", True)


@pytest.fixture
def chunk_size():
    """Shrink a policy's chunks for one test: ``chunk_size("expire-leases", 2)``; any
    policy the test registers meanwhile is gone after it too."""
    from dataclasses import replace

    from cleanup import policies

    with policies.registered():
        yield lambda name, size: policies.register_policy(
            replace(policies.get_policy(name), chunk_size=size))
