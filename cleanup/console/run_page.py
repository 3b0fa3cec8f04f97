"""What the run page shows above and below the run's fields: its progress and totals,
then its chunks, one state at a time if asked, paged for big runs."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import Count
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import ngettext

from cleanup import display
from cleanup.models import Chunk, Run
from cleanup.observability.status import run_summary
from cleanup.observability.waits import why_it_waits, working_seconds

CHUNKS_PER_PAGE = 50


def run_totals(run: Run) -> dict:
    """The run page's headline: progress, what its chunks did, why it waits, and its
    rate over the time it worked (not the time it was stuck)."""
    summary = run_summary(run)
    done = summary["chunks"]["committed"] + summary["chunks"]["acknowledged"]
    now = timezone.now()
    seconds = ((run.finished_at or now) - run.created_at).total_seconds()
    worked = working_seconds(run)
    return {
        **summary,
        "done": done,
        "position_percent": None if summary["position"] is None
        else round(100 * summary["position"]),
        "seconds": round(seconds, 1),
        "worked_seconds": round(worked, 1),
        "rate": round(summary["rows_changed"] / worked) if worked > 0 else None,
        "waits": why_it_waits(run, now),
        "dead": summary["chunks"]["dead_lettered"],
    }


def chunk_table(request, run: Run) -> dict:
    """The run page's chunk table: one state at a time if asked, paged for big runs."""
    counts = dict(run.chunks.order_by().values_list("state").annotate(n=Count("pk")))
    state = request.GET.get("chunk_state", "")
    chunks = run.chunks.order_by("chunk_id")
    if state in counts:
        chunks = chunks.filter(state=state)
    else:
        state = ""
    page = Paginator(chunks, CHUNKS_PER_PAGE).get_page(request.GET.get("chunks"))
    dead = counts.get(Chunk.State.DEAD_LETTERED, 0)
    return {
        "dead_letters_url": reverse("admin:cleanup_chunk_changelist")
        + f"?run__id__exact={run.pk}&state={Chunk.State.DEAD_LETTERED}",
        "requeue_label": ngettext("Requeue this run's %(count)s dead letter…",
                                  "Requeue this run's %(count)s dead letters…", dead)
        % {"count": display.number(dead)},
        "chunk_page": page,
        "chunk_pages": page.paginator.get_elided_page_range(page.number, on_each_side=2,
                                                            on_ends=1),
        "chunk_state": state,
        "chunk_states": [(choice, label, counts[choice]) for choice, label
                         in Chunk.State.choices if choice in counts],
        "chunk_total": sum(counts.values()),
    }
