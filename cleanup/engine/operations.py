"""Operator actions on runs and chunks, shared by the admin and the commands.

Each acts only on the rows still in a state it applies to and reports the others
as skipped, so a stale page or a second click changes nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import structlog
from django.db import transaction

from cleanup.display import SHORT_ID_LENGTH, id_range, parse_id
from cleanup.engine import halts, outcomes, transport, window
from cleanup.exceptions import (
    ActionResult,
    CleanupError,
    UnknownChunk,
    UnknownPolicy,
    UnknownRun,
    operator_reason,
)
from cleanup.models import Chunk, Halt, Run
from cleanup.policies import get_policy

log = structlog.get_logger("cleanup.operations")

# How many of the runs a short id matches a refusal names.
SHOWN_CANDIDATES = 5


def get_run(run_id) -> Run:
    """The run with this id: its full id, or the 8-hex short id the admin shows."""
    text = str(run_id).strip()
    if not text:
        raise CleanupError("run id is empty")
    parsed = parse_id(text)
    if parsed is None:
        raise CleanupError(f"no run with id {text}: give its full id or the "
                           f"{SHORT_ID_LENGTH} hex digits the admin shows")
    if isinstance(parsed, uuid.UUID):
        try:
            return Run.objects.get(pk=parsed)
        except Run.DoesNotExist:
            raise UnknownRun(text) from None
    # The ids that start with these 8 hex digits form one range of the primary key.
    matches = list(Run.objects.filter(pk__range=id_range(parsed))
                   .order_by("-created_at")[:SHOWN_CANDIDATES + 1])
    if not matches:
        raise UnknownRun(text)
    if len(matches) > 1:
        shown = ", ".join(str(run.id) for run in matches[:SHOWN_CANDIDATES])
        more = " and more" if len(matches) > SHOWN_CANDIDATES else ""
        raise CleanupError(f"short run id {parsed!r} is ambiguous: it matches {shown}{more}; "
                           "give the full id")
    return matches[0]


def latest_run() -> Run:
    run = Run.objects.order_by("-created_at").first()
    if run is None:
        raise UnknownRun("(latest): no run yet")
    return run


class AllChunks:
    """The explicit "every chunk of the run" selection (an empty list selects none)."""

    def __repr__(self) -> str:
        return "ALL_CHUNKS"


ALL_CHUNKS = AllChunks()


def chunk_pks(run: Run, chunk_ids: Iterable[int] | AllChunks, *,
              state: str | None = None) -> list[int]:
    """Translate a run's chunk ids into chunk pks; ``ALL_CHUNKS`` (in ``state``) for all.

    An empty selection is refused: a caller whose filter matched nothing must never
    act on the whole run by accident.
    """
    chunks = Chunk.objects.filter(run=run)
    if chunk_ids is ALL_CHUNKS:
        if state is not None:
            chunks = chunks.filter(state=state)
        return list(chunks.order_by("chunk_id").values_list("pk", flat=True))
    chunk_ids = sorted(set(chunk_ids or ()))
    if not chunk_ids:
        raise CleanupError(f"no chunk of run {run.id} selected; name chunk ids, or ask for "
                           "all of its chunks")
    found = dict(chunks.filter(chunk_id__in=chunk_ids).values_list("chunk_id", "pk"))
    missing = [number for number in chunk_ids if number not in found]
    if missing:
        raise UnknownChunk(run.id, missing)
    return [found[number] for number in chunk_ids]


def requeue(pks: Iterable[int], *, resend: bool = True, actor: str = "") -> ActionResult:
    """Put dead-lettered chunks back in the queue; their runs reopen.

    The deliveries that never completed are set aside, so the poison limit counts
    afresh; the counters themselves keep adding. Chunks of a cancelled run stay put.
    """
    pks = list(pks)
    with transaction.atomic():
        chunks = outcomes.requeued(pks)
        if resend:
            transport.send(chunks)
    _log("requeued", chunks, actor)
    return ActionResult(len(chunks), len(pks) - len(chunks), tuple(c.pk for c in chunks))


def discard(pks: Iterable[int], reason: str, *, actor: str = "") -> ActionResult:
    """Give up on dead-lettered chunks for a stated reason; their runs may complete."""
    reason = discard_reason(reason)
    pks = list(pks)
    with transaction.atomic():
        chunks = outcomes.discarded(pks, reason)
    _log("discarded", chunks, actor, reason=reason)
    return ActionResult(len(chunks), len(pks) - len(chunks), tuple(c.pk for c in chunks))


def discard_reason(reason: str | None) -> str:
    """The reason, stripped, by every operator's reason's rule (one line, at most
    MAX_REASON printable characters); ``CleanupError`` if it breaks it."""
    return operator_reason(reason, "a discard's",
                           missing="a reason is required to discard a chunk")


def cancel(run_ids: Iterable, *, actor: str = "") -> ActionResult:
    """Cancel running runs: their unfinished chunks become cancelled, and any later
    delivery of them is a no-op. Work already committed stays."""
    run_ids = list(run_ids)
    with transaction.atomic():
        cancelled = outcomes.cancelled(run_ids)
    for run, chunks in cancelled:
        log.info("run cancelled", run_id=str(run.id), policy=run.policy,
                 chunks_cancelled=chunks, actor=actor)
    runs = [run for run, _ in cancelled]
    return ActionResult(len(runs), len(run_ids) - len(runs), tuple(r.pk for r in runs))


def _log(event: str, chunks: list[Chunk], actor: str, **extra) -> None:
    for chunk in chunks:
        log.info(f"chunk {event}", run_id=str(chunk.run_id), chunk_id=chunk.chunk_id,
                 actor=actor, **extra)


def pause_reason(reason: str | None) -> str:
    """The reason, stripped; ``CleanupError`` if it is empty, too long or not one line
    of printable text (the console's form and the command both come through here)."""
    return operator_reason(reason, "a pause's", missing="a pause needs a reason (--reason): "
                           "it is what the console, the status and the alerts show")


def pause_policy(policy_name: str, reason: str, *, actor: str = "") -> halts.HaltChange:
    """Open a pause of the policy; a policy already paused keeps its first pause."""
    policy = get_policy(policy_name)
    reason = pause_reason(reason)
    halt = halts.begin(policy.name, Halt.PAUSED, detail=reason, actor=actor)
    if halt is None:  # paused already (the one open pause per policy)
        return halts.HaltChange(halts.open_halts(policy.name)[0], changed=False)
    log.warning("policy paused", policy=policy.name, reason=reason, actor=actor)
    return halts.HaltChange(halt, changed=True)


def resume_policy(policy_name: str, *, actor: str = "") -> halts.HaltChange:
    """End the policy's pause and its failing halt (cleanup.engine.halts), whichever
    are open, and top its window up now; a policy with neither is left as it is
    (``changed`` False, with its last pause if it had one). A policy no longer
    registered (removed by a deploy) has every open halt ended: nothing else would."""
    try:
        policy = get_policy(policy_name)
    except UnknownPolicy:
        return _end_halts_of_a_gone_policy(policy_name, actor)
    with transaction.atomic():
        ended = halts.end(policy.name, actor=actor, reasons=Halt.ENDED_BY_OPERATOR)
        if not ended:
            last = Halt.objects.filter(policy=policy.name, reason=Halt.PAUSED).first()
            if last is None:
                raise CleanupError(f"policy {policy.name!r} is not paused, nor halted for "
                                   "failing")
            return halts.HaltChange(last, changed=False)
    # Its own transaction, after the halts ended: the window refills as a chunk's end
    # would.
    planned = window.top_up_now(policy)
    for halt in ended:
        log.info("policy resumed", policy=policy.name, reason=halt.reason, actor=actor,
                 planned=planned, halted_for=str(halt.ended_at - halt.began_at))
    pause = next((halt for halt in ended if halt.reason == Halt.PAUSED), ended[0])
    return halts.HaltChange(pause, changed=True, planned=planned)


def _end_halts_of_a_gone_policy(policy_name: str, actor: str) -> halts.HaltChange:
    with transaction.atomic():
        halted = halts.end(policy_name, actor=actor)
        if not halted:
            get_policy(policy_name)  # the unknown policy's own refusal, naming the known
    for halt in halted:
        log.warning("halt of a policy no longer registered ended", policy=policy_name,
                    reason=halt.reason, actor=actor)
    pause = next((halt for halt in halted if halt.reason == Halt.PAUSED), halted[0])
    return halts.HaltChange(pause, changed=True, planned=0)
