"""Learners renewing holds while a contender cleans, each renewal timed."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from reservations.conf import conf
from reservations.models import SeatHold

# Renewals per second per probe is about 1 / (PAUSE + the renewal's own time).
PAUSE = 0.01
CLEANED, UNTOUCHED = "cleaned", "untouched"


class RenewalProbe(threading.Thread):
    """Renew random holds of a fixed sample on its own connection until stopped.

    A renewal here is the row work of ``services.renew_hold``: lock the hold, move its
    expiry. The service's capacity count for an expired hold is left out, so the time
    measured is the wait for the row and not a section-wide count.
    """

    def __init__(self, kind: str, ids: list[int], seed: int):
        super().__init__(name=f"renewals-{kind}", daemon=True)
        self.kind = kind
        self.ids = ids
        self.rng = random.Random(seed)
        self.latencies: list[float] = []
        self.renewed: set[int] = set()
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._renew_one(self.rng.choice(self.ids))
                self._stopping.wait(PAUSE)
        except BaseException as exc:  # reported by the runner, not lost with the thread
            self.error = exc
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join()

    def _renew_one(self, pk: int) -> None:
        started = time.perf_counter()
        # One UPDATE in its own transaction: it takes the row lock, or waits for it.
        found = SeatHold.objects.filter(pk=pk, status=SeatHold.Status.HELD).update(
            expires_at=timezone.now() + timedelta(minutes=conf.HOLD_MINUTES)
        )
        self.latencies.append(time.perf_counter() - started)
        if found:
            self.renewed.add(pk)


def sample_ids(*, expired: bool, size: int, seed: int) -> list[int]:
    """Ids of held holds, expired by now or not, drawn at random."""
    now = timezone.now()
    rows = SeatHold.objects.filter(status=SeatHold.Status.HELD)
    rows = rows.filter(expires_at__lte=now) if expired else rows.filter(expires_at__gt=now)
    ids = list(rows.values_list("pk", flat=True))
    random.Random(seed).shuffle(ids)
    return ids[:size]


def summary(latencies: list[float]) -> dict:
    if not latencies:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 50) * 1000, 2),
        "p99_ms": round(percentile(ordered, 99) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def percentile(ordered: list[float], pct: float) -> float:
    """The nearest-rank percentile of an ascending list."""
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]
