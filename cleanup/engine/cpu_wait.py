"""How long this thread has waited for a CPU: what a busy client adds to a chunk's time.

A chunk's transaction time is the database's work and the worker's. On a host whose
CPUs are busy with something else, the worker waits to be scheduled (to read the
DELETE's result, to write the outcome) while its locks are held; the database was no
slower. Sizing learns the database's pace without that wait, so a busy client does not
shrink the chunks, which would add per-chunk work for the same busy CPUs to do.

Linux reports a thread's time runnable but not running (``run_delay``) in
``/proc/thread-self/schedstat``; elsewhere, or without that file, there is no reading
and sizing uses the whole transaction time, as it always did.
"""

from __future__ import annotations

SCHEDSTAT = "/proc/thread-self/schedstat"


def waited() -> float | None:
    """Seconds this thread has spent ready to run but waiting for a CPU, since it
    started; None where the kernel does not say."""
    try:
        with open(SCHEDSTAT, encoding="ascii") as stat:
            on_cpu, waiting = (int(field) for field in stat.read().split()[:2])
    except (OSError, ValueError):
        return None
    # A kernel that keeps no scheduler statistics reads "0 0 0", even for this thread,
    # which is running.
    return waiting / 1e9 if on_cpu else None


def since(start: float | None) -> float | None:
    """Seconds waited for a CPU since ``start`` (a ``waited()`` reading), or None."""
    now = waited()
    if start is None or now is None:
        return None
    return max(now - start, 0.0)
