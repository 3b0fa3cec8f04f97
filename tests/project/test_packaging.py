"""The engine as a host project meets it: its wheel, built and installed non-editable into a
fresh virtualenv by the README's two commands, beside a minimal project of the test's own
(settings, one model, one policy), migrates, dispatches and applies a run, and renders
the console's pages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
import zipfile

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT
from tests.project.test_project import section

pytestmark = pytest.mark.wheel

# Where the README's commands name the reader's checkout.
CHECKOUT = "/path/to/seat-hold-cleanup"

HOST_SETTINGS = '''
import os
SECRET_KEY = "host-project-test"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django.contrib.staticfiles",
    "django_q", "cleanup", "tokens",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "hostsite.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages"]},
}]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": os.environ["HOST_DB_NAME"],
    "USER": os.environ["HOST_DB_USER"], "HOST": os.environ["HOST_DB_HOST"],
    "PORT": os.environ["HOST_DB_PORT"],
}}
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
Q_CLUSTER = {"name": "host", "orm": "default", "retry": 180, "timeout": 120,
             "catch_up": False, "max_attempts": 0}
'''

HOST_FILES = {
    "manage.py": '''
        import os, sys
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
        from django.core.management import execute_from_command_line
        execute_from_command_line(sys.argv)
    ''',
    "hostsite/__init__.py": "",
    "hostsite/urls.py": '''
        from django.contrib import admin
        from django.urls import include, path
        urlpatterns = [path("admin/", admin.site.urls), path("", include("cleanup.urls"))]
    ''',
    "tokens/__init__.py": "",
    "tokens/models.py": '''
        from django.db import models
        class Token(models.Model):
            expires_at = models.DateTimeField()
    ''',
    "tokens/apps.py": '''
        from django.apps import AppConfig
        from django.db.models import Q

        def expired(cutoff):
            return Q(expires_at__lte=cutoff)

        class TokensConfig(AppConfig):
            name = "tokens"
            def ready(self):
                from cleanup.policies import Policy, register_policy
                register_policy(Policy(name="expire-tokens", model_label="tokens.Token",
                                       eligible=expired, observed_field="expires_at",
                                       partition_field=None, scheme="range",
                                       chunk_size=2))
    ''',
    "tokens/migrations/__init__.py": "",
    "tokens/migrations/0001_initial.py": '''
        from django.db import migrations, models
        class Migration(migrations.Migration):
            initial = True
            operations = [migrations.CreateModel(name="Token", fields=[
                ("id", models.BigAutoField(primary_key=True)),
                ("expires_at", models.DateTimeField())])]
    ''',
}

HOST_CHECK = '''
import json, cleanup
from datetime import timedelta
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from cleanup.models import Run
from tokens.models import Token
now = timezone.now()
Token.objects.bulk_create([Token(expires_at=now - timedelta(hours=1)) for _ in range(5)]
                          + [Token(expires_at=now + timedelta(hours=1))])
from django.core.management import call_command
from io import StringIO
out = StringIO()
call_command("cleanup_dispatch", "--policy", "expire-tokens", "--sync", "--json", stdout=out)
run = json.loads(out.getvalue())
User.objects.create_superuser("op", "op@example.com", "pw")
client = Client()
client.login(username="op", password="pw")
overview = client.get("/admin/cleanup/cleanupoverview/")
other = Run.objects.create(policy="expire-tokens", dispatch_key="k", cutoff=now,
                           scheme="range", trigger="command")
confirm = client.post("/admin/cleanup/run/", {"action": "cancel_runs",
                                               "_selected_action": [str(other.pk)]})
print(json.dumps({
    "engine_from": cleanup.__file__, "state": run["state"], "left": Token.objects.count(),
    "overview": [overview.status_code, "expire-tokens" in overview.content.decode()],
    "confirmation": [confirm.status_code, "Cancel runs" in confirm.content.decode()],
}))
'''


@pytest.fixture
def host_database(db):
    """A database of the host project's own, on the tests' PostgreSQL server."""
    settings = connection.settings_dict
    name = f"host_{uuid.uuid4().hex[:12]}"
    server = {"host": settings["HOST"] or "127.0.0.1", "port": settings["PORT"] or 5432,
              "user": settings["USER"] or "root", "dbname": "postgres"}
    with psycopg.connect(**server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield {"HOST_DB_NAME": name, "HOST_DB_USER": server["user"],
           "HOST_DB_HOST": server["host"], "HOST_DB_PORT": str(server["port"])}
    with psycopg.connect(**server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def readme_wheel_commands() -> tuple[str, str]:
    """The README's commands that build the engine's wheel from a checkout and install it."""
    text = section(ROOT / "README.md", "Install the engine in your project")
    build, install = re.findall(r"`(python -m pip (?:wheel|install dist/)[^`]+)`", text)
    return build, install


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    return result


def test_the_wheel_works_installed_into_a_host_project_of_its_own(tmp_path, host_database):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    # The README's commands as a reader runs them, the virtualenv active, in one directory;
    # without a PYTHONPATH into the checkout, whose egg-info the build leaves there (pip
    # would take it for the engine installed already).
    active = {**{name: value for name, value in os.environ.items() if name != "PYTHONPATH"},
              "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    build, install = readme_wheel_commands()
    assert CHECKOUT in build
    run("bash", "-c", build.replace(CHECKOUT, str(ROOT)), cwd=tmp_path, env=active)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert f"dist/{wheel.name}" in install  # the file the build wrote, named as it is
    names = zipfile.ZipFile(wheel).namelist()
    # The engine only: no host project (config) and no product app beside it.
    tops = {name.split("/")[0] for name in names}
    assert "cleanup" in tops and all(top.endswith(".dist-info") for top in tops - {"cleanup"})
    assert "cleanup/templates/admin/cleanup/cleanupoverview/overview.html" in names
    run("bash", "-c", install, cwd=tmp_path, env=active)

    host = tmp_path / "host"
    for path, text in {**HOST_FILES, "hostsite/settings.py": HOST_SETTINGS}.items():
        (host / path).parent.mkdir(parents=True, exist_ok=True)
        (host / path).write_text(textwrap.dedent(text).lstrip())
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", **host_database}
    run(python, "manage.py", "check", cwd=host, env=env)
    run(python, "manage.py", "migrate", "--verbosity", "0", cwd=host, env=env)
    checked = run(python, "manage.py", "shell", "-c", HOST_CHECK, cwd=host, env=env)

    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert report["engine_from"].startswith(str(venv))  # the installed wheel, not the tree
    assert (report["state"], report["left"]) == ("completed", 1)
    assert report["overview"] == [200, True]
    assert report["confirmation"] == [200, True]
