"""The message validator under arbitrary input: every message is either well-typed or
dead-lettered with a reason; nothing raises out of the task."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cleanup.engine.dispatch import dispatch
from cleanup.engine.messages import ChunkMessage, parse
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, OrphanMessage
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(raw=json_values | st.binary(max_size=40))
def test_arbitrary_input_is_dead_lettered_never_raised(raw):
    assert apply_chunk(raw) == Outcome.DEAD_LETTERED
    assert OrphanMessage.objects.filter(error__gt="").exists()


@pytest.fixture
def planned():
    LeaseFactory.create_batch(2, expired=True)
    return dispatch("expire-leases").run.chunks.get()


@FUZZ
@given(key=st.sampled_from(["version", "run_id", "chunk_id", "policy", "cutoff", "items"]),
       replacement=json_values)
@example(key="chunk_id", replacement=2**31)  # past the ledger's integer: once raised
def test_near_miss_messages_validate_or_are_dead_lettered(planned, key, replacement):
    message = {**planned.message, key: replacement}
    try:
        parsed = parse(message)
    except Exception as exc:  # noqa: BLE001 - the only allowed failure is MalformedMessage
        assert type(exc).__name__ == "MalformedMessage", exc
        parsed = None
    if parsed is not None:
        assert isinstance(parsed, ChunkMessage)
        assert isinstance(parsed.chunk_id, int) and parsed.cutoff.utcoffset() is not None

    outcome = apply_chunk(message)

    if parsed is not None and message == planned.message:
        assert outcome in (Outcome.DELETED, Outcome.NOOP)
    elif outcome != Outcome.NOOP:  # a dead-lettered chunk takes later copies as no-ops
        assert outcome == Outcome.DEAD_LETTERED
    chunk = Chunk.objects.get(pk=planned.pk)
    assert chunk.state != Chunk.State.RETRYING  # nothing is left to retry forever
    assert Lease.objects.count() in (0, 2)
