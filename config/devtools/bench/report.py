"""The benchmark's table, JSON and chart, and the regression guard on its ratios."""

from __future__ import annotations

import json
from pathlib import Path

from config.devtools.bench import targets
from config.devtools.bench.efficiency import PARTS

BASELINE = Path(__file__).with_name("baseline.json")
# The headline: each pipeline run against its scheme's two-connection limit.
HEADLINE = {"range_to_limit": "range first run", "range_third_run_to_limit": "third run",
            "items_to_limit": "items first run", "items_second_run_to_limit": "second run"}
SHORT_LABELS = {"single_delete": "One\nDELETE", "pipeline_range_first": "Range\nfirst run",
                "pipeline_range_second": "Range\nsecond run", "pipeline_range": "Range\nthird run",
                "pipeline_items_first": "Items\nfirst run",
                "pipeline_items": "Items\nsecond run", "handwritten_unnest": "Hand-written\nunnest",
                "one_task_per_row": "Task per row\n(extrapolated)",
                "two_connections_range": "Range\nlimit\n(2 conn.)",
                "two_connections_unnest": "Items\nlimit\n(2 conn.)"}
COLOURS = {"single_delete": "#555555", "handwritten_unnest": "#999999",
           "two_connections_range": "#1f3b57", "two_connections_unnest": "#1f3b57",
           "one_task_per_row": "#d08030", "pipeline_range_first": "#9cc3e0",
           "pipeline_items_first": "#9cc3e0", "pipeline_range_second": "#6aa8d8"}


def table(report: dict) -> str:
    preset, idle = report["preset"], report["idle_renewals"]
    lines = [
        f"{preset['expired']:,} expired among {preset['total']:,} holds"
        f"{' with their reminders' if report.get('reminders', True) else ' (no reminders)'}"
        f"{_load(report)}; "
        f"{report['machine']['cpus']} CPUs, PostgreSQL {report['machine']['postgresql']}, "
        f"{report['machine']['broker']} broker, chunk budget "
        f"{report['machine']['chunk_budget_ms']} ms",
        *_headline(report),
        "",
        f"{'contender':<34}{'rows':>10}{'wall s':>9}{'rows/s':>10}{'x DELETE':>9}"
        f"{'x limit':>8}{'size':>14}{'chunk p99':>10}{'max ms':>9}{'1st chunk s':>12}{'RSS MB':>8}"
        f"{'wkr MB':>8}  "
        f"{'renewal p50/p99 ms':>34}",
        f"{'':<141}{'untouched':>15}{'being cleaned':>20}",
    ]
    for row in report["results"]:
        wall = row["extrapolated_seconds"] if row["extrapolated"] else row["seconds"]
        lines.append(
            f"{row['label']:<34}{_n(row['rows'])}{wall:>9.2f}{row['rows_per_second']:>10,}"
            f"{row['ratio_to_single_delete']:>9.3f}{_ratio(row.get('ratio_to_limit'))}"
            f"{_size(row):>14}"
            f"{_ms(row['chunk_p99_ms'])}"
            f"{_ms(row['chunk_max_ms'], 9)}{_s(row.get('command_to_first_chunk_s'), 12)}"
            f"{_ms(row['dispatcher_rss_mb'], 8)}{_ms(row.get('worker_rss_mb'), 8)}  "
            f"{_pair(row['renewals']['untouched']):>15}"
            f"{_pair(row['renewals']['cleaned']):>20}"
        )
    lines += ["", "Where a pipeline run's time went, per chunk, ms p50/p95 (efficiency: share "
              "of wall time with a chunk statement executing; cpu wait: of the statement, its "
              "worker waiting for a CPU; vacuum s: a vacuum working on the holds, the "
              "reminders, which slows the pipeline down):",
              f"{'':<34}{'efficiency':>11}" + "".join(f"{part:>16}" for part in PARTS)
              + f"{'vacuum s':>16}"]
    for row in report["results"]:
        if row.get("time_efficiency") is None:
            continue
        spent = row["per_chunk_ms"]
        lines.append(f"{row['label']:<34}{row['time_efficiency']:>11.1%}" + "".join(
            f"{spent[part]['p50']:>9.1f}/{spent[part]['p95']:<6.1f}" if part in spent
            else f"{'-':>16}" for part in PARTS) + f"{_vacuumed(row):>16}")
    lines += _wal(report)
    lines += [
        "",
        f"{'idle (nothing cleaning)':<141}{_pair(idle['untouched']):>15}"
        f"{_pair(idle['cleaned']):>20}",
        "",
        "Wall time of the one-task-per-row row is extrapolated from its sample of "
        f"{preset['per_row_sample']:,} rows.",
        "Size: a pipeline run's first chunks -> its chunks' median; 1st chunk s: from "
        "the dispatch command's start to its first chunk's start; RSS MB: the dispatch "
        "command's peak; wkr MB: the largest of the queue's processes during the run; window "
        f"{report['machine'].get('window', '-')} chunks in flight; x limit: a pipeline run's "
        "rate over its scheme's two-connection limit's.",
        "Ratios: " + "; ".join(f"{name} {value:.3f}"
                               for name, value in report["ratios"].items()),
    ]
    lines += ["", "Targets (each met, or by how much it falls short and where the time went):",
              *targets.lines(targets.judge(report))]
    for row in report["results"]:
        failed = [name for name, ok in row["checks"].items() if ok is False]
        if failed:
            lines.append(f"FAILED checks for {row['label']}: {', '.join(failed)}")
    return "\n".join(lines)


