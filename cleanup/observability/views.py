"""The /metrics endpoint: the ledger's figures plus django-prometheus's own, for the
networks CLEANUP_METRICS_ALLOWED_NETWORKS allows or a bearer token; and /health."""

from __future__ import annotations

import hmac
import ipaddress
import os
from functools import lru_cache

from django.db import transaction
from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)

from cleanup.bounds import lock_bounded
from cleanup.conf import conf
from cleanup.observability import health as health_report
from cleanup.observability.metrics import ledger_collector
from cleanup.rules import network_list


def metrics(request):
    """Export the metrics to an allowed scraper.

    django-prometheus's own view builds a fresh registry when PROMETHEUS_MULTIPROC_DIR
    is set and so would drop the ledger collector; this one adds it to either.
    """
    if not scraper_allowed(request):
        return HttpResponseForbidden("metrics are restricted (see CLEANUP_METRICS_*)\n")
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(ledger_collector())
    else:
        registry = REGISTRY
    # One transaction, every statement's lock wait bounded: a table locked by another
    # session fails the scrape after the bound rather than hold it.
    with transaction.atomic(), lock_bounded():
        body = generate_latest(registry)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def scraper_allowed(request) -> bool:
    token = conf.METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "")
        if hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return True
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(client in network for network in metrics_networks())


def metrics_networks() -> tuple:
    """The networks allowed to scrape /metrics, parsed once per value of the setting.

    Entries are stripped; one that is not a network is left out (and named by system
    check cleanup.E007), and so is a setting that is no list (cleanup.E022), so a typo
    never turns a scrape into an error.
    """
    return parse_networks(_entries(conf.METRICS_ALLOWED_NETWORKS))[0]


def invalid_metrics_networks() -> tuple[str, ...]:
    """The entries of METRICS_ALLOWED_NETWORKS that are not networks."""
    return parse_networks(_entries(conf.METRICS_ALLOWED_NETWORKS))[1]


def _entries(setting: object) -> tuple[str, ...]:
    if not network_list(setting):
        return ()
    if isinstance(setting, str):
        setting = setting.split(",")
    return tuple(str(entry).strip() for entry in setting if str(entry).strip())


@lru_cache(maxsize=16)
def parse_networks(entries: tuple[str, ...]) -> tuple[tuple, tuple[str, ...]]:
    """Return (networks, entries that are not networks); host bits count as a mistake."""
    networks, invalid = [], []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry))
        except ValueError:
            invalid.append(entry)
    return tuple(networks), tuple(invalid)


def health(request):
    """200 when the database answers and some cluster takes work, else 503."""
    with lock_bounded():
        healthy, details = health_report.report()
    return JsonResponse({"healthy": healthy, **details}, status=200 if healthy else 503)
