"""What each CLEANUP_* setting must be, with the hint a system check gives when it is
not (the checks themselves are in cleanup.checks)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core import checks
from django.utils.module_loading import import_string

from cleanup.conf import DEFAULTS, PREFIX, conf

# PostgreSQL's integer settings (lock_timeout, in milliseconds) stop at INT_MAX.
PG_INT_MAX = 2_147_483_647
# A retention of more than a century is a unit mistake, not a policy.
MAX_RETENTION_DAYS = 36_500
# django-q2's scheduler passes every 30 s, so a slot may fire up to that late.
SCHEDULER_PASS_SECONDS = 30
# Upper bounds of the durations: past them a value is a unit mistake (1e308), which
# would keep a reading, a grace or a backoff for ever.
DAY = 86_400
MAX_PRESSURE_CHECK_SECONDS = 300
MAX_BACKOFF = 60
MAX_CHUNK_BUDGET_MS = 60_000
# Attempts of an outbox event: past a thousand a handler is not failing, it is broken.
MAX_EVENT_ATTEMPTS = 1_000
# An event's payload: past a megabyte it is a document, not ids. Past a nesting of 100,
# Python's own JSON encoder nears its recursion limit.
MAX_EVENT_PAYLOAD_BYTES = 1_048_576
MAX_EVENT_PAYLOAD_DEPTH = 100


def whole(value: Any) -> bool:
    """Whether the value is an int; True and False are not counts."""
    return isinstance(value, int) and not isinstance(value, bool)


def number(value: Any) -> bool:
    """Whether the value is a finite int or float (not a bool)."""
    return (whole(value) or isinstance(value, float)) and math.isfinite(value)


def network_list(value: Any) -> bool:
    """Whether the value has a shape METRICS_ALLOWED_NETWORKS may take."""
    return isinstance(value, str | list | tuple | set | frozenset)


def indicator_paths(value: Any) -> bool:
    """Whether the value lists dotted paths that import as callables."""
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        return False
    try:
        return all(callable(import_string(path)) for path in value)
    except Exception:  # noqa: BLE001 - a host's module may raise anything on import
        return False


@dataclass(frozen=True)
class Rule:
    """What one CLEANUP_* setting must be, judged by its own value."""

    name: str
    id: str
    requirement: str
    hint: str
    valid: Callable[[Any], bool]

    def errors(self) -> list[checks.Error]:
        value = getattr(conf, self.name)
        if self.valid(value):
            return []
        return [
            checks.Error(
                f"{PREFIX}_{self.name} is {value!r}; it must be {self.requirement}.",
                hint=f"{self.hint} The default is {DEFAULTS[self.name]!r}.",
                id=self.id,
            )
        ]


# The chunk-sizing settings, each on its own, before their bounds are compared (the
# floor above a ceiling is cleanup.E006, in cleanup.checks).
SIZING_RULES = (
    Rule("CHUNK_BUDGET_MS", "cleanup.E036",
         f"a number of milliseconds from 0 (off) to {MAX_CHUNK_BUDGET_MS}",
         "Set the transaction time a learned chunk should take, or 0 to always use the "
         "policy's chunk_size; a chunk's transaction holds learners' rows that long.",
         lambda value: number(value) and 0 <= value <= MAX_CHUNK_BUDGET_MS),
    *(
        Rule(name, id_, "a whole number of rows, at least 1",
             f"Set the {bound} rows a learned {kind} may hold.",
             lambda value: whole(value) and value >= 1)
        for name, id_, bound, kind in (
            ("MIN_ROWS_PER_CHUNK", "cleanup.E037", "fewest", "chunk size"),
            ("MAX_ITEMS_PER_CHUNK", "cleanup.E038", "most", "items chunk"),
            ("MAX_RANGE_ROWS_PER_CHUNK", "cleanup.E039", "most", "range chunk"),
        )
    ),
)
WINDOW_RULE = Rule(
    "WINDOW", "cleanup.E011", "a whole number of chunks, at least 1",
    "With no room in the window no run would ever plan a chunk. Set it above the worker "
    "count, so a worker finishing a chunk finds the next one queued.",
    lambda value: whole(value) and value >= 1,
)
SETTING_RULES = (
    Rule("MAX_UNFINISHED_DELIVERIES", "cleanup.E013", "a whole number of deliveries, at least 1",
         "Set how many deliveries of a chunk may start without completing before it is "
         "dead-lettered; at 0 every chunk would be dead-lettered on its first delivery.",
         lambda value: whole(value) and value >= 1),
    Rule("TRANSIENT_RETRIES", "cleanup.E014", "a whole number of retries, 0 or more",
         "Set how often one delivery retries a deadlock, lock timeout, serialization failure "
         "or dropped connection before the broker redelivers it; 0 retries none.",
         lambda value: whole(value) and value >= 0),
    Rule("TRANSIENT_BACKOFF", "cleanup.E015", f"a number of seconds from 0 to {MAX_BACKOFF}",
         "Set the base of the jittered exponential backoff between in-task retries, in "
         "seconds (an int or a float).",
         lambda value: number(value) and 0 <= value <= MAX_BACKOFF),
    Rule("LOCK_TIMEOUT_MS", "cleanup.E016",
         f"a whole number of milliseconds from 1 to {PG_INT_MAX}",
         "Set how long a chunk's DELETE may wait for a row lock before it gives up and is "
         "retried; PostgreSQL reads 0 as no timeout, which lets a chunk hang.",
         lambda value: whole(value) and 1 <= value <= PG_INT_MAX),
    Rule("ROW_LOCK_WAIT_MS", "cleanup.E030",
         f"a whole number of milliseconds from 1 to {PG_INT_MAX}",
         "Set how long a chunk waits for learners' rows another transaction keeps locked "
         "before it goes on without them (at most CLEANUP_LOCK_TIMEOUT_MS is waited); "
         "PostgreSQL reads 0 as waiting for ever.",
         lambda value: whole(value) and 1 <= value <= PG_INT_MAX),
    Rule("FAILING_CHUNKS", "cleanup.E031", "a whole number of chunks from 2 to 10000",
         "Set how many of a policy's last chunks (across its runs) are weighed to halt a "
         "failing policy: more than half of them dead-lettered halts it until an operator "
         "resumes it.",
         lambda value: whole(value) and 2 <= value <= 10_000),
    *(
        Rule(name, id_, f"a whole number of milliseconds from 1 to {PG_INT_MAX}",
             f"Set how long {what}; PostgreSQL reads 0 as no limit, which lets a frozen "
             "process hold learners' rows for good.",
             lambda value: whole(value) and 1 <= value <= PG_INT_MAX)
        for name, id_, what in (
            ("STATEMENT_TIMEOUT_MS", "cleanup.E027",
             "one statement of a chunk's transaction may run"),
            ("IDLE_IN_TRANSACTION_TIMEOUT_MS", "cleanup.E040",
             "a chunk's transaction may sit idle before the server ends its session"),
        )
    ),
    Rule("SYNC_CLAIM_SECONDS", "cleanup.E028", "a number of seconds from 1 to 86400",
         "Set how long the queue holds a --sync process's messages for it; past it the "
         "workers take them. Too short lets workers apply chunks the process was about to "
         "(harmless: its own delivery is then a no-op); too long leaves a dead process's "
         "chunks waiting.",
         lambda value: number(value) and 1 <= value <= 86_400),
    Rule("SCHEDULE_GRACE_SECONDS", "cleanup.E017",
         f"a number of seconds above {SCHEDULER_PASS_SECONDS}, at most {DAY}",
         "Set how late a schedule slot may fire before it counts as missed. django-q2's "
         f"scheduler passes every {SCHEDULER_PASS_SECONDS} s, so a healthy slot fires up to "
         "that late; a shorter grace reports missed schedules that are not.",
         lambda value: number(value) and SCHEDULER_PASS_SECONDS < value <= DAY),
    Rule("HEARTBEAT_STALE_SECONDS", "cleanup.E018",
         f"a number of seconds above {60 + SCHEDULER_PASS_SECONDS}, at most {DAY}",
         "Set how long a cluster may go without a heartbeat before it is reported as not "
         "taking work. Heartbeats run once a minute and may fire up to "
         f"{SCHEDULER_PASS_SECONDS} s late; a shorter limit makes /health answer 503 for a "
         "healthy cluster.",
         lambda value: number(value) and 60 + SCHEDULER_PASS_SECONDS < value <= DAY),
    *(
        Rule(name, id_, f"a whole number of days from 1 to {MAX_RETENTION_DAYS}",
             f"Set how many days {what} are kept before the engine purges them.",
             lambda value: whole(value) and 1 <= value <= MAX_RETENTION_DAYS)
        for name, id_, what in (
            ("LEDGER_RETENTION_DAYS", "cleanup.E019", "finished chunks, slots and runs"),
            ("TASK_RESULT_RETENTION_DAYS", "cleanup.E020", "django-q2's saved task results"),
            ("EVENT_RETENTION_DAYS", "cleanup.E035",
             "outbox events delivered or discarded"),
        )
    ),
    Rule("MAX_REPLICA_LAG", "cleanup.E023", f"a number of seconds above 0, at most {DAY}",
         "Set how far behind a streaming standby may replay before the engine halts "
         "its policies; at 0 any lag at all would halt them.",
         lambda value: number(value) and 0 < value <= DAY),
    Rule("MAX_LOCK_WAIT_MS", "cleanup.E024",
         f"a whole number of milliseconds from 1 to {PG_INT_MAX}",
         "Set how long another session may wait on a chunk's row lock before the policy's "
         "next chunks shrink.",
         lambda value: whole(value) and 1 <= value <= PG_INT_MAX),
    Rule("PRESSURE_CHECK_SECONDS", "cleanup.E025",
         f"a number of seconds from 0 to {MAX_PRESSURE_CHECK_SECONDS}",
         "Set how long a pressure reading is reused before the indicators are read again; "
         "a reading kept longer would miss a halt raised meanwhile.",
         lambda value: number(value) and 0 <= value <= MAX_PRESSURE_CHECK_SECONDS),
    Rule("PRESSURE_INDICATORS", "cleanup.E026",
         "a list of dotted paths of callables that can be imported",
         "List the host's own indicators, e.g. ['myproject.pressure.batch_window']; each "
         "takes (policy, connection) and returns a cleanup.engine.pressure.Signal.",
         lambda value: indicator_paths(value)),
    Rule("NODE_NAME", "cleanup.E029", "a string of at most 255 characters, without "
         "surrounding whitespace",
         "Name this host's clusters as the overview and /health should show them, e.g. "
         "'worker-2', or '' for the machine's host name.",
         lambda value: isinstance(value, str) and value == value.strip() and len(value) <= 255),
    Rule("METRICS_TOKEN", "cleanup.E021", "a string without surrounding whitespace",
         "Set the bearer token Prometheus sends in its Authorization header, or '' for none. "
         "HTTP drops the whitespace around a header's value, so such a token never matches.",
         lambda value: isinstance(value, str) and value == value.strip()),
    Rule("METRICS_ALLOWED_NETWORKS", "cleanup.E022",
         "a list of networks, or one string of networks separated by commas",
         "Set the CIDR networks allowed to scrape /metrics, e.g. ['10.0.0.0/8'], or [] for "
         "none. Until then no network may scrape (a token still works).",
         network_list),
    Rule("EVENT_MAX_ATTEMPTS", "cleanup.E032",
         f"a whole number of attempts from 1 to {MAX_EVENT_ATTEMPTS}",
         "Set how many failed handler calls an outbox event may have before it is "
         "dead-lettered; its ordering key waits behind it until then.",
         lambda value: whole(value) and 1 <= value <= MAX_EVENT_ATTEMPTS),
    *(
        Rule(name, id_, f"a number of seconds above 0, at most {DAY}",
             f"Set {what}; at 0 a failing handler would be called again at once, in a loop.",
             lambda value: number(value) and 0 < value <= DAY)
        for name, id_, what in (
            ("EVENT_BACKOFF_SECONDS", "cleanup.E033",
             "the wait before an outbox event's second attempt (doubled after each failure)"),
            ("EVENT_BACKOFF_MAX_SECONDS", "cleanup.E034",
             "the longest wait between two attempts of an outbox event"),
        )
    ),
    Rule("EVENT_PAYLOAD_MAX_BYTES", "cleanup.E041",
         f"a whole number of bytes from 2 to {MAX_EVENT_PAYLOAD_BYTES}",
         "Set the largest JSON payload emit() stores; an event carries ids, and its handler "
         "reads the rest. emit() refuses a larger payload with BadEvent.",
         lambda value: whole(value) and 2 <= value <= MAX_EVENT_PAYLOAD_BYTES),
    Rule("EVENT_PAYLOAD_MAX_DEPTH", "cleanup.E042",
         f"a whole number of levels from 1 to {MAX_EVENT_PAYLOAD_DEPTH}",
         "Set the deepest nesting of lists and objects emit() stores in a payload ({} is 1 "
         "deep); emit() refuses a deeper payload with BadEvent.",
         lambda value: whole(value) and 1 <= value <= MAX_EVENT_PAYLOAD_DEPTH),
)

# Every setting's one rule: check_window judges WINDOW_RULE, check_settings the others.
RULES = (*SETTING_RULES, *SIZING_RULES, WINDOW_RULE)
