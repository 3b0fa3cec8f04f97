"""What the engine's own tests run with where only the engine is installed (.ci/engine):
the engine alone (tests/engine_only_settings.py) plus its test app (tests/engine_app)."""

from tests.engine_only_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.engine_app"]  # noqa: F405
