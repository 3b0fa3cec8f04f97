"""The performance targets, judged from the bench's reports: each met, or by how much
it falls short, and where a pipeline run's time went instead.

A report judges what one run can show (ratios, efficiency, chunk latency, the first
chunk). Some targets compare runs: reminders' cost (a run with them against one
without), contention (quiet against ``--cpu-load``) and scale (a larger preset
against ``large``); ``across`` pairs the reports it is given by what each ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

RANGE_RUNS = ("pipeline_range_first", "pipeline_range_second", "pipeline_range")
ITEMS_RUNS = ("pipeline_items_first", "pipeline_items")
# The targets, as the performance issues set them (the later one where they differ).
RANGE_EFFICIENCY = 0.90
ITEMS_EFFICIENCY = 0.88
# Against each scheme's limit, two connections running its statements with nothing else
# to do: the headline.
RANGE_FIRST_TO_LIMIT = 0.95
RANGE_THIRD_TO_LIMIT = 0.98
ITEMS_TO_LIMIT = 0.95
WAL_PER_ROW = 1.15
RANGE_FIRST_RATIO = 0.9
RANGE_THIRD_RATIO = 1.0
ITEMS_RATIO = 1.2
CHUNK_P99_MS = 100
FIRST_CHUNK_S = 0.5
# A chunk's fixed cost, its starting plus its finishing, per chunk.
FIXED_P50_MS = 8
FIXED_P95_MS = 15
# Within 20% of the floor measured for any layout with reminders in a table of their own.
REMINDERS_COST = 2.0
CONTENTION_LOSS = 0.30
SCALE_CHANGE = 0.10
# "A few hundred chunks, not thousands" for a range run's ledger.
LEDGER_CHUNKS = 999
# The runs whose time the growth table shows, per preset.
GROWTH_RUNS = {"single_delete": "one DELETE", "pipeline_range_first": "range first run",
               "pipeline_range": "range third run"}


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    met: bool
    # Empty when met; else by how much it falls short, and the breakdown behind it.
    short_by: str = ""
    why: str = ""


def judge(report: dict) -> list[Verdict]:
    """Verdicts on the targets one report shows."""
    runs = {row["name"]: row for row in report["results"]}
    ratios = report["ratios"]
    verdicts = []
    for name, run, required, label in (
        ("range_to_limit", "pipeline_range_first", RANGE_FIRST_TO_LIMIT,
         "range first run >= {}x its two-connection limit"),
        ("range_third_run_to_limit", "pipeline_range", RANGE_THIRD_TO_LIMIT,
         "range third run >= {}x its two-connection limit"),
        ("items_to_limit", "pipeline_items_first", ITEMS_TO_LIMIT,
         "items first run >= {}x its two-connection limit"),
        ("range_to_single_delete", "pipeline_range_first", RANGE_FIRST_RATIO,
         "range first run >= {}x one DELETE"),
        ("range_third_run_to_single_delete", "pipeline_range", RANGE_THIRD_RATIO,
         "range third run >= {}x one DELETE"),
        ("items_to_handwritten_unnest", "pipeline_items_first", ITEMS_RATIO,
         "items first run >= {}x the unnest loop"),
    ):
        if name in ratios:
            verdicts.append(_at_least(label.format(required), ratios[name], required, "x",
                                      why=_why(runs, [run])))
    for names, required, label in ((RANGE_RUNS, RANGE_EFFICIENCY, "range"),
                                   (ITEMS_RUNS, ITEMS_EFFICIENCY, "items")):
        efficiencies = [runs[name]["time_efficiency"] for name in names
                        if runs.get(name, {}).get("time_efficiency") is not None]
        if efficiencies:
            verdicts.append(_at_least(f"{label} runs' time efficiency >= {required:.0%}",
                                      min(efficiencies), required, "%",
                                      why=_why(runs, names)))
    pipelines = [row for row in report["results"] if row["name"].startswith("pipeline")]
    wal = [row for row in pipelines if row.get("wal_per_row_to_single_delete")]
    if wal:
        worst = max(wal, key=lambda row: row["wal_per_row_to_single_delete"])
        verdicts.append(_at_most(
            f"pipeline runs' WAL per row <= {WAL_PER_ROW}x one DELETE's",
            worst["wal_per_row_to_single_delete"], WAL_PER_ROW, "x",
            # The renewals racing a run write WAL for as long as it runs.
            why=f"the most: {worst['label']}, {worst['wal_bytes_per_row']:,.0f} bytes a row; "
                + ", ".join(f"{row['name']} {row['wal_per_row_to_single_delete']:.3f}x in "
                            f"{row['seconds']:.1f} s" for row in wal)
                + f" (one DELETE in {runs['single_delete']['seconds']:.1f} s)"))
    if pipelines:
        worst = max(row["chunk_p99_ms"] for row in pipelines)
        verdicts.append(_at_most(f"chunk p99 <= {CHUNK_P99_MS} ms", worst, CHUNK_P99_MS, " ms"))
        verdicts += _fixed_cost(pipelines)
        first = max(row["first_chunk_after_s"] for row in pipelines)
        commands = [row["command_to_first_chunk_s"] for row in pipelines
                    if row.get("command_to_first_chunk_s") is not None]
        if commands:
            verdicts.append(_at_most(
                f"first chunk <= {FIRST_CHUNK_S} s after the dispatch command's start",
                max(commands), FIRST_CHUNK_S, " s",
                why=f"from its run's creation: up to {first:.2f} s; the rest is the "
                    "command's process starting (Python, Django, the project)"))
    return verdicts


def _fixed_cost(pipelines: list[dict]) -> list[Verdict]:
    """A chunk's fixed cost, the slowest run's, at p50 and p95, beside its worker's own
    time between two statements."""
    timed = [row for row in pipelines if "fixed" in (row.get("per_chunk_ms") or {})]
    if not timed:
        return []
    verdicts = []
    for quantile, limit in (("p50", FIXED_P50_MS), ("p95", FIXED_P95_MS)):
        worst = max(timed, key=lambda row: row["per_chunk_ms"]["fixed"][quantile])
        spent = worst["per_chunk_ms"]
        between = spent.get("between", {}).get(quantile)
        verdicts.append(_at_most(
            f"a chunk's fixed cost (starting + finishing) {quantile} <= {limit} ms",
            spent["fixed"][quantile], float(limit), " ms",
            why=f"{worst['label']}: starting {spent['starting'][quantile]:.1f} ms, finishing "
                f"{spent['finishing'][quantile]:.1f} ms; its worker's own time "
                "from a statement's end to its next statement's start "
                + (f"{between:.1f} ms" if between is not None else "unknown")
                + " (the top-up, the commit, django-q2 handing over the result and the next "
                  "message, and any wait for one)"))
    return verdicts


def across(reports: list[dict]) -> list[Verdict]:
    """Verdicts on the targets that compare reports, for each pair the list holds."""
    verdicts = []
    for with_them in reports:
        for without in reports:
            if (_kind(with_them)["reminders"] and _differ_only_in(with_them, without,
                                                                   "reminders")):
                cost = (_rate(without, "single_delete") / _rate(with_them, "single_delete"))
                verdicts.append(_at_most(
                    f"one DELETE with reminders <= {REMINDERS_COST}x holds alone "
                    f"({_name(with_them)} against {_name(without)})", cost, REMINDERS_COST, "x"))
    for quiet in reports:
        for loaded in reports:
            if not _kind(quiet)["cpu_load"] and _differ_only_in(quiet, loaded, "cpu_load"):
                for name, value in quiet["ratios"].items():
                    if name in loaded["ratios"] and value:
                        loss = 1 - loaded["ratios"][name] / value
                        verdicts.append(_at_most(
                            f"{name} beside {loaded['cpu_load']} CPU-bound process(es) "
                            f"within {CONTENTION_LOSS:.0%} of quiet ({_name(quiet)})",
                            loss, CONTENTION_LOSS, "%"))
    for small in reports:
        for big in reports:
            if (small["preset"]["name"] == "large" and big["preset"]["expired"]
                    > small["preset"]["expired"] and _differ_only_in(small, big, "preset")):
                verdicts += _scale(small, big)
    return verdicts


def _scale(small: dict, big: dict) -> list[Verdict]:
    label = f"{_name(big)} against {_name(small)}"
    verdicts = []
    name = "range_to_single_delete"
    if name in small["ratios"] and name in big["ratios"]:
        change = abs(big["ratios"][name] / small["ratios"][name] - 1)
        verdicts.append(_at_most(f"range first run's ratio within {SCALE_CHANGE:.0%} ({label})",
                                 change, SCALE_CHANGE, "%"))
    small_runs = {row["name"]: row for row in small["results"]}
    for row in big["results"]:
        other = small_runs.get(row["name"])
        if other is None or not row["name"].startswith("pipeline"):
            continue
        for field, what in (("worker_rss_mb", "the queue's processes' peak memory"),
                            ("dispatcher_rss_mb", "the dispatcher's peak memory")):
            if row.get(field) and other.get(field):
                change = row[field] / other[field] - 1
                verdicts.append(_at_most(
                    f"{row['label']}: {what} flat within {SCALE_CHANGE:.0%} ({label})",
                    change, SCALE_CHANGE, "%",
                    why=f"{other[field]:.1f} -> {row[field]:.1f} MB"))
        if row.get("per_chunk_ms") and other.get("per_chunk_ms"):
            # Planning the next chunk is part of finishing one.
            before = other["per_chunk_ms"]["finishing"]["p50"]
            after = row["per_chunk_ms"]["finishing"]["p50"]
            verdicts.append(_at_most(
                f"{row['label']}: planning per chunk the same (finishing p50 within "
                f"{SCALE_CHANGE:.0%}, {label})", after / before - 1, SCALE_CHANGE, "%",
                why=f"{before:.1f} -> {after:.1f} ms"))
        if row["name"] == "pipeline_range_first":
            verdicts.append(_at_most(f"{row['label']}: the ledger a few hundred chunks "
                                     f"({label})", row["chunks"], LEDGER_CHUNKS, " chunks",
                                     why=f"{row['chunks']:,} chunks of about "
                                         f"{row['chunk_size']:,} rows"))
    return verdicts


def growth(reports: list[dict]) -> list[str]:
    """How the one DELETE's and the range runs' time grows with the backlog: a line per
    preset (smallest backlog first), for each set of reports that differ only in it."""
    out = []
    for alike in _by_all_but_preset(reports):
        if len({report["preset"]["name"] for report in alike}) < 2:
            continue
        out.append(f"  {_conditions(alike[0]).strip() or 'with reminders, quiet'}; first "
                   "run: the range first run's ratio to the one DELETE")
        out.append(f"  {'preset':<8}{'expired':>11}{'holds':>12}"
                   + "".join(f"{label:>24}" for label in GROWTH_RUNS.values())
                   + f"{'first run':>11}")
        for report in sorted(alike, key=lambda report: report["preset"]["expired"]):
            runs = {row["name"]: row for row in report["results"]}
            cells = "".join(_time_and_rate(runs.get(name)) for name in GROWTH_RUNS)
            ratio = report["ratios"].get("range_to_single_delete")
            out.append(f"  {report['preset']['name']:<8}{report['preset']['expired']:>11,}"
                       f"{report['preset']['total']:>12,}{cells}"
                       + (f"{ratio:>10.3f}x" if ratio is not None else f"{'-':>11}"))
    return out


def _by_all_but_preset(reports: list[dict]) -> list[list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for report in reports:
        rest = {key: value for key, value in _kind(report).items() if key != "preset"}
        groups.setdefault(tuple(sorted(rest.items())), []).append(report)
    return list(groups.values())


def _time_and_rate(row: dict | None) -> str:
    """A run's seconds and microseconds per row deleted."""
    if not row or not row["rows"]:
        return f"{'-':>24}"
    return f"{row['seconds']:>9.2f} s {row['seconds'] / row['rows'] * 1e6:>6.2f} us/row"


