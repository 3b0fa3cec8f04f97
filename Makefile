# The commands a newcomer needs: `make demo`, `make serve` and `make test`.
# Each creates .venv and installs the project into it on first use.

VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install lint test demo serve bench soak public-surface

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[site,test]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The slow kinds (README, Tests): the fast part runs first, then these. BEFORE_SLOW is a
# command run between the two (CI waits there for the parts it runs beside this one);
# SLOW_APART, slow kinds the caller runs elsewhere (CI runs the live Prometheus tests
# beside the fast parts: .ci/run).
SLOW := qcluster or browser or soak or bench or prometheus or wheel or pooler
BEFORE_SLOW ?= true
SLOW_APART ?=

test: lint
	$(VENV)/bin/pytest -m "not ($(SLOW))"
	$(BEFORE_SLOW)
	$(VENV)/bin/pytest -m "($(SLOW))$(if $(SLOW_APART), and not ($(SLOW_APART)))"

demo: $(STAMP)
	$(PYTHON) manage.py migrate --verbosity 0
	$(PYTHON) manage.py run_demo --noinput

# The admin console on http://127.0.0.1:8000/admin/ (create a user first with
# `.venv/bin/python manage.py createsuperuser`); run `make demo` before for data.
# gunicorn serves the app and WhiteNoise its static files, as in production. It serves
# pages only: cleanup_ready first says in one line whether the schedules are installed
# and a qcluster takes work, and what to run if not.
SERVE_ADDRESS ?= 127.0.0.1:8000
serve: $(STAMP)
	$(PYTHON) manage.py migrate --verbosity 0
	$(PYTHON) manage.py collectstatic --noinput --verbosity 0
	$(PYTHON) manage.py cleanup_ready
	$(VENV)/bin/gunicorn config.wsgi --bind $(SERVE_ADDRESS) --workers 2 --access-logfile -

# Development tools (config.devtools, installed only by config.dev_settings): the
# benchmark of docs/performance.md and the fault-injection soak. Give
# them a database of their own: both delete all reservation data first.
DEV := DJANGO_SETTINGS_MODULE=config.dev_settings
bench: $(STAMP)
	$(DEV) $(PYTHON) manage.py migrate --verbosity 0
	$(DEV) $(PYTHON) manage.py cleanup_bench --preset $(or $(PRESET),large)

soak: $(STAMP)
	$(DEV) $(PYTHON) manage.py migrate --verbosity 0
	$(DEV) $(PYTHON) manage.py cleanup_soak --duration $(or $(DURATION),600) --min-faults 10

# The public surface of the version in pyproject.toml, recorded once CHANGELOG.md names
# every change since the last record (tests/project/test_changelog.py checks that first).
public-surface: $(STAMP)
	WRITE_PUBLIC_SURFACE=1 $(VENV)/bin/pytest -q tests/project/test_changelog.py
