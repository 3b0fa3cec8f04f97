"""The operator console: read-only ledger pages and actions over the same services
as the commands."""

from __future__ import annotations

import json
import uuid

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, F, Max, Q, Sum
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import ngettext

from cleanup import display, frontier, operations, planning, triage
from cleanup import health as health_report
from cleanup.conf import lease
from cleanup.dispatch import describe_dispatch, dispatch
from cleanup.exceptions import CleanupError
from cleanup.forms import DiscardForm, DispatchForm, NewCutoffForm
from cleanup.models import Chunk, CleanupOverview, OrphanMessage, Run, Slot
from cleanup.overview import banner, overview
from cleanup.policies import get_policy
from cleanup.replay import replay
from cleanup.status import run_summary

CHUNKS_PER_PAGE = 50
OVERVIEW_REFRESH_SECONDS = 5
# Each run and chunk state's badge class; its colour is in cleanup/static/cleanup/console.css
# (tests/test_console_lists.py checks every class has a rule there).
STATE_COLOURS = {
    "planned": "state-planned", "enqueued": "state-enqueued", "retrying": "state-retrying",
    "committed": "state-committed", "acknowledged": "state-acknowledged",
    "dead_lettered": "state-dead-lettered", "discarded": "state-discarded",
    "cancelled": "state-cancelled", "running": "state-running", "completed": "state-completed",
    "completed_with_dead_letters": "state-completed-with-dead-letters",
}
SLOT_OUTCOMES = {"fired": "fired, not dispatched", "started": "started a run",
                 "coalesced": "coalesced"}

# Labels short enough for the runs list; the full one is the badge's title.
SHORT_RUN_STATES = {"completed_with_dead_letters": "Dead letters"}


def badge(state: str, label: str, title: str = ""):
    """A run's or chunk's state; one written by hand past the choices shows as unknown."""
    if state not in STATE_COLOURS:
        return unknown_badge(state)
    return display.badge(state, label, title)


def unknown_badge(value: str, what: str = "state"):
    return display.badge("unknown", f"unknown: {value}", f"a {what} the code does not know")


def run_totals(run: Run) -> dict:
    """The run page's headline: progress and what its chunks did."""
    summary = run_summary(run)
    done = summary["chunks"]["committed"] + summary["chunks"]["acknowledged"]
    seconds = ((run.finished_at or timezone.now()) - run.created_at).total_seconds()
    return {
        **summary,
        "done": done,
        "planned_text": f"{run.chunks_planned}" if run.planned_all
        else f"{run.chunks_planned} so far",
        "position_percent": None if summary["position"] is None
        else round(100 * summary["position"]),
        "seconds": round(seconds, 1),
        "rate": round(summary["rows_changed"] / seconds) if seconds > 0 else None,
        "dead": summary["chunks"]["dead_lettered"],
    }


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def runs_by_short_id(text: str) -> list:
    """The ids of the runs a full id or an 8-hex-digit short id names."""
    parsed = display.parse_id(text)
    if parsed is None:
        return []
    if not isinstance(parsed, str):
        return list(Run.objects.filter(pk=parsed).values_list("pk", flat=True))
    return list(Run.objects.filter(pk__range=display.id_range(parsed)).order_by()
                .values_list("pk", flat=True)[:20])


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


def actor(request) -> str:
    return f"admin:{request.user.get_username()}"


