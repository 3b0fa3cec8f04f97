"""The README's sample of `make demo`'s report is what the command prints: line for line,
only its figures (counts, times, the ids in addresses) and its columns' widths apart.

The fast test renders the command's table from fixed figures; the checks' names are
run_demo's own, written as it runs, so the slow one runs the demo itself (its progress
lines come before the report and are not in the README's sample; the engine's log lines
are not shown below -v 2). transaction=True there: `manage.py run_demo` and the qcluster it
starts are processes of their own and must see the test database's committed rows.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from reservations.demo import MAIL_DIR, DemoReport
from reservations.management.commands.run_demo import Command
from tests.conftest import ROOT, subprocess_env
from tests.engine.test_processes import QCLUSTER_ENV

FENCED = re.compile(r"^```[^\n]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# What differs from one demo to the next: a count, a time, an id in an address.
FIGURE = re.compile(r"\d[\d,:]*")


def readme_report() -> list[str]:
    """The README's sample report: its code block with the racing learners' line."""
    (block,) = [block for block in FENCED.findall((ROOT / "README.md").read_text())
                if "\nRacing learners: " in block]
    return block.splitlines()


def shape(lines: list[str]) -> list[str]:
    """Each line with its figures as ``#`` and its runs of spaces as one space (a column
    widens with its figures)."""
    return [re.sub(" {2,}", " ", FIGURE.sub("#", line)) for line in lines]


def report_of(printed: str) -> list[str]:
    """The report in what the command printed: from its table's heading on."""
    lines = printed.rstrip("\n").splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("policy ")]
    return lines[start:]


def run(policy: str, candidates: int, chunks: int, changed: int, skipped: int, noops: int,
        deliveries: int, mutation: str) -> dict:
    """A run as run_summary reports it, with the fields the table reads."""
    return {"policy": policy, "candidates": candidates, "chunks_planned": chunks,
            "rows_changed": changed, "items_skipped": skipped, "noop_deliveries": noops,
            "deliveries": deliveries, "state": "completed", "mutation": mutation}


def test_the_readmes_demo_report_is_the_commands_table(monkeypatch):
    monkeypatch.chdir(ROOT)  # the report names the mail folder from where it is run
    readme = readme_report()
    # Fixed figures, a real demo's; the checks as the README names them (see above).
    report = DemoReport(
        runs=[run("expire-holds", 3003, 6, 2983, 20, 6, 12, "delete"),
              run("purge-reminder-attempts", 1529, 3, 1529, 0, 0, 3, "delete"),
              run("mark-reminders-ready", 3140, 6, 140, 3000, 5, 6, "update")],
        racing={"renewed": 10, "confirmed": 10, "survivors": 20},
        reminders={"by_state": {"sent": 140, "pending": 376, "cancelled": 10},
                   "mails": 144, "folder": str(MAIL_DIR),
                   "sample": {"To": "learner-215@learners.example.edu",
                              "Subject": "Your seat hold expires at 22:13 UTC",
                              "Message-ID": "<reminder-3215-20261205T220831Z@example.edu>"}},
        waitlist={"freed": 4, "by_source": {"cleanup": 3, "learner": 1}, "offered": 4,
                  "offer_mails": 4,
                  "sample": {"To": "waiting-13-2@learners.example.edu",
                             "Subject": "A seat in Institution 1 full section 1 is yours "
                                        "until 22:42 UTC",
                             "Message-ID": "<seat-offer-2-2@example.edu>"}},
        checks={line.removeprefix("  [ok] "): True for line in readme
                if line.startswith("  [ok] ")},
    )

    printed = report_of(Command().table(report))

    assert shape(printed) == shape(readme)


@pytest.mark.django_db(transaction=True)
@pytest.mark.qcluster
def test_make_demo_prints_the_readmes_report():
    result = subprocess.run(
        [sys.executable, "manage.py", "run_demo", "--noinput", "--timeout", "120"],
        cwd=ROOT, env=subprocess_env(**QCLUSTER_ENV), capture_output=True, text=True,
        timeout=300)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert shape(report_of(result.stdout)) == shape(readme_report())
    # Its steps and its report, no INFO line among them (this test's short task timeout
    # draws a system check's warning, which stays).
    assert not [line for line in result.stderr.splitlines()
                if "[info" in line or "Enqueued" in line], result.stderr[-3000:]
