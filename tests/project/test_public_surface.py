"""The engine's import surface for hosts (issues 36, 45): the engine's own names in
``cleanup.__all__``, the helpers for a host's own commands, pages and metrics in
``cleanup.host.__all__``. Every name resolves to a definition of that very name, never an
alias; importing either module loads no model (a settings module or an AppConfig may
import it before the registry is ready); and the product imports the engine only
through the two."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from importlib import import_module

import pytest

import cleanup
import cleanup.host
from tests.conftest import ROOT, subprocess_env

PRODUCT = ROOT / "reservations"
PUBLIC = {"cleanup": cleanup, "cleanup.host": cleanup.host}


def renamed_in(module) -> set[str]:
    """The names ``module`` binds to another name: ``A = B``, ``from m import B as A``."""
    found = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name | ast.Attribute):
            found |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            found |= {alias.asname for alias in node.names
                      if alias.asname not in (None, alias.name)}
    return found


@pytest.mark.parametrize("public", PUBLIC)
def test_every_public_name_is_importable_under_the_name_it_is_defined_with(public):
    module = PUBLIC[public]
    for name in module.__all__:
        found = getattr(module, name)  # what ``from <public> import <name>`` does
        where, attribute = module._SURFACE[name]
        if attribute is None:
            assert found.__name__ == where and where.rpartition(".")[2] == name, name
            continue
        assert attribute == name, f"{public}.{name} is {where}.{attribute}"
        # A function's or a class's own name; a constant is the attribute read above.
        assert getattr(found, "__name__", name) == name, f"{public}.{name} is {found!r}"
        assert name not in renamed_in(import_module(where)), f"{where}.{name} is an alias"


def test_the_two_surfaces_are_sorted_and_share_no_name():
    for module in PUBLIC.values():
        assert module.__all__ == sorted(set(module.__all__))
        assert set(module.__all__) <= set(dir(module))
    assert set(cleanup.__all__) & set(cleanup.host.__all__) == set()


def test_a_name_outside_the_surface_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'cleanup' has no attribute 'Nope'"):
        cleanup.Nope  # noqa: B018
    with pytest.raises(AttributeError,
                       match="module 'cleanup.host' has no attribute 'Nope'"):
        cleanup.host.Nope  # noqa: B018


@pytest.mark.parametrize("public", PUBLIC)
def test_importing_a_surface_loads_no_model_nor_the_engine(public):
    probe = (f"import sys, {public}; "
             "loaded = sorted(m for m in sys.modules if m.startswith('cleanup.')); "
             f"print(loaded); assert loaded == {sorted({public} - {'cleanup'})}, loaded")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=subprocess_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def engine_imports(path) -> list[str]:
    """The engine modules ``path`` imports below the package root, ``cleanup.host`` aside."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.append(node.module or "")
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [module for module in found
            if module.startswith("cleanup.") and module != "cleanup.host"]


def test_the_product_imports_the_engine_only_through_its_surface():
    # Migrations are history: they keep the paths they were written with.
    deep = {str(path.relative_to(ROOT)): engine_imports(path)
            for path in PRODUCT.rglob("*.py") if "migrations" not in path.parts}
    assert {path: modules for path, modules in deep.items() if modules} == {}