def judged(reports: dict[str, dict]) -> str:
    """The targets judged from saved reports (by path): each report's own, then those
    that compare two of them (reminders' cost, contention, scale), and how time grew
    with the backlog where the reports hold more than one preset."""
    out = []
    for name, report in reports.items():
        out += [f"{name}:", *targets.lines(targets.judge(report))]
    compared = targets.lines(targets.across(list(reports.values())))
    out += ["Across reports:", *(compared or ["  (no two of these compare: give a run "
                                             "with and without reminders, quiet and with "
                                             "--cpu-load, or large and a larger preset)"])]
    grown = targets.growth(list(reports.values()))
    if grown:
        out += ["How time grew with the backlog (per preset: seconds, and microseconds a "
                "hold deleted):", *grown]
    return "\n".join(out)


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def draw(report: dict, path: Path) -> None:
    """Throughput and renewal latency per contender, side by side, on log scales."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = report["results"]
    # Eleven groups of labels share the width of seven: the longest break more.
    labels = [SHORT_LABELS.get(row["name"], row["name"]).replace(
        "Hand-written\n", "Hand-\nwritten\n") for row in rows]
    figure, (throughput, latency) = pyplot.subplots(1, 2, figsize=(16, 6))
    bars = throughput.bar(labels, [row["rows_per_second"] for row in rows],
                          color=[COLOURS.get(row["name"], "#2a7ab0") for row in rows])
    throughput.bar_label(bars, labels=[_bar_label(row) for row in rows], fontsize=8)
    throughput.set_yscale("log")
    throughput.set_ylabel("rows deleted per second (log)")
    throughput.set_title("Throughput (label: ratio to one DELETE; a pipeline run's also to\n"
                         "its scheme's two-connection limit, the dark bar after its runs)")

    groups = [*labels, "idle"]
    renewals = [row["renewals"] for row in rows] + [report["idle_renewals"]]
    width = 0.38
    for offset, kind, colour, legend in (
        (-width / 2, "untouched", "#2a9d5a", "p99, holds not being cleaned"),
        (width / 2, "cleaned", "#c0392b", "p99, holds being cleaned"),
    ):
        latency.bar([i + offset for i in range(len(groups))],
                    [r[kind]["p99_ms"] or 0 for r in renewals], width, label=legend,
                    color=colour)
    latency.set_xticks(range(len(groups)), groups)
    latency.set_yscale("log")
    latency.set_ylabel("renewal latency p99, ms (log)")
    latency.set_title("Concurrent hold renewals")
    latency.legend()
    throughput.tick_params(axis="x", labelsize=7)
    latency.tick_params(axis="x", labelsize=7)
    preset = report["preset"]
    figure.suptitle(f"cleanup_bench {preset['name']}: {preset['expired']:,} expired among "
                    f"{preset['total']:,} holds, {report['machine']['cpus']} CPUs")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def baseline_key(report: dict) -> str:
    """The preset's name, marked when the run left reminders out, ran beside a CPU load
    or ran some contenders only: each kind is guarded against its own, and has files of
    its own."""
    key = report["preset"]["name"]
    if not report.get("reminders", True):
        key += "-without-reminders"
    if report.get("cpu_load"):
        key += f"-cpu-load-{report['cpu_load']}"
    if report.get("only"):
        key += f"-{report['only']}-only"
    return key


def check_baseline(report: dict) -> tuple[bool, str]:
    """Fail only when one of the run's ratios falls below half of the one recorded for
    its preset; return the verdict and a line per ratio."""
    key = baseline_key(report)
    recorded = _baselines().get(key)
    if recorded is None:
        return False, f"no baseline recorded for {key!r} in {BASELINE.name}"
    verdicts, lines = [], []
    for name, value in sorted(recorded["ratios"].items()):
        floor = value / 2
        measured = report["ratios"].get(name)
        passed = measured is not None and measured >= floor
        verdicts.append(passed)
        shown = "missing" if measured is None else f"{measured:.3f}"
        lines.append(f"  {name}: {shown}, floor {floor:.3f} (half of {value:.3f}): "
                     f"{'ok' if passed else 'REGRESSION'}")
    head = (f"Regression guard ({key}, recorded {recorded['recorded']}): "
            f"{'ok' if all(verdicts) else 'REGRESSION'}")
    return all(verdicts), "\n".join([head, *lines])


def record_baseline(report: dict) -> None:
    """Record every ratio of the run as its preset's baseline."""
    baselines = _baselines()
    baselines[baseline_key(report)] = {
        "ratios": report["ratios"],
        "recorded": report["finished_at"][:10],
        "cpus": report["machine"]["cpus"],
    }
    BASELINE.write_text(json.dumps(baselines, indent=2, sort_keys=True) + "\n")