def lines(verdicts: list[Verdict]) -> list[str]:
    """One line per verdict, and the breakdown under each one missed."""
    out = []
    for verdict in verdicts:
        state = "met" if verdict.met else f"NOT MET: {verdict.short_by}"
        out.append(f"  {verdict.target}: {verdict.measured}: {state}")
        if verdict.why and not verdict.met:
            out.append(f"      {verdict.why}")
    return out


def as_dicts(verdicts: list[Verdict]) -> list[dict]:
    return [asdict(verdict) for verdict in verdicts]


def _at_least(target: str, value: float, required: float, unit: str, *, why: str = "") -> Verdict:
    met = value >= required
    gap = (f"{(required - value) * 100:.1f} points" if unit == "%"
           else _show(required - value, unit))
    return Verdict(target, _show(value, unit), met,
                   "" if met else f"short by {gap} ({(required - value) / required:.0%} "
                                  "of the target)", why)


def _at_most(target: str, value: float, limit: float, unit: str, *, why: str = "") -> Verdict:
    met = value <= limit
    gap = f"{(value - limit) * 100:.1f} points" if unit == "%" else _show(value - limit, unit)
    return Verdict(target, _show(value, unit), met, "" if met else f"over by {gap}", why)


def _show(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.1%}"
    if unit == "x":
        return f"{value:.3f}x"
    return f"{value:,.2f}{unit}" if isinstance(value, float) else f"{value:,}{unit}"


