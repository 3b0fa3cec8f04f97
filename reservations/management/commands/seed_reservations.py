import time

from django.core.management.base import BaseCommand, CommandError

from reservations import seeding


class Command(BaseCommand):
    help = ("Create demo tenants, sections and seat holds in bulk; each held hold gets its "
            "pending renewal reminder (and, if asked, reminder attempts).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenants", type=int, required=True,
                            help="New tenants (institutions), each with four sections.")
        parser.add_argument("--expired", type=int, required=True,
                            help="Held holds that expired within the past day.")
        parser.add_argument("--active", type=int, required=True,
                            help="Held holds expiring in the future.")
        parser.add_argument("--confirmed", type=int, default=0,
                            help="Confirmed holds, which cleanup never touches.")
        parser.add_argument("--reminder-attempts", "--reminders", dest="attempts", type=int,
                            default=0,
                            help="Reminder attempts (sent reminders' records), half of them "
                            "past retention. --reminders is the old spelling.")
        parser.add_argument("--seed", type=int, default=0, help="Random seed.")

    def handle(self, *args, tenants, expired, active, confirmed, attempts, seed: int,
               **options):
        if tenants < 1:
            raise CommandError("--tenants must be at least 1")
        if min(expired, active, confirmed, attempts) < 0:
            raise CommandError("counts cannot be negative")
        started = time.monotonic()

        def progress(what: str, done: int, total: int) -> None:
            if options["verbosity"] > 0 and total >= 100_000:
                self.stderr.write(f"  {what}: {done:,}/{total:,}")

        counts = seeding.seed(tenants=tenants, expired=expired, active=active,
                              confirmed=confirmed, attempts=attempts, random_seed=seed,
                              progress=progress)
        self.stdout.write(
            f"Seeded {counts['tenants']} tenants, {counts['sections']} sections, "
            f"{counts['expired']} expired, {counts['active']} active, "
            f"{counts['confirmed']} confirmed holds, {counts['reminders']} pending reminders, "
            f"{counts['attempts']} reminder attempts "
            f"in {time.monotonic() - started:.1f}s."
        )
