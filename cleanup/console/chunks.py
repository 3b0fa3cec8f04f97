"""The chunks list, the chunk page and the dead letters grouped by cause: where an
operator replays, requeues or discards chunks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.postgres.aggregates import ArrayAgg
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Count, Max, Min
from django.template.defaultfilters import filesizeformat
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from cleanup import display
from cleanup.console.actions import Action, actor
from cleanup.console.badges import state_badge
from cleanup.console.base import LedgerAdmin, count_field, runs_by_short_id, shorten
from cleanup.console.forms import DiscardForm
from cleanup.engine import operations
from cleanup.models import Chunk
from cleanup.observability import blockers, waits
from cleanup.observability.counters import WAL_COUNTED_FROM


class ChunkStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        first = Chunk.State.DEAD_LETTERED
        return [(first, first.label)] + [(s, s.label) for s in Chunk.State if s != first]

    def queryset(self, request, queryset):
        return queryset.filter(state=self.value()) if self.value() else queryset


# The chunk page's outcome: each a count_field below, with separators.
COUNTS = ("rows_deleted_number", "rows_updated_number", "items_skipped_number",
          "rows_locked_number", "wal_written", "deliveries_number",
          "deliveries_completed_number", "noop_deliveries_number", "failures_number",
          "transient_retries_number", "dead_letters_number")


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
        (None, {"fields": ("run_link", "chunk_id", "state", "planned_rows_number")}),
        ("Failure", {"fields": ("failure_class", "reason", "last_error_text",
                                "discard_reason")}),
        ("Outcome", {"fields": COUNTS}),
        ("Message", {"fields": ("message_as_sent", "message_received")}),
        ("Timestamps", {"fields": ("planned_at", "enqueued_at", "last_delivery_at",
                                   "committed_at", "acknowledged_at", "dead_lettered_at",
                                   "discarded_at")}),
    ]
    readonly_fields = [f for _, spec in fieldsets for f in spec["fields"]]

    @admin.display(description=Chunk._meta.get_field("planned_rows").verbose_name)
    def planned_rows_number(self, obj):
        shown = display.number(obj.planned_rows)
        return f"about {shown} (estimated)" if obj.rows_estimated else shown

    planned_rows_number.help_text = (
        "The eligible rows planned into the chunk: counted, or estimated from the density "
        "of the run's latest chunks (its statement changes what is eligible either way).")
    rows_deleted_number = count_field(Chunk, "rows_deleted")
    rows_updated_number = count_field(Chunk, "rows_updated")
    items_skipped_number = count_field(Chunk, "items_skipped")
    rows_locked_number = count_field(Chunk, "rows_locked")
    deliveries_number = count_field(Chunk, "deliveries")
    deliveries_completed_number = count_field(Chunk, "deliveries_completed")
    noop_deliveries_number = count_field(Chunk, "noop_deliveries")
    failures_number = count_field(Chunk, "failures")
    transient_retries_number = count_field(Chunk, "transient_retries")
    dead_letters_number = count_field(Chunk, "dead_letters")

    @admin.display(description="WAL written")
    def wal_written(self, chunk):
        if chunk.wal_bytes is not None:
            return f"{filesizeformat(chunk.wal_bytes)} ({display.number(chunk.wal_bytes)} bytes)"
        if connection.pg_version < WAL_COUNTED_FROM:
            return ("unknown on PostgreSQL < 18: the server keeps no WAL counters for each "
                    "session")
        if chunk.committed_at is None:
            return "-"
        return ("unknown: not measured when it committed (behind a transaction pooler, its "
                "transaction ran on another server connection than its delivery's start; or "
                "the reading failed, as the worker's log says)")

    wal_written.help_text = (
        "The WAL its committing transaction wrote: its statement, the rows' indexes and "
        "its ledger writes (docs/performance.md, A chunk's WAL).")

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
        chunk = self.get_object(request, object_id)
        extra_context = {**(extra_context or {}),
                         "can_requeue": self.has_requeue_permission(request),
                         "can_discard": self.has_discard_permission(request),
                         "blockers": chunk and blockers.for_chunk(chunk),
                         "deliveries": chunk and waits.deliveries(chunk),
                         "deliveries_not_kept": chunk and waits.not_kept(chunk),
                         "in_progress_limit": waits.IN_PROGRESS_NO_LONGER_THAN}
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
        return display.id_html(chunk.run_id, reverse("admin:cleanup_run_change",
                                                     args=[chunk.run_id]))

    @admin.display(description="policy", ordering="run__policy")
    def policy(self, chunk):
        return chunk.run.policy

    @admin.display(description="state", ordering="state")
    def state_badge(self, chunk):
        return state_badge(chunk)

    @admin.display(description="last error")
    def error(self, chunk):
        """The last real error's own line, and the poison verdict below it."""
        summary = chunk.failure_summary
        if not summary:
            return ""
        if not chunk.cause or not chunk.verdict.strip():
            return format_html('<span title="{}">{}</span>', summary, shorten(summary, 60))
        # Both: the verdict (why the engine gave up) must not be cut off behind the cause.
        verdict = chunk.verdict.strip().splitlines()[0]
        return format_html('<span title="{}">{}<br><small>{}</small></span>', summary,
                           shorten(chunk.cause, 60), shorten(verdict, 60))

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
        # Scrolls sideways inside the page: a traceback's lines are as long as its code's.
        return (format_html('<pre class="traceback">{}</pre>', chunk.last_error)
                if chunk.last_error else "-")

    @admin.action(description="Replay selected chunks (committed ones become no-ops)",
                  permissions=["replay"])
    def replay_chunks(self, request, queryset):
        def replay_by_run(chunks, _):
            # Exactly the chunks selected, grouped by run: without the model's ordering,
            # which would join the run into the query.
            selected: dict = {}
            for run_id, chunk_id in chunks.order_by().values_list("run_id", "chunk_id"):
                selected.setdefault(run_id, []).append(chunk_id)
            return self.replay_each(request, selected,
                                    lambda chunk_ids: f"Replayed chunks {sorted(chunk_ids)}")
        return self.act(request, queryset, Action(
            "replay_chunks", "Replay chunks",
            "Each selected chunk is sent again with its run's own cutoff. Committed "
            "chunks turn into no-ops; dead-lettered ones are requeued.",
            done=("%(count)d chunk re-sent.", "%(count)d chunks re-sent."),
            skipped="%(count)d discarded or cancelled chunks were left alone."),
            replay_by_run)

    @admin.action(description="Requeue selected dead-lettered chunks", permissions=["requeue"])
    def requeue_chunks(self, request, queryset):
        return self.act(request, queryset, Action(
            "requeue_chunks", "Requeue chunks",
            "Each dead-lettered chunk goes back to the queue with its run's own cutoff, "
            "its run reopens, and the poison limit counts afresh. Other chunks are left "
            "alone.",
            done=("%(count)d chunk requeued.", "%(count)d chunks requeued."),
            skipped="%(count)d chunks were not dead-lettered (or their run was cancelled) "
                    "and were left alone.", logged="Requeued"),
            lambda chunks, _: operations.requeue([c.pk for c in chunks],
                                                 actor=actor(request)))

    @admin.action(description="Discard selected dead-lettered chunks", permissions=["discard"])
    def discard_chunks(self, request, queryset):
        return self.act(request, queryset, Action(
            "discard_chunks", "Discard chunks",
            "Only dead-lettered chunks are discarded; no delivery will retry them.",
            done=("%(count)d chunk discarded.", "%(count)d chunks discarded."),
            skipped="%(count)d chunks were not dead-lettered and were left alone.",
            logged="Discarded: %(reason)s", form=DiscardForm),
            lambda chunks, given: operations.discard([c.pk for c in chunks], given["reason"],
                                                     actor=actor(request)))

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
            "groups": dead_letter_groups(policy=policy),
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


