"""The operator console: read-only ledger pages and actions over the same services
as the commands."""

from __future__ import annotations

import json
import uuid

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, F, Q, Sum
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import ngettext

from cleanup import health as health_report
from cleanup import operations, planning
from cleanup.conf import lease
from cleanup.dispatch import dispatch
from cleanup.exceptions import CleanupError
from cleanup.forms import DiscardForm, DispatchForm, NewCutoffForm
from cleanup.models import Chunk, CleanupOverview, OrphanMessage, Run, Slot
from cleanup.overview import overview
from cleanup.policies import get_policy
from cleanup.replay import replay
from cleanup.status import run_summary

CHUNKS_PER_PAGE = 50
STATE_COLOURS = {
    "planned": "#777", "enqueued": "#2a6ebb", "retrying": "#c77c00", "committed": "#2f8f2f",
    "acknowledged": "#1d6b1d", "dead_lettered": "#b00020", "discarded": "#555",
    "cancelled": "#555", "running": "#2a6ebb", "completed": "#1d6b1d",
    "completed_with_dead_letters": "#b00020",
}


# Labels short enough for the runs list; the full one is the badge's title.
SHORT_RUN_STATES = {"completed_with_dead_letters": "Dead letters"}


def badge(state: str, label: str, title: str = ""):
    return format_html(
        '<span title="{}" style="background:{};color:#fff;padding:1px 6px;border-radius:8px;'
        'white-space:nowrap">{}</span>', title or label, STATE_COLOURS.get(state, "#555"),
        label,
    )


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
            "selected": [str(pk) for pk in queryset.values_list("pk", flat=True)],
        }
        return TemplateResponse(request, "admin/cleanup/confirm_action.html", context)


