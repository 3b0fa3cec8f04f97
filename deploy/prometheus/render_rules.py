"""Render the shipped alert rules with the runbook's base URL, so that every rule's
runbook_url is an absolute link an operator can click.

    CLEANUP_RUNBOOK_BASE_URL=https://docs.example.org/seat-holds/docs/operations.md \\
        python deploy/prometheus/render_rules.py --output /etc/prometheus/rules/cleanup.yml

The base is wherever this project's docs/operations.md is served (a Git host's page of
it, an internal docs site): each alert's anchor is its heading under "Alerts and what to
do" there. ``--base-url`` overrides the environment. Nothing is written when the base is
missing, is not an absolute http(s) URL, or is the README (the alerts' headings are not
there). Standard library only: it runs where Prometheus is configured, without the app.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

PLACEHOLDER = "${CLEANUP_RUNBOOK_BASE_URL}"
# The page whose headings the rules' anchors name.
RUNBOOK_PAGE = "docs/operations.md"
TEMPLATE = Path(__file__).with_name("cleanup-alerts.yml")


class BadBase(ValueError):
    """The runbook's base URL is missing or cannot make an absolute link."""


def check_base(base: str | None) -> str:
    """Return the base, stripped; refuse one that is missing, relative, not http(s) or
    the README."""
    base = (base or "").strip()
    if not base:
        raise BadBase("CLEANUP_RUNBOOK_BASE_URL is not set: give the address where "
                      f"{RUNBOOK_PAGE} is served (or --base-url)")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadBase(f"runbook base {base!r} is not an absolute http(s) URL")
    if parts.fragment or base.endswith("#"):
        raise BadBase(f"runbook base {base!r} has an anchor; each rule adds its own")
    if parts.path.rstrip("/").rsplit("/", 1)[-1].lower() == "readme.md":
        # Every anchor would be dead: a base set when the runbook was in the README.
        raise BadBase(f"runbook base {base!r} is the README; the alerts' headings are in "
                      f"{RUNBOOK_PAGE}: give the address where that page is served")
    return base


def render(template: str, base: str) -> str:
    """The rules with every runbook link made absolute under ``base``."""
    base = check_base(base)
    if PLACEHOLDER not in template:
        raise BadBase(f"the template names no {PLACEHOLDER}: nothing to render")
    return template.replace(PLACEHOLDER, base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("CLEANUP_RUNBOOK_BASE_URL"),
                        help=f"Where {RUNBOOK_PAGE} is served "
                             "(default: $CLEANUP_RUNBOOK_BASE_URL).")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    parser.add_argument("--output", type=Path, help="File to write (default: stdout).")
    args = parser.parse_args(argv)
    try:
        rules = render(args.template.read_text(), args.base_url)
    except (BadBase, OSError) as exc:
        print(f"render_rules: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(rules)
    else:
        args.output.write_text(rules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