class LedgerAdmin(admin.ModelAdmin):
    """Ledger rows are written by the engine only: no add, change or delete by hand."""

    class Media:
        # The console's badges, instants and column widths, on each of its pages.
        css = {"all": ("cleanup/console.css",)}

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        """Refuse, with 403, an action this user was not offered (a forged POST)."""
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)

    def has_replay_permission(self, request):
        return request.user.has_perm("cleanup.replay")

    def has_requeue_permission(self, request):
        return request.user.has_perm("cleanup.requeue")

    def has_discard_permission(self, request):
        return request.user.has_perm("cleanup.discard")

    def has_dispatch_permission(self, request):
        return request.user.has_perm("cleanup.dispatch")

    def has_cancel_permission(self, request):
        return request.user.has_perm("cleanup.cancel")

    def report(self, request, result, done: str, done_plural: str, skipped: str) -> None:
        """Tell the operator what an action did and what it left alone."""
        self.message_user(
            request, ngettext(done, done_plural, result.done) % {"count": result.done},
            messages.SUCCESS if result.done else messages.WARNING,
        )
        if result.skipped:
            self.message_user(request, skipped % {"count": result.skipped}, messages.WARNING)

    def confirmation(self, request, queryset, action: str, title: str, question: str,
                     form=None):
        """The two-step confirmation page of a destructive action."""
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "question": question,
            "objects": queryset[:100],
            "count": queryset.count(),
            "action": action,
            "form": form,
            "opts": self.model._meta,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "next": self._next_url(request) or "",
            "back": self._next_url(request) or request.get_full_path(),
        }
        if self._across(request):
            # Every row of the filtered list: carried as the filter itself (thousands of
            # ids would pass Django's limit on form fields), with what it held when shown.
            context.update(select_across=True, expected=self._fingerprint(queryset),
                           selected=[str(queryset.order_by("pk").values_list(
                               "pk", flat=True).first())])
        else:
            context["selected"] = [str(pk) for pk in
                                   queryset.order_by().values_list("pk", flat=True)]
        return TemplateResponse(request, "admin/cleanup/confirm_action.html", context)

    def confirmed(self, request, queryset) -> bool:
        """The operator said yes on the confirmation page, to exactly what it showed."""
        if request.POST.get("post") != "yes":
            return False
        if self._across(request) and request.POST.get("expected") != self._fingerprint(
                queryset):
            self.message_user(request, "The rows the list holds changed since the "
                              "confirmation was shown: check them and confirm again.",
                              messages.WARNING)
            return False
        return True

    @staticmethod
    def _across(request) -> bool:
        return request.POST.get("select_across") == "1"

    @staticmethod
    def _fingerprint(queryset) -> str:
        """How many rows, and the highest pk: enough to tell a list that gained or lost
        rows since it was shown."""
        figures = queryset.order_by().aggregate(rows=Count("pk"), last=Max("pk"))
        return f"{figures['rows']}:{figures['last']}"

    def _next_url(self, request) -> str | None:
        """The page the operator acted from (a chunk page, the dead-letter groups), if the
        action was sent from one; None sends them back to the list they acted on."""
        target = request.POST.get("next", "")
        if target and url_has_allowed_host_and_scheme(
                target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
            return target
        return None

    def back_to_where_they_were(self, request):
        """After an action: the page it was sent from, or (None) the list it ran on."""
        target = self._next_url(request)
        return HttpResponseRedirect(target) if target else None


@admin.register(Run)
class RunAdmin(LedgerAdmin):
    # Fits a 1366 px laptop with the sidebar open: two-line cells for what belongs
    # together, the cutoff to the second (exact in its title and on the run page).
    list_display = ("short_id", "policy_scheme", "cutoff_short", "state_badge", "progress",
                    "rows_changed", "duration")
    list_filter = ("policy", FoundWorkFilter, "state", "trigger")
    search_fields = ("dispatch_key",)
    actions = ["replay_runs", "cancel_runs"]
    fields = ("id", "policy", "scheme", "state", "trigger", "replay_link", "dispatch_key",
              "cutoff_exact", "frozen_parameters", "candidates", "chunks_planned",
              "planning_progress", "planning_error", "window", "chunk_size",
              "next_chunk_size", "max_span", "created_at", "finished_at")
    readonly_fields = fields

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

    @admin.display(description="state", ordering="state")
    def state_badge(self, run):
        return badge(run.state, SHORT_RUN_STATES.get(run.state, run.get_state_display()),
                     title=run.get_state_display())

    @admin.display(description="progress")
    def progress(self, run):
        # A run still planning as it goes has more chunks to come than planned so far.
        planned = display.number(run.chunks_planned) + ("" if run.planned_all else "+")
        bar = format_html('<span class="nowrap"><progress value="{}" max="{}" '
                          'style="width:4em"></progress> {}/{}</span>', run.done,
                          max(run.chunks_planned, 1), display.number(run.done), planned)
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
        resent = 0
        for run in queryset:
            try:
                resent += replay(run.pk).resent
            except CleanupError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            self.log_change(request, run, "Replayed with its own cutoff")
        self.message_user(request, ngettext("%(count)d chunk re-sent.",
                                            "%(count)d chunks re-sent.", resent)
                          % {"count": resent}, messages.SUCCESS)

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request, queryset):
        if not self.confirmed(request, queryset):
            return self.confirmation(
                request, queryset, "cancel_runs", "Cancel runs",
                "Their unfinished chunks will be cancelled and later deliveries of them "
                "will change nothing. Work already committed stays.")
        result = operations.cancel([r.pk for r in queryset], actor=actor(request))
        for run in Run.objects.filter(pk__in=result.affected):
            self.log_change(request, run, "Cancelled")
        self.report(request, result, "%(count)d run cancelled.", "%(count)d runs cancelled.",
                    "%(count)d runs were not running and were left alone.")

    def get_urls(self):
        return [
            path("dispatch/", self.admin_site.admin_view(self.dispatch_view),
                 name="cleanup_run_dispatch"),
            path("<uuid:run_id>/replay/", self.admin_site.admin_view(self.new_cutoff_view),
                 name="cleanup_run_replay"),
        ] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, object_id)
        if run is None and (found := runs_by_short_id(object_id)):
            # The short id the console shows, in a URL: the run it names.
            if len(found) == 1:
                return HttpResponseRedirect(reverse("admin:cleanup_run_change",
                                                    args=[found[0]]))
            return HttpResponseRedirect(
                reverse("admin:cleanup_run_changelist") + f"?q={object_id}&work=all")
        extra_context = extra_context or {}
        if run is not None:
            extra_context.update(chunk_table(request, run))
            extra_context["can_replay"] = self.has_replay_permission(request)
            extra_context["can_requeue"] = self.has_requeue_permission(request)
            extra_context["can_discard"] = self.has_discard_permission(request)
            extra_context["totals"] = run_totals(run)
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

    def dispatch_view(self, request):
        """Dispatch a policy now: form, dry-run preview, then confirmation."""
        if not self.has_dispatch_permission(request):
            raise PermissionDenied
        form = DispatchForm(request.POST or None)
        context = {"title": "Dispatch a policy now", "form": form}
        if request.method == "POST" and form.is_valid():
            policy = form.cleaned_data["policy"]
            scheme = form.cleaned_data["scheme"] or None
            try:
                if "_confirm" in request.POST:
                    key = self._confirm_key(request)
                    result = dispatch(policy, scheme=scheme, cutoff=form.cleaned_data["cutoff"],
                                      key=f"admin:{key}", trigger=Run.Trigger.ADMIN)
                    return self._started(request, result.run, result.created,
                                         f"Dispatched {policy} from the admin",
                                         describe_dispatch(result))
                context.update(self._preview(policy, scheme, form.cleaned_data["cutoff"]))
            except CleanupError as exc:
                form.add_error(None, str(exc))
        return self._form_page(request, context)

    def new_cutoff_view(self, request, run_id):
        """Replay a run with a new cutoff: form, dry-run preview, then confirmation."""
        if not self.has_replay_permission(request):
            raise PermissionDenied
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            self.message_user(request, f"No run with id {run_id}.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:cleanup_run_changelist"))
        form = NewCutoffForm(request.POST or None)
        context = {"title": f"Replay run {str(run.id)[:8]} with a new cutoff", "form": form,
                   "run": run}
        if request.method == "POST" and form.is_valid():
            cutoff = form.cleaned_data["cutoff"] or timezone.now()  # empty: now
            try:
                if "_confirm" in request.POST:
                    result = replay(run.pk, new_cutoff=cutoff)
                    return self._started(request, result.run, result.created,
                                         f"Replay of run {run.id} with a new cutoff")
                context.update(self._preview(run.policy, run.scheme, cutoff, not_before=run))
            except CleanupError as exc:
                form.add_error(None, str(exc))
        return self._form_page(request, context)

    def _preview(self, policy_name, scheme, cutoff, not_before=None) -> dict:
        """What the dispatch would do: its own dry run, per partition."""
        result = dispatch(policy_name, scheme=scheme, cutoff=cutoff, replay_of=not_before,
                          dry_run=True)
        field = get_policy(policy_name).partition_field
        return {"preview": result.preview, "preview_cutoff": result.cutoff.isoformat(),
                "preview_scheme": result.scheme, "confirm_key": uuid.uuid4(),
                # Named for what the policy partitions by (a tenant, a run, a policy).
                "preview_partition": field.replace("_", " ").capitalize() if field
                else "Partition"}

    def _confirm_key(self, request) -> uuid.UUID:
        try:
            return uuid.UUID(request.POST.get("confirm_key", ""))
        except ValueError:
            raise CleanupError("the confirmation was tampered with; start again") from None

    def _started(self, request, run, created, log_message, summary: str = ""):
        """Say what the dispatch did (the command's own sentence, where there is one)."""
        if created:
            self.log_change(request, run, log_message)
            if not summary:
                planned = (f"{display.number(run.chunks_planned)} chunks for "
                           f"{display.number(run.candidates)} rows" if run.planned_all
                           else f"first {display.number(run.chunks_planned)} chunks sent, "
                           "the rest planned as they finish")
                summary = f"Started run {run.id}: {planned}."
            self.message_user(request, summary, messages.SUCCESS)
        else:
            self.message_user(request, f"Run {run.id} had already been started; "
                              "nothing new was sent.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:cleanup_run_change", args=[run.pk]))

    def _form_page(self, request, context):
        context = {**self.admin_site.each_context(request), "opts": self.opts, **context}
        return TemplateResponse(request, "admin/cleanup/run/preview_form.html", context)


class ChunkStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        first = Chunk.State.DEAD_LETTERED
        return [(first, first.label)] + [(s, s.label) for s in Chunk.State if s != first]

    def queryset(self, request, queryset):
        return queryset.filter(state=self.value()) if self.value() else queryset


@admin.register(Chunk)
class ChunkAdmin(LedgerAdmin):
    # A short label (#12) beside its run's short id; fits a 1366 px laptop.
    list_display = ("label", "state_badge", "failure", "tries", "changed", "error", "when")
    list_display_links = None  # the label links to the chunk, its second line to the run
    list_filter = (ChunkStateFilter, "failure_class", "run__policy")
    list_select_related = ("run",)
    search_fields = ("cause",)
    search_help_text = "A run's id (or the 8 digits the console shows), or an error's text."
    actions = ["replay_chunks", "requeue_chunks", "discard_chunks"]
    fieldsets = [
        (None, {"fields": ("run_link", "chunk_id", "state", "planned_rows")}),
        ("Failure", {"fields": ("failure_class", "reason", "last_error_text",
                                "discard_reason")}),
        ("Outcome", {"fields": ("rows_deleted", "rows_updated", "items_skipped", "deliveries",
                                "deliveries_completed", "noop_deliveries", "failures",
                                "transient_retries", "dead_letters")}),
        ("Message", {"fields": ("message_as_sent", "message_received")}),
        ("Timestamps", {"fields": ("planned_at", "enqueued_at", "last_delivery_at",
                                   "committed_at", "acknowledged_at", "dead_lettered_at",
                                   "discarded_at")}),
    ]
    readonly_fields = [f for _, spec in fieldsets for f in spec["fields"]]

    def get_fieldsets(self, request, obj=None):
        """What went wrong first on a chunk that failed; otherwise no failure section. The
        message a refused delivery carried shows beside the one sent, where it differed."""
        fieldsets = self.fieldsets
        if obj is None or not obj.received_message:
            fieldsets = [(name, {"fields": tuple(f for f in spec["fields"]
                                                 if f != "message_received")})
                         for name, spec in fieldsets]
        if obj is not None and (obj.failure_class or obj.last_error):
            failure = [spec for spec in fieldsets if spec[0] == "Failure"]
            return failure + [spec for spec in fieldsets if spec[0] != "Failure"]
        return [spec for spec in fieldsets if spec[0] != "Failure"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}),
                         "can_requeue": self.has_requeue_permission(request),
                         "can_discard": self.has_discard_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="reason")
    def reason(self, chunk):
        """What the operator reads first: the error's own line, then the verdict."""
        return chunk.failure_summary or "-"

    def lookup_allowed(self, lookup, value, request=None):
        # A run's chunks (its page links here) and a dead-letter group (by its cause).
        return lookup in ("run", "run__id__exact", "cause") or super().lookup_allowed(
            lookup, value, request)

    @admin.display(description="chunk", ordering="run__created_at")
    def label(self, chunk):
        return format_html(
            '<a href="{}">#{}</a><br><small>{} <span class="policy-name">{}</span></small>',
            reverse("admin:cleanup_chunk_change", args=[chunk.pk]), chunk.chunk_id,
            display.id_html(chunk.run_id, reverse("admin:cleanup_run_change",
                                                  args=[chunk.run_id])), chunk.run.policy)

    @admin.display(description="tries", ordering="deliveries")
    def tries(self, chunk):
        return display.number(chunk.deliveries)

    @admin.display(description="changed")
    def changed(self, chunk):
        """Rows deleted or, for an update policy, updated."""
        return display.number(chunk.rows_changed)

    @admin.display(description="failure", ordering="failure_class")
    def failure(self, chunk):
        """The failure's class, its description on hover."""
        if not chunk.failure_class:
            return ""
        return format_html('<span class="nowrap" title="{}">{}</span>',
                           chunk.get_failure_class_display(), chunk.failure_class)

    @admin.display(description="last change")
    def when(self, chunk):
        moment = (chunk.acknowledged_at or chunk.committed_at or chunk.dead_lettered_at
                  or chunk.discarded_at or chunk.last_delivery_at or chunk.planned_at)
        return display.moment_html(moment, relative=True)

    @admin.display(description="run", ordering="run__created_at")
    def run_link(self, chunk):
        url = reverse("admin:cleanup_run_change", args=[chunk.run_id])
        return format_html('<a href="{}">{}</a>', url, str(chunk.run_id)[:8])

    @admin.display(description="policy", ordering="run__policy")
    def policy(self, chunk):
        return chunk.run.policy

    @admin.display(description="state", ordering="state")
    def state_badge(self, chunk):
        return badge(chunk.state, chunk.get_state_display())

    @admin.display(description="last error")
    def error(self, chunk):
        """The last real error's own line, and the poison verdict below it."""
        summary = chunk.failure_summary
        if not summary:
            return ""
        if not chunk.cause or not chunk.verdict.strip():
            return format_html('<span title="{}">{}</span>', summary, _shorten(summary, 60))
        # Both: the verdict (why the engine gave up) must not be cut off behind the cause.
        verdict = chunk.verdict.strip().splitlines()[0]
        return format_html('<span title="{}">{}<br><small>{}</small></span>', summary,
                           _shorten(chunk.cause, 60), _shorten(verdict, 60))

    @admin.display(description="message as sent")
    def message_as_sent(self, chunk):
        """Collapsed: an items message holds thousands of pairs."""
        items = chunk.message.get("items")
        what = (f"{len(items)} items" if isinstance(items, list)
                else f"range [{chunk.message.get('start_id')}, {chunk.message.get('end_id')})")
        return format_html('<details class="message"><summary>Version {}, {} (show the '
                           'message)</summary><pre>{}</pre></details>',
                           chunk.message.get("version"), what,
                           json.dumps(chunk.message, indent=1))

    @admin.display(description="message received")
    def message_received(self, chunk):
        """What the refused delivery carried, where it differed from the message sent."""
        try:
            text = json.dumps(json.loads(chunk.received_message), indent=1)
        except ValueError:
            text = chunk.received_message
        return format_html('<details class="message" open><summary>Differs from the message '
                           'as sent</summary><pre>{}</pre></details>', text)

    @admin.display(description="last error")
    def last_error_text(self, chunk):
        return format_html("<pre>{}</pre>", chunk.last_error) if chunk.last_error else "-"

    @admin.action(description="Replay selected chunks (committed ones become no-ops)",
                  permissions=["replay"])
    def replay_chunks(self, request, queryset):
        if not self.confirmed(request, queryset):
            return self.confirmation(
                request, queryset, "replay_chunks", "Replay chunks",
                "Each selected chunk is sent again with its run's own cutoff. Committed "
                "chunks turn into no-ops; dead-lettered ones are requeued.")
        # Exactly the chunks selected, grouped by run: without the model's ordering,
        # which would join the run into the query.
        selected: dict = {}
        for run_id, chunk_id in queryset.order_by().values_list("run_id", "chunk_id"):
            selected.setdefault(run_id, []).append(chunk_id)
        resent = skipped = 0
        for run_id, chunk_ids in selected.items():
            try:
                result = replay(run_id, chunk_ids=chunk_ids)
            except CleanupError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            resent, skipped = resent + result.resent, skipped + result.skipped
            self.log_change(request, result.run, f"Replayed chunks {sorted(chunk_ids)}")
        self.report(request, operations.ActionResult(resent, skipped),
                    "%(count)d chunk re-sent.", "%(count)d chunks re-sent.",
                    "%(count)d discarded or cancelled chunks were left alone.")
        return self.back_to_where_they_were(request)

    @admin.action(description="Requeue selected dead-lettered chunks", permissions=["requeue"])
    def requeue_chunks(self, request, queryset):
        if not self.confirmed(request, queryset):
            return self.confirmation(
                request, queryset, "requeue_chunks", "Requeue chunks",
                "Each dead-lettered chunk goes back to the queue with its run's own cutoff, "
                "its run reopens, and the poison limit counts afresh. Other chunks are left "
                "alone.")
        result = operations.requeue([c.pk for c in queryset], actor=actor(request))
        for chunk in Chunk.objects.filter(pk__in=result.affected):
            self.log_change(request, chunk, "Requeued")
        self.report(request, result, "%(count)d chunk requeued.", "%(count)d chunks requeued.",
                    "%(count)d chunks were not dead-lettered (or their run was cancelled) "
                    "and were left alone.")
        return self.back_to_where_they_were(request)

    @admin.action(description="Discard selected dead-lettered chunks", permissions=["discard"])
    def discard_chunks(self, request, queryset):
        form = DiscardForm(request.POST if "reason" in request.POST else None)
        if not self.confirmed(request, queryset) or not form.is_valid():
            return self.confirmation(
                request, queryset, "discard_chunks", "Discard chunks",
                "Only dead-lettered chunks are discarded; no delivery will retry them.",
                form=form)
        result = operations.discard([c.pk for c in queryset], form.cleaned_data["reason"],
                                    actor=actor(request))
        for chunk in Chunk.objects.filter(pk__in=result.affected):
            self.log_change(request, chunk, f"Discarded: {form.cleaned_data['reason']}")
        self.report(request, result, "%(count)d chunk discarded.",
                    "%(count)d chunks discarded.",
                    "%(count)d chunks were not dead-lettered and were left alone.")
        return self.back_to_where_they_were(request)

    def get_urls(self):
        return [
            path("dead-letters/", self.admin_site.admin_view(self.dead_letters_view),
                 name="cleanup_chunk_dead_letters"),
        ] + super().get_urls()

    def dead_letters_view(self, request):
        """Dead letters grouped by cause, each group requeued or discarded as one."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        policy = request.GET.get("policy") or None
        context = {
            **self.admin_site.each_context(request),
            "title": "Dead letters by cause",
            "opts": self.opts,
            "groups": triage.dead_letter_groups(policy=policy),
            "policy": policy,
            "can_requeue": self.has_requeue_permission(request),
            "can_discard": self.has_discard_permission(request),
        }
        return TemplateResponse(request, "admin/cleanup/chunk/dead_letters.html", context)

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}),
                         "dead_letter_groups_url": reverse("admin:cleanup_chunk_dead_letters")}
        return super().changelist_view(request, extra_context)

    def get_search_results(self, request, queryset, search_term):
        """A run's full or short id finds its chunks; other text searches the causes."""
        if display.parse_id(search_term) is not None:
            runs = runs_by_short_id(search_term)
            if runs:
                return queryset.filter(run_id__in=runs), False
        return super().get_search_results(request, queryset, search_term)


