"""The benchmark's data: seeded once into a template, restored fresh for each contender."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, connection
from django.utils import timezone

from config.devtools.wipe import wipe_reservations
from reservations import seeding
from reservations.models import Reminder, SeatHold

# The tables a run deletes from, each copied to a template once and refilled from it
# before every contender, its times moved by how long ago it was seeded (and nothing
# else): a hold's reminder goes with the hold, through the product's trigger.
TABLES = {SeatHold: ("expires_at",), Reminder: ("due_at",)}


def _template(model) -> str:
    return f"bench_{model._meta.db_table}_template"


def _columns(model, shifted=()) -> str:
    names = [field.column for field in model._meta.concrete_fields]
    return ", ".join(f"{name} + %(shift)s" if name in shifted else name for name in names)


@dataclass(frozen=True)
class Preset:
    name: str
    expired: int
    total: int
    tenants: int
    # Rows deleted by the one-task-per-row contender; its rate is extrapolated.
    per_row_sample: int
    # Seconds of renewals measured with nothing cleaning, for the idle p99.
    idle_seconds: float


PRESETS = {
    # Big enough that qcluster polling and process start-up are a small share.
    "small": Preset("small", expired=100_000, total=200_000, tenants=4, per_row_sample=300,
                    idle_seconds=3),
    # The figures in docs/performance.md.
    "large": Preset("large", expired=1_000_000, total=2_000_000, tenants=8,
                    per_row_sample=2_000, idle_seconds=10),
    # How the figures hold as the backlog grows (neither in CI: about 20 minutes and
    # an hour on 2 cores).
    "larger": Preset("larger", expired=1_500_000, total=3_000_000, tenants=8,
                     per_row_sample=2_000, idle_seconds=10),
    "xlarge": Preset("xlarge", expired=5_000_000, total=10_000_000, tenants=16,
                     per_row_sample=2_000, idle_seconds=10),
}


def wipe() -> None:
    """Empty the reservation tables and drop templates left by an interrupted run."""
    wipe_reservations()
    drop_template()


def seed_template(preset: Preset, progress: Callable[[str, int, int], None], *,
                  reminders: bool = True):
    """Seed the preset's holds (each held one with its reminder, as the product makes
    them, unless ``reminders`` is False) and keep a copy; return the time their ages
    count from.

    That is the seeding's start, not its end: every expiry is relative to the seeding
    transaction's ``now()``, and a seeding of 10 million holds takes longer than an
    active hold's window (counted from its end, each restore would bring active holds
    back already expired).
    """
    wipe()
    started = timezone.now()  # just before the seeding's transaction, which sets now()
    rest = preset.total - preset.expired
    seeding.seed(tenants=preset.tenants, expired=preset.expired, active=rest * 3 // 4,
                 confirmed=rest - rest * 3 // 4, attempts=0, random_seed=1,
                 progress=progress, hold_reminders=reminders)
    with connection.cursor() as cursor:
        for model in TABLES:
            cursor.execute(f'CREATE UNLOGGED TABLE "{_template(model)}" AS '
                           f'SELECT {_columns(model)} FROM "{model._meta.db_table}"')
    return started


def restore(seeded_at) -> bool:
    """Refill the holds table from the template, its expiries shifted to keep their age.

    Returns whether a checkpoint could be forced (it takes a superuser), so the WAL
    of the refill is not flushed during the next contender.
    """
    shift = timezone.now() - seeded_at
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE " + ", ".join(
            f'"{model._meta.db_table}"' for model in TABLES) + " CASCADE")
        for model, shifted in TABLES.items():
            table = model._meta.db_table
            cursor.execute(f'INSERT INTO "{table}" ({_columns(model)}) '
                           f'SELECT {_columns(model, shifted)} FROM "{_template(model)}"',
                           {"shift": shift})
            cursor.execute(f'VACUUM ANALYZE "{table}"')
        try:
            cursor.execute("CHECKPOINT")
        except DatabaseError:
            return False
    return True


def drop_template() -> None:
    with connection.cursor() as cursor:
        for model in TABLES:
            cursor.execute(f'DROP TABLE IF EXISTS "{_template(model)}"')
