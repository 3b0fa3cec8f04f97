"""Start a run: freeze its cutoff, record its span and send its first window of chunks,
all in one transaction, then count what was eligible; the run plans the rest as it goes
(cleanup.engine.window).

Each entry point reads top to bottom: check the request (``_request``), answer with the
run its key already names (``_existing``), or create the run (``_create``: ``_start``
plans the first window, then the count), applying it here for ``--sync``
(``_dispatch_here``), or count what it would plan (``preview_dispatch``: a dry run's
``Preview``). The one ``Policy`` looked up by ``_request`` is carried down.
What a dispatch did is its ``DispatchResult``: that result as JSON (``cleanup_dispatch
--json``, the log line) and in one sentence (``describe_dispatch``: the command, the
console after a dispatch from the admin)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from math import ceil

import structlog
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Count, Subquery, Sum
from django.db.models.functions import Coalesce

from cleanup.conf import conf
from cleanup.cutoffs import frozen_cutoff
from cleanup.display import number, utc_text
from cleanup.engine import frontier, halts, planning, sizing, transitions, transport, window
from cleanup.engine.in_process import (
    Applied,
    Progress,
    apply_in_process,
)
from cleanup.engine.steps import step
from cleanup.exceptions import BadKey, KeyReused
from cleanup.expressions import count_of
from cleanup.models import ROWS_CHANGED, Chunk, Halt, Run
from cleanup.policies import ITEMS, Policy, check_scheme, get_policy

log = structlog.get_logger("cleanup.dispatch")

__all__ = ["DispatchResult", "check_key", "describe_dispatch", "dispatch",
           "dispatch_in_process", "preview_dispatch"]


@dataclass(frozen=True)
class Request:
    """One dispatch request with every input checked, before anything is written."""

    policy: Policy
    scheme: str
    cutoff: datetime
    frozen: dict[str, datetime]  # the policy's deadlines at that cutoff
    key: str
    key_given: bool  # a key the caller named: the run that has it answers the request
    trigger: str = Run.Trigger.COMMAND
    replay_of: Run | None = None
    # What was asked as such (None: the default), held against the run a key names.
    asked_scheme: str | None = None
    asked_cutoff: datetime | None = None


WHOLE_TABLE = "whole table"


@dataclass(frozen=True)
class Preview:
    """What a dispatch would do, counted without planning or writing anything."""

    rows_by_partition: dict
    chunks: int
    # The rows of the run's first chunks, which the count assumes throughout.
    chunk_rows: int = 0
    # Whether the run's chunks grow past chunk_rows as it learns the database's pace
    # (cleanup.engine.sizing): then the count is what the first size would take.
    grows: bool = False

    @property
    def rows(self) -> int:
        return sum(self.rows_by_partition.values())

    @property
    def sizing(self) -> str:
        """What the chunk count assumes, as the dry run and the console's preview say it
        (nothing when nothing is eligible)."""
        if not self.chunks:
            return ""
        if self.grows and self.chunks > 1:
            return (f"counted at its first chunks' size ({number(self.chunk_rows)} rows): a "
                    "run's chunks grow as it learns the database's pace, so it usually takes "
                    "fewer")
        return f"{number(self.chunk_rows)} rows a chunk"


@dataclass(frozen=True)
class DispatchResult:
    """What a dispatch did: the run it created, joined or found by its key, or what a
    dry run would plan (``preview``). The run's figures are read from the run."""

    request: Request
    run: Run | None = None  # None: a dry run
    preview: Preview | None = None  # a dry run's counts per partition
    created: bool = False
    coalesced: bool = False  # the run in flight that took this request
    # The first window as this dispatch planned it (a run it created).
    first_chunks: int = 0
    first_rows: int = 0
    # A run that got no room in the policy's window: the run it waits behind.
    waiting_behind: uuid.UUID | None = None
    # --sync: what this process applied, and whether it handed the rest to the queue.
    applied: Applied | None = None
    # The policy's halts open when the dispatch (or its --sync process) ended.
    halts: tuple[Halt, ...] = ()

    @property
    def halted(self) -> str:
        """Why the policy plans nothing now, in words; empty when it is not halted."""
        return "; ".join(halts.describe(halt) for halt in self.halts)

    @property
    def dry_run(self) -> bool:
        return self.run is None

    @property
    def policy(self) -> str:
        return self.request.policy.name

    @property
    def mutation(self) -> str:
        return self.request.policy.mutation

    @property
    def scheme(self) -> str:
        return self.run.scheme if self.run else self.request.scheme

    @property
    def cutoff(self) -> datetime:
        return self.run.cutoff if self.run else self.request.cutoff

    @property
    def candidates(self) -> int:
        """Rows planned so far (a dry run's: the rows it would plan)."""
        return self.run.candidates if self.run else self.preview.rows

    @property
    def chunks(self) -> int:
        return self.run.chunks_planned if self.run else self.preview.chunks

    @property
    def planned_all(self) -> bool:
        """False while the run still plans its chunks as it goes: ``candidates`` and
        ``chunks`` count only what is planned so far."""
        return self.run.planned_all if self.run else True

    @property
    def eligible(self) -> int | None:
        """Rows eligible at the cutoff when the run was dispatched, counted once; None
        when that count failed, or for a run dispatched before they were counted."""
        return self.run.eligible_at_dispatch if self.run else self.preview.rows

    def fields(self) -> dict:
        """The result, JSON-safe: what ``cleanup_dispatch --json`` prints."""
        run, applied = self.run, self.applied
        return {
            "run_id": str(run.id) if run else None,
            "created": self.created,
            "dry_run": self.dry_run,
            "policy": self.policy,
            "scheme": self.scheme,
            "cutoff": self.cutoff.isoformat(timespec="microseconds"),
            "candidates": self.candidates,
            "eligible": self.eligible,
            "first_chunks": self.first_chunks,
            "first_rows": self.first_rows,
            "waiting_behind": str(self.waiting_behind) if self.waiting_behind else None,
            "halted": self.halted or None,
            "planned_all": self.planned_all,
            "state": run.state if run else None,
            # --sync: what this process applied, and whether the queue has the rest.
            "sync": None if applied is None else {
                "chunks_applied": applied.chunks,
                "rows_changed": applied.rows,
                "run_rows_changed": applied.run_rows,
                "rows_locked": applied.rows_locked,
                "handed_to_queue": applied.handed_over,
                "failed_chunk": applied.failed_chunk,
                "cause": applied.cause or None,
                "note": applied.note or None,
            },
            "summary": describe_dispatch(self),
        }