@admin.register(Slot)
class SlotAdmin(LedgerAdmin):
    """The trigger ledger: each schedule slot the scheduler fired and what it did."""

    list_display = ("policy_name", "slot", "fired", "outcome_badge", "run_link", "dispatched")
    list_filter = ("policy", "outcome")
    fields = ("policy", "slot_at", "fired_at", "dispatched_at", "outcome", "run_link")
    readonly_fields = fields

    @admin.display(description="policy", ordering="policy")
    def policy_name(self, slot):
        return format_html('<span class="policy-name">{}</span>', slot.policy)

    @admin.display(description="slot", ordering="slot_at")
    def slot(self, slot):
        return display.moment_html(slot.slot_at)

    @admin.display(description="fired at", ordering="fired_at")
    def fired(self, slot):
        """When the scheduler fired it: the date only where it is not the slot's."""
        return display.moment_html(slot.fired_at, relative=True,
                                   date=slot.fired_at.date() != slot.slot_at.date())

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, slot):
        if slot.outcome not in SLOT_OUTCOMES:
            return unknown_badge(slot.outcome, "outcome")
        return display.badge(slot.outcome, SLOT_OUTCOMES[slot.outcome],
                             slot.get_outcome_display())

    @admin.display(description="run")
    def run_link(self, slot):
        if not slot.run_id:
            return "-"
        return display.id_html(slot.run_id, reverse("admin:cleanup_run_change",
                                                    args=[slot.run_id]))

    @admin.display(description="dispatched", ordering="dispatched_at")
    def dispatched(self, slot):
        """When a worker dispatched it, and how long after the scheduler fired it."""
        if slot.dispatched_at is None:
            return "-"
        same_day = slot.dispatched_at.date() == slot.fired_at.date()
        return format_html("{}<br><small>{} after firing</small>",
                           display.moment_html(slot.dispatched_at, date=not same_day),
                           display.duration((slot.dispatched_at - slot.fired_at)
                                            .total_seconds()))


