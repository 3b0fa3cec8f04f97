"""A command's result is its last line: errors logged on the way (a --sync process
taken over mid-run) print before it, not after it, when it exits 0."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, subprocess_env

COMMAND = """
import django, logging, sys
django.setup()
from cleanup.management.base import CleanupCommand


class Command(CleanupCommand):
    def run(self, **options):
        logging.getLogger("cleanup.window").error("planning the next chunk failed")
        return {"done": 1}

    def describe(self, result, verbosity):
        return "Done: the summary."


Command().run_from_argv(["manage.py", "example"])
"""


def test_errors_met_on_the_way_print_before_the_summary_which_stays_last():
    process = subprocess.run([sys.executable, "-c", COMMAND], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                             env=subprocess_env())

    assert process.returncode == 0, process.stdout
    lines = process.stdout.strip().splitlines()
    assert lines[-1] == "Done: the summary."
    assert any("planning the next chunk failed" in line for line in lines[:-1]), lines
