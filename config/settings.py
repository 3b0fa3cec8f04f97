"""Settings, driven by the environment.

Two profiles. The default one needs nothing but an optional DATABASE_URL (without
it an embedded PostgreSQL starts under .data/, except for a command's help, which reads
no database); it has an insecure development key
and DEBUG off. DJANGO_PROFILE=production requires DJANGO_SECRET_KEY and
DJANGO_ALLOWED_HOSTS and turns on secure cookies.

A variable that cannot be read raises ImproperlyConfigured naming it; manage.py prints
that as one line and exits non-zero.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.embedded_db import NOT_STARTED, embedded_database, only_help
from config.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

PROFILE = os.environ.get("DJANGO_PROFILE", "default")
if PROFILE not in {"default", "production"}:
    raise ImproperlyConfigured(f"DJANGO_PROFILE must be 'default' or 'production', not {PROFILE!r}")
PRODUCTION = PROFILE == "production"


def _env_number(name: str, default, kind=float):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ImproperlyConfigured(f"{name} must be {what}, not {value!r}") from None


def _env_list(name: str) -> list[str]:
    """A comma-separated variable, each entry stripped, empty entries dropped."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


DEBUG = False
if PRODUCTION:
    SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
    if not SECRET_KEY:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is required in the production profile.")
    ALLOWED_HOSTS = _env_list("DJANGO_ALLOWED_HOSTS")
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured(
            "DJANGO_ALLOWED_HOSTS is required in the production profile "
            "(comma-separated host names, e.g. cleanup.example.edu)."
        )
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_SSL_REDIRECT = os.environ.get("DJANGO_SSL_REDIRECT", "1") != "0"
    SECURE_HSTS_SECONDS = _env_number("DJANGO_HSTS_SECONDS", 31_536_000, int)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    X_FRAME_OPTIONS = "DENY"
    if os.environ.get("DJANGO_BEHIND_TLS_PROXY"):
        # The proxy terminates TLS and says so in this header.
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # /metrics: the networks allowed to scrape (comma-separated CIDRs) and/or a token.
    # System check cleanup.E007 refuses an entry that is not a network.
    CLEANUP_METRICS_ALLOWED_NETWORKS = _env_list("METRICS_ALLOWED_NETWORKS")
    CLEANUP_METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
else:
    SECRET_KEY = "insecure-development-key-do-not-use-in-production"
    ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "django_q",
    "cleanup",
    "reservations",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS and JS) from STATIC_ROOT, whatever serves the app.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if os.environ.get("DATABASE_URL", "").strip():
    try:
        _database = dj_database_url.parse(os.environ["DATABASE_URL"].strip())
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"DATABASE_URL cannot be read ({exc}); expected postgres://user@host:port/name"
        ) from None
elif only_help(sys.argv):
    # `manage.py COMMAND --help` must not start (and leave running) a server it never uses.
    _database = dict(NOT_STARTED)
else:
    _database = embedded_database(BASE_DIR / ".data")
# Persistent connections with health checks, and no psycopg pool: qcluster forks its
# workers, and a pool inherited across fork hands one socket to several processes.
_database.update(CONN_MAX_AGE=60, CONN_HEALTH_CHECKS=True)
_pooler = os.environ.get("DATABASE_POOLER", "").strip().lower()
if _pooler not in ("", "none", "transaction"):
    raise ImproperlyConfigured(
        f"DATABASE_POOLER is {_pooler!r}; expected 'transaction' (PgBouncer in transaction "
        "mode, or a pooler that behaves like it) or nothing"
    )
if _pooler == "transaction":
    # A transaction pooler hands each transaction any server connection: nothing may
    # outlive one. No server-side cursor (Django's iterator() outside a transaction
    # would DECLARE one WITH HOLD) and no prepared statement, even with OPTIONS that
    # turn on server-side binding (psycopg then prepares a query run 5 times).
    _database["DISABLE_SERVER_SIDE_CURSORS"] = True
    _database.setdefault("OPTIONS", {})["prepare_threshold"] = None
DATABASES = {"default": _database}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True
STATIC_URL = "static/"
# `collectstatic` fills it (`make serve` runs it); WhiteNoise serves it. In production
# the file names carry a hash of their content, so browsers may cache them for good.
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT", "") or BASE_DIR / ".data" / "static")
if not PRODUCTION:
    # Until `collectstatic` has run (tests, the demo) WhiteNoise finds an empty folder
    # rather than warning on every request that there is none; production must collect.
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage" if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage",
    },
}

