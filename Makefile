# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates .venv and installs the project into it on first use.

VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install lint test demo serve

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[site,test]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint
	$(VENV)/bin/pytest

demo: $(STAMP)
	$(PYTHON) manage.py migrate --verbosity 0
	$(PYTHON) manage.py run_demo --noinput

# The admin console on http://127.0.0.1:8000/admin/ (create a user first with
# `.venv/bin/python manage.py createsuperuser`); run `make demo` before for data.
# gunicorn serves the app and WhiteNoise its static files, as in production.
SERVE_ADDRESS ?= 127.0.0.1:8000
serve: $(STAMP)
	$(PYTHON) manage.py migrate --verbosity 0
	$(PYTHON) manage.py collectstatic --noinput --verbosity 0
	$(VENV)/bin/gunicorn config.wsgi --bind $(SERVE_ADDRESS) --workers 2 --access-logfile -
