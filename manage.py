#!/usr/bin/env python
"""Django's command-line utility for this project."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import OperationalError

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # Configuration mistakes (no DATABASE_URL where no embedded server can run, a
        # missing production secret) deserve one line, not a traceback.
        sys.exit(f"Configuration error: {exc}")
    except OperationalError as exc:
        # So does a DATABASE_URL that parses but names a server or database that is not
        # there, whatever the command (migrate, qcluster, ...); a statement that fails
        # once connected keeps its traceback.
        from cleanup.management.base import connection_failure

        problem = connection_failure(exc)
        if problem is None or "--traceback" in sys.argv:
            raise
        sys.exit(f"Database error: {problem}")


if __name__ == "__main__":
    main()
