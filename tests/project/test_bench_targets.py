"""The performance targets judged from bench reports, fed with reports the bench wrote
(docs/bench-large*.json), and ``cleanup_bench --judge``'s refusals."""

from __future__ import annotations

import copy
import json

import pytest
from django.core.management import CommandError, call_command

from config.devtools.bench import targets
from tests.conftest import ROOT

LARGE = json.loads((ROOT / "docs" / "bench-large.json").read_text())
ALONE = json.loads((ROOT / "docs" / "bench-large-without-reminders-range-only.json").read_text())


def by_target(verdicts) -> dict:
    return {verdict.target: verdict for verdict in verdicts}


def test_a_report_judges_each_target_it_shows_with_the_shortfall_and_the_breakdown():
    verdicts = by_target(targets.judge(LARGE))
    first = verdicts["range first run >= 0.9x one DELETE"]
    assert first.measured == f"{LARGE['ratios']['range_to_single_delete']:.3f}x"
    assert not first.met and first.short_by.startswith("short by 0.403x")
    # Where the time went: the first run's own chunks, not another run's.
    spent = next(row for row in LARGE["results"]
                 if row["name"] == "pipeline_range_first")["per_chunk_ms"]
    assert f"statement {spent['statement']['p50']:.1f} ms" in first.why
    assert "Pipeline, range, first run" in first.why
    assert "Pipeline, range, third run" in verdicts[
        "range third run >= 1.0x one DELETE"].why
    worst = max(row["chunk_p99_ms"] for row in LARGE["results"]
                if row["name"].startswith("pipeline"))
    p99 = verdicts["chunk p99 <= 100 ms"]
    assert p99.met and p99.measured == f"{worst:,} ms" and p99.short_by == ""
    efficiency = verdicts["items runs' time efficiency >= 88%"]
    assert not efficiency.met and "points" in efficiency.short_by


def test_a_range_only_report_judges_no_items_target():
    names = set(by_target(targets.judge(ALONE)))
    assert not any("items" in name for name in names)
    assert "range runs' time efficiency >= 90%" in names


def test_reports_with_and_without_reminders_judge_the_reminders_cost():
    verdicts = targets.across([LARGE, ALONE])
    assert len(verdicts) == 1  # the same preset, quiet both: only the reminders differ
    (cost,) = verdicts
    rate = {report["reminders"]: next(row["rows_per_second"] for row in report["results"]
                                      if row["name"] == "single_delete")
            for report in (LARGE, ALONE)}
    assert cost.measured == f"{rate[False] / rate[True]:.3f}x"
    assert not cost.met and cost.short_by.startswith("over by")


def test_a_loaded_run_is_judged_against_the_quiet_one_ratio_by_ratio():
    loaded = copy.deepcopy(LARGE) | {"cpu_load": 1}
    loaded["ratios"] = {name: value * 0.75 for name, value in LARGE["ratios"].items()}
    verdicts = targets.across([LARGE, loaded])
    assert len(verdicts) == len(LARGE["ratios"])
    assert all(v.met and v.measured == "25.0%" for v in verdicts)
    loaded["ratios"]["range_to_single_delete"] = LARGE["ratios"]["range_to_single_delete"] / 2
    missed = [v for v in targets.across([LARGE, loaded]) if not v.met]
    assert [v.measured for v in missed] == ["50.0%"]
    assert missed[0].short_by == "over by 20.0 points"


def test_a_larger_preset_is_judged_against_large_for_ratio_memory_planning_and_ledger():
    bigger = copy.deepcopy(LARGE)
    bigger["preset"] = bigger["preset"] | {"name": "xlarge", "expired": 5_000_000}
    for row in bigger["results"]:
        row["worker_rss_mb"] = 60.0
    small = copy.deepcopy(LARGE)
    for row in small["results"]:
        row["worker_rss_mb"] = 50.0
    verdicts = targets.across([small, bigger])
    memory = [v for v in verdicts if "queue's processes' peak memory" in v.target]
    assert memory and all(not v.met and v.measured == "20.0%" for v in memory)
    assert all(v.met for v in verdicts if "planning per chunk" in v.target)
    (ratio,) = [v for v in verdicts if v.target.startswith("range first run's ratio")]
    assert ratio.met and ratio.measured == "0.0%"
    (ledger,) = [v for v in verdicts if "ledger" in v.target]
    assert ledger.met  # 241 chunks
    # Nothing is compared the other way round, nor a preset with itself.
    assert targets.across([bigger]) == targets.across([small]) == []


