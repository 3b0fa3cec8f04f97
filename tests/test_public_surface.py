"""The engine's import surface for hosts (issue 36): every name in ``cleanup.__all__``
resolves, importing ``cleanup`` loads no model (a settings module or an AppConfig may
import it before the registry is ready), and the product imports the engine only
through it."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

import cleanup
from tests.conftest import ROOT, subprocess_env

PRODUCT = ROOT / "reservations"


def test_every_public_name_resolves_to_what_its_module_defines():
    from cleanup.outbox import register
    from cleanup.policies import Policy
    from cleanup.policies import register as register_policy

    resolved = {name: getattr(cleanup, name) for name in cleanup.__all__}
    assert all(value is not None for value in resolved.values())
    assert resolved["Policy"] is Policy
    assert resolved["register_policy"] is register_policy
    assert resolved["register_handler"] is register
    assert sorted(cleanup.__all__) == cleanup.__all__ and len(set(cleanup.__all__)) == len(
        cleanup.__all__)


def test_a_name_outside_the_surface_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'cleanup' has no attribute 'Nope'"):
        cleanup.Nope  # noqa: B018


def test_importing_cleanup_loads_no_model_nor_the_engine():
    probe = ("import sys, cleanup; "
             "loaded = sorted(m for m in sys.modules if m.startswith('cleanup.')); "
             "print(loaded); assert loaded == [], loaded")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=subprocess_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def engine_imports(path) -> list[str]:
    """The engine modules ``path`` imports below the package root."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cleanup."):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("cleanup.")]
    return found


def test_the_product_imports_the_engine_only_through_its_surface():
    # Migrations are history: they keep the paths they were written with.
    deep = {str(path.relative_to(ROOT)): engine_imports(path)
            for path in PRODUCT.rglob("*.py") if "migrations" not in path.parts}
    assert {path: modules for path, modules in deep.items() if modules} == {}
