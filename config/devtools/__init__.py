"""Development tools of this repository: the benchmark and the soak. Installed only by
config.dev_settings (the tests, `make bench`, `make soak`), never in production."""

from pathlib import Path

# The project's manage.py, which the tools start their qclusters and commands with.
MANAGE = Path(__file__).resolve().parents[2] / "manage.py"