# Dead letters grouped by what made them fail, for triage a group at a time.
@dataclass(frozen=True)
class DeadLetterGroup:
    failure_class: str
    cause: str
    count: int
    runs: int
    policies: list[str]
    first_at: datetime | None
    last_at: datetime | None
    verdict: str  # a poison group's verdict, as one of its chunks has it
    example_pk: int  # one chunk of the group: the admin's action needs one selected
    policy: str | None = None  # the policy the groups were counted for, if only one

    @property
    def chunks_url(self) -> str:
        """The chunk list filtered to exactly this group."""
        query = {"state": Chunk.State.DEAD_LETTERED, "failure_class": self.failure_class,
                 "cause": self.cause}
        if self.policy:
            query["run__policy"] = self.policy
        query = urlencode(query)
        return f"{reverse('admin:cleanup_chunk_changelist')}?{query}"

    @property
    def requeue_label(self) -> str:
        return f"Requeue {self.count:,}…"

    @property
    def discard_label(self) -> str:
        return f"Discard {self.count:,}…"

    @property
    def what(self) -> str:
        """The group's cause as the operator reads it."""
        return self.cause or (self.verdict.splitlines()[0] if self.verdict else
                              "no error recorded")


def dead_letters(policy: str | None = None):
    chunks = Chunk.objects.filter(state=Chunk.State.DEAD_LETTERED)
    return chunks.filter(run__policy=policy) if policy else chunks


def dead_letter_groups(policy: str | None = None) -> list[DeadLetterGroup]:
    """Dead letters by failure class and cause, the biggest group first."""
    rows = (
        dead_letters(policy).order_by().values("failure_class", "cause")
        .annotate(count=Count("pk"), runs=Count("run", distinct=True),
                  policies=ArrayAgg("run__policy", distinct=True, default=[]),
                  first_at=Min("dead_lettered_at"), last_at=Max("dead_lettered_at"),
                  verdict=Max("verdict"), example_pk=Min("pk"))
        .order_by("-count", "failure_class", "cause")
    )
    return [DeadLetterGroup(**row, policy=policy) for row in rows]
