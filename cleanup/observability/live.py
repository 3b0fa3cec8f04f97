"""The overview's live view: queue depth per policy, the workers busy and the chunk
each applies, rows changed per minute over the last hour.

Read in four queries whatever the ledger's size (the overview refreshes every few
seconds): the chunks sent and not finished per policy and state (few rows, found by the
state index), those of them with a delivery that has no outcome yet, the rows committed
per policy and minute (the ``chunk_committed_at`` index), and the broker's queue length.

Idle workers are not counted: a cluster's heartbeat says it takes work, not how many
workers it runs, so "busy" is all the view can say honestly.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import attrgetter

from django.db.models import BooleanField, Count, Func, Sum
from django.db.models.functions import TruncMinute
from django_q.brokers import get_broker
from django_q.conf import Conf

from cleanup import display
from cleanup.models import Chunk
from cleanup.models.ledger import ROWS_CHANGED
from cleanup.observability.waits import read_history
from cleanup.policies import all_policies

MINUTES = 60
# Sent and waiting for a worker: enqueued, or left for redelivery after a failure.
SENT = (Chunk.State.ENQUEUED, Chunk.State.RETRYING)

# The chart's geometry in SVG user units: one slot per minute, a band above the bars
# for the peak's label.
BAR_WIDTH = 5
BAR_STEP = 6
LABEL_BAND = 12
BARS_HEIGHT = 40
CHART_WIDTH = MINUTES * BAR_STEP
CHART_HEIGHT = LABEL_BAND + BARS_HEIGHT
# A minute with rows is never drawn thinner than this, so it never reads as empty.
LEAST_BAR = 2


class HasOpenDelivery(Func):
    """Whether a chunk's history holds a delivery with no outcome: in progress, or its
    worker died."""

    function = "jsonb_path_exists"
    template = "%(function)s(%(expressions)s, '$[*] ? (!(exists(@.outcome)))')"
    output_field = BooleanField()
    conditional = True


@dataclass(frozen=True)
class Delivery:
    """A delivery with no outcome yet, of a chunk not finished."""

    worker: str  # host:pid (the history's random token left out)
    policy: str
    chunk_pk: int
    chunk_id: int
    chunk_state: str
    run_id: uuid.UUID
    number: int
    started_at: datetime
    now: datetime

    @property
    def age(self) -> timedelta:
        return max(self.now - self.started_at, timedelta(0))

    @property
    def run_short_id(self) -> str:
        return display.short_id(self.run_id)


@dataclass(frozen=True)
class Bar:
    """One minute of a policy's chart."""

    minute: datetime
    rows: int
    x: int
    height: float
    current: bool  # the minute still going on

    @property
    def y(self) -> float:
        return round(CHART_HEIGHT - self.height, 1)

    @property
    def title(self) -> str:
        so_far = " so far" if self.current else ""
        unit = "row" if self.rows == 1 else "rows"
        return f"{self.minute:%H:%M} UTC{so_far}: {display.number(self.rows)} {unit}"


@dataclass(frozen=True)
class Chart:
    """Rows a policy changed per minute over the last hour, scaled to its own peak."""

    policy: str
    bars: tuple[Bar, ...]  # oldest first, the minute going on last

    @property
    def total(self) -> int:
        return sum(bar.rows for bar in self.bars)

    @property
    def peak(self) -> Bar:
        """The tallest minute (the latest of equals)."""
        return max(reversed(self.bars), key=lambda bar: bar.rows)

    @property
    def now(self) -> Bar:
        """The last whole minute: the one going on would read low until it ends."""
        return self.bars[-2]

    @property
    def peak_label(self) -> str:
        return f"peak {display.number(self.peak.rows)} at {self.peak.minute:%H:%M}"

    @property
    def peak_label_x(self) -> float:
        return self.peak.x + BAR_WIDTH / 2

    @property
    def peak_label_anchor(self) -> str:
        """Where the label hangs from its bar, so it stays inside the chart."""
        if self.peak_label_x < CHART_WIDTH * 0.25:
            return "start"
        return "end" if self.peak_label_x > CHART_WIDTH * 0.75 else "middle"

    @property
    def summary(self) -> str:
        """The chart in words, its text alternative."""
        return (f"{self.policy}: {display.number(self.total)} rows changed in the last hour; "
                f"{display.number(self.now.rows)} a minute now ({self.now.minute:%H:%M} UTC)")


@dataclass(frozen=True)
class PolicyLive:
    """One policy's row of the live view."""

    policy: str
    waiting: int  # sent, no delivery in progress
    retrying: int  # of those, left for redelivery after a failure
    applying: int  # chunks with a delivery in progress
    chart: Chart | None  # None: nothing changed in the last hour


@dataclass(frozen=True)
class LiveView:
    """What the overview's live view shows."""

    now: datetime
    policies: tuple[PolicyLive, ...]
    busy: tuple[Delivery, ...]  # oldest first
    # Begun longer ago than django-q2's retry and never ended: shown apart, not as busy.
    # A worker killed mid-chunk leaves such an entry for good, and by then the broker
    # hands the message out again.
    silent: tuple[Delivery, ...]
    broker_messages: int  # every task waiting in the broker, not only chunks
    busy_within: timedelta  # django-q2's retry: how recent a busy delivery's start is
    first_minute: datetime
    last_minute: datetime
    chart_width: int = CHART_WIDTH
    chart_height: int = CHART_HEIGHT
    bar_width: int = BAR_WIDTH
    bars_height: int = BARS_HEIGHT
    label_band: int = LABEL_BAND