# Mail (renewal reminders). The default profile prints each mail to the worker's
# output; production sends through SMTP. Either can be any Django email backend.
EMAIL_BACKEND = os.environ.get("DJANGO_EMAIL_BACKEND", "").strip() or (
    "django.core.mail.backends.smtp.EmailBackend" if PRODUCTION
    else "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = _env_number("EMAIL_PORT", 25, int)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("EMAIL_USE_TLS", "") == "1"
# Seconds an SMTP connection may block: how long one send can hold up the sender's run
# (a send holds no row lock, so renewals and cleanup never wait on it).
EMAIL_TIMEOUT = _env_number("EMAIL_TIMEOUT", 10)
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH", "") or BASE_DIR / ".data" / "mail"
# The sender of reminders; its domain also names each reminder's Message-ID.
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "") or "seats@example.edu"

# django-q2 with the ORM broker on the models' own alias, so a run, its chunks and
# their queue messages commit in one transaction.
# - timeout (120 s): far above the slowest chunk (a 500-row chunk takes well under a
#   second) and above planning a million-row backlog, which the dispatcher does in
#   one scheduled task.
# - retry (180 s): the lease after which an unacknowledged task is handed out again;
#   it must exceed timeout, or a slow task runs twice at once.
# - catch_up off: after an outage one run covers the backlog, not one per missed slot.
# - max_attempts 0: the chunk ledger, not django-q2, decides when to dead-letter.
# - save_limit -1: successful results are not stored. The chunk ledger records every
#   outcome; with a positive limit django-q2's monitor locks and loads all the kept
#   successes (arguments included) on every result, which measured as the largest
#   per-chunk cost of the pipeline (docs/performance.md). Failures are still stored.
# - poll (0.05 s): how long an idle pusher sleeps before looking at the queue again;
#   it is the delay before a new run's first chunk starts.
# - bulk 1: a pusher takes one message at a time, so the other cluster's workers get
#   the rest.
# How much of the database's time a chunk's transaction may take (docs/settings.md).
CLEANUP_CHUNK_BUDGET_MS = _env_number("CLEANUP_CHUNK_BUDGET_MS", 40)
# How far the engine lets the database it cleans fall behind (docs/settings.md).
CLEANUP_MAX_REPLICA_LAG = _env_number("CLEANUP_MAX_REPLICA_LAG", 10)
CLEANUP_MAX_LOCK_WAIT_MS = _env_number("CLEANUP_MAX_LOCK_WAIT_MS", 200, int)
CLEANUP_PRESSURE_CHECK_SECONDS = _env_number("CLEANUP_PRESSURE_CHECK_SECONDS", 2)
# How long a frozen or cut-off process may hold learners' rows and its --sync run
# (docs/operations.md, Deploying behind a pooler and on several hosts).
CLEANUP_STATEMENT_TIMEOUT_MS = _env_number("CLEANUP_STATEMENT_TIMEOUT_MS", 30_000, int)
CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = _env_number(
    "CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS", 5_000, int)
CLEANUP_SYNC_CLAIM_SECONDS = _env_number("CLEANUP_SYNC_CLAIM_SECONDS", 30)
# What this host's clusters are called on the overview and /health (empty: the host name).
CLEANUP_NODE_NAME = os.environ.get("CLEANUP_NODE_NAME", "").strip()

Q_CLUSTER = {
    "name": os.environ.get("Q_CLUSTER_QUEUE", "cleanup"),
    "orm": "default",
    "workers": _env_number("Q_WORKERS", 2, int),
    "timeout": _env_number("Q_TIMEOUT", 120, int),
    "retry": _env_number("Q_RETRY", 180, int),
    "poll": _env_number("Q_POLL", 0.05),
    "bulk": _env_number("Q_BULK", 1, int),
    "catch_up": False,
    "max_attempts": 0,
    "ack_failures": False,
    "save_limit": _env_number("Q_SAVE_LIMIT", -1, int),
    "label": "Task queue",
}
if os.environ.get("Q_BROKER", "orm") == "redis":
    # Messages then leave the database transaction: they are sent after the run
    # commits, and the reconciler re-sends any that a dying worker took with it.
    del Q_CLUSTER["orm"]
    Q_CLUSTER["redis"] = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

LOGGING = logging_config(json_lines=PRODUCTION or bool(os.environ.get("LOG_JSON")),
                         queue_level="WARNING" if PRODUCTION else "INFO")
