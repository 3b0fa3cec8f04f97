"""The product's raw SQL is fixed text with bound parameters, as the engine's is
(tests/console/test_security.py says what counts as fixed)."""

from __future__ import annotations

from tests.console.test_security import raw_sql_checked_in


def test_no_sql_is_assembled_from_input():
    assert raw_sql_checked_in("reservations") >= 6
