"""The runs list and the run page: what each run did (its progress and totals, then its
chunks, one state at a time if asked, paged for big runs), replayed or cancelled from
here."""

from __future__ import annotations

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Count, F, Q, Sum
from django.http import HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext
from django.views.generic import RedirectView

from cleanup import display
from cleanup.console.actions import Action, actor
from cleanup.console.badges import SHORT_RUN_STATES, state_badge
from cleanup.console.base import count_field, runs_by_short_id
from cleanup.console.dispatching import DispatchPagesAdmin
from cleanup.engine import frontier, operations, planning
from cleanup.models import Chunk, Run
from cleanup.observability import blockers
from cleanup.observability.status import run_summary
from cleanup.observability.waits import why_it_waits, working_seconds

# The replays a run page links to; the list's search finds every one.
SHOWN_REPLAYS = 10
CHUNKS_PER_PAGE = 50


class FoundWorkFilter(admin.SimpleListFilter):
    """Runs that found nothing (one a minute when all is well) are hidden by default."""

    title = "work found"
    parameter_name = "work"

    def lookups(self, request, model_admin):
        return [("found", "Found work (default)"), ("none", "Found nothing"), ("all", "All")]

    def choices(self, changelist):
        value = self.value() or "found"
        for lookup, title in self.lookup_choices:
            yield {"selected": value == lookup, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}

    def queryset(self, request, queryset):
        value = self.value() or "found"
        found = Q(chunks_planned__gt=0) | Q(state=Run.State.RUNNING)
        if value == "found":
            return queryset.filter(found)
        if value == "none":
            return queryset.exclude(found)
        return queryset


