#!/usr/bin/env python
"""Django's command-line utility for this project."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # Configuration mistakes (no DATABASE_URL where no embedded server can run, a
        # missing production secret) deserve one line, not a traceback.
        sys.exit(f"Configuration error: {exc}")


if __name__ == "__main__":
    main()