def live_view(now: datetime) -> LiveView:
    """What the overview's live view shows: every registered policy, zero where idle."""
    names = [policy.name for policy in all_policies()]
    busy_within = timedelta(seconds=Conf.RETRY)
    busy, silent = open_deliveries(now, busy_within)
    sent = sent_chunks()
    # A chunk being applied stays enqueued (or retrying) until its delivery commits: it
    # is not waiting for a worker any more. Two deliveries of one chunk count it once.
    # The two reads are not one snapshot: a chunk that committed in between would take
    # its count below zero.
    applying: dict[str, dict[int, str]] = {}
    for delivery in busy:
        applying.setdefault(delivery.policy, {})[delivery.chunk_pk] = delivery.chunk_state
    charts = rows_per_minute(now)
    slots = minutes(now)
    policies = []
    for name in names:
        counts, taken = sent.get(name, {}), list(applying.get(name, {}).values())
        retrying = counts.get(Chunk.State.RETRYING, 0) - taken.count(Chunk.State.RETRYING)
        enqueued = counts.get(Chunk.State.ENQUEUED, 0) - taken.count(Chunk.State.ENQUEUED)
        policies.append(PolicyLive(
            policy=name, waiting=max(enqueued, 0) + max(retrying, 0),
            retrying=max(retrying, 0), applying=len(taken), chart=charts.get(name),
        ))
    return LiveView(now=now, policies=tuple(policies), busy=busy, silent=silent,
                    broker_messages=get_broker().queue_size(), busy_within=busy_within,
                    first_minute=slots[0], last_minute=slots[-1])


def sent_chunks() -> dict[str, dict[str, int]]:
    """Chunks sent and not finished, per policy and state: one query on the state index."""
    found: dict[str, dict[str, int]] = {}
    for row in (Chunk.objects.filter(state__in=SENT).order_by()
                .values("run__policy", "state").annotate(chunks=Count("pk"))):
        found.setdefault(row["run__policy"], {})[row["state"]] = row["chunks"]
    return found


def open_deliveries(now: datetime, busy_within: timedelta
                    ) -> tuple[tuple[Delivery, ...], tuple[Delivery, ...]]:
    """The deliveries with no outcome of unfinished chunks, in one query: those begun
    within ``busy_within`` (busy), and the older ones (their worker may have died)."""
    busy, silent = [], []
    rows = (Chunk.objects.filter(state__in=Chunk.UNFINISHED).filter(HasOpenDelivery("history"))
            .order_by().values_list("pk", "chunk_id", "run_id", "run__policy", "state",
                                    "history"))
    for pk, chunk_id, run_id, policy, state, history in rows:
        # Read as the chunk page reads it: an entry edited by hand into something else
        # is left out, never an error on the overview.
        for entry in read_history(history):
            if entry.ended or entry.began_at is None:
                continue
            delivery = Delivery(
                worker=entry.worker or "unknown", policy=policy, chunk_pk=pk,
                chunk_id=chunk_id, chunk_state=state, run_id=run_id, number=entry.number,
                started_at=entry.began_at, now=now)
            (busy if delivery.age < busy_within else silent).append(delivery)
    by_start = attrgetter("started_at")
    return tuple(sorted(busy, key=by_start)), tuple(sorted(silent, key=by_start))


def minutes(now: datetime) -> list[datetime]:
    """The chart's minutes, in UTC: the 59 whole ones before ``now``'s, then its own."""
    this_minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    return [this_minute - timedelta(minutes=MINUTES - 1 - n) for n in range(MINUTES)]


def rows_per_minute(now: datetime) -> dict[str, Chart]:
    """Each policy's chart of the rows its chunks changed per minute over the last
    hour, by when they committed; no chart for a policy that changed nothing."""
    slots = minutes(now)
    rows = (Chunk.objects.filter(committed_at__gte=slots[0],
                                 committed_at__lt=slots[-1] + timedelta(minutes=1))
            .order_by()
            .annotate(minute=TruncMinute("committed_at", tzinfo=UTC))
            .values("run__policy", "minute").annotate(rows=Sum(ROWS_CHANGED)))
    per_policy: dict[str, dict[datetime, int]] = {}
    for row in rows:
        per_policy.setdefault(row["run__policy"], {})[row["minute"]] = row["rows"]
    return {policy_name: chart(policy_name, slots, changed)
            for policy_name, changed in per_policy.items() if any(changed.values())}


def chart(policy_name: str, slots: list[datetime], changed: dict[datetime, int]) -> Chart:
    """The bars of one policy's minutes, the tallest at the full height."""
    peak = max(changed.values())
    bars = []
    for n, minute in enumerate(slots):
        rows = changed.get(minute, 0)
        height = max(BARS_HEIGHT * rows / peak, LEAST_BAR) if rows else 0
        bars.append(Bar(minute=minute, rows=rows, x=n * BAR_STEP, height=round(height, 1),
                        current=n == len(slots) - 1))
    return Chart(policy=policy_name, bars=tuple(bars))
