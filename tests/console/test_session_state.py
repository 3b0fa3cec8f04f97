"""No state lives on a database session (invariant 11): behind a transaction pooler a
server connection outlives its client and serves other clients, so a session-level
lock, a plain SET, a cursor or prepared statement kept past a transaction, or a LISTEN
would leak to them or vanish. Read two ways: the SQL written in the engine's code and
the project's configuration, and every statement the engine sends through a whole day
of work.

transaction=True where a session is inspected after the work: the test's own
transaction would hide what outlives one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import connection

from cleanup.engine import leases, operations, pressure, window
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.pressure import Level, Signal
from cleanup.engine.reconcile import reconcile
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk
from tests.conftest import ROOT

# Statements (or calls) whose effect outlives the transaction that ran them.
SESSION_SCOPED = [
    (re.compile(r"\bpg_(try_)?advisory_lock(_shared)?\s*\(", re.I), "a session advisory lock"),
    (re.compile(r"\bpg_advisory_unlock", re.I), "a session advisory unlock"),
    # SQL's SET in either case, not prose's "Set X to ...".
    (re.compile(r"^\s*(?:SET|set)\s+(?i:(SESSION\s+)?(?!LOCAL\b)([\w.]+\s*(=|TO\b)"
                r"|TIME\s+ZONE\b|ROLE\b|SESSION\s+AUTHORIZATION\b))"), "a SET without LOCAL"),
    (re.compile(r"\bset_config\s*\([^)]*,\s*(false|%s)\s*\)", re.I),
     "set_config for the session (or with a run-time choice)"),
    (re.compile(r"^\s*RESET\b", re.I), "a RESET"),
    (re.compile(r"^\s*(UN)?LISTEN\b|\bpg_notify\s*\(|^\s*NOTIFY\b", re.I), "LISTEN/NOTIFY"),
    (re.compile(r"^\s*(PREPARE|DEALLOCATE)\b", re.I), "a prepared statement"),
    (re.compile(r"\bWITH\s+HOLD\b", re.I), "a cursor WITH HOLD"),
    (re.compile(r"^\s*CREATE\s+TEMP(ORARY)?\b", re.I), "a temporary table"),
]
# The engine's code and the project's configuration; the development tools (bench,
# soak) talk to their own databases directly and are not deployed. The product's code is
# read by tests/product/test_product_session_state.py.
ENGINE_CODE = [ROOT / "cleanup", ROOT / "config"]
EXCLUDED = [ROOT / "config" / "devtools", ROOT / "cleanup" / "migrations"]


def session_scoped(sql: str) -> list[str]:
    """What in ``sql`` outlives its transaction, in words."""
    return [what for pattern, what in SESSION_SCOPED if pattern.search(sql)]


def sql_literals(path: Path) -> list[tuple[int, str]]:
    """Every string constant (and f-string text) of a module that could be SQL."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else "{}"
                           for part in node.values)
            found.append((node.lineno, text))
    return found


def modules(tops: list[Path], excluded: list[Path]) -> list[Path]:
    """Every module below ``tops``, but those below ``excluded``."""
    return sorted(path for top in tops for path in top.rglob("*.py")
                  if not any(path.is_relative_to(folder) for folder in excluded))


def session_scoped_sql(paths: list[Path]) -> list[str]:
    """Each string of ``paths`` that outlives its transaction, with where and what."""
    return [f"{path.relative_to(ROOT)}:{line}: {what}: {text.strip()[:80]}"
            for path in paths for line, text in sql_literals(path)
            for what in session_scoped(text)]


@pytest.mark.parametrize("sql, expected", [
    ("SELECT pg_advisory_lock(1)", ["a session advisory lock"]),
    ("SELECT pg_try_advisory_lock(hashtext('x'))", ["a session advisory lock"]),
    ("SELECT pg_advisory_unlock_all()", ["a session advisory unlock"]),
    ("SET statement_timeout = 0", ["a SET without LOCAL"]),
    ("SET SESSION lock_timeout = '1s'", ["a SET without LOCAL"]),
    ("set time zone 'UTC'", ["a SET without LOCAL"]),
    ("Set DJANGO_EMAIL_BACKEND to a dotted path.", []),
    ("SELECT set_config('lock_timeout', '1s', false)", [
        "set_config for the session (or with a run-time choice)"]),
    ("LISTEN cleanup", ["LISTEN/NOTIFY"]),
    ("DECLARE c CURSOR WITH HOLD FOR SELECT 1", ["a cursor WITH HOLD"]),
    ("SET LOCAL lock_timeout = '1s'", []),
    ("SELECT pg_advisory_xact_lock(1)", []),
    ("SELECT set_config('lock_timeout', %s, true)", []),
    ('UPDATE "t" SET "a" = 1', []),
])
def test_the_detector_tells_session_scoped_sql_from_transaction_scoped(sql, expected):
    assert session_scoped(sql) == expected


def test_no_sql_in_the_project_outlives_its_transaction():
    engine_modules = modules(ENGINE_CODE, EXCLUDED)
    assert engine_modules and session_scoped_sql(engine_modules) == []


@pytest.fixture
def every_statement():
    """Every statement this connection sends, with its parameters filled in."""
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        shown = sql
        if params and not many and isinstance(params, list | tuple):
            shown = sql.replace("%s", "{}").format(*(repr(p) for p in params)) \
                if sql.count("%s") == len(params) else sql
        sent.append(shown)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


def session_settings() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                       [["lock_timeout", "statement_timeout", "application_name",
                         "idle_in_transaction_session_timeout"]])
        return dict(cursor.fetchall())


def advisory_locks_of_this_session() -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT classid, objid FROM pg_locks WHERE locktype = 'advisory' "
                       "AND pid = pg_backend_pid()")
        return cursor.fetchall()


@pytest.mark.django_db(transaction=True)
def test_a_day_of_work_sends_nothing_that_outlives_its_transaction(
        every_statement, settings, monkeypatch, account):
    from tests.engine_app.factories import LeaseFactory

    settings.CLEANUP_WINDOW = 2
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0
    monkeypatch.setattr(window, "MIN_RECHECK_SECONDS", 0.01)
    LeaseFactory.create_batch(12, account=account, expired=True)
    before = session_settings()

    # Queued runs applied by a worker, a --sync run, the reconciler.
    run = dispatch("expire-leases", scheme="range").run
    while chunk := Chunk.objects.filter(run=run, state__in=Chunk.UNFINISHED).first():
        apply_chunk(chunk.message)
    LeaseFactory.create_batch(3, account=account, expired=True)
    dispatch_in_process("expire-leases")
    reconcile()
    # A policy held by the database's pressure, rechecked until it clears.
    readings = iter([Signal(Level.HALT, "replica_lag", 20, 10, "a standby 20 s behind")])
    monkeypatch.setattr(pressure, "check", lambda policy: next(
        readings, Signal(Level.OK, "none", None, None, "no indicator")))
    LeaseFactory.create_batch(3, account=account, expired=True)
    dispatch("expire-leases")
    window.recheck("expire-leases")
    # An operator's pause and resume, and a scrape of the backlog.
    operations.pause_policy("expire-leases", "maintenance", actor="test")
    operations.resume_policy("expire-leases", actor="test")
    from cleanup.observability.metrics import LedgerCollector
    list(LedgerCollector().collect())

    assert len(every_statement) > 50  # the work really ran through this connection
    offending = [(sql[:120], what) for sql in every_statement for what in session_scoped(sql)]
    assert offending == []
    assert advisory_locks_of_this_session() == []
    assert session_settings() == before
    assert leases.live(["recheck:expire-leases"], 3600) == set()  # given up at its end
