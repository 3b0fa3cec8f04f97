"""Read the git history for tests/recorded/record.py: files as a commit had them, and
every task path and Schedule row a commit's own code (not its tests) wrote."""

from __future__ import annotations

import ast
import json
import re
import subprocess

from tests.recorded import HERE

ROOT = HERE.parent.parent


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def full(commit: str) -> str:
    return git("rev-parse", commit).strip()


def source(commit: str, *paths: str) -> tuple[str, str]:
    """The first of ``paths`` that exists at ``commit``, and its text."""
    for path in paths:
        try:
            return path, git("show", f"{commit}:{path}")
        except subprocess.CalledProcessError:
            continue
    raise FileNotFoundError(f"none of {paths} at {commit}")


# What names a task path in a commit's own code: a *_TASK constant, a schedule's or an
# engine schedule's func, register_task's func, async_task's first argument.
PATH_LITERAL = re.compile(r'"((?:cleanup|reservations|config)\.[\w.]+)"')


def paths_in(commit: str) -> dict[str, set[str]]:
    """The dotted paths ``commit`` queues tasks under or installs schedules for."""
    found: dict[str, set[str]] = {}
    listed = git("grep", "-l", "-E", "async_task|_TASK|register_task|_SCHEDULES|SENDER",
                 commit, "--", "*.py", ":!tests", ":!*/migrations/*")
    for path in (line.split(":", 1)[1] for line in listed.split()):
        text = git("show", f"{commit}:{path}")
        for node in ast.walk(ast.parse(text)):
            for role, literal in _roles(node):
                if PATH_LITERAL.fullmatch(f'"{literal}"'):
                    found.setdefault(literal, set()).add(f"{role} ({path})")
    return found


def _roles(node: ast.AST):
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
            node.targets[0], ast.Name):
        name = node.targets[0].id
        if name.endswith("_TASK") and isinstance(node.value, ast.Constant):
            yield ("schedule func" if name == "DISPATCH_TASK" else "queued task"), node.value.value
        if name in ("ENGINE_SCHEDULES", "SENDER") or name.endswith("_SCHEDULES"):
            values = node.value.values if isinstance(node.value, ast.Dict) else [node.value]
            for value in values:
                if isinstance(value, ast.Constant):
                    yield ("schedule func" if name != "SENDER" else "queued task"), value.value
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        called = getattr(node.func, "id", getattr(node.func, "attr", ""))
        if called == "async_task":
            yield "queued task", node.args[0].value
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "register_task" and len(
            node.args) >= 2 and isinstance(node.args[1], ast.Constant):
        yield "schedule func", node.args[1].value


# Paths no longer importable on purpose: queued only by the benchmark, which refuses a
# database with cleanup schedules (config/devtools/wipe.py), so never by a deployment.
DEV_ONLY = {
    "reservations.bench.tasks.expire_one": "the benchmark's one-task-per-row contender, "
    "moved to config.devtools.bench.tasks in c7441e9; only ever queued into a bench database",
    "reservations.bench.tasks.ready": "the benchmark's readiness probe, moved with it",
}


def record_task_paths() -> None:
    commits = git("rev-list", "--reverse", "HEAD").split()
    seen: dict[str, dict] = {}
    for commit in commits:
        for path, roles in paths_in(commit).items():
            entry = seen.setdefault(path, {"first_commit": commit, "roles": set()})
            entry["last_commit"] = commit
            entry["roles"] |= roles
    document = {
        "about": "Every dotted path a release queued a task under (async_task, django-q2 "
                 "stores it in the queued task) or installed a django-q2 Schedule for, with "
                 "the first and last commit whose own code (not its tests) named it.",
        "head": full("HEAD"),
        "paths": {
            path: {"first_commit": entry["first_commit"], "last_commit": entry["last_commit"],
                   "roles": sorted(entry["roles"]),
                   **({"not_kept_importable": DEV_ONLY[path]} if path in DEV_ONLY else {})}
            for path, entry in sorted(seen.items())
        },
    }
    (HERE / "task_paths.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {(HERE / 'task_paths.json').relative_to(ROOT)} ({len(seen)} paths)")


def constants(text: str) -> dict:
    """A module's top-level NAME = "text" assignments."""
    found = {}
    for node in ast.parse(text).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)):
            found[node.targets[0].id] = node.value.value
    return found


def calls(text: str, name: str):
    return [node for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == name]


def schedule_rows(commit: str) -> list[dict]:
    """The Schedule rows ``cleanup_schedule`` installed at ``commit``: one dispatch per
    scheduled policy (func DISPATCH_TASK, kwargs repr({'policy': name}), the slot passed
    as ``scheduled_for``: so since the first commit), then the engine's and the host's
    tasks (no kwargs)."""
    try:
        _, text = source(commit, "cleanup/scheduling/schedules.py", "cleanup/schedules.py")
    except FileNotFoundError:
        return []
    dispatch_task = constants(text)["DISPATCH_TASK"]
    rows = []
    for module in ("reservations/policies.py", "cleanup/retention.py"):
        try:
            _, policies = source(commit, module)
        except FileNotFoundError:
            continue
        names = constants(policies)
        for call in calls(policies, "Policy"):
            given = {k.arg: k.value for k in call.keywords}
            if "schedule" not in given or (isinstance(given["schedule"], ast.Constant)
                                           and given["schedule"].value is None):
                continue
            policy = names[given["name"].id] if isinstance(given["name"], ast.Name) \
                else given["name"].value
            rows.append({"name": f"cleanup:{policy}", "func": dispatch_task,
                         "kwargs": repr({"policy": policy}),
                         "intended_date_kwarg": "scheduled_for"})
    for node in ast.parse(text).body:
        if (isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", "") == "ENGINE_SCHEDULES"):
            for name, func in ast.literal_eval(node.value).items():
                rows.append({"name": f"cleanup:{name}", "func": func, "kwargs": None,
                             "intended_date_kwarg": None})
    try:
        _, apps = source(commit, "reservations/apps.py")
    except FileNotFoundError:
        apps = ""
    for call in calls(apps, "register_task"):
        name, func = (arg.value for arg in call.args[:2])
        rows.append({"name": f"cleanup:{name}", "func": func, "kwargs": None,
                     "intended_date_kwarg": None})
    return rows


def record_schedules() -> None:
    seen: dict[str, dict] = {}
    for commit in git("rev-list", "--reverse", "HEAD").split():
        for row in schedule_rows(commit):
            key = json.dumps(row, sort_keys=True)
            seen.setdefault(key, {**row, "first_commit": commit})["last_commit"] = commit
    document = {
        "about": "Every django-q2 Schedule row cleanup_schedule installed (schedule_type "
                 "cron, repeats -1), as each commit's schedules module wrote it, with the "
                 "first and last commit that did.",
        "schedules": sorted(seen.values(), key=lambda row: row["name"]),
    }
    (HERE / "schedules.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {(HERE / 'schedules.json').relative_to(ROOT)} ({len(seen)} rows)")
