"""Start a run: freeze its cutoff, record its span and send its first window of chunks,
all in one transaction, then count what was eligible; the run plans the rest as it goes
(cleanup.engine.window). ``describe_dispatch`` (cleanup.engine.summary) says what a dispatch
did, for the command and the console alike."""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import structlog
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Count, Q, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django_q.conf import Conf

from cleanup.cutoffs import frozen_cutoff
from cleanup.engine import frontier, halts, planning, sizing, sync_lease, transitions, window
from cleanup.engine.in_process import (
    Applied,
    Progress,
    apply_in_process,
    rows_changed_by,
    waiting_behind,
)
from cleanup.engine.preview import Preview, preview
from cleanup.engine.summary import describe_dispatch
from cleanup.exceptions import BadKey, KeyReused, UnknownPolicy
from cleanup.models import ROWS_CHANGED, Chunk, Run
from cleanup.policies import Policy, check_scheme, get_policy

log = structlog.get_logger("cleanup.dispatch")

__all__ = ["DispatchResult", "check_key", "describe_dispatch", "dispatch",
           "dispatch_in_process", "preview_dispatch"]


@dataclass(frozen=True)
class DispatchResult:
    run: Run | None
    created: bool
    policy: str
    scheme: str
    cutoff: datetime
    candidates: int
    chunks: int
    dry_run: bool = False
    coalesced: bool = False  # the run in flight that took this request
    # False while the run still plans its chunks as it goes: candidates and chunks
    # count only what is planned so far.
    planned_all: bool = True
    # A dry run's counts per partition, as the admin's preview shows them.
    preview: Preview | None = None
    # Rows eligible at the cutoff when the run was dispatched, counted once; None for a
    # run dispatched before they were counted.
    eligible: int | None = None
    # The first window as this dispatch planned it (a run it created).
    first_chunks: int = 0
    first_rows: int = 0
    # A run that got no room in the policy's window: the run it waits behind.
    waiting_behind: uuid.UUID | None = None
    # --sync: what this process applied, and whether it handed the rest to the queue.
    applied: Applied | None = None
    # Why the policy plans nothing now, in words (a pause), when it is halted.
    halted: str = ""
    mutation: str = "delete"


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
    under the policy's planning lock, so concurrent requests cannot both miss it), once
    any run whose ``--sync`` process died has been taken over.
    """
    return _dispatch(policy_name, scheme=scheme, cutoff=cutoff, key=key, trigger=trigger,
                     replay_of=replay_of, coalesce_within=coalesce_within)


def dispatch_in_process(
    policy_name: str,
    *,
    scheme: str | None = None,
    cutoff: datetime | None = None,
    key: str | None = None,
    trigger: str = Run.Trigger.COMMAND,
    progress: Progress | None = None,
) -> DispatchResult:
    """``dispatch``, then apply the run's chunks in this process instead of the queue
    (``--sync``), under the run's lease (cleanup.engine.sync_lease); the run is handed
    to the queue if this process cannot finish it. ``progress(chunks, rows, eligible)``
    is called after each chunk applied."""
    return _dispatch(policy_name, scheme=scheme, cutoff=cutoff, key=key, trigger=trigger,
                     sync=True, progress=progress)


def preview_dispatch(
    policy_name: str,
    *,
    scheme: str | None = None,
    cutoff: datetime | None = None,
    replay_of: Run | None = None,
) -> DispatchResult:
    """What ``dispatch`` would do, counted per partition; nothing is planned or written."""
    return _dispatch(policy_name, scheme=scheme, cutoff=cutoff, replay_of=replay_of,
                     dry_run=True)


def _dispatch(
    policy_name: str,
    *,
    scheme: str | None = None,
    cutoff: datetime | None = None,
    key: str | None = None,
    trigger: str = Run.Trigger.COMMAND,
    replay_of: Run | None = None,
    sync: bool = False,
    dry_run: bool = False,
    coalesce_within: timedelta | None = None,
    progress: Progress | None = None,
) -> DispatchResult:
    policy = get_policy(policy_name)
    requested_scheme, scheme = scheme, check_scheme(scheme, policy)
    key = check_key(key)
    requested_cutoff = None if cutoff is None else frozen_cutoff(
        cutoff, not_before=replay_of.cutoff if replay_of else None
    )
    cutoff = requested_cutoff or frozen_cutoff(None)
    frozen = policy.freeze(cutoff)
    if dry_run:
        counted = preview(policy, cutoff, scheme, sizing.chunk_size(policy, scheme))
        return DispatchResult(
            None, False, policy.name, scheme, cutoff, counted.rows, counted.chunks, dry_run=True,
            preview=counted, eligible=counted.rows, mutation=policy.mutation,
        )

    request = (policy.name, requested_scheme, requested_cutoff)
    if key is not None and (existing := Run.objects.filter(dispatch_key=key).first()):
        return _existing(existing, request, sync=sync, progress=progress)
    key = key or f"command:{uuid.uuid4()}"
    # django-q2's sync mode would run each task inside this transaction, before the
    # run commits; apply the chunks after it instead.
    sync = sync or Conf.SYNC
    run_id = uuid.uuid4()
    # The lease is taken before the run commits, so no session ever sees the run in
    # process with nobody holding it.
    with sync_lease.holding(run_id) if sync else nullcontext():
        try:
            result = _start(policy, run_id, key, cutoff, frozen, scheme, trigger, replay_of,
                            sync=sync, coalesce_within=coalesce_within)
        except IntegrityError:
            result = None  # another dispatcher with the same key committed first
        if result is not None and result.created:
            result = replace(result, eligible=_count_eligible(policy, frozen, result.run))
            _log_dispatched(result, key, trigger)
            if sync:
                result = _with_applied(result, apply_in_process(result.run, progress))
    if result is None:
        return _existing(Run.objects.get(dispatch_key=key), request, sync=sync,
                         progress=progress)
    return result


def _start(policy: Policy, run_id, key, cutoff, frozen, scheme, trigger, replay_of, *,
           sync: bool, coalesce_within: timedelta | None) -> DispatchResult:
    """Create the run and plan its first window in one transaction (or join a run in
    flight)."""
    with transaction.atomic():
        window.lock_policy(policy.name)
        if coalesce_within is not None:
            # Never join a run that nobody applies: a dead --sync run is the queue's first.
            window.take_over_abandoned(policy.name)
            if in_flight := _in_flight(policy, coalesce_within):
                return _result(in_flight, created=False, coalesced=True)
        size = sizing.chunk_size(policy, scheme)
        span = planning.span(policy, frozen, scheme)
        run = transitions.create_run(
            id=run_id,
            policy=policy.name,
            dispatch_key=key,
            cutoff=cutoff,
            parameters={name: value.isoformat() for name, value in frozen.items()
                        if name != "cutoff"},
            scheme=scheme,
            trigger=trigger,
            replay_of=replay_of,
            chunk_size=size,
            next_chunk_size=size,
            max_span=sizing.max_span(policy, scheme, size),
            span_start=span.start,
            span_end=span.end,
            frontier=frontier.dump(span.frontier),
            planned_all=span.frontier is None,
            window=window.size(policy),
            in_process=sync,
        )
        # The first window; the run waits for room if the policy's other runs
        # hold the whole window.
        window.top_up(policy.name, strict=True)
        run.refresh_from_db()
        if run.planned_all and run.chunks_planned == 0:
            run = transitions.settle_run(run.pk)  # nothing to do: completed
        return _result(run, created=True, first=True)


# How long counting the rows eligible at dispatch may take before it is given up.
ELIGIBLE_COUNT_TIMEOUT_MS = 10_000


def _count_eligible(policy: Policy, frozen: dict[str, datetime], run: Run) -> int | None:
    """Count the rows eligible at dispatch, once the first window is on its way (so the
    count, a scan of the backlog, never delays the first chunk nor holds the planning
    lock), and record it on the run.

    Read in one statement, so in one snapshot: the rows still eligible plus those the
    run's chunks changed meanwhile, each chunk's rows and its ledger row being gone (or
    there) together.
    """
    # Grouped by a constant: one row (or none, hence the Coalesce) per subquery.
    eligible = (policy.eligible_rows(frozen).order_by().annotate(one=Value(1)).values("one")
                .annotate(n=Count("pk")).values("n"))
    changed = Chunk.objects.filter(run_id=run.pk).order_by().values("run_id").annotate(
        n=Sum(ROWS_CHANGED)).values("n")
    try:
        with transaction.atomic(using=eligible.db), connections[eligible.db].cursor() as cursor:
            # A figure for the operator: never worth a minute-long scan of a huge backlog.
            cursor.execute("SELECT set_config('statement_timeout', %s, true)",
                           [f"{ELIGIBLE_COUNT_TIMEOUT_MS}ms"])
            rows = Run.objects.using(eligible.db).filter(pk=run.pk).annotate(
                rows=Coalesce(Subquery(eligible), 0) + Coalesce(Subquery(changed), 0),
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


def _result(run: Run, *, created: bool, coalesced: bool = False, first: bool = False,
            applied: Applied | None = None) -> DispatchResult:
    """What a dispatch returns about ``run``, as the ledger has it now."""
    waiting = (run.state == Run.State.RUNNING and run.chunks_planned == 0
               and not run.planned_all)
    try:
        mutation = get_policy(run.policy).mutation
    except UnknownPolicy:
        mutation = "delete"
    return DispatchResult(
        run, created, run.policy, run.scheme, run.cutoff, run.candidates, run.chunks_planned,
        coalesced=coalesced, planned_all=run.planned_all,
        eligible=run.eligible_at_dispatch,
        first_chunks=run.chunks_planned if first else 0,
        first_rows=run.candidates if first else 0,
        waiting_behind=waiting_behind(run) if waiting else None,
        applied=applied, mutation=mutation,
        halted="; ".join(halts.describe(halt) for halt in halts.open_halts(run.policy))
        if run.state == Run.State.RUNNING else "",
    )


def _with_applied(result: DispatchResult, applied: Applied) -> DispatchResult:
    """The result once this process has applied what it could of the run."""
    run = result.run
    run.refresh_from_db()
    result = replace(result, run=run, candidates=run.candidates, chunks=run.chunks_planned,
                     planned_all=run.planned_all, applied=applied)
    log.info("applied in process", run_id=str(run.id), policy=run.policy,
             chunks_applied=applied.chunks, rows_changed=applied.rows,
             eligible=run.eligible_at_dispatch, handed_to_queue=applied.handed_over,
             note=applied.note, state=str(run.state), summary=describe_dispatch(result))
    return result


def _log_dispatched(result: DispatchResult, key: str, trigger: str) -> None:
    run = result.run
    log.info(
        "dispatched",
        run_id=str(run.id),
        policy=run.policy,
        scheme=run.scheme,
        cutoff=run.cutoff.isoformat(),
        parameters=run.parameters,
        dispatch_key=key,
        trigger=str(trigger),
        eligible=result.eligible,
        first_chunks=result.first_chunks,
        first_rows=result.first_rows,
        waiting_behind=str(result.waiting_behind) if result.waiting_behind else None,
        planned_all=run.planned_all,
        window=run.window,
        chunk_size=run.chunk_size,
        max_span=run.max_span,
        in_process=run.in_process,
        summary=describe_dispatch(result),
    )


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


def _in_flight(policy: Policy, within: timedelta) -> Run | None:
    """A running run of the policy that a new slot joins: one started within
    ``within``, or one still planning (its chunks keep coming, whatever its age)."""
    return (
        Run.objects.filter(policy=policy.name, state=Run.State.RUNNING)
        .filter(Q(created_at__gte=timezone.now() - within)
                | Q(planned_all=False, planning_error=""))
        .order_by("-created_at")
        .first()
    )


def _existing(run: Run, request: tuple, *, sync: bool,
              progress: Progress | None = None) -> DispatchResult:
    """Return the run a key already names, if the request is the same one."""
    policy, scheme, cutoff = request
    contradictions = [
        f"{what} {asked} (the run has {has})"
        for what, asked, has in (("policy", policy, run.policy), ("scheme", scheme, run.scheme),
                                 ("cutoff", cutoff and cutoff.isoformat(),
                                  run.cutoff.isoformat()))
        if asked is not None and asked != has
    ]
    if contradictions:
        raise KeyReused(
            f"dispatch key {run.dispatch_key!r} belongs to run {run.id}; this request asks "
            f"for {', '.join(contradictions)}: use another key"
        )
    applied = _finish_here(run, progress) if sync else None
    run.refresh_from_db()
    return _result(run, created=False, applied=applied)


def _finish_here(run: Run, progress: Progress | None) -> Applied | None:
    """Apply what an interrupted --sync run of this key (or the queue) left unfinished,
    unless another live process applies it; None if the run has finished."""
    if not sync_lease.acquire(run.pk):
        return Applied(0, rows_changed_by(run), note="another process is applying this run "
                       "(it holds the run's lease); nothing was applied here")
    try:
        if not transitions.claim_in_process(run.pk):
            return None
        return apply_in_process(run, progress)
    finally:
        sync_lease.release(run.pk)
