"""What pytest runs with: the development settings plus the engine's own test app
(tests/engine_app), which manage.py and `make demo` never load."""

from config.dev_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.engine_app"]  # noqa: F405
