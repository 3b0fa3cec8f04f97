"""No state lives on a database session (invariant 11), in the product's code: the
engine's half and the detector are in tests/console/test_session_state.py."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.console.test_session_state import modules, session_scoped_sql


def test_no_sql_in_the_project_outlives_its_transaction():
    product_modules = modules([ROOT / "reservations"], [ROOT / "reservations" / "migrations"])
    assert product_modules and session_scoped_sql(product_modules) == []
