"""The PgBouncer fixture (tests/pooler.py) is real, and shows the hazards of transaction pooling.

Behind a pooler in transaction mode a client's transactions run on whichever server
connection is free, and a server connection outlives its client: a session-level
advisory lock stays held after the client that took it has gone, where no client
can release it, while a transaction-level one ends with its transaction. psycopg's
prepared statements and Django's holdable server-side cursors (``.iterator()`` outside
a transaction) name objects on one server connection that the next statement may not
reach; Django's default settings prepare nothing.

Each test talks to the pytest-django test database through a real PgBouncer, and
leaves no advisory lock behind on the pooler's server connections.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests import pooler as pgbouncer
from tests.pooler import (
    Churn,
    Pooler,
    advisory_parts,
    env_through,
    pooler_advisory_locks,
    session_level_locks,
    terminate_backends,
)

pytestmark = pytest.mark.pooler

ROOT = Path(__file__).resolve().parents[2]
# Advisory keys of these tests only, far from hashtextextended's usual outputs.
SESSION_KEY = 0x5EA7_0000_0000_0A01
XACT_KEY = 0x5EA7_0000_0000_0A02
ATTEMPTS = 200


@pytest.fixture(scope="module")
def dbname(django_db_setup) -> str:
    """The test database's name (pytest-django has created and migrated it)."""
    return connection.settings_dict["NAME"]


@pytest.fixture(scope="module")
def pooler(dbname) -> Iterator[Pooler]:
    with pgbouncer.started(connection.settings_dict) as running:
        yield running


@pytest.fixture
def direct(pooler, dbname) -> Iterator[str]:
    """The test database's URL on PostgreSQL itself; each test leaves no advisory lock behind."""
    url = pooler.direct_url(dbname)
    yield url
    leftover = pooler_advisory_locks(pooler, url)
    terminate_backends(url, {lock.pid for lock in leftover})
    assert not leftover, f"the test left advisory locks on the pooler's servers: {leftover}"


def test_the_pooler_is_a_pgbouncer_in_transaction_mode(pooler, dbname):
    with pooler.connect(dbname) as client:
        assert client.execute("SELECT current_database()").fetchone() == (dbname,)
    pools = {row["database"]: row for row in pooler.admin("SHOW POOLS")}
    assert pools[dbname]["pool_mode"] == "transaction"
    assert pooler.admin("SHOW CLIENTS") and pooler.admin("SHOW VERSION")
    assert pooler.startup_seconds is not None and pooler.startup_seconds < 5


def test_a_session_lock_outlives_its_client_on_a_pooled_server_connection(pooler, dbname,
                                                                           direct):
    with pooler.connect(dbname, application_name="pooler-test-locker") as client:
        pid, _ = client.execute("SELECT pg_backend_pid(), pg_advisory_lock(%s)",
                                [SESSION_KEY]).fetchone()
    classid, objid = advisory_parts(SESSION_KEY)
    try:
        # The client has gone; the server connection it used is back in the pool.
        left = [lock for lock in session_level_locks(direct, dbname)
                if (lock.classid, lock.objid) == (classid, objid)]
        assert [(lock.pid, lock.state) for lock in left] == [(pid, "idle")]
        assert pid in pooler.server_pids(dbname)
        assert any(lock.pid == pid for lock in pooler_advisory_locks(pooler, direct))
        with psycopg.connect(direct, autocommit=True) as other:
            assert other.execute("SELECT pg_try_advisory_lock(%s)",
                                 [SESSION_KEY]).fetchone() == (False,)
    finally:
        terminate_backends(direct, {pid})
    assert not [lock for lock in session_level_locks(direct, dbname)
                if (lock.classid, lock.objid) == (classid, objid)]


def test_one_clients_transactions_move_between_server_connections_under_churn(pooler,
                                                                               dbname):
    with Churn(pooler, dbname, clients=8) as churn, pooler.connect(dbname) as client:
        churn.wait_busy()
        pids = [client.execute("SELECT pg_backend_pid()").fetchone()[0]]
        for _attempt in range(ATTEMPTS):
            pids.append(client.execute("SELECT pg_backend_pid()").fetchone()[0])
            if pids[-1] != pids[-2]:
                break
    assert pids[-1] != pids[-2], f"{len(pids)} transactions all ran on backend {pids[0]}"
    assert not churn.errors


def test_a_transaction_lock_leaves_nothing_behind(pooler, dbname, direct):
    classid, objid = advisory_parts(XACT_KEY)
    with Churn(pooler, dbname, clients=8) as churn, pooler.connect(dbname) as client:
        churn.wait_busy()
        for _round in range(5):
            with client.transaction():
                pid = client.execute("SELECT pg_backend_pid() FROM pg_advisory_xact_lock(%s)",
                                     [XACT_KEY]).fetchone()[0]
                held = [lock for lock in pooler_advisory_locks(pooler, direct)
                        if (lock.classid, lock.objid) == (classid, objid)]
                assert [(lock.pid, lock.state) for lock in held] == [(pid, "idle in transaction")]
                assert not session_level_locks(direct, dbname)
            assert not pooler_advisory_locks(pooler, direct)
    assert not churn.errors


def test_psycopg_prepared_statements_break_behind_the_pooler(pooler, dbname):
    """Why Pooler.connect turns preparing off: psycopg prepares on one server connection."""
    with Churn(pooler, dbname, clients=8) as churn, \
            pooler.connect(dbname, prepare_threshold=5) as client:
        churn.wait_busy()
        missing = 0
        for number in range(ATTEMPTS):
            try:
                client.execute("SELECT %s::int", [number]).fetchone()
            except psycopg.errors.InvalidSqlStatementName:
                missing += 1
                break
    assert missing, f"{ATTEMPTS} prepared executions all found their statement"
    assert not churn.errors


ORM_QUERIES = """
import json
import psycopg
from django.contrib.contenttypes.models import ContentType
from django.db import ProgrammingError, connection, transaction

def iterate():
    try:
        return len(list(ContentType.objects.iterator(chunk_size=1)))
    except (psycopg.ProgrammingError, ProgrammingError) as exc:
        # Django wraps the error, or not, depending on where the FETCH fails.
        return "ProgrammingError" if "does not exist" in str(exc) else repr(exc)

for number in range(10):
    ContentType.objects.filter(pk__gt=number).count()
with transaction.atomic():
    inside = iterate()
configured = connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False)
outside = iterate()
connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
disabled = iterate()
print(json.dumps({"port": connection.settings_dict["PORT"], "inside": inside,
                  "configured": configured, "outside": outside, "disabled": disabled}))
"""


def test_django_through_the_pooler(pooler, dbname):
    """Run Django's ORM behind it: fine, but for server-side cursors outside a transaction."""
    with Churn(pooler, dbname, clients=8) as churn:
        churn.wait_busy()
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-v", "0", "-c",
                               ORM_QUERIES], cwd=ROOT, env=env_through(pooler, dbname),
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert int(seen["port"]) == pooler.port
    assert isinstance(seen["inside"], int) and seen["inside"] > 1
    assert seen["disabled"] == seen["inside"]
    # Otherwise a holdable cursor's FETCH reaches a server connection that never
    # declared it.
    assert seen["outside"] == (seen["inside"] if seen["configured"] else "ProgrammingError")
    assert time.monotonic() - started < 120
    assert not churn.errors