def test_judge_prints_each_report_and_the_comparisons(capsys):
    with_them = str(ROOT / "docs" / "bench-large.json")
    alone = str(ROOT / "docs" / "bench-large-without-reminders-range-only.json")
    call_command("cleanup_bench", "--judge", with_them, alone)
    out = capsys.readouterr().out
    assert out.startswith(f"{with_them}:\n")
    assert f"{alone}:\n" in out
    assert "Across reports:\n  one DELETE with reminders <= 2.0x holds alone" in out
    # One preset: nothing to say about growth.
    assert "How time grew" not in out


def test_judge_keeps_apart_reports_that_share_a_file_name(tmp_path, capsys):
    # Each run writes bench-<preset>.json: two presets' runs in two directories.
    bigger = copy.deepcopy(LARGE)
    bigger["preset"] = bigger["preset"] | {"name": "xlarge", "expired": 5_000_000,
                                           "total": 10_000_000}
    for row in bigger["results"]:
        row["seconds"] *= 5
    paths = []
    for name, report in (("one", bigger), ("two", LARGE)):  # the larger one first
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "bench.json")
        paths[-1].write_text(json.dumps(report))
    call_command("cleanup_bench", "--judge", *map(str, paths))
    out = capsys.readouterr().out
    assert f"{paths[0]}:\n" in out and f"{paths[1]}:\n" in out
    assert "range first run's ratio within 10% (xlarge against large)" in out
    # How time grew: a line per preset, smallest backlog first, seconds and us a row.
    grown = out.split("How time grew with the backlog")[1].splitlines()
    assert grown[1].startswith("  with reminders, quiet;")
    grown = grown[3:]
    assert [line.split()[0] for line in grown] == ["large", "xlarge"]
    delete = next(row for row in LARGE["results"] if row["name"] == "single_delete")
    assert f"{delete['seconds']:.2f} s" in grown[0]
    assert f"{delete['seconds'] * 5:.2f} s" in grown[1]
    assert f"{delete['seconds'] / delete['rows'] * 1e6:.2f} us/row" in grown[0]


def test_judge_refuses_a_report_given_twice():
    path = str(ROOT / "docs" / "bench-large.json")
    with pytest.raises(CommandError, match="given twice; nothing was judged"):
        call_command("cleanup_bench", "--judge", path, str(ROOT / "docs" / ".." / "docs"
                                                            / "bench-large.json"))


@pytest.mark.parametrize("content, error", [
    (None, "cannot read"),
    ("not json", "is not JSON"),
    ('{"preset": {}}', "is not a cleanup_bench report"),
    ("[1, 2]", "is not a cleanup_bench report"),
])
def test_judge_refuses_what_is_not_a_report(tmp_path, content, error):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CommandError, match=error):
        call_command("cleanup_bench", "--judge", str(path))


def test_a_chunks_fixed_cost_is_judged_at_p50_and_p95_with_its_workers_share():
    report = copy.deepcopy(LARGE)
    for row in report["results"]:
        if row["name"].startswith("pipeline"):
            spent = row["per_chunk_ms"]
            spent["fixed"] = {"p50": 7.5, "p95": 14.0, "sum_s": 1.0}
            spent["between"] = {"p50": 5.0, "p95": 9.0, "sum_s": 0.5}
    third = next(row for row in report["results"] if row["name"] == "pipeline_range")
    third["per_chunk_ms"]["fixed"] = {"p50": 30.5, "p95": 12.0, "sum_s": 2.0}
    verdicts = by_target(targets.judge(report))
    p50 = verdicts["a chunk's fixed cost (starting + finishing) p50 <= 8 ms"]
    assert (p50.met, p50.measured, p50.short_by) == (False, "30.50 ms", "over by 22.50 ms")
    assert p50.why.startswith("Pipeline, range, third run: starting ")
    assert "its worker's own time from a statement's end to its next statement's start " \
           "5.0 ms" in p50.why
    p95 = verdicts["a chunk's fixed cost (starting + finishing) p95 <= 15 ms"]
    assert p95.met and p95.measured == "14.00 ms"
    # A report from before the fixed cost was kept judges nothing of it.
    assert not [name for name in by_target(targets.judge(LARGE)) if "fixed cost" in name]


def test_the_first_chunk_is_judged_from_the_dispatch_commands_start():
    verdicts = by_target(targets.judge(LARGE))
    first = verdicts["first chunk <= 0.5 s after the dispatch command's start"]
    worst = max(row["command_to_first_chunk_s"] for row in LARGE["results"]
                if row["name"].startswith("pipeline"))
    assert first.measured == f"{worst:,.2f} s" and first.met == (worst <= 0.5)
    assert "from its run's creation: up to" in first.why