# An orphan's raw text can be a whole items message (about 100 KB): the list shows its start.
RAW_PREVIEW = 100


@admin.register(OrphanMessage)
class OrphanMessageAdmin(LedgerAdmin):
    """Messages no chunk took: when, what they named, why, and how they began."""

    list_display = ("received", "named", "error", "raw_start")
    fields = ("received_at", "run_id", "chunk_id", "error", "raw")
    readonly_fields = fields

    @admin.display(description="received", ordering="received_at")
    def received(self, orphan):
        return display.moment_html(orphan.received_at, relative=True)

    @admin.display(description="named")
    def named(self, orphan):
        """The run and chunk it named, where they could be read."""
        if orphan.run_id is None:
            return "-"
        chunk = "" if orphan.chunk_id is None else f" #{orphan.chunk_id}"
        return format_html("{}{}", display.id_html(orphan.run_id), chunk)

    @admin.display(description="message")
    def raw_start(self, orphan):
        return format_html('<code title="{} characters">{}</code>', display.number(
            len(orphan.raw)), _shorten(orphan.raw, RAW_PREVIEW))


@admin.register(CleanupOverview)
class CleanupOverviewAdmin(LedgerAdmin):
    """Per policy: backlog, stalled work, missed schedules, dead letters."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("cleanup.view_run")

    def get_urls(self):
        return [path("", self.admin_site.admin_view(self.changelist_view),
                     name="cleanup_cleanupoverview_changelist")]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        policies = overview(now)
        clusters = health_report.report()[1].get("clusters", [])
        context = {
            **self.admin_site.each_context(request),
            "title": "Cleanup overview",
            "opts": self.opts,
            "policies": policies,
            "clusters": clusters,
            "alerts": banner(policies, clusters),
            "now": now,
            "lease": lease(),
            "refresh_seconds": OVERVIEW_REFRESH_SECONDS,
        }
        return TemplateResponse(request, "admin/cleanup/cleanupoverview/overview.html",
                                context)
