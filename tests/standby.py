"""A throwaway PostgreSQL primary with a real streaming standby, for the pressure tests.

Both clusters run as the ``postgres`` OS user (``runuser``), with the server binaries
of the newest PostgreSQL under ``/usr/lib/postgresql``, in a temporary directory, on
free ports of 127.0.0.1 with trust authentication. The standby is a
``pg_basebackup -R`` of the primary, streaming, replaying and reporting its positions
every second. Nothing here touches the machine's own cluster.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OS_USER = "postgres"
HOST = "127.0.0.1"
ROOT = Path("/usr/lib/postgresql")
TOOLS = ("initdb", "pg_ctl", "pg_basebackup")
STREAMING_TIMEOUT = 30.0

HBA = f"""\
local all all trust
host replication all {HOST}/32 trust
host all all {HOST}/32 trust
"""


@dataclass(frozen=True)
class Pair:
    """Where the primary and its standby listen; both take the superuser ``postgres``."""

    host: str
    primary_port: int
    standby_port: int
    user: str = OS_USER

    def conninfo(self, port: int, dbname: str = "postgres") -> dict[str, object]:
        """Keyword arguments for ``psycopg.connect`` to the cluster on ``port``."""
        return {"host": self.host, "port": port, "user": self.user, "dbname": dbname}


def binaries() -> Path | None:
    """The bin directory of the newest PostgreSQL with every tool the pair needs."""
    if not ROOT.is_dir():
        return None
    versions = sorted((p for p in ROOT.iterdir() if p.name.isdigit()),
                      key=lambda p: int(p.name), reverse=True)
    for version in versions:
        if all((version / "bin" / tool).is_file() for tool in TOOLS):
            return version / "bin"
    return None


def unavailable() -> str | None:
    """Why the pair cannot start on this machine, or None when it can."""
    if binaries() is None:
        return f"no PostgreSQL server binaries ({', '.join(TOOLS)}) under {ROOT}/<version>/bin"
    if shutil.which("runuser") is None:
        return "runuser is not installed"
    if os.geteuid() != 0:
        return "runuser needs root to start the clusters as the postgres user"
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        return f"no {OS_USER!r} OS user"
    return None


@contextmanager
def streaming_pair() -> Iterator[Pair]:
    """Start a primary and a streaming standby; stop them at once and remove them after."""
    bin_dir = binaries()
    assert bin_dir is not None, unavailable()
    owner = pwd.getpwnam(OS_USER)
    base = Path(tempfile.mkdtemp(prefix="cleanup-standby-"))
    os.chown(base, owner.pw_uid, owner.pw_gid)
    primary, standby = base / "primary", base / "standby"
    pair = Pair(HOST, _free_port(), _free_port())
    started: list[Path] = []

    def run(*args: str | Path) -> None:
        command = ["runuser", "-u", OS_USER, "--", *(str(arg) for arg in args)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode:
            logs = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}"
                             for log in base.glob("*.log"))
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n"
                               f"{done.stdout}{done.stderr}{logs}")

    def start(data: Path) -> None:
        run(bin_dir / "pg_ctl", "-D", data, "-l", base / f"{data.name}.log", "-w", "start")
        started.append(data)

    try:
        run(bin_dir / "initdb", "-D", primary, "-U", OS_USER, "--auth=trust", "--no-sync",
            "--no-instructions")
        (primary / "pg_hba.conf").write_text(HBA)
        _append(primary / "postgresql.conf", {
            "listen_addresses": f"'{HOST}'", "port": pair.primary_port,
            "unix_socket_directories": f"'{base}'", "wal_level": "replica",
            "max_wal_senders": 4, "fsync": "off", "shared_buffers": "'32MB'",
        })
        start(primary)
        run(bin_dir / "pg_basebackup", "-h", HOST, "-p", pair.primary_port, "-U", OS_USER,
            "-D", standby, "-R", "-X", "stream", "-c", "fast")
        # The copied postgresql.conf names the primary's port; a later line wins.
        _append(standby / "postgresql.conf", {
            "port": pair.standby_port, "hot_standby": "on",
            "wal_receiver_status_interval": "'1s'",
        })
        start(standby)
        _wait_streaming(pair)
        yield pair
    finally:
        for data in reversed(started):
            subprocess.run(["runuser", "-u", OS_USER, "--", str(bin_dir / "pg_ctl"), "-D",
                            str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _append(conf: Path, values: dict[str, object]) -> None:
    with conf.open("a") as file:
        file.writelines(f"{name} = {value}\n" for name, value in values.items())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _wait_streaming(pair: Pair) -> None:
    import psycopg

    deadline = time.monotonic() + STREAMING_TIMEOUT
    with psycopg.connect(**pair.conninfo(pair.primary_port), autocommit=True) as primary:
        while time.monotonic() < deadline:
            row = primary.execute("SELECT count(*) FROM pg_stat_replication "
                                  "WHERE state = 'streaming'").fetchone()
            if row and row[0]:
                return
            time.sleep(0.1)
    raise RuntimeError(f"the standby on port {pair.standby_port} is not streaming "
                       f"after {STREAMING_TIMEOUT:.0f} s")