def dispatch(
    policy_name: str,
    *,
    scheme: str | None = None,
    cutoff: datetime | None = None,
    key: str | None = None,
    trigger: str = Run.Trigger.COMMAND,
    replay_of: Run | None = None,
    coalesce_within: timedelta | None = None,
) -> DispatchResult:
    """Create the run for ``key`` (or return the one that has it) and send its chunks to
    the queue.

    A key names one request: reusing it for the same policy returns its run; for another
    policy, or with a scheme or cutoff that contradicts the run, it is refused. Every
    input is checked before anything is written. With ``coalesce_within``, a running
    run of the policy started that recently is returned instead of a new one (checked
    under the policy's planning lock, so concurrent requests cannot both miss it).
    """
    with step("dispatch", policy_name):  # no lock waited for past its bound
        request = _request(policy_name, scheme, cutoff, key, trigger, replay_of)
        if existing := _run_of_key(request):
            return _existing(existing, request)
        result = _create(request, uuid.uuid4(), coalesce_within=coalesce_within)
        # None: another dispatcher with the same key committed first.
        return result or _existing(Run.objects.get(dispatch_key=request.key), request)


def dispatch_in_process(
    policy_name: str,
    *,
    scheme: str | None = None,
    cutoff: datetime | None = None,
    key: str | None = None,
    trigger: str = Run.Trigger.COMMAND,
    progress: Progress | None = None,
) -> DispatchResult:
    """``dispatch``, then apply the run's chunks in this process, taking their messages
    from the queue as a worker would (``--sync``: cleanup.engine.in_process); what it
    does not finish is the queue's. ``progress(chunks, rows, eligible)`` is called after
    each chunk applied."""
    request = _request(policy_name, scheme, cutoff, key, trigger, None)
    return _dispatch_here(request, progress)


def preview_dispatch(
    policy_name: str,
    *,
    scheme: str | None = None,
    cutoff: datetime | None = None,
    replay_of: Run | None = None,
) -> DispatchResult:
    """What ``dispatch`` would do, counted per partition; nothing is planned or written."""
    request = _request(policy_name, scheme, cutoff, None, Run.Trigger.COMMAND, replay_of)
    policy = request.policy
    counted = preview(policy, request.cutoff, request.scheme,
                      sizing.chunk_size(policy, request.scheme))
    return DispatchResult(request, preview=counted)


