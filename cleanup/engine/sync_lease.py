"""The lease of a run applied by its dispatching process (``--sync``).

While the lease is live the workers leave the run to its process; once it lapses (the
process died, froze or lost the database; an expiry further off than
``CLEANUP_SYNC_LEASE_SECONDS`` from now, set by hand, counts as lapsed) whoever notices
first hands the run to the queue (``cleanup.engine.window.take_over_abandoned``). The
process renews it in every chunk's transaction, so a chunk is applied only while the run
is still its own, and a takeover waits for a chunk in progress to commit: no chunk is
applied or counted by both. The lease is taken before the run's row commits, so no
session ever sees an in-process run that nobody holds while its process lives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import structlog

from cleanup.conf import conf
from cleanup.engine import leases

log = structlog.get_logger("cleanup.sync_lease")


def name(run_id) -> str:
    """The lease's name for the run."""
    return f"run:{run_id}"


def acquire(run_id) -> bool:
    """Take the run's lease for this process unless another live one holds it."""
    return leases.take(name(run_id), leases.this_process(), conf.SYNC_LEASE_SECONDS)


def renew(run_id) -> bool:
    """Extend this process's lease on the run; False if the run was taken over. In a
    transaction, a takeover then waits until that transaction ends."""
    return leases.renew(name(run_id), leases.this_process(), conf.SYNC_LEASE_SECONDS)


def release(run_id) -> None:
    """Give the run's lease up, if this process still holds it."""
    leases.release(name(run_id), leases.this_process())


@contextmanager
def holding(run_id) -> Iterator[None]:
    """Hold a new run's lease for the block (its id is fresh: nobody else can hold it)."""
    if not acquire(run_id):
        raise RuntimeError(f"the lease of run {run_id} is held by another process")
    try:
        yield
    finally:
        try:
            release(run_id)
        except Exception as exc:  # noqa: BLE001 - unreleased, it lapses on its own
            log.warning("releasing a run's lease failed; it lapses on its own",
                        run_id=str(run_id), error=str(exc))


def alive(run_ids: Iterable) -> set:
    """The runs among ``run_ids`` whose lease a process holds unexpired."""
    by_name = {name(run_id): run_id for run_id in run_ids}
    return {by_name[held] for held in leases.live(by_name, conf.SYNC_LEASE_SECONDS)}


def lapsed_in_transaction(run_id) -> bool:
    """Whether the run's lease lapsed, ended in the caller's transaction: its owner,
    renewing meanwhile, finds it gone once this commits (and a renewal that came first
    keeps it: False)."""
    return leases.end_lapsed(name(run_id), conf.SYNC_LEASE_SECONDS)
