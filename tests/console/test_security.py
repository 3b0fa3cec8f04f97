"""Who may do what in the console, CSRF, and the production profile."""

from __future__ import annotations

import secrets
import subprocess
import sys

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import ROOT, subprocess_env
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db

ACTION_PERMS = ["replay", "requeue", "discard", "dispatch", "cancel"]
ROLES = ["anonymous", "staff", "support", *ACTION_PERMS, "superuser"]


def login(client: Client, role: str) -> None:
    if role == "anonymous":
        return
    if role == "superuser":
        user = User.objects.create_superuser("root", "root@example.org", "pw")
    else:
        user = User.objects.create_user(role, password="pw", is_staff=True)
        codenames = [] if role == "staff" else ["view_run", "view_chunk"]
        if role in ACTION_PERMS:
            codenames.append(role)
        user.user_permissions.set(Permission.objects.filter(
            content_type__app_label="cleanup", codename__in=codenames))
    client.force_login(user)


@pytest.fixture
def world(account):
    """A running run with an enqueued chunk, and a finished one with a dead letter."""
    LeaseFactory.create_batch(2, account=account, expired=True)
    dead = dispatch("expire-leases").run.chunks.get()
    apply_chunk({**dead.message, "version": 7})
    LeaseFactory(account=account, expired=True)
    running = dispatch("expire-leases", key="running").run
    OrmQ.objects.all().delete()
    return {"dead": Chunk.objects.get(pk=dead.pk), "running": running}


def snapshot() -> tuple:
    return (sorted(Chunk.objects.values_list("pk", "state", "discard_reason")),
            sorted(Run.objects.values_list("pk", "state")), OrmQ.objects.count())


def attempts(world) -> dict:
    """For each permission, the forged request that would use it."""
    dead, running = world["dead"], world["running"]
    chunks = reverse("admin:cleanup_chunk_changelist")
    runs = reverse("admin:cleanup_run_changelist")
    replay_url = reverse("admin:cleanup_run_replay", args=[dead.run_id])
    return {
        "replay": (replay_url, {"cutoff": timezone.now().isoformat(), "_confirm": "1"}),
        "requeue": (chunks, {"action": "requeue_chunks", "_selected_action": [dead.pk]}),
        "discard": (chunks, {"action": "discard_chunks", "_selected_action": [dead.pk],
                             "post": "yes", "reason": "x"}),
        "dispatch": (reverse("admin:cleanup_run_dispatch"),
                     {"policy": "expire-leases", "confirm_key": "6f1c1a58-5cb0-4a55-8a39"
                      "-0f25b8f6f1d1", "_confirm": "1"}),
        "cancel": (runs, {"action": "cancel_runs", "_selected_action": [running.pk],
                          "post": "yes"}),
    }


@pytest.mark.parametrize("role", ROLES)
def test_each_action_is_allowed_exactly_to_its_permission(client, world, role):
    login(client, role)
    for perm, (url, data) in attempts(world).items():
        before = snapshot()
        response = client.post(url, data)
        allowed = role in (perm, "superuser")
        if allowed:
            assert response.status_code in (200, 302), (perm, response.status_code)
        elif role == "anonymous":
            assert response.status_code == 302 and "/login/" in response["Location"]
            assert snapshot() == before
        else:
            assert response.status_code == 403, (perm, role, response.status_code)
            assert snapshot() == before, (perm, role)


PAGES = {
    "runs": lambda w: reverse("admin:cleanup_run_changelist"),
    "run": lambda w: reverse("admin:cleanup_run_change", args=[w["running"].pk]),
    "chunks": lambda w: reverse("admin:cleanup_chunk_changelist"),
    "chunk": lambda w: reverse("admin:cleanup_chunk_change", args=[w["dead"].pk]),
    "overview": lambda w: reverse("admin:cleanup_cleanupoverview_changelist"),
    "orphans": lambda w: reverse("admin:cleanup_orphanmessage_changelist"),
}


@pytest.mark.parametrize("role", ROLES)
def test_pages_are_readable_by_viewers_only(client, world, role):
    login(client, role)
    for name, url in PAGES.items():
        response = client.get(url(world))
        if role == "anonymous":
            assert response.status_code == 302, name
        elif role == "staff" or (role != "superuser" and name == "orphans"):
            assert response.status_code == 403, (name, role)
        else:
            assert response.status_code == 200, (name, role)


def test_csrf_is_enforced_on_actions(world):
    client = Client(enforce_csrf_checks=True)
    login(client, "superuser")
    before = snapshot()
    url, data = attempts(world)["requeue"]
    assert client.post(url, data).status_code == 403
    assert snapshot() == before