def _why(runs: dict, names) -> str:
    """Where the slowest of the runs' chunks spent their time: the fixed cost of a chunk
    (starting it and finishing it) beside its statement, and its wait for a worker."""
    present = [runs[name] for name in names if runs.get(name, {}).get("per_chunk_ms")]
    if not present:
        return ""
    row = min(present, key=lambda r: r["time_efficiency"])
    spent = row["per_chunk_ms"]
    fixed = spent["starting"]["p50"] + spent["finishing"]["p50"]
    statement = spent["statement"]["p50"]
    waited = (f" (its worker waiting for a CPU {spent['cpu wait']['p50']:.1f} ms of it)"
              if "cpu wait" in spent else "")
    return (f"{row['label']}: {row['time_efficiency']:.1%} efficient; per chunk p50 "
            f"statement {statement:.1f} ms{waited}, starting + finishing {fixed:.1f} ms "
            f"({fixed / statement:.1f}x the statement), waiting for a worker "
            f"{spent['waiting']['p50']:.1f} ms; {row['chunks']:,} chunks of "
            f"{row['chunk_size']:,} rows (median)" + _inside(row.get("functions")))


def _inside(functions: dict | None) -> str:
    """The ledger's functions a pipeline called, each with its mean time per call."""
    if not functions:
        return ""
    return "; in the ledger's functions, per call: " + ", ".join(
        f"{name} {spent['ms_per_call']:.2f} ms"
        for name, spent in sorted(functions.items(), key=lambda item: -item[1]["calls"]))


def _rate(report: dict, name: str) -> float:
    return next(row["rows_per_second"] for row in report["results"] if row["name"] == name)


def _kind(report: dict) -> dict:
    """What a report ran: its preset, with or without reminders, beside how much load."""
    return {"preset": report["preset"]["name"], "reminders": report.get("reminders", True),
            "cpu_load": report.get("cpu_load") or 0}


def _differ_only_in(one: dict, other: dict, key: str) -> bool:
    mine, theirs = _kind(one), _kind(other)
    return mine[key] != theirs[key] and all(
        mine[name] == theirs[name] for name in mine if name != key)


def _name(report: dict) -> str:
    return report["preset"]["name"] + _conditions(report)


def _conditions(report: dict) -> str:
    """What a report ran under besides its preset, if not the product quiet."""
    conditions = ""
    if not report.get("reminders", True):
        conditions += " without reminders"
    if report.get("cpu_load"):
        conditions += f" beside {report['cpu_load']} CPU-bound"
    return conditions