@admin.register(Run)
class RunAdmin(LedgerAdmin):
    # Fits a 1366 px laptop with the sidebar open: two-line cells for what belongs
    # together, the cutoff to the second (exact in its title and on the run page).
    list_display = ("short_id", "policy_scheme", "cutoff_short", "state_badge", "progress",
                    "rows_changed", "dead_letters", "duration")
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
        return format_html('{}<br><small title="what started it">{}</small>', str(run.id)[:8],
                           self.started_by(run))

    @admin.display(description="policy", ordering="policy")
    def policy_scheme(self, run):
        return format_html('{}<br><small>{}</small>', run.policy, run.scheme)

    @admin.display(description="cutoff", ordering="cutoff")
    def cutoff_short(self, run):
        exact = run.cutoff.isoformat(timespec="microseconds")
        return format_html('<span title="{}" style="white-space:nowrap">{}</span>', exact,
                           run.cutoff.strftime("%Y-%m-%d %H:%M:%S"))

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
        if run.replay_of_id:
            url = reverse("admin:cleanup_run_change", args=[run.replay_of_id])
            return format_html('{} of run <a href="{}">{}</a>', run.get_trigger_display(),
                               url, str(run.replay_of_id)[:8])
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
        planned = f"{run.chunks_planned}" if run.planned_all else f"{run.chunks_planned}+"
        return format_html('<span style="white-space:nowrap"><progress value="{}" max="{}" '
                           'style="width:4em"></progress> {}/{}</span>', run.done,
                           max(run.chunks_planned, 1), run.done, planned)

    @admin.display(description="planning")
    def planning_progress(self, run):
        """How far the frontier has got through the run's span."""
        if run.planned_all:
            return "every chunk planned"
        parts = ["planning as chunks finish"]
        if (at := planning.position(run)) is not None:
            parts.append(f"{at:.0%} through its span")
        if (left := planning.remaining_rows(run)) is not None:
            parts.append(f"about {left:,} rows to go")
        return ", ".join(parts)

    @admin.display(description="changed", ordering="changed")
    def rows_changed(self, run):
        """Rows the run's chunks deleted or, for an update policy, updated."""
        return run.changed

    @admin.display(description="dead", ordering="dead")
    def dead_letters(self, run):
        return run.dead or ""

    @admin.display(description="took")
    def duration(self, run):
        seconds = ((run.finished_at or timezone.now()) - run.created_at).total_seconds()
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

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
        if request.POST.get("post") != "yes":
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
        extra_context = extra_context or {}
        if run is not None:
            chunks = Paginator(run.chunks.order_by("chunk_id"), CHUNKS_PER_PAGE)
            extra_context["chunk_page"] = chunks.get_page(request.GET.get("chunks"))
            extra_context["can_replay"] = self.has_replay_permission(request)
            extra_context["totals"] = run_totals(run)
        return super().change_view(request, object_id, form_url, extra_context)

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
                                         f"Dispatched {policy} from the admin")
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

    def _started(self, request, run, created, log_message):
        if created:
            self.log_change(request, run, log_message)
            planned = (f"{run.chunks_planned} chunks for {run.candidates} rows" if
                       run.planned_all else f"first {run.chunks_planned} chunks sent, the rest "
                       "planned as they finish")
            self.message_user(request, f"Started run {run.id}: {planned}.", messages.SUCCESS)
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
        return lookup in ("run", "run__id__exact") or super().lookup_allowed(
            lookup, value, request)

    @admin.display(description="chunk", ordering="run__created_at")
    def label(self, chunk):
        return format_html(
            '<a href="{}">#{}</a><br><small><a href="{}" title="{}">{}</a> {}</small>',
            reverse("admin:cleanup_chunk_change", args=[chunk.pk]), chunk.chunk_id,
            reverse("admin:cleanup_run_change", args=[chunk.run_id]), chunk.run_id,
            str(chunk.run_id)[:8], chunk.run.policy)

    @admin.display(description="tries", ordering="deliveries")
    def tries(self, chunk):
        return chunk.deliveries

    @admin.display(description="changed")
    def changed(self, chunk):
        """Rows deleted or, for an update policy, updated."""
        return chunk.rows_changed

    @admin.display(description="failure", ordering="failure_class")
    def failure(self, chunk):
        return chunk.failure_class or ""

    @admin.display(description="last change")
    def when(self, chunk):
        moment = (chunk.acknowledged_at or chunk.committed_at or chunk.dead_lettered_at
                  or chunk.discarded_at or chunk.last_delivery_at or chunk.planned_at)
        return format_html('<span title="{}" style="white-space:nowrap">{}</span>',
                           moment.isoformat(timespec="microseconds"),
                           moment.strftime("%m-%d %H:%M:%S"))

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
        """The last real error's own line, and the poison verdict beside it."""
        summary = chunk.failure_summary
        if not summary:
            return ""
        return format_html('<span title="{}">{}</span>', summary, _shorten(summary, 60))

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
        if request.POST.get("post") != "yes":
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

    @admin.action(description="Requeue selected dead-lettered chunks", permissions=["requeue"])
    def requeue_chunks(self, request, queryset):
        result = operations.requeue([c.pk for c in queryset], actor=actor(request))
        for chunk in Chunk.objects.filter(pk__in=result.affected):
            self.log_change(request, chunk, "Requeued")
        self.report(request, result, "%(count)d chunk requeued.", "%(count)d chunks requeued.",
                    "%(count)d chunks were not dead-lettered (or their run was cancelled) "
                    "and were left alone.")

    @admin.action(description="Discard selected dead-lettered chunks", permissions=["discard"])
    def discard_chunks(self, request, queryset):
        form = DiscardForm(request.POST if "reason" in request.POST else None)
        if request.POST.get("post") != "yes" or not form.is_valid():
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


@admin.register(Slot)
class SlotAdmin(LedgerAdmin):
    """The trigger ledger: each schedule slot the scheduler fired and what it did."""

    list_display = ("policy", "slot_at", "fired_at", "outcome", "run_link", "dispatched_at")
    list_filter = ("policy", "outcome")
    readonly_fields = list_display

    @admin.display(description="run")
    def run_link(self, slot):
        if not slot.run_id:
            return "-"
        url = reverse("admin:cleanup_run_change", args=[slot.run_id])
        return format_html('<a href="{}">{}</a>', url, str(slot.run_id)[:8])


@admin.register(OrphanMessage)
class OrphanMessageAdmin(LedgerAdmin):
    list_display = ("received_at", "error", "raw")
    readonly_fields = ("received_at", "error", "raw")


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
        context = {
            **self.admin_site.each_context(request),
            "title": "Cleanup overview",
            "opts": self.opts,
            "policies": overview(),
            "clusters": health_report.report()[1].get("clusters", []),
            "lease": lease(),
        }
        return TemplateResponse(request, "admin/cleanup/cleanupoverview/overview.html",
                                context)