def preview(policy: Policy, cutoff: datetime, scheme: str, size: int) -> Preview:
    """Count eligible rows per partition (tenant) and the chunks planning would make.

    Both planners fill every chunk but the last (per partition, for ranges), so the
    chunk count follows from the row counts at the first chunks' ``size``. A run
    learning its pace grows its chunks from there (up to the scheme's ceiling), so it
    usually takes fewer; for ranges a range wider than the run's span cap is cut
    further when planned.
    """
    column = policy.partition_column
    eligible = policy.eligible_rows(policy.freeze(cutoff))
    if column is None:  # ranges over the whole table
        rows = eligible.count()
        rows_by_partition = {WHOLE_TABLE: rows} if rows else {}
    else:
        rows_by_partition = dict(
            eligible.values_list(column).annotate(rows=Count("pk")).order_by(column))
    if scheme == ITEMS:
        chunks = ceil(sum(rows_by_partition.values()) / size)
    else:
        chunks = sum(ceil(n / size) for n in rows_by_partition.values())
    ceiling = conf.MAX_ITEMS_PER_CHUNK if scheme == ITEMS else conf.MAX_RANGE_ROWS_PER_CHUNK
    grows = bool(conf.CHUNK_BUDGET_MS) and size < ceiling
    return Preview(rows_by_partition, chunks, chunk_rows=size, grows=grows)


def _request(policy_name: str, scheme: str | None, cutoff: datetime | None,
             key: str | None, trigger: str, replay_of: Run | None) -> Request:
    """Check every input of a dispatch (a ``CleanupError`` names what is wrong) and
    freeze its cutoff."""
    policy = get_policy(policy_name)
    checked_scheme = check_scheme(scheme, policy)
    key = check_key(key)
    asked_cutoff = None if cutoff is None else frozen_cutoff(
        cutoff, not_before=replay_of.cutoff if replay_of else None)
    frozen_at = asked_cutoff or frozen_cutoff(None)
    return Request(policy, checked_scheme, frozen_at, policy.freeze(frozen_at),
                   key or f"command:{uuid.uuid4()}", key is not None, trigger, replay_of,
                   scheme, asked_cutoff)


def _run_of_key(request: Request) -> Run | None:
    if not request.key_given:
        return None
    return Run.objects.filter(dispatch_key=request.key).first()


def _dispatch_here(request: Request, progress: Progress | None) -> DispatchResult:
    """Dispatch, then apply the run's chunks in this process; for a key that names a
    run already, apply what is left of that one."""
    with step("dispatch", request.policy.name):
        run = _run_of_key(request)
    if run is None:
        run_id = uuid.uuid4()
        # Taken from before the run commits: its first window's messages are this process's.
        with transport.applying_here(run_id) as taken:
            with step("dispatch", request.policy.name):
                result = _create(request, run_id, coalesce_within=None)
            if result is not None:
                return _with_applied(result, apply_in_process(result.run, taken, progress))
        run = Run.objects.get(dispatch_key=request.key)  # another dispatch of the key was first
    result = _existing(run, request)  # refuses a request the key's run contradicts
    if run.state == Run.State.RUNNING:
        with transport.applying_here(run.pk) as taken:
            applied = apply_in_process(run, taken, progress)
        result = _with_applied(_existing(run, request), applied)
    return result


def _create(request: Request, run_id, *,
            coalesce_within: timedelta | None) -> DispatchResult | None:
    """Create the run and send its first window (or join a run in flight), then count
    what was eligible; None if another dispatcher with the same key committed first."""
    try:
        run, created = _start(request, run_id, coalesce_within=coalesce_within)
    except IntegrityError:
        return None
    if not created:
        return _result(run, request, created=False, coalesced=True)
    _count_eligible(request, run)
    result = _result(run, request, created=True, first=True)
    log.info("dispatched", dispatch_key=request.key, trigger=str(request.trigger),
             window=run.window, chunk_size=run.chunk_size, max_span=run.max_span,
             **_logged(result))
    return result


def _start(request: Request, run_id, *,
           coalesce_within: timedelta | None) -> tuple[Run, bool]:
    """Create the run and plan its first window in one transaction, or find the run in
    flight a slot joins; return the run and whether it was created."""
    policy, scheme = request.policy, request.scheme
    with transaction.atomic():
        window.lock_policy(policy.name)
        joined = coalesce_within is not None and window.run_to_join(policy, coalesce_within)
        if joined:
            return joined, False
        size = sizing.chunk_size(policy, scheme)
        max_span = sizing.max_span(policy, scheme, size)
        span = planning.span(policy, request.frozen, scheme)
        run = transitions.create_run(
            id=run_id,
            policy=policy.name,
            dispatch_key=request.key,
            cutoff=request.cutoff,
            parameters={name: value.isoformat() for name, value in request.frozen.items()
                        if name != "cutoff"},
            scheme=scheme,
            trigger=request.trigger,
            replay_of=request.replay_of,
            chunk_size=size,
            next_chunk_size=size,
            max_span=max_span,
            span_start=span.start,
            span_end=span.end,
            frontier=frontier.dump(span.frontier),
            planned_all=span.frontier is None,
            window=window.size(policy),
        )
        # The first window; the run waits for room if the policy's other runs
        # hold the whole window.
        window.top_up(policy, strict=True)
        run.refresh_from_db()
        if run.planned_all and run.chunks_planned == 0:
            run = transitions.settle_run(run.pk)  # nothing to do: completed
        return run, True


