import importlib.util
import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from config.devtools.bench import report as reporting
from config.devtools.bench.data import PRESETS
from config.devtools.bench.runner import run_bench
from config.devtools.wipe import guard as guard_wipe
from reservations.management.wiping import add_wipe_arguments, exit_on_sigterm


class Command(BaseCommand):
    help = (
        "Benchmark the cleanup pipeline (range and items schemes, real qcluster) against "
        "one set-based DELETE, each scheme's limit (two connections running its statements "
        "with nothing else to do), hand-written DELETE ... USING unnest, and one task per "
        "row, on the same seeded holds, with renewals racing each; with each contender's "
        "WAL. Deletes every tenant, section, hold and reminder attempt first."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--preset", choices=sorted(PRESETS), default="small",
                            help="small: 100,000 expired among 200,000 holds (CI); "
                                 "large: 1,000,000 among 2,000,000 (docs/performance.md); "
                                 "xlarge: 5,000,000 among 10,000,000.")
        parser.add_argument("--output-dir", default="artifacts/bench",
                            help="Where bench-<preset>.json and .png go (marked "
                                 "-without-reminders, -cpu-load-N, -range-only for "
                                 "such runs).")
        parser.add_argument("--timeout", type=float, default=1800,
                            help="Seconds to wait for any one contender.")
        parser.add_argument("--check-baseline", action="store_true",
                            help="Fail if any ratio recorded for the preset (range first "
                            "and third run to one DELETE, items runs to the hand-written "
                            "loop) is below half of the recorded one.")
        parser.add_argument("--record-baseline", action="store_true",
                            help="Record this run's ratios as the preset's baseline "
                            "(kept apart for --without-reminders).")
        parser.add_argument("--without-reminders", action="store_true",
                            help="Seed holds without their renewal reminders, to measure the "
                                 "engine alone (the product deletes a hold's reminder with "
                                 "it).")
        parser.add_argument("--only", choices=["range"],
                            help="range: only the one DELETE, the three range runs and their "
                                 "two-connection limit (for the larger presets, where the "
                                 "items runs take long).")
        parser.add_argument("--cpu-load", type=int, default=0, metavar="N",
                            help="Run N CPU-bound processes beside every contender, to "
                                 "measure the pipeline on a busy host (default 0).")
        parser.add_argument("--judge", nargs="+", metavar="REPORT",
                            help="Run nothing: judge the performance targets from saved "
                                 "bench-*.json reports, each on its own and pairs of them "
                                 "(with and without reminders, quiet and --cpu-load, large "
                                 "and a larger preset).")
        add_wipe_arguments(parser,
                           json_help="Print the report as one JSON line instead of the table.")

    def handle(self, *args, preset, output_dir, timeout, interactive, **options):
        if options["judge"]:
            self.stdout.write(reporting.judged(_saved_reports(options["judge"])))
            return
        if timeout <= 0:
            raise CommandError("--timeout must be positive")
        if not 0 <= options["cpu_load"] <= 64:
            raise CommandError("--cpu-load must be between 0 and 64")
        if importlib.util.find_spec("matplotlib") is None:
            # Checked first: the chart is drawn at the end of a run of minutes.
            raise CommandError("cleanup_bench draws its chart with matplotlib: install the "
                               "test extra (pip install -e '.[site,test]'); nothing changed.")
        guard_wipe("The benchmark", interactive)
        say = (lambda line: None) if options["json"] else self.stdout.write
        exit_on_sigterm("cleanup_bench")
        report = run_bench(PRESETS[preset], timeout=timeout, say=say,
                           reminders=not options["without_reminders"],
                           cpu_load=options["cpu_load"], only=options["only"])
        output = Path(output_dir)
        # A run without reminders or beside a load has files of its own: it does not
        # overwrite the product's.
        stem = f"bench-{reporting.baseline_key(report)}"
        reporting.write_json(report, output / f"{stem}.json")
        reporting.draw(report, output / f"{stem}.png")
        guard_ok, guard = reporting.check_baseline(report)
        if options["json"]:
            self.stdout.write(json.dumps(report | {"guard": guard}, default=str))
        else:
            self.stdout.write(reporting.table(report))
            self.stdout.write(f"\n{guard}\nWrote {output}/{stem}.json and .png")
        if options["record_baseline"]:
            reporting.record_baseline(report)
        if not report["checks_passed"]:
            raise CommandError("a correctness check failed (see the report)")
        if options["check_baseline"] and not guard_ok:
            raise CommandError(guard)


def _saved_reports(paths: list[str]) -> dict[str, dict]:
    """The bench reports at ``paths``, by path as given (two runs' reports can share a
    file name); a clear error for one that is not, or one given twice."""
    reports, seen = {}, set()
    for path in paths:
        resolved = Path(path).resolve()
        if resolved in seen:
            raise CommandError(f"{path} is given twice; nothing was judged")
        seen.add(resolved)
        try:
            report = json.loads(Path(path).read_text())
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise CommandError(f"{path} is not JSON: {exc}") from exc
        if not isinstance(report, dict) or not {"preset", "results", "ratios"} <= report.keys():
            raise CommandError(f"{path} is not a cleanup_bench report (no preset, results "
                               "and ratios)")
        reports[path] = report
    return reports
