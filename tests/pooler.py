"""A real PgBouncer in transaction mode in front of the test PostgreSQL, for tests.

``Pooler`` starts Debian's ``pgbouncer`` on a free port of 127.0.0.1 with its own ini in
a temporary directory under /tmp, pooling every database name (``*``) of the upstream
server with ``pool_mode = transaction`` and trust authentication, and stops it at the
end. Run as root, it runs as the ``postgres`` OS user: Debian's pgbouncer refuses root,
and the checkout may sit where that user cannot read, so nothing of it is read from
there. ``Churn`` keeps other clients busy through it, so server connections change
hands between one client's transactions; ``session_level_locks`` and
``pooler_advisory_locks`` ask PostgreSQL directly which advisory locks are left behind.

``started()`` skips where pgbouncer cannot run, and fails instead when CI=true.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import quote

import psycopg
from psycopg.rows import dict_row

OS_USER = "postgres"
HOST = "127.0.0.1"
BINARY_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0
ADMIN_DATABASE = "pgbouncer"


def binary() -> str | None:
    """Return the pgbouncer executable, or None."""
    # /usr/sbin, where Debian puts it, is not on every user's PATH.
    found = shutil.which("pgbouncer")
    if found:
        return found
    for directory in BINARY_DIRS:
        candidate = Path(directory) / "pgbouncer"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def unavailable(upstream_host: str = HOST) -> str | None:
    """Say why PgBouncer cannot start on this machine, or cannot reach the server at
    ``upstream_host`` (an address, or a socket's folder); None when it can."""
    if binary() is None:
        return "pgbouncer is not installed (Debian package pgbouncer)"
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam(OS_USER)
        except KeyError:
            return f"pgbouncer refuses to run as root and there is no {OS_USER!r} OS user"
        if upstream_host.startswith("/") and not _enterable(upstream_host, user):
            # The embedded server's socket sits in its data folder, 0700 to its own user.
            return (f"pgbouncer runs as the {OS_USER!r} OS user, which cannot enter the "
                    f"server's socket folder {upstream_host}: run the pooler tests against a "
                    "server on TCP (DATABASE_URL), as CI does")
    return None


def _enterable(folder: str, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` may pass through ``folder`` and each folder above it."""
    groups = {user.pw_gid, *(group.gr_gid for group in grp.getgrall()
                              if user.pw_name in group.gr_mem)}
    path = Path(folder)
    for step in (path, *path.parents):
        try:
            status = step.stat()
        except OSError:
            return False
        if status.st_uid == user.pw_uid:
            allowed = status.st_mode & stat.S_IXUSR
        elif status.st_gid in groups:
            allowed = status.st_mode & stat.S_IXGRP
        else:
            allowed = status.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def skip_or_fail(upstream_host: str = HOST) -> None:
    """Skip the calling test where PgBouncer cannot run; fail instead under CI."""
    import pytest

    reason = unavailable(upstream_host)
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the pooler tests must run under CI: {reason}")
    pytest.skip(reason)


class Pooler:
    """PgBouncer in transaction mode in front of one PostgreSQL server."""

    def __init__(self, upstream_host: str = HOST, upstream_port: int = 5432,
                 user: str = "root", *, pool_size: int = 4, max_client_conn: int = 200,
                 extra: Mapping[str, object] | None = None) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = int(upstream_port)
        self.user = user
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.extra = dict(extra or {})
        self.port = 0
        self.base: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    @classmethod
    def for_database(cls, settings_dict: Mapping[str, Any], **options: Any) -> Pooler:
        """Build a pooler in front of the server of a Django DATABASES entry."""
        return cls(settings_dict.get("HOST") or HOST, settings_dict.get("PORT") or 5432,
                   settings_dict.get("USER") or "root", **options)

    def __enter__(self) -> Pooler:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    @property
    def log_path(self) -> Path:
        assert self.base is not None, "the pooler has not started"
        return self.base / "pgbouncer.log"

    def log(self) -> str:
        """Return PgBouncer's log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except (AssertionError, OSError):
            return ""

    def url_for(self, dbname: str) -> str:
        """Return a postgres:// URL for ``dbname`` through the pooler."""
        return f"postgres://{quote(self.user, safe='')}@{HOST}:{self.port}/{quote(dbname)}"

    def direct_url(self, dbname: str) -> str:
        """Return a postgres:// URL for ``dbname`` on the upstream server, bypassing the pooler."""
        host = self.upstream_host
        # A socket directory goes in the query string; a bare host in the authority.
        if host.startswith("/"):
            return (f"postgres://{quote(self.user, safe='')}@:{self.upstream_port}/"
                    f"{quote(dbname)}?host={quote(host, safe='')}")
        return f"postgres://{quote(self.user, safe='')}@{host}:{self.upstream_port}/{quote(dbname)}"

    def connect(self, dbname: str, **options: Any) -> psycopg.Connection[Any]:
        """Open an autocommit psycopg connection to ``dbname`` through the pooler."""
        # psycopg prepares a statement after its fifth run; PgBouncer 1.18 in
        # transaction mode may send the next run to a server that never saw it.
        options = {"autocommit": True, "prepare_threshold": None, "connect_timeout": 5,
                   **options}
        return psycopg.connect(self.url_for(dbname), **options)

    def admin(self, sql: str) -> list[dict[str, Any]]:
        """Run one command (SHOW POOLS, SHOW SERVERS, RECONNECT, ...) on the admin console."""
        # The console speaks only the simple query protocol: a ClientCursor sends that.
        with psycopg.connect(self.url_for(ADMIN_DATABASE), autocommit=True, connect_timeout=5,
                             cursor_factory=psycopg.ClientCursor, row_factory=dict_row) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def server_pids(self, dbname: str | None = None) -> set[int]:
        """Return the backend pids of the pooler's server connections (to ``dbname``)."""
        return {row["remote_pid"] for row in self.admin("SHOW SERVERS")
                if row["remote_pid"] and (dbname is None or row["database"] == dbname)}

    def start(self) -> None:
        """Start PgBouncer and wait until it accepts connections."""
        assert self.process is None, "the pooler is running"
        executable = binary()
        assert executable is not None, unavailable()
        self.base = Path(tempfile.mkdtemp(prefix="cleanup-pgbouncer-", dir="/tmp"))
        owner = pwd.getpwnam(OS_USER) if os.geteuid() == 0 else None
        if owner is not None:
            os.chown(self.base, owner.pw_uid, owner.pw_gid)
        started = time.monotonic()
        # Another process may take the probed port before PgBouncer binds it.
        for _attempt in range(3):
            self.port = _free_port()
            self._write_config(owner)
            self.process = subprocess.Popen(
                [executable, str(self.base / "pgbouncer.ini")], cwd=self.base,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
                user=owner.pw_uid if owner else None, group=owner.pw_gid if owner else None,
                extra_groups=[] if owner else None, start_new_session=True)
            if self._wait_ready(started):
                self.startup_seconds = time.monotonic() - started
                return
            if "Address already in use" not in self.log():
                break
        log = self.log()
        self.stop()
        raise RuntimeError(f"pgbouncer did not accept connections within {START_TIMEOUT:.0f} s:"
                           f"\n{log[-3000:]}")

    def stop(self) -> None:
        """Stop PgBouncer, wait for its server connections to end, and remove its directory."""
        process, self.process = self.process, None
        servers: list[dict[str, Any]] = []
        if process is not None and process.poll() is None:
            try:
                servers = self.admin("SHOW SERVERS")
            except psycopg.Error:
                servers = []
            # SIGTERM is an immediate shutdown in 1.18; SIGINT would wait for clients.
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT)
            self._wait_backends_gone(servers)
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def _write_config(self, owner: pwd.struct_passwd | None) -> None:
        assert self.base is not None
        for old in ("pgbouncer.log", "pgbouncer.pid"):
            (self.base / old).unlink(missing_ok=True)
        settings: dict[str, object] = {
            "listen_addr": HOST,
            "listen_port": self.port,
            # No unix socket: its default directory (/tmp) may hold another pooler's.
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": self.base / "userlist.txt",
            "admin_users": self.user,
            "pool_mode": "transaction",
            "default_pool_size": self.pool_size,
            "max_client_conn": self.max_client_conn,
            "server_reset_query": "",
            # What production poolers commonly ignore. Not "options": psycopg and Django
            # send neither by default, and a client that relies on startup options
            # should fail here rather than silently lose them.
            "ignore_startup_parameters": "extra_float_digits",
            "logfile": self.base / "pgbouncer.log",
            "pidfile": self.base / "pgbouncer.pid",
            **self.extra,
        }
        files = {
            "pgbouncer.ini": (
                "[databases]\n"
                f"* = host={self.upstream_host} port={self.upstream_port}\n\n"
                "[pgbouncer]\n"
                + "".join(f"{name} = {value}\n" for name, value in settings.items())
            ),
            # With trust, PgBouncer still admits only the users this file names.
            "userlist.txt": f'"{self.user}" ""\n',
        }
        for name, text in files.items():
            path = self.base / name
            path.write_text(text)
            if owner is not None:
                os.chown(path, owner.pw_uid, owner.pw_gid)

    def _wait_backends_gone(self, servers: list[dict[str, Any]]) -> None:
        # Backends end a moment after their socket closes; until then a test database
        # cannot be dropped ("is being accessed by other users").
        pids = [row["remote_pid"] for row in servers if row["remote_pid"]]
        if not pids:
            return
        deadline = time.monotonic() + STOP_TIMEOUT
        try:
            with psycopg.connect(self.direct_url(servers[0]["database"]), autocommit=True,
                                 connect_timeout=5) as conn:
                while time.monotonic() < deadline:
                    row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                                       "WHERE pid = ANY(%s)", [pids]).fetchone()
                    if not row or not row[0]:
                        return
                    time.sleep(0.02)
        except psycopg.Error:
            return

    def _wait_ready(self, started: float) -> bool:
        assert self.process is not None
        while time.monotonic() - started < START_TIMEOUT:
            if self.process.poll() is not None:
                self.process = None
                return False
            try:
                self.admin("SHOW VERSION")
            except psycopg.OperationalError:
                time.sleep(0.02)
                continue
            return True
        return False


@contextmanager
def started(settings_dict: Mapping[str, Any] | None = None, **options: Any) -> Iterator[Pooler]:
    """Run a pooler in front of the tests' database (skipping, or failing under CI, without one)."""
    if settings_dict is None:
        from django.db import connection

        settings_dict = connection.settings_dict
    skip_or_fail(settings_dict.get("HOST") or HOST)
    with Pooler.for_database(settings_dict, **options) as pooler:
        yield pooler


class Churn:
    """Other clients running short transactions through the pooler until stopped."""

    def __init__(self, pooler: Pooler, dbname: str, clients: int = 8,
                 statement: str = "SELECT pg_sleep(0.005)", max_seconds: float = 60.0) -> None:
        self.pooler = pooler
        self.dbname = dbname
        self.clients = clients
        self.statement = statement
        self.max_seconds = max_seconds
        self.transactions = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Churn:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start the clients."""
        deadline = time.monotonic() + self.max_seconds
        self._threads = [threading.Thread(target=self._client, args=(deadline,), daemon=True,
                                          name=f"churn-{number}")
                         for number in range(self.clients)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop the clients and wait for them to disconnect."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.max_seconds + 10)

    def wait_busy(self, transactions: int = 50, timeout: float = 10.0) -> None:
        """Wait until the clients have committed ``transactions`` transactions between them."""
        deadline = time.monotonic() + timeout
        while self.transactions < transactions:
            if self.errors:
                raise AssertionError(f"churn failed: {self.errors[:3]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"churn committed {self.transactions} transactions in "
                                     f"{timeout:.0f} s, not {transactions}")
            time.sleep(0.01)

    def _client(self, deadline: float) -> None:
        try:
            with self.pooler.connect(self.dbname, application_name="churn") as conn:
                while not self._stop.is_set() and time.monotonic() < deadline:
                    with conn.transaction():
                        conn.execute(self.statement)
                    with self._lock:
                        self.transactions += 1
        except Exception as exc:  # reported through errors, not raised in a thread
            with self._lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")


class AdvisoryLock(NamedTuple):
    """An advisory lock as pg_locks and pg_stat_activity show it."""

    pid: int
    application_name: str
    classid: int
    objid: int
    state: str | None


def advisory_parts(key: int) -> tuple[int, int]:
    """Return the (classid, objid) pg_locks shows for the one-bigint advisory ``key``."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


_ADVISORY = """
    SELECT a.pid, a.application_name, l.classid::bigint, l.objid::bigint, a.state
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND a.pid <> pg_backend_pid()
"""


def session_level_locks(dsn_direct: str, dbname: str | None = None) -> list[AdvisoryLock]:
    """List advisory locks held by sessions outside any transaction (session-level, left behind)."""
    # An idle session has no transaction, so whatever advisory lock it holds is a
    # session-level one that outlives the client that took it.
    sql = _ADVISORY + " AND a.state = 'idle'"
    params: list[object] = []
    if dbname is not None:
        sql += " AND a.datname = %s"
        params.append(dbname)
    return _advisory(dsn_direct, sql + " ORDER BY a.pid, l.classid, l.objid", params)


def pooler_advisory_locks(pooler: Pooler, dsn_direct: str) -> list[AdvisoryLock]:
    """List the advisory locks the pooler's server connections hold, in a transaction or not."""
    pids = sorted(pooler.server_pids())
    if not pids:
        return []
    return _advisory(dsn_direct, _ADVISORY + " AND a.pid = ANY(%s) ORDER BY a.pid, l.classid, "
                     "l.objid", [pids])


def terminate_backends(dsn_direct: str, pids: set[int] | list[int]) -> None:
    """End the given backends on the server and wait until they are gone."""
    pids = sorted(pids)
    if not pids:
        return
    with psycopg.connect(dsn_direct, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                     "WHERE pid = ANY(%s)", [pids])


def _advisory(dsn_direct: str, sql: str, params: list[object]) -> list[AdvisoryLock]:
    with psycopg.connect(dsn_direct, autocommit=True) as conn:
        return [AdvisoryLock(*row) for row in conn.execute(sql, params).fetchall()]


def env_through(pooler: Pooler, dbname: str, base: Mapping[str, str] | None = None,
                **extra: str) -> dict[str, str]:
    """Copy the environment, with DATABASE_URL naming ``dbname`` through the pooler."""
    env = {**(os.environ if base is None else base), "PYTHONUNBUFFERED": "1", **extra,
           "DATABASE_URL": pooler.url_for(dbname)}
    # As tests.conftest.subprocess_env: a test's own multiprocess metrics directory
    # is no place for a subprocess's.
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]