# How long counting the rows eligible at dispatch may take before it is given up.
ELIGIBLE_COUNT_TIMEOUT_MS = 10_000


def _count_eligible(request: Request, run: Run) -> int | None:
    """Count the rows eligible at dispatch, once the first window is on its way (so the
    count, a scan of the backlog, never delays the first chunk nor holds the planning
    lock), and record it on the run.

    Read in one statement, so in one snapshot: the rows still eligible plus those the
    run's chunks changed meanwhile, each chunk's rows and its ledger row being gone (or
    there) together.
    """
    policy = request.policy
    eligible = policy.eligible_rows(request.frozen)
    # Grouped by the run: one row, or none (hence the Coalesce).
    changed = Chunk.objects.filter(run_id=run.pk).order_by().values("run_id").annotate(
        n=Sum(ROWS_CHANGED)).values("n")
    try:
        with transaction.atomic(using=eligible.db), connections[eligible.db].cursor() as cursor:
            # A figure for the operator: never worth a minute-long scan of a huge backlog.
            cursor.execute("SELECT set_config('statement_timeout', %s, true)",
                           [f"{ELIGIBLE_COUNT_TIMEOUT_MS}ms"])
            rows = Run.objects.using(eligible.db).filter(pk=run.pk).annotate(
                rows=count_of(eligible) + Coalesce(Subquery(changed), 0),
            ).values_list("rows", flat=True).get()
    except DatabaseError as exc:
        # The run is dispatched already: a count that fails (a statement timeout on a
        # huge backlog) leaves the figure unknown, not the dispatch failed.
        log.warning("counting the rows eligible failed", run_id=str(run.pk),
                    policy=policy.name, error=str(exc).strip())
        return None
    if transitions.record_eligible(run.pk, rows):
        run.eligible_at_dispatch = rows
    return run.eligible_at_dispatch


def _result(run: Run, request: Request, *, created: bool, coalesced: bool = False,
            first: bool = False) -> DispatchResult:
    """What a dispatch returns about ``run``, as the ledger has it now."""
    waiting = (run.state == Run.State.RUNNING and run.chunks_planned == 0
               and not run.planned_all)
    return DispatchResult(
        request, run, created=created, coalesced=coalesced,
        first_chunks=run.chunks_planned if first else 0,
        first_rows=run.candidates if first else 0,
        waiting_behind=window.waiting_behind(run) if waiting else None,
        halts=tuple(halts.open_halts(run.policy)),
    )


def _with_applied(result: DispatchResult, applied: Applied) -> DispatchResult:
    """The result once this process has applied what it could of the run."""
    result.run.refresh_from_db()
    # Its own chunks may have halted the policy (failing) while it applied them.
    result = replace(result, applied=applied, halts=tuple(halts.open_halts(result.run.policy)))
    log.info("applied in process", chunks_applied=applied.chunks, rows_changed=applied.rows,
             handed_to_queue=applied.handed_over, note=applied.note, **_logged(result))
    return result


def _logged(result: DispatchResult) -> dict:
    """What each log line of a dispatch says of its run."""
    fields = result.fields()
    return {name: fields[name] for name in (
        "run_id", "policy", "scheme", "cutoff", "eligible", "first_chunks", "first_rows",
        "waiting_behind", "planned_all", "summary")} | {
        "parameters": result.run.parameters, "state": str(result.run.state)}


def check_key(key: str | None) -> str | None:
    """Refuse a dispatch key that is empty or longer than the ledger keeps."""
    if key is None:
        return None
    limit = Run._meta.get_field("dispatch_key").max_length
    if not key.strip():
        raise BadKey("dispatch key is empty (leave it out for a fresh run)")
    if len(key) > limit:
        raise BadKey(f"dispatch key is {len(key)} characters long; the limit is {limit}")
    return key