def _baselines() -> dict:
    return json.loads(BASELINE.read_text()) if BASELINE.exists() else {}


def _headline(report: dict) -> list[str]:
    """Each pipeline run's rate over its limit's, and the most WAL a pipeline run wrote
    a row over one DELETE's."""
    ratios = report["ratios"]
    shown = [f"{label} {ratios[name]:.3f}x" for name, label in HEADLINE.items()
             if name in ratios]
    lines = ["Headline, to the two-connection limit: " + ", ".join(shown)] if shown else []
    wal = [row for row in report["results"] if row["name"].startswith("pipeline")
           and row.get("wal_per_row_to_single_delete")]
    if wal:
        worst = max(wal, key=lambda row: row["wal_per_row_to_single_delete"])
        lines.append(f"WAL per row, at most {worst['wal_per_row_to_single_delete']:.3f}x "
                     f"one DELETE's ({worst['label']})")
    return lines


def _wal(report: dict) -> list[str]:
    """Each contender's WAL, in all and per row deleted."""
    rows = [row for row in report["results"] if row.get("wal_bytes") is not None]
    if not rows:
        return []
    idle = report.get("idle_wal_bytes_per_second")
    lines = ["", "WAL the server wrote during each contender (pg_current_wal_lsn before and "
             "after; the full-page image of each page first changed after the restore's "
             "CHECKPOINT included; the renewals' and any other database's too"
             + (f": {idle / 1024:,.0f} kB/s idle" if idle is not None else "") + "):",
             f"{'':<34}{'WAL MB':>10}{'bytes/row':>11}{'x DELETE':>10}"]
    for row in rows:
        lines.append(f"{row['label']:<34}{row['wal_bytes'] / 2**20:>10,.1f}"
                     f"{_ms(row['wal_bytes_per_row'], 11)}"
                     f"{_ratio(row['wal_per_row_to_single_delete'], 10)}")
    return lines


def _bar_label(row: dict) -> str:
    ratio = f"{row['ratio_to_single_delete']:.2g}x"
    return ratio if row.get("ratio_to_limit") is None else (
        f"{ratio}\n{row['ratio_to_limit']:.2f}x limit")


def _ratio(value, width: int = 8) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.3f}"


def _vacuumed(row: dict) -> str:
    seconds = row.get("vacuum_seconds") or {}
    return ", ".join(f"{value:.1f}" for value in seconds.values()) or "-"


def _load(report: dict) -> str:
    count = report.get("cpu_load")
    return f", beside {count} CPU-bound process{'es' if count > 1 else ''}" if count else ""


def _n(value, width: int = 10) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width},}"


def _size(row: dict) -> str:
    first = row.get("first_chunk_size")
    if first is None or first == row["chunk_size"]:
        return "-" if row["chunk_size"] is None else f"{row['chunk_size']:,}"
    return f"{first:,}->{row['chunk_size']:,}"


def _s(value, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.2f}"


def _ms(value, width: int = 10) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width},.1f}"


def _pair(summary: dict) -> str:
    if not summary["n"]:
        return "-"
    return f"{summary['p50_ms']:.1f}/{summary['p99_ms']:.1f}"