class RunAdmin(DispatchPagesAdmin):
    # Fits a 1366 px laptop with the sidebar open: two-line cells for what belongs
    # together, the cutoff to the second (exact in its title and on the run page).
    list_display = ("short_id", "policy_scheme", "cutoff_short", "state_badge", "progress",
                    "rows_changed", "duration")
    list_filter = ("policy", FoundWorkFilter, "state", "trigger")
    search_fields = ("dispatch_key",)
    actions = ["replay_runs", "cancel_runs"]
    fields = ("id", "policy", "scheme", "state", "trigger", "replay_link", "replays_links",
              "dispatch_key", "cutoff_exact", "frozen_parameters", "candidates_number",
              "chunks_planned_number", "planning_progress", "planning_error",
              "window_number", "chunk_size_number", "next_chunk_size_number",
              "max_span_number", "created_at", "finished_at")
    readonly_fields = fields
    candidates_number = count_field(Run, "candidates")
    chunks_planned_number = count_field(Run, "chunks_planned")
    window_number = count_field(Run, "window")
    chunk_size_number = count_field(Run, "chunk_size")
    next_chunk_size_number = count_field(Run, "next_chunk_size")
    max_span_number = count_field(Run, "max_span")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            done=Count("chunks", filter=Q(chunks__state__in=Chunk.DONE)),
            dead=Count("chunks", filter=Q(chunks__state=Chunk.State.DEAD_LETTERED)),
            changed=Sum(F("chunks__rows_deleted") + F("chunks__rows_updated"), default=0),
        )

    @admin.display(description="run", ordering="created_at")
    def short_id(self, run):
        return format_html('{}<br><small title="what started it">{}</small>',
                           display.id_html(run.id), self.started_by(run))

    @admin.display(description="policy", ordering="policy")
    def policy_scheme(self, run):
        return format_html('<span class="policy-name">{}</span><br><small>{}</small>',
                           run.policy, run.scheme)

    @admin.display(description="cutoff", ordering="cutoff")
    def cutoff_short(self, run):
        return display.moment_html(run.cutoff, relative=True)

    @admin.display(description="cutoff", ordering="cutoff")
    def cutoff_exact(self, run):
        return run.cutoff.isoformat(timespec="microseconds")

    @admin.display(description="frozen parameters")
    def frozen_parameters(self, run):
        """The deadlines the predicate derived from the cutoff at dispatch."""
        if not run.parameters:
            return "-"
        return format_html_join(", ", "{} = {}", sorted(run.parameters.items()))

    @admin.display(description="started by", ordering="trigger")
    def started_by(self, run):
        # Not a link: the list links the whole first cell to the run (the run page links
        # the run it replayed).
        if run.replay_of_id:
            return format_html("{} of run {}", run.get_trigger_display(),
                               display.id_html(run.replay_of_id))
        return run.get_trigger_display()

    @admin.display(description="replay of")
    def replay_link(self, run):
        if not run.replay_of_id:
            return "-"
        url = reverse("admin:cleanup_run_change", args=[run.replay_of_id])
        return format_html('<a href="{}">{}</a>', url, run.replay_of_id)

    @admin.display(description="replayed by")
    def replays_links(self, run):
        """The runs that replay this one with a new cutoff, newest first (a replay with
        its own cutoff re-sends this run's chunks and starts no run)."""
        replays = list(run.replays.order_by("-created_at")[:SHOWN_REPLAYS + 1])
        if not replays:
            return "-"
        links = format_html_join(
            mark_safe("<br>"), '<a href="{}">{}</a> <small>({}, cutoff {} UTC)</small>',
            ((reverse("admin:cleanup_run_change", args=[replay.pk]), replay.pk,
              replay.get_state_display(), display.utc_text(replay.cutoff))
             for replay in replays[:SHOWN_REPLAYS]))
        if len(replays) <= SHOWN_REPLAYS:
            return links
        every = reverse("admin:cleanup_run_changelist") + f"?q=replay:{run.pk}&work=all"
        return format_html('{}<br><a href="{}">every replay of this run</a>', links, every)

    @admin.display(description="state", ordering="state")
    def state_badge(self, run):
        return state_badge(run, SHORT_RUN_STATES.get(run.state), title=run.get_state_display())

    @admin.display(description="progress")
    def progress(self, run):
        # A run still planning as it goes has more chunks to come than planned so far.
        planned = display.number(run.chunks_planned) + ("" if run.planned_all else "+")
        bar = format_html('<span class="nowrap"><progress value="{}" max="{}"></progress> '
                          '{}/{}</span>', run.done, max(run.chunks_planned, 1),
                          display.number(run.done), planned)
        if not run.dead:
            return bar
        return format_html('{}<br><small class="dead-letters">{}</small>', bar,
                           self.dead_letters(run))

    @admin.display(description="planning")
    def planning_progress(self, run):
        """How far the frontier has got through the run's span."""
        if run.planned_all:
            return "every chunk planned"
        if bad := frontier.problem(run):
            return f"planning stopped: {bad}"
        parts = ["planning as chunks finish"]
        if (at := planning.position(run)) is not None:
            parts.append(f"{at:.0%} through its span")
        if (left := planning.remaining_rows(run)) is not None:
            parts.append(f"about {left:,} rows to go")
        return ", ".join(parts)

    @admin.display(description="changed", ordering="changed")
    def rows_changed(self, run):
        """Rows the run's chunks deleted or, for an update policy, updated, of the rows
        found eligible."""
        return format_html('{}<br><small title="rows found eligible in the chunks planned so '
                           'far">of {}</small>', display.number(run.changed),
                           display.number(run.candidates))

    @admin.display(description="dead letters", ordering="dead")
    def dead_letters(self, run):
        return f"{display.number(run.dead)} dead" if run.dead else ""

    @admin.display(description="took")
    def duration(self, run):
        seconds = ((run.finished_at or timezone.now()) - run.created_at).total_seconds()
        if run.finished_at is None:
            return format_html("{}<br><small>so far</small>", display.duration(seconds))
        return display.duration(seconds)

    @admin.action(description="Replay selected runs with their own cutoff",
                  permissions=["replay"])
    def replay_runs(self, request, queryset):
        return self.act(request, queryset, Action(
            "replay_runs", "Replay runs",
            "Every chunk of each selected run is sent again with the run's own cutoff: "
            "committed ones turn into no-ops, dead-lettered ones are requeued, "
            "discarded and cancelled ones stay as they are. A run re-sent before whose "
            "chunks are still in flight is refused.",
            done=("%(count)d chunk re-sent.", "%(count)d chunks re-sent.")),
            lambda runs, _: self.replay_each(
                request, {run.pk: operations.ALL_CHUNKS for run in runs},
                lambda _: "Replayed with its own cutoff"))

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request, queryset):
        return self.act(request, queryset, Action(
            "cancel_runs", "Cancel runs",
            "Their unfinished chunks will be cancelled and later deliveries of them "
            "will change nothing. Work already committed stays.",
            done=("%(count)d run cancelled.", "%(count)d runs cancelled."),
            skipped="%(count)d runs were not running and were left alone.",
            logged="Cancelled"),
            lambda runs, _: operations.cancel([r.pk for r in runs], actor=actor(request)))

    def get_urls(self):
        """Django's redirect from a run's short URL (``run/<id>/``) to its page, keeping
        the query string (a page of its chunks) as the run page's own redirect does."""
        short_url = "<path:object_id>/"
        return [url for url in super().get_urls() if str(url.pattern) != short_url] + [
            path(short_url, self.admin_site.admin_view(RedirectView.as_view(
                pattern_name=f"{self.admin_site.name}:cleanup_run_change",
                query_string=True))),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, object_id)
        if run is None and (found := runs_by_short_id(object_id)):
            # The short id the console shows, in a URL: the run it names, on the same
            # page of its chunks (the query string is the page's).
            if len(found) == 1:
                query = request.GET.urlencode()
                return HttpResponseRedirect(reverse("admin:cleanup_run_change",
                                                    args=[found[0]])
                                            + (f"?{query}" if query else ""))
            return HttpResponseRedirect(
                reverse("admin:cleanup_run_changelist") + f"?q={object_id}&work=all")
        extra_context = extra_context or {}
        if run is not None:
            extra_context.update(chunk_table(request, run))
            extra_context["can_replay"] = self.has_replay_permission(request)
            extra_context["can_requeue"] = self.has_requeue_permission(request)
            extra_context["can_discard"] = self.has_discard_permission(request)
            extra_context["totals"] = run_totals(run)
            extra_context["blockers"] = blockers.for_run(run)
        return super().change_view(request, object_id, form_url, extra_context)

    def get_search_results(self, request, queryset, search_term):
        """A run's full id or the short id the console shows finds that run; any other
        text searches the dispatch keys (a replay's key names the run it replays)."""
        if display.parse_id(search_term) is not None:
            by_id = queryset.filter(pk__in=runs_by_short_id(search_term))
            if by_id.exists():
                return by_id, False
        return super().get_search_results(request, queryset, search_term)

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}),
                         "can_dispatch": self.has_dispatch_permission(request)}
        return super().changelist_view(request, extra_context)


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
