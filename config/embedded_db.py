"""Start the private PostgreSQL of the default profile when no DATABASE_URL is set."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

NO_WHEEL_MESSAGE = (
    "No embedded PostgreSQL for Python {major}.{minor} (pgserver has no wheel for it): "
    "set DATABASE_URL to a PostgreSQL server."
)


def embedded_database(data_dir: Path) -> dict:
    """Start (or reuse) the server under data_dir and return its DATABASES entry."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns about a missing XDG_RUNTIME_DIR when run as root.
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:
        raise ImproperlyConfigured(
            NO_WHEEL_MESSAGE.format(major=sys.version_info[0], minor=sys.version_info[1])
        ) from exc
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None keeps the server up after this process exits, so a qcluster,
    # a runserver and management commands started one after another share it.
    server = pgserver.get_server(data_dir, cleanup_mode=None)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "HOST": str(server.pgdata),
    }
