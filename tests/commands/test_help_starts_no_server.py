"""A command's help, with no DATABASE_URL, prints and starts no embedded PostgreSQL.

The checkout's own .data/ may hold a server already (one `make demo` left running), so
the commands run from a copy of the host project (manage.py and config/, whose
settings put the data folder beside them) under a fresh folder: any server they
started would be that folder's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture
def project_copy():
    # Under the checkout's .data/ rather than pytest's tmp_path: run as root, the
    # embedded package opens every folder above a cluster to its own system user, and
    # .data/ is already open to it (tests/project/test_embedded_db.py).
    (ROOT / ".data").mkdir(exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix="test-help-", dir=ROOT / ".data"))
    shutil.copy(ROOT / "manage.py", copy)
    shutil.copytree(ROOT / "config", copy / "config",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "reservations").symlink_to(ROOT / "reservations")
    yield copy
    for pid_file in copy.rglob("postmaster.pid"):  # only if one was started after all
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        deadline = time.monotonic() + 30
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    shutil.rmtree(copy)


def servers_of(folder: Path) -> list[str]:
    """The command lines of running processes that name ``folder`` (a postmaster's -D)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # the process ended meanwhile
            continue
        if "postgres" in args[0] and any(str(folder) in arg for arg in args):
            found.append(" ".join(args))
    return found


@pytest.mark.parametrize("args, usage", [
    (["seed_reservations", "--help"], "usage: manage.py seed_reservations [-h]"),
    (["cleanup_status", "-h"], "usage: manage.py cleanup_status [-h]"),
    (["help", "cleanup_dispatch"], "usage: manage.py cleanup_dispatch [-h]"),
    (["help"], "Type 'manage.py help <subcommand>' for help on a specific subcommand."),
])
def test_help_prints_without_starting_the_embedded_postgresql(project_copy, args, usage):
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=project_copy, env=env,
                            capture_output=True, text=True, timeout=120)

    assert (result.returncode, result.stderr) == (0, "")
    assert usage in result.stdout
    assert list((project_copy / ".data").glob("postgres*")) == []
    assert servers_of(project_copy) == []
