"""The ledger's counters and gauges per policy, as /metrics reports them: read from the
totals the database keeps (cleanup.models.Total, cleanup/sql/totals_v1.sql).

Every change of a chunk or a run adds what it changed to its policy's totals as it
commits, so a scrape reads one row per policy however many chunks the ledger keeps,
and a purge deletes ledger rows without taking anything from the counters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from cleanup.models import Total, rows_changed

# The histograms' buckets. cleanup/sql/totals_v1.sql counts a chunk into the same ones
# (tests/engine/test_totals.py pins the two).
DURATION_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
ROWS_BUCKETS = (0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000)

# The server version (connection.pg_version) from which a chunk's WAL is counted: the
# first with per-session WAL counters (cleanup/sql/wal_v1.sql).
WAL_COUNTED_FROM = 180000

STATE_PREFIX = "state_"  # a chunk state's gauge: chunks of the policy in that state now
RUNNING = "running"  # the policy's runs not finished yet


@dataclass(frozen=True)
class LedgerFigures:
    """What one scrape reads from the ledger's totals."""

    sums: dict[str, dict[str, int]]  # counters per policy, purged rows included
    states: dict[str, dict[str, int]]  # chunks per policy and current state
    running: dict[str, int]  # runs per policy not finished yet


def ledger_figures() -> LedgerFigures:
    """Every policy's counters (0 for one it has not counted yet), chunk states and runs
    running: one row per policy."""
    sums = defaultdict(lambda: defaultdict(int))
    states, running = defaultdict(dict), {}
    for subject, figures in Total.objects.filter(family="policy").values_list(
            "subject", "figures"):
        # Figures edited by hand out of shape are left out, never a failed scrape.
        for key, value in (figures.items() if isinstance(figures, dict) else ()):
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if key.startswith(STATE_PREFIX):
                states[subject][key.removeprefix(STATE_PREFIX)] = value
            elif key == RUNNING:
                running[subject] = value
            else:
                sums[subject][key] = value
        sums[subject]["rows_changed"] = rows_changed(sums[subject])
    return LedgerFigures(sums, states, running)
