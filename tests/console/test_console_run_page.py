"""The run page and the lists as an operator reads them (issue 33, item 9): the short URL
keeps its query string, the chunk table's links come back to the table, a run links to
its replays, its progress line reads in order, and every count has its separators."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from cleanup import display
from cleanup.engine.dispatch import dispatch
from cleanup.engine.replay import replay
from cleanup.models import Chunk, Run
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def big_run(account, chunk_size, settings) -> Run:
    """A run of 60 one-row chunks: two pages of its chunk table."""
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 100
    LeaseFactory.create_batch(60, account=account, expired=True)
    return dispatch("expire-leases").run


def run_page(run) -> str:
    return reverse("admin:cleanup_run_change", args=[run.pk])


@pytest.mark.parametrize("short_url", ["/admin/cleanup/run/{short}/",
                                       "/admin/cleanup/run/{short}/change/"])
def test_a_short_run_url_keeps_its_query_string_on_the_way_to_the_run(admin_client,
                                                                      big_run, short_url):
    url = short_url.format(short=display.short_id(big_run.pk))

    response = admin_client.get(url + "?chunks=2&chunk_state=enqueued", follow=True)

    assert response.redirect_chain[-1][0] == run_page(big_run) + (
        "?chunks=2&chunk_state=enqueued")
    assert "page 2 of 2" in response.content.decode()


def test_the_chunk_tables_links_come_back_to_the_table_not_the_top(admin_client, big_run):
    page = admin_client.get(run_page(big_run)).content.decode()

    table = re.search(r'<fieldset class="module" id="run-chunks">(.*?)</fieldset>', page,
                      re.S).group(1)
    links = re.findall(r'<a href="(\?[^"]*)"', table)
    assert '<table class="run-chunks">' in table
    assert "?chunks=2#run-chunks" in links  # the next page
    assert "?chunk_state=enqueued#run-chunks" in links  # a state
    assert all(link.endswith("#run-chunks") for link in links), links


def test_a_run_links_to_the_runs_that_replay_it(admin_client, expired_leases):
    original = dispatch("expire-leases").run
    LeaseFactory(expired=True)
    later = replay(original.pk, new_cutoff=timezone.now()).run
    unrelated = dispatch("expire-leases", key="unrelated").run

    page = admin_client.get(run_page(original)).content.decode()
    replayed_page = admin_client.get(run_page(later)).content.decode()

    row = re.search(r'<div class="form-row field-replays_links">(.*?)</div>\s*</div>\s*</div>',
                    page, re.S).group(1)
    assert "Replayed by" in row
    assert f'<a href="{run_page(later)}">{later.pk}</a>' in row
    assert str(unrelated.pk) not in row
    # And the replay still links back to what it replays.
    assert f'<a href="{run_page(original)}">{original.pk}</a>' in replayed_page


def test_the_progress_line_of_a_run_still_planning_reads_in_order(admin_client, account,
                                                                  settings, chunk_size):
    settings.CLEANUP_WINDOW = 2
    chunk_size("expire-leases", 1)
    LeaseFactory.create_batch(6, account=account, expired=True)
    run = dispatch("expire-leases", scheme="range").run

    page = admin_client.get(run_page(run)).content.decode()

    progress = " ".join(re.search(r'<p class="run-progress">(.*?)</p>', page, re.S)
                        .group(1).split())
    assert re.search(r"</progress> 0 of 2 chunks done so far, still planning \(", progress)
    assert "so far chunks" not in progress


def test_the_run_page_shows_counts_with_separators(admin_client, expired_leases):
    run = dispatch("expire-leases").run
    Run.objects.filter(pk=run.pk).update(chunk_size=20_000, candidates=1_216_086,
                                         max_span=999_999)
    Chunk.objects.filter(run=run).update(planned_rows=20_000, deliveries=1_234)

    page = admin_client.get(run_page(run)).content.decode()
    chunk = admin_client.get(reverse("admin:cleanup_chunk_change",
                                     args=[run.chunks.get().pk])).content.decode()

    assert readonly(page, "chunk_size_number") == "20,000"
    assert readonly(page, "candidates_number") == "1,216,086"
    assert readonly(page, "max_span_number") == "999,999"
    assert readonly(chunk, "planned_rows_number") == "20,000"
    assert readonly(chunk, "deliveries_number") == "1,234"
    # Labelled and explained as the fields are.
    assert "Chunk size:" in page and "Rows of the run's first chunks." in page
    assert "Deliveries started." in chunk
    assert not re.search(r'class="readonly">\d{4,}<', page + chunk)


def test_the_lists_count_their_rows_with_separators(admin_client):
    # Ids none of which reads 1234 (the sequence's next ids could): only a count without
    # its separator would show it as a number of its own. The run's id is fixed for the
    # same reason; each chunk's cause is what the search finds.
    planned = (timezone.now() - timedelta(hours=1)).replace(microsecond=0)
    run = Run.objects.create(id=uuid.UUID("5eed0000-0000-4000-8000-000000000000"),
                             policy="expire-leases", dispatch_key="lease:separators",
                             cutoff=planned, scheme="items", trigger="command")
    Chunk.objects.bulk_create(
        Chunk(pk=20_000 + n, run=run, chunk_id=20_000 + n, planned_at=planned,
              message={"version": 1, "run_id": str(run.pk), "chunk_id": 20_000 + n},
              cause=f"lease-{n}") for n in range(1_234))

    chunks = admin_client.get(reverse("admin:cleanup_chunk_changelist"))
    found = admin_client.get(reverse("admin:cleanup_chunk_changelist"), {"q": "lease-1"})

    listing = " ".join(chunks.content.decode().split())
    assert "1,234 chunks" in listing
    assert "Select all 1,234 chunks" in listing and "All 1,234 selected" in listing
    assert re.search(r"345 results \(<a href=[^>]*>1,234 total</a>\)",
                     " ".join(found.content.decode().split()))
    # As a number of its own: a timestamp's microseconds (09.312342) may hold the digits.
    assert not re.search(r"(?<![\d.,:])1234(?![\d,])", listing)


def readonly(page: str, field: str) -> str:
    return re.search(rf'field-{field}">.*?<div class="readonly">(.*?)</div>', page,
                     re.S).group(1).strip()