def _existing(run: Run, request: Request) -> DispatchResult:
    """Return the run a key already names, if the request is the same one."""
    contradictions = [
        f"{what} {asked} (the run has {has})"
        for what, asked, has in (
            ("policy", request.policy.name, run.policy),
            ("scheme", request.asked_scheme, run.scheme),
            ("cutoff", request.asked_cutoff and request.asked_cutoff.isoformat(),
             run.cutoff.isoformat()))
        if asked is not None and asked != has
    ]
    if contradictions:
        raise KeyReused(
            f"dispatch key {run.dispatch_key!r} belongs to run {run.id}; this request asks "
            f"for {', '.join(contradictions)}: use another key"
        )
    run.refresh_from_db()
    return _result(run, request, created=False)


def describe_dispatch(result: DispatchResult) -> str:
    """Say in one sentence what a dispatch did and what it knows, as the command prints
    it and the console shows it: "Dispatched run ... of expire-holds (items, cutoff
    ...): 200,000 rows eligible; first 4 chunks planned (1,664 rows), the rest as they
    finish."
    """
    cutoff = f"{utc_text(result.cutoff)} UTC"
    if result.dry_run:
        size = f", {result.preview.sizing}" if result.preview and result.preview.sizing else ""
        return (f"Dry run: {result.policy} would plan {_count(result.chunks, 'chunk')} "
                f"({result.scheme}) for {_count(result.candidates, 'row')} eligible at "
                f"{cutoff}{size}.")
    run = result.run
    what = f"run {run.id} of {result.policy} ({result.scheme}, cutoff {cutoff})"
    if result.coalesced:
        head = f"Joined {what}, in flight since {utc_text(run.created_at)} UTC"
        when = " at its dispatch"
    elif result.created:
        head, when = f"Dispatched {what}", ""
    else:
        head, when = f"Already dispatched: {what}", " at dispatch"
    parts = []
    if result.eligible is not None:
        parts.append(f"{_count(result.eligible, 'row')} eligible{when}")
    parts.append(_planned(result))
    if result.applied is not None:
        parts.append(_applied(result, result.applied))
    if result.halts and run.state != Run.State.RUNNING:
        parts.append(f"the policy is now {result.halted}{_until(result)}")
    return f"{head}: {'; '.join(parts)}."


def _until(result: DispatchResult) -> str:
    """Until when a halted policy plans nothing: an operator's pause and a failing halt
    end only by a resume, the database's pressure by itself."""
    if any(halt.reason in Halt.ENDED_BY_OPERATOR for halt in result.halts):
        return (f"; nothing more is planned until it is resumed (cleanup_resume --policy "
                f"{result.policy})")
    return "; nothing more is planned until that clears (a worker looks again by itself)"


def _planned(result: DispatchResult) -> str:
    if result.halts and result.run.state == Run.State.RUNNING:
        return f"the policy is {result.halted}{_until(result)}"
    if result.waiting_behind is not None:
        return f"waiting for room in the window behind run {result.waiting_behind}"
    if result.chunks == 0:
        return "nothing to do" if result.planned_all else "waiting for room in the window"
    if result.created:
        chunks, rows = result.first_chunks, result.first_rows
    else:
        chunks, rows = result.chunks, result.candidates
    planned = f"{_count(chunks, 'chunk')} planned ({_count(rows, 'row')})"
    if result.planned_all and (not result.created or result.first_chunks == result.chunks):
        return planned
    if result.created:
        return f"first {planned}, the rest as they finish"
    return f"{planned} so far, the rest as they finish"


def _applied(result: DispatchResult, applied: Applied) -> str:
    verb = "updated" if result.mutation == "update" else "deleted"
    of_eligible = ("" if result.eligible is None
                   else f" of {_count(result.eligible, 'row')}")
    if applied.rows == applied.run_rows:
        rows = (f"{number(applied.rows)}{of_eligible}" if of_eligible
                else _count(applied.rows, "row"))
        text = f"applied here: {rows} {verb} in {_count(applied.chunks, 'chunk')}"
    else:  # other processes applied some of the run too
        text = (f"applied here: {_count(applied.rows, 'row')} {verb} in "
                f"{_count(applied.chunks, 'chunk')} (the run's chunks: "
                f"{number(applied.run_rows)}{of_eligible or ' rows'} {verb} in all)")
    if applied.rows_locked:
        text += (f", {number(applied.rows_locked)} skipped: locked by another transaction "
                 "(a later run takes them)")
    return f"{text}; {applied.note}" if applied.note else text


def _count(n: int, word: str) -> str:
    return f"{number(n)} {word}" + ("" if n == 1 else "s")