def test_production_profile_passes_the_deploy_checks():
    env = subprocess_env(DJANGO_PROFILE="production", DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
                         DJANGO_ALLOWED_HOSTS="cleanup.example.org",
                         METRICS_ALLOWED_NETWORKS="10.0.0.0/8")
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_profile_refuses_to_start_without_a_secret_key():
    env = subprocess_env(DJANGO_PROFILE="production")
    env.pop("DJANGO_SECRET_KEY", None)
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Configuration error: DJANGO_SECRET_KEY is required in the production profile.")


def test_no_sql_is_assembled_from_input():
    """Raw SQL (execute and executemany) is fixed text with bound parameters: no
    %-formatting, and f-strings interpolate nothing but table names from model metadata
    or module constants that are themselves fixed text. SQL passed by name is followed
    to what the module binds to that name."""
    assert raw_sql_checked_in("cleanup") >= 6


def raw_sql_checked_in(package: str) -> int:
    """Check each raw statement of ``package`` is fixed SQL; return how many there are."""
    import ast

    executes = 0
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        assigned: dict[str, list] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
                    elif isinstance(target, ast.Tuple) and target.elts and isinstance(
                            target.elts[0], ast.Name):
                        # sql, params = ...: the SQL is the first of what the call returns.
                        assigned.setdefault(target.elts[0].id, []).append(node.value)
            if isinstance(node, ast.FunctionDef):
                # What a function returns, by its name: an ORM compiler's SQL is fixed.
                for returned in ast.walk(node):
                    if isinstance(returned, ast.Return) and returned.value is not None:
                        assigned.setdefault(f"{node.name}()", []).append(returned.value)
        # A parameter is followed to the arguments every call in the module passes it.
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            names = [arg.arg for arg in function.args.args]
            for call in ast.walk(tree):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == function.name:
                    for name, value in zip(names, call.args, strict=False):
                        assigned.setdefault(name, []).append(value)
                    for keyword in call.keywords:
                        assigned.setdefault(keyword.arg, []).append(keyword.value)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call)
                    and getattr(node.func, "attr", "") in ("execute", "executemany")
                    and node.args):
                continue
            if isinstance(node.func.value, ast.Call) and getattr(
                    node.func.value.func, "id", "") == "super":
                continue  # a management command's own execute(), not SQL
            executes += 1
            assert _fixed_sql(node.args[0], assigned), f"{path}:{node.lineno}"
    return executes


def _fixed_sql(node, assigned, depth=0) -> bool:
    import ast

    if depth > 8:  # deep enough for a statement built in steps
        return False
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(part, ast.Constant) or _fixed_name(part.value, assigned, depth)
                   for part in node.values)
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, ast.Add) and all(
            _fixed_sql(side, assigned, depth + 1) for side in (node.left, node.right))
    if isinstance(node, ast.Name):
        return node.id in assigned and all(
            _fixed_sql(value, assigned, depth + 1) for value in assigned[node.id])
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "replace":
        return _fixed_sql(node.func.value, assigned, depth + 1) and all(
            _fixed_sql(arg, assigned, depth + 1) for arg in node.args)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "format":
        return (not node.args and _fixed_sql(node.func.value, assigned, depth + 1)
                and all(_fixed_name(k.value, assigned, depth) for k in node.keywords))
    if isinstance(node, ast.IfExp):
        return all(_fixed_sql(side, assigned, depth + 1) for side in (node.body, node.orelse))
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("as_sql",
                                                                         "sql_with_params"):
        return True  # compiled by the ORM from a queryset: its values are bound parameters
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "mogrify":
        # The driver quotes the parameters into fixed SQL: fixed if the SQL is.
        return bool(node.args) and _fixed_sql(node.args[0], assigned, depth + 1)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        returns = assigned.get(f"{node.func.id}()", [])
        return bool(returns) and all(_fixed_sql(value, assigned, depth + 1)
                                     for value in returns)
    return False


def _fixed_name(node, assigned, depth) -> bool:
    """What an f-string may interpolate: a table name from model metadata, or fixed text."""
    import ast

    if ast.unparse(node).endswith("_meta.db_table"):
        return True
    if isinstance(node, ast.IfExp):
        return all(_fixed_name(side, assigned, depth + 1) for side in (node.body, node.orelse))
    if isinstance(node, ast.Name) and depth < 8:
        return node.id in assigned and all(
            _fixed_name(value, assigned, depth + 1) for value in assigned[node.id])
    return _fixed_sql(node, assigned, depth + 1)
