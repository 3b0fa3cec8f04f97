"""Where `make demo`'s mails go: a documented folder of the checkout, emptied of the
previous demo's mails, named in the report; nothing is left in the system's temp dir.

transaction=True: `manage.py run_demo` and the qcluster it starts are processes of
their own and must see the test database's committed rows.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, subprocess_env
from tests.engine.test_processes import QCLUSTER_ENV

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.qcluster]

MAIL_DIR = ROOT / ".data" / "demo-mail"
# Django's file backend names each file "<YYYYmmdd-HHMMSS>-<id>.log".
MAIL_FILE = re.compile(r"\d{8}-\d{6}-\d+\.log")


def mail_files() -> list[Path]:
    return sorted(p for p in MAIL_DIR.iterdir() if MAIL_FILE.fullmatch(p.name))


def test_the_demo_writes_its_mails_to_the_checkouts_data_folder_and_says_so():
    MAIL_DIR.mkdir(parents=True, exist_ok=True)
    stale = MAIL_DIR / "20200101-000000-1.log"  # a previous demo's
    stale.write_text("Subject: from an earlier demo\n")
    temp_before = set(Path(tempfile.gettempdir()).glob("demo-mail-*"))

    result = subprocess.run(
        [sys.executable, "manage.py", "run_demo", "--noinput", "--expired", "40", "--active",
         "10", "--racers", "2", "--timeout", "120"],
        cwd=ROOT, env=subprocess_env(**QCLUSTER_ENV), capture_output=True, text=True,
        timeout=300)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("Reminders now")]
    mails = int(re.search(r"; (\d+) mails? written", line)[1])
    assert line.endswith(" written by the cluster's file backend to .data/demo-mail/ (kept "
                         "until the next demo).")
    assert not stale.exists()
    written = b"".join(path.read_bytes() for path in mail_files())
    assert mails > 0 and written.count(b"\nSubject: ") == mails
    assert set(Path(tempfile.gettempdir()).glob("demo-mail-*")) == temp_before
