"""The /metrics endpoint: the ledger's figures plus django-prometheus's own."""

from __future__ import annotations

import hmac
import ipaddress
import os

from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)

from cleanup.conf import conf, metrics_networks
from cleanup.observability import health as health_report
from cleanup.observability.metrics import ledger_collector


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
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


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


def health(request):
    """200 when the database answers and some cluster takes work, else 503."""
    healthy, details = health_report.report()
    return JsonResponse({"healthy": healthy, **details}, status=200 if healthy else 503)
