"""The project's settings plus its development tools (cleanup_bench, cleanup_soak): what
the tests, `make bench` and `make soak` run with. Production uses config.settings."""

from config.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "config.devtools"]  # noqa: F405
