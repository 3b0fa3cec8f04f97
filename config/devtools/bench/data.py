"""The benchmark's data: seeded once into a template, restored fresh for each contender."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, connection
from django.utils import timezone

from config.devtools.wipe import wipe_reservations
from reservations import seeding
from reservations.models import SeatHold

# The seat-hold columns, written out: the copy moves expires_at, and nothing else.
COLUMNS = "id, tenant_id, section_id, learner_ref, status, expires_at, created_at, updated_at"
HOLDS = SeatHold._meta.db_table
CREATE_TEMPLATE = (
    f'CREATE UNLOGGED TABLE bench_seathold_template AS SELECT {COLUMNS} FROM "{HOLDS}"'
)
REFILL = (
    f'INSERT INTO "{HOLDS}" ({COLUMNS}) SELECT '
    + COLUMNS.replace("expires_at", "expires_at + %(shift)s")
    + " FROM bench_seathold_template"
)
DROP_TEMPLATE = "DROP TABLE IF EXISTS bench_seathold_template"


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
}


def wipe() -> None:
    """Empty the reservation tables and drop a template left by an interrupted run."""
    wipe_reservations()
    with connection.cursor() as cursor:
        cursor.execute(DROP_TEMPLATE)


def seed_template(preset: Preset, progress: Callable[[str, int, int], None]):
    """Seed the preset's holds and keep a copy of them; return when they were seeded."""
    wipe()
    rest = preset.total - preset.expired
    seeding.seed(tenants=preset.tenants, expired=preset.expired, active=rest * 3 // 4,
                 confirmed=rest - rest * 3 // 4, attempts=0, random_seed=1,
                 progress=progress, hold_reminders=False)
    with connection.cursor() as cursor:
        cursor.execute(CREATE_TEMPLATE)
    return timezone.now()


def restore(seeded_at) -> bool:
    """Refill the holds table from the template, its expiries shifted to keep their age.

    Returns whether a checkpoint could be forced (it takes a superuser), so the WAL
    of the refill is not flushed during the next contender.
    """
    with connection.cursor() as cursor:
        cursor.execute(f'TRUNCATE "{SeatHold._meta.db_table}" CASCADE')
        cursor.execute(REFILL, {"shift": timezone.now() - seeded_at})
        cursor.execute(f'VACUUM ANALYZE "{SeatHold._meta.db_table}"')
        try:
            cursor.execute("CHECKPOINT")
        except DatabaseError:
            return False
    return True


def drop_template() -> None:
    with connection.cursor() as cursor:
        cursor.execute(DROP_TEMPLATE)
