
from django.core.management.base import BaseCommand, CommandError

from cleanup.management.reports import progress, write_report
from config.devtools.soak.runner import run_soak
from config.devtools.wipe import guard
from reservations.management.wiping import add_wipe_arguments, exit_on_sigterm


class Command(BaseCommand):
    help = (
        "Soak the cleanup pipeline: two qcluster subprocesses, live learner traffic, "
        "reminders falling due, marked and sent, seats freed in full sections offered to "
        "their waitlists by both clusters' publishers, injected faults, then checks. "
        "Deletes every tenant, section (with its waitlist), hold, reminder and reminder "
        "attempt first. Uses the configured broker (Q_BROKER=redis for Redis)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--duration", type=float, default=60, help="Seconds of faults.")
        parser.add_argument("--min-faults", type=int, default=2,
                            help="Minimum hits of each fault kind for the soak to pass; "
                                 "traffic and faults go on past --duration, at most as "
                                 "long again, until each kind hit that often.")
        parser.add_argument("--seed", type=int, default=1,
                            help="Random seed of the traffic and the faults (default 1).")
        add_wipe_arguments(parser)

    def handle(self, *args, duration, min_faults, seed, interactive, **options):
        if duration < 10:
            raise CommandError("--duration must be at least 10 seconds")
        guard("The soak", interactive)
        say = progress(self, options)
        exit_on_sigterm("cleanup_soak")
        report = run_soak(duration=duration, min_faults=min_faults, seed=seed, say=say)
        write_report(self, report, options, table=self.table, failed="a soak check failed")

    def table(self, report) -> str:
        soaked = report.figures["soaked_seconds"]
        lines = ["", f"Soak with the {report.broker} broker for {soaked:.0f} s "
                 f"(--duration {report.duration:.0f})", ""]
        lines += ["Faults that hit work in flight:"]
        lines += [f"  {kind:<32}{n:>6}" for kind, n in report.faults.items()]
        lines += ["", f"Runs by state:   {report.runs}", f"Chunks by state: {report.chunks}",
                  f"Learner traffic: {report.traffic}", "", "Figures:"]
        lines += [f"  {name:<44}{value}" for name, value in report.figures.items()
                  if name != "final_runs"]
        lines += ["", "Checks:"]
        lines += [f"  [{'ok' if ok else 'FAILED'}] {name}" for name, ok in report.checks.items()]
        if report.errors:
            lines += ["", f"Injection errors ({len(report.errors)}):", *report.errors[:5]]
        return "\n".join(lines)
