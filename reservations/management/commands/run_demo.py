import os
from datetime import timedelta
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from cleanup.host import Duration, WholeNumber, count, progress, quiet_logs, write_report
from reservations.demo import MAIL_DIR, run_demo
from reservations.management.wiping import add_wipe_arguments, confirm_wipe


class Command(BaseCommand):
    help = (
        "Run one real cleanup cycle through a qcluster subprocess and print a report. "
        "Deletes every tenant, section, hold, reminder, reminder attempt and waitlist "
        "first."
    )

    def add_arguments(self, parser) -> None:
        # A demo is minutes of work on a laptop: bounds far above that, below hours.
        parser.add_argument("--expired", type=WholeNumber(2, 1_000_000), default=3000,
                            help="Expired holds to seed (default 3000).")
        parser.add_argument("--active", type=WholeNumber(0, 1_000_000), default=500,
                            help="Unexpired holds to seed, which must survive (default 500).")
        parser.add_argument("--racers", type=WholeNumber(1, 100_000), default=10,
                            help="Candidates renewed, and as many confirmed, mid-run.")
        parser.add_argument("--timeout", type=Duration(timedelta(hours=6), bare="s"),
                            default=timedelta(seconds=180),
                            help="How long to wait for the runs to finish: seconds, or "
                            "a duration such as 10m (default 180, at most 6h).")
        parser.add_argument("--mail-dir", type=Path, default=MAIL_DIR,
                            help="Where the cluster writes the reminders it sends, one file "
                            "per connection; the demo first removes the mail files a "
                            "previous demo left there (default: .data/demo-mail in the "
                            "checkout).")
        add_wipe_arguments(parser)

    def handle(self, *args, expired, active, racers, timeout, mail_dir, interactive,
               **options):
        if expired < 2 * racers:
            raise CommandError("--expired must be at least twice --racers")
        if isinstance(timeout, timedelta):  # call_command(timeout=30) passes a number
            timeout = timeout.total_seconds()
        confirm_wipe("The demo", interactive)
        say = progress(self, options)
        try:
            # Its steps and its report, not the engine's INFO lines between them (-v 2).
            with quiet_logs(options["verbosity"]):
                report = run_demo(expired=expired, active=active, racers=racers,
                                  timeout=timeout, say=say, mail=mail_dir.resolve())
        except TimeoutError as exc:
            raise CommandError(str(exc)) from exc
        write_report(self, report, options, table=self.table, failed="a demo check failed")

    def table(self, report) -> str:
        header = f"{'policy':<26}{'candidates':>11}{'chunks':>8}{'changed':>9}" \
                 f"{'skipped':>9}{'no-ops':>8}{'deliveries':>12}  state"
        lines = ["", header, "-" * len(header)]
        for run in report.runs:
            lines.append(
                f"{run['policy']:<26}{run['candidates']:>11,}{run['chunks_planned']:>8,}"
                f"{run['rows_changed']:>9,}{run['items_skipped']:>9,}"
                f"{run['noop_deliveries']:>8,}{run['deliveries']:>12,}  "
                f"{run['state']} ({run['mutation']})"
            )
        racing = report.racing
        lines += ["", f"Racing learners: {racing['renewed']} renewed, {racing['confirmed']} "
                      f"confirmed; {racing['survivors']} of them survived."]
        reminders = report.reminders
        states = ", ".join(f"{n} {state}" for state, n in sorted(reminders["by_state"].items()))
        lines += [f"Reminders now: {states or 'none'}; {count(reminders['mails'], 'mail')} "
                  f"written by the cluster's file backend to {_shown(reminders['folder'])}/ "
                  "(kept until the next demo)."]
        if reminders["sample"]:
            sample = reminders["sample"]
            lines.append(f"  e.g. to {sample['To']}: \"{sample['Subject']}\" "
                         f"(Message-ID {sample['Message-ID']})")
        waitlist = report.waitlist
        lines.append(
            f"Waitlists: {waitlist['freed']} seats freed in full sections "
            f"({waitlist['by_source']['cleanup']} by cleanup, "
            f"{waitlist['by_source']['learner']} released by their learner); "
            f"{waitlist['offered']} offered to the first learner waiting, "
            f"{count(waitlist['offer_mails'], 'offer mail')} among the mails written.")
        if waitlist["sample"]:
            sample = waitlist["sample"]
            lines.append(f"  e.g. to {sample['To']}: \"{sample['Subject']}\" "
                         f"(Message-ID {sample['Message-ID']})")
        lines.append("")
        lines += [f"  [{'ok' if ok else 'FAILED'}] {name}" for name, ok in report.checks.items()]
        return "\n".join(lines)


def _shown(folder: str) -> str:
    """The folder as the operator typed the command: relative to where they stand when
    it is below it."""
    relative = os.path.relpath(folder)
    return folder if relative.startswith("..") else relative
