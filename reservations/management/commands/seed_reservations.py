import time

from django.core.management.base import BaseCommand

from cleanup.host import MAX_INTEGER, WholeNumber
from reservations import seeding

# Bounds that keep a typo from seeding for hours (or overflowing a key).
MAX_TENANTS = 100_000
MAX_ROWS = 100_000_000


class Command(BaseCommand):
    help = ("Create demo tenants, sections and seat holds in bulk; each held hold gets its "
            "pending renewal reminder (and, if asked, reminder attempts).")

    def add_arguments(self, parser) -> None:
        rows = WholeNumber(0, MAX_ROWS)
        parser.add_argument("--tenants", type=WholeNumber(1, MAX_TENANTS), required=True,
                            help="New tenants (institutions), each with four sections.")
        parser.add_argument("--expired", type=rows, required=True,
                            help="Held holds that expired within the past day.")
        parser.add_argument("--active", type=rows, required=True,
                            help="Held holds expiring in the future.")
        parser.add_argument("--confirmed", type=rows, default=0,
                            help="Confirmed holds, which cleanup never touches.")
        parser.add_argument("--reminder-attempts", "--reminders", dest="attempts", type=rows,
                            default=0,
                            help="Reminder attempts (sent reminders' records), half of them "
                            "past retention. --reminders is the old spelling.")
        parser.add_argument("--seed", type=WholeNumber(0, MAX_INTEGER), default=0,
                            help="Random seed.")

    def handle(self, *args, tenants, expired, active, confirmed, attempts, seed: int,
               **options):
        started = time.monotonic()

        def progress(what: str, done: int, total: int) -> None:
            # Progress is news, not an error: plain, on stdout with the result.
            if options["verbosity"] > 0 and total >= 100_000:
                self.stdout.write(f"  {what}: {done:,}/{total:,}")

        counts = seeding.seed(tenants=tenants, expired=expired, active=active,
                              confirmed=confirmed, attempts=attempts, random_seed=seed,
                              progress=progress)
        self.stdout.write(
            f"Seeded {counts['tenants']:,} tenants, {counts['sections']:,} sections, "
            f"{counts['expired']:,} expired, {counts['active']:,} active, "
            f"{counts['confirmed']:,} confirmed holds, {counts['reminders']:,} pending "
            f"reminders, {counts['attempts']:,} reminder attempts "
            f"in {time.monotonic() - started:.1f}s."
        )
