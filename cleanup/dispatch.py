"""Start a run: freeze its cutoff, record its span and send its first window of chunks,
all in one transaction; the run plans the rest as it goes (cleanup.window)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone
from django_q.conf import Conf

from cleanup import planning, sizing, transitions, window
from cleanup.counters import ROWS_CHANGED
from cleanup.cutoffs import frozen_cutoff
from cleanup.exceptions import BadKey, KeyReused
from cleanup.models import Chunk, Run
from cleanup.policies import Policy, check_scheme, get_policy
from cleanup.preview import Preview, preview

log = structlog.get_logger("cleanup.dispatch")

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


def dispatch(
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
    progress: Callable[[int, int], None] | None = None,
) -> DispatchResult:
    """Create the run for ``key`` (or return the one that has it) and send its chunks.

    A key names one request: reusing it for the same policy returns its run; for another
    policy, or with a scheme or cutoff that contradicts the run, it is refused. Every
    input is checked before anything is written. ``sync`` applies the chunks in this
    process instead of the queue. With ``coalesce_within``, a running run of the policy
    started that recently is returned instead of a new one (checked under the policy's
    planning lock, so concurrent requests cannot both miss it). With ``sync``,
    ``progress(chunks, rows)`` is called after each chunk applied.
    """
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
            preview=counted,
        )

    request = (policy.name, requested_scheme, requested_cutoff)
    if key is not None and (existing := Run.objects.filter(dispatch_key=key).first()):
        return _existing(existing, request, sync=sync, progress=progress)
    key = key or f"command:{uuid.uuid4()}"
    # django-q2's sync mode would run each task inside this transaction, before the
    # run commits; apply the chunks after it instead.
    sync = sync or Conf.SYNC
    try:
        with transaction.atomic():
            window.lock_policy(policy.name)
            if coalesce_within is not None and (in_flight := _in_flight(policy,
                                                                        coalesce_within)):
                return DispatchResult(in_flight, False, policy.name, in_flight.scheme,
                                      in_flight.cutoff, in_flight.candidates,
                                      in_flight.chunks_planned, coalesced=True,
                                      planned_all=in_flight.planned_all)
            size = sizing.chunk_size(policy, scheme)
            span = planning.span(policy, frozen, scheme)
            run = Run.objects.create(
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
                frontier=span.frontier,
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
    except IntegrityError:
        # Another dispatcher with the same key committed first.
        return _existing(Run.objects.get(dispatch_key=key), request, sync=sync,
                         progress=progress)
    log.info(
        "dispatched",
        run_id=str(run.id),
        policy=policy.name,
        scheme=scheme,
        cutoff=cutoff.isoformat(),
        parameters=run.parameters,
        dispatch_key=key,
        trigger=str(trigger),
        candidates=run.candidates,
        chunks=run.chunks_planned,
        planned_all=run.planned_all,
        window=run.window,
        chunk_size=run.chunk_size,
        max_span=run.max_span,
    )
    if sync:
        apply_in_process(run, progress)
        run.refresh_from_db()
    return DispatchResult(
        run, True, policy.name, scheme, cutoff, run.candidates, run.chunks_planned,
        planned_all=run.planned_all,
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


def apply_in_process(run: Run, progress: Callable[[int, int], None] | None = None) -> None:
    """Apply a run's chunks here, one after another, without the queue, until it has
    none left unfinished (each commit plans the next)."""
    from cleanup.worker import apply_chunk

    applied = 0
    while chunks := list(run.chunks.filter(state__in=Chunk.UNFINISHED).order_by("chunk_id")):
        for chunk in chunks:
            apply_chunk(chunk.message)
            transitions.acknowledge(Q(pk=chunk.pk))
            applied += 1
            if progress is not None:
                progress(applied, _rows_changed(run))
    run.refresh_from_db()
    if run.state == Run.State.RUNNING and not run.planned_all:
        # The policy's other runs hold the window: hand the rest of this one to the
        # queue, so the chunks planned for it later are sent, not left waiting here.
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(in_process=False)
            window.top_up(run.policy)
        log.info("run handed to the queue", run_id=str(run.id), policy=run.policy)


def _rows_changed(run: Run) -> int:
    return Chunk.objects.filter(run=run).aggregate(n=Sum(ROWS_CHANGED))["n"] or 0


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
              progress: Callable[[int, int], None] | None = None) -> DispatchResult:
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
    if sync:
        # Finish what an interrupted --sync run of this key left unapplied.
        apply_in_process(run, progress)
        run.refresh_from_db()
    return DispatchResult(
        run, False, run.policy, run.scheme, run.cutoff, run.candidates, run.chunks_planned,
        planned_all=run.planned_all,
    )
