"""A host's pressure indicator is input the engine does not write: whatever it returns,
the answer is validated where it enters (``pressure.validated``), and anything that is
no valid signal halts the policy with a reason an operator can read. Through the door
an operator meets it by: ``cleanup_dispatch``, queued and ``--sync``, and the checks.
"""

from __future__ import annotations

import math
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from cleanup.checks import check_settings
from cleanup.engine import pressure
from cleanup.engine.pressure import INDICATOR_ERROR, Level, Signal
from cleanup.models import Halt, Run
from tests.engine_app.factories import LeaseFactory

POLICY = "expire-leases"
ANSWER: dict = {}


def host_answer(policy, connection):
    return ANSWER["value"]


@pytest.fixture
def indicator(settings, account):
    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.engine.test_indicator_contract.host_answer"]
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0
    pressure.forget()
    LeaseFactory.create_batch(3, account=account, expired=True)
    yield ANSWER
    pressure.forget()


HOSTILE = [
    pytest.param(None, "host_answer returned None, not a Signal", id="None"),
    pytest.param("HOLD", "host_answer returned 'HOLD', not a Signal", id="a string"),
    pytest.param(Signal("2", "x", None, None, ""),
                 "host_answer returned the level '2', not one of OK (0), SLOW (1), HALT (2)",
                 id="a level as text"),
    pytest.param(Signal(7, "x", None, None, ""),
                 "host_answer returned the level 7, not one of OK (0), SLOW (1), HALT (2)",
                 id="a level out of the enum"),
    pytest.param(Signal(Level.OK, "x", math.nan, None, ""),
                 "host_answer returned the value nan, not a finite number", id="NaN"),
    pytest.param(Signal(Level.OK, "x", None, math.inf, ""),
                 "host_answer returned the limit inf, not a finite number", id="infinity"),
    pytest.param(Signal(Level.OK, None, None, None, ""),
                 "host_answer returned the reason None, not text", id="no reason"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("answer, detail", HOSTILE)
@pytest.mark.parametrize("sync", [False, True], ids=["queued", "--sync"])
def test_an_answer_that_is_no_signal_halts_the_policy_and_says_what_was_wrong(
        indicator, answer, detail, sync):
    indicator["value"] = answer
    out = StringIO()

    call_command("cleanup_dispatch", "--policy", POLICY, *(["--sync"] if sync else []),
                 stdout=out, stderr=StringIO())

    run = Run.objects.get()
    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    assert (halt.reason, halt.detail) == (INDICATOR_ERROR, detail)
    assert run.chunks_planned == 0 and run.state == Run.State.RUNNING
    # The operator reads why, and that it clears by itself: resuming is for a pause.
    said = out.getvalue()
    assert detail in said and "until that clears" in said and "cleanup_resume" not in said


@pytest.mark.django_db
def test_a_plain_two_is_a_halt_never_an_open_gate(indicator):
    indicator["value"] = Signal(2, "batch_window", 1.0, 0.0, "nightly batch")

    call_command("cleanup_dispatch", "--policy", POLICY, "--sync", stdout=StringIO(),
                 stderr=StringIO())

    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    assert halt.reason == "batch_window"
    assert Run.objects.get().chunks_planned == 0


@pytest.mark.django_db
def test_long_or_binary_texts_are_cleaned_and_bounded_before_they_are_stored(indicator):
    indicator["value"] = Signal(Level.HALT, "r" * 100, 1.0, 0.0, "a\x00b\nc" + "d" * 2000)

    call_command("cleanup_dispatch", "--policy", POLICY, stdout=StringIO(), stderr=StringIO())

    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    assert halt.reason == "r" * 63 + "…"
    assert halt.detail.startswith("a b c") and len(halt.detail) == pressure.MAX_DETAIL
    assert "\x00" not in halt.detail


@pytest.mark.django_db
def test_a_valid_answer_passes_through_unchanged(indicator):
    answer = Signal(Level.SLOW, "batch_window", 3.0, 2, "busy")
    assert pressure.validated(answer, "host_answer") == answer
    assert pressure.validated(Signal(1, "b", None, None, "").level is Level.SLOW, "x")


@pytest.fixture
def module_that_raises_on_import(tmp_path, monkeypatch):
    (tmp_path / "raising_indicators.py").write_text(
        "raise RuntimeError('the host module is broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "raising_indicators.batch_window"
    sys.modules.pop("raising_indicators", None)


def test_an_indicator_module_that_raises_on_import_is_cleanup_e026(settings,
                                                                   module_that_raises_on_import):
    settings.CLEANUP_PRESSURE_INDICATORS = [module_that_raises_on_import]
    assert [error.id for error in check_settings()] == ["cleanup.E026"]


@pytest.mark.django_db
def test_an_indicator_module_that_raises_on_import_halts_instead_of_failing_dispatch(
        indicator, settings, module_that_raises_on_import):
    settings.CLEANUP_PRESSURE_INDICATORS = [module_that_raises_on_import]

    call_command("cleanup_dispatch", "--policy", POLICY, stdout=StringIO(), stderr=StringIO())

    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    assert halt.reason == INDICATOR_ERROR
    assert halt.detail == ("raising_indicators.batch_window failed: RuntimeError: "
                           "the host module is broken")


@pytest.mark.django_db
def test_resuming_while_an_indicator_answers_none_resumes_and_halts_for_the_indicator(
        indicator, admin_client):
    from django.urls import reverse

    call_command("cleanup_pause", "--policy", POLICY, "--reason", "maintenance",
                 stdout=StringIO())
    call_command("cleanup_dispatch", "--policy", POLICY, stdout=StringIO(), stderr=StringIO())
    indicator["value"] = None

    call_command("cleanup_resume", "--policy", POLICY, stdout=StringIO())

    open_halts = set(Halt.objects.filter(policy=POLICY, ended_at__isnull=True)
                     .values_list("reason", flat=True))
    assert open_halts == {INDICATOR_ERROR}
    # The console's door too: a pause and a resume answer with a redirect, not a 500.
    call_command("cleanup_pause", "--policy", POLICY, "--reason", "again", stdout=StringIO())
    response = admin_client.post(reverse("admin:cleanup_policy_resume", args=[POLICY]))
    assert response.status_code == 302
    assert not Halt.objects.filter(policy=POLICY, reason=Halt.PAUSED,
                                   ended_at__isnull=True).exists()


DEPTHS: list[int] = []


def depth_recorder(policy, connection):
    """Records how many transactions (and savepoints) were open when it was read."""
    DEPTHS.append(len(connection.atomic_blocks))
    return Signal(Level.OK, "depth", None, None, "")


@pytest.mark.django_db(transaction=True)  # the chunk's own transaction must be the outer one
def test_indicators_are_never_read_while_a_chunk_holds_learners_rows(settings, account,
                                                                    chunk_size):
    from cleanup.engine.dispatch import dispatch
    from cleanup.engine.worker import apply_chunk
    from cleanup.models import Chunk

    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.engine.test_indicator_contract.depth_recorder"]
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0  # read at every planning: no cache hides it
    settings.CLEANUP_WINDOW = 1
    chunk_size(POLICY, 1)
    LeaseFactory.create_batch(3, account=account, expired=True)
    run = dispatch(POLICY).run
    DEPTHS.clear()

    while chunk := Chunk.objects.filter(run=run, state__in=Chunk.UNFINISHED).first():
        apply_chunk(chunk.message)  # each commit plans the next chunk

    run.refresh_from_db()
    assert run.chunks_planned == 3 and run.state == Run.State.COMPLETED
    # Read before each chunk's transaction, in a savepoint of its own: never inside it.
    assert DEPTHS and set(DEPTHS) == {1}


def slow_indicator(policy, connection):
    import time

    time.sleep(0.2)
    return Signal(Level.OK, "slow", None, None, "")


@pytest.mark.django_db
def test_an_indicator_slower_than_its_bound_halts_and_says_so(settings, account, monkeypatch):
    monkeypatch.setattr(pressure, "INDICATOR_SECONDS", 0.1)
    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.engine.test_indicator_contract.slow_indicator"]
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0
    pressure.forget()
    LeaseFactory.create_batch(3, account=account, expired=True)

    call_command("cleanup_dispatch", "--policy", POLICY, stdout=StringIO(), stderr=StringIO())

    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    assert halt.reason == INDICATOR_ERROR
    assert halt.detail.startswith("slow_indicator took 0.2 s to answer, more than 0.1 s")
    pressure.forget()
