"""The outbox's events: the list, an event's page, and where an operator requeues or
discards dead events (cleanup.outbox's own requeue and discard)."""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections, router
from django.http import Http404, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.translation import ngettext

from cleanup import display, outbox
from cleanup.conf import conf
from cleanup.console.actions import Action
from cleanup.console.base import LedgerAdmin, shorten
from cleanup.console.forms import DiscardForm
from cleanup.exceptions import ActionResult
from cleanup.models import Chunk, Event

# Each state's badge: the chunk state's colour it shares (cleanup/static/cleanup/
# console.css) and its label. A pending event that failed before is "retrying": it waits
# out its back-off, and holds its ordering key meanwhile.
EVENT_BADGES = {
    "pending": ("enqueued", "pending"),
    "retrying": ("retrying", "retrying"),
    "delivered": ("acknowledged", "delivered"),
    "dead": ("dead-lettered", "dead"),
    "discarded": ("discarded", "discarded"),
}

# The list counts its rows up to this many, then says "10,000+": a COUNT(*) of the
# delivered events piling up until the purge reads every one of them on each page.
LIST_COUNT_CAP = 10_000

# Every event name in the table, by a skip scan of the (name, key) unique index: one
# probe per name, however many events each has (SELECT DISTINCT reads them all).
NAMES = """
WITH RECURSIVE names(name) AS (
    (SELECT name FROM cleanup_event ORDER BY name LIMIT 1)
    UNION ALL
    SELECT (SELECT later.name FROM cleanup_event AS later WHERE later.name > names.name
            ORDER BY later.name LIMIT 1)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL
"""


def event_names() -> list[str]:
    """The names of the events in the outbox, in order."""
    with connections[router.db_for_read(Event)].cursor() as cursor:
        cursor.execute(NAMES)
        return [name for (name,) in cursor.fetchall()]


def event_badge(event: Event):
    """An event's state as a badge; one written by hand past the choices as unknown."""
    if event.state not in Event.State.values:
        return display.badge("unknown", f"unknown: {event.state}",
                             "a state the code does not know")
    if event.state == Event.State.PENDING and event.attempts:
        return display.badge(*EVENT_BADGES["retrying"], ngettext(
            "pending: %(count)d attempt failed, tried again after its back-off",
            "pending: %(count)d attempts failed, tried again after its back-off",
            event.attempts) % {"count": event.attempts})
    return display.badge(*EVENT_BADGES[event.state])


def next_try(event: Event):
    """When a publisher takes a pending event: not before its back-off ends, and only
    once no earlier event of its ordering key is pending."""
    if event.state != Event.State.PENDING:
        return "-"
    if event.available_at <= timezone.now():
        when = "due now: the publisher's next run takes it"
    else:
        when = format_html("not before {} UTC ({}), at the publisher's first run after",
                           display.utc_text(event.available_at), display.ago(event.available_at))
    # The head of its key, through the pending events' partial index (ordering_key, id).
    head = (Event.objects.filter(ordering_key=event.ordering_key, state=Event.State.PENDING,
                                 pk__lt=event.pk).order_by("ordering_key", "pk")
            .values_list("pk", flat=True).first() if event.ordering_key else None)
    if head is None:
        return when
    return format_html('{}; and only once <a href="{}">event {}</a>, the first pending one '
                       "of its ordering key, is delivered or dead", when,
                       reverse("admin:cleanup_event_change", args=[head]), head)


class CappedPaginator(Paginator):
    """Counts at most LIST_COUNT_CAP rows (a few milliseconds through an index); past the
    cap the list says so ("10,000+ events") and pages through the newest of them."""

    @cached_property
    def counted(self) -> int:
        return self.object_list.order_by().values("pk")[: LIST_COUNT_CAP + 1].count()

    @cached_property
    def count(self) -> int:
        return min(self.counted, LIST_COUNT_CAP)

    @property
    def capped(self) -> bool:
        return self.counted > LIST_COUNT_CAP


class EventChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        # The list shows neither payload nor traceback: each up to kilobytes a row.
        return super().get_queryset(request, exclude_parameters).defer(
            "payload", "last_error", "reason")


class EventStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        first = Event.State.DEAD
        return [(first, first.label)] + [(s, s.label) for s in Event.State if s != first]

    def queryset(self, request, queryset):
        return queryset.filter(state=self.value()) if self.value() else queryset


class EventNameFilter(admin.SimpleListFilter):
    title = "name"
    parameter_name = "name"

    def lookups(self, request, model_admin):
        return [(name, name) for name in event_names()]

    def queryset(self, request, queryset):
        return queryset.filter(name=self.value()) if self.value() else queryset


class EventDiscardForm(DiscardForm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        reason = self.fields["reason"]
        reason.help_text = "Kept on each event; no publisher delivers it again."
        reason.error_messages["required"] = ("A reason is required to discard events: "
                                             "nothing was discarded.")


class EventAdmin(LedgerAdmin):
    """The outbox's events, newest first; dead ones requeued or discarded from here."""

    # Fits a 1366 px laptop with the sidebar open: two-line cells for what belongs
    # together (the source below the id, the key below the name, the attempts below the
    # state, the delivery below the creation).
    list_display = ("event", "name_key", "ordering_key_short", "state_badge", "created",
                    "error")
    list_display_links = None  # the id links to the event, the line below to its source
    list_filter = (EventStateFilter, EventNameFilter)
    search_fields = ("key",)  # the box; get_search_results says how it searches
    search_help_text = ("An event's key, exact (seathold:42) or its start (seathold:4), "
                        "or its dedup id (reservations.seat_freed/seathold:42).")
    # Newest first, through the primary key; the other columns would sort the table.
    ordering = ("-id",)
    sortable_by = ("event",)
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a count per filter choice
    actions = ["requeue_events", "discard_events"]
    fieldsets = [
        (None, {"fields": ("name", "key", "dedup", "ordering_key", "state_badge",
                           "source_link")}),
        ("Failure", {"fields": ("cause", "last_error_text", "reason")}),
        ("Payload", {"fields": ("payload_json",)}),
        ("Timestamps", {"fields": ("created", "call", "next_try_text", "delivered",
                                   "settled")}),
    ]
    readonly_fields = [f for _, spec in fieldsets for f in spec["fields"]]

    def get_changelist(self, request, **kwargs):
        return EventChangeList

    def get_urls(self):
        return [
            path("<path:object_id>/chunk/", self.admin_site.admin_view(self.chunk_view),
                 name="cleanup_event_chunk"),
        ] + super().get_urls()

    def chunk_view(self, request, object_id):
        """The page of the chunk that wrote an event, found when followed (a lookup per
        row would cost the list a probe for each row it skips to reach a page)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        event = self.get_object(request, object_id)
        if event is None:
            raise Http404(f"No event {object_id}.")
        chunk = (Chunk.objects.filter(run_id=event.run_id, chunk_id=event.chunk_id)
                 .values_list("pk", flat=True).first())
        if chunk is not None:
            return HttpResponseRedirect(reverse("admin:cleanup_chunk_change", args=[chunk]))
        self.message_user(request, f"Chunk #{event.chunk_id} of run {event.run_id} is no "
                          "longer in the ledger: the ledger's purge took its run.",
                          messages.WARNING)
        return HttpResponseRedirect(reverse("admin:cleanup_event_change", args=[event.pk]))

    def get_fieldsets(self, request, obj=None):
        """The failure first on a dead or discarded event, after the event on one that
        failed and went on, left out on one that never failed; the discard's reason and
        the next try only where they apply."""
        if obj is None:
            return self.fieldsets
        left_out = set() if obj.reason else {"reason"}
        if obj.state != Event.State.PENDING:
            left_out.add("next_try_text")
        if obj.call_started_at is None:
            left_out.add("call")
        fieldsets = [(name, {"fields": tuple(f for f in spec["fields"] if f not in left_out)})
                     for name, spec in self.fieldsets]
        if not (obj.cause or obj.last_error or obj.reason):
            return [spec for spec in fieldsets if spec[0] != "Failure"]
        if obj.state in (Event.State.DEAD, Event.State.DISCARDED):
            failure = [spec for spec in fieldsets if spec[0] == "Failure"]
            return failure + [spec for spec in fieldsets if spec[0] != "Failure"]
        return fieldsets

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}),
                         "can_requeue": self.has_requeue_permission(request),
                         "can_discard": self.has_discard_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context)

    def get_search_results(self, request, queryset, search_term):
        """An event's exact key or dedup id, else the keys starting with the text. The
        exact ones probe the (name, key) unique index once per name; icontains would
        read the whole table."""
        term = search_term.strip()
        if not term:
            return queryset, False
        names = event_names()
        name, _, key = term.partition("/")
        if name in names and key:
            return queryset.filter(name=name, key=key), False
        exact = queryset.filter(name__in=names, key=term)
        if exact.exists():
            return exact, False
        # A prefix: through event_key_prefix, the key's pattern ops (LIKE under a
        # collation other than C).
        return queryset.filter(key__startswith=term), False

    @admin.display(description="event", ordering="id")
    def event(self, event):
        return format_html('<a href="{}">#{}</a><br><small>{}</small>',
                           reverse("admin:cleanup_event_change", args=[event.pk]), event.pk,
                           self.source_link(event))

    @admin.display(description="name")
    def name_key(self, event):
        """The name, and the key below it (both one word: cut, in full on hover)."""
        return format_html('<span class="policy-name" title="{}">{}</span><br>'
                           '<small class="nowrap" title="{}">{}</small>', event.name,
                           shorten(event.name, 32), event.key, shorten(event.key, 22))

    @admin.display(description="ordering key")
    def ordering_key_short(self, event):
        if not event.ordering_key:
            return "-"
        return format_html('<span class="nowrap" title="{}">{}</span>', event.ordering_key,
                           shorten(event.ordering_key, 14))

    @admin.display(description="state")
    def state_badge(self, event):
        """The state, and below it the handler calls that failed (of the most a pending
        event gets before it is dead)."""
        if not event.attempts:
            return event_badge(event)
        if event.state == Event.State.PENDING:
            failed = (f"{display.number(event.attempts)} of {conf.EVENT_MAX_ATTEMPTS:,} "
                      "attempts failed")
        else:
            failed = ngettext("%(count)s attempt failed", "%(count)s attempts failed",
                              event.attempts) % {"count": display.number(event.attempts)}
        return format_html("{}<br><small>{}</small>", event_badge(event), failed)

    @admin.display(description="created")
    def created(self, event):
        """When it was written; below, how long its delivery took, or how long ago."""
        if event.delivered_at is None:
            below = display.ago(event.created_at)
        else:
            taken = (event.delivered_at - event.created_at).total_seconds()
            below = f"delivered in {display.duration(max(taken, 0))}"
        return format_html('{}<br><small class="nowrap">{}</small>',
                           display.moment_html(event.created_at),
                           below)

    @admin.display(description="delivered")
    def delivered(self, event):  # when its handler's transaction committed
        return display.moment_html(event.delivered_at)

    @admin.display(description="settled")
    def settled(self, event):  # when it left pending: delivered, dead or discarded
        return display.moment_html(event.settled_at, relative=True)

    @admin.display(description="handler call")
    def call(self, event):
        """A call recorded before its handler ran and not returned (cleanup.outbox)."""
        return format_html("began {} UTC ({}) and has not returned: running now, or its "
                           "publisher died in it, which the next publisher counts as a "
                           "failed attempt (not before {} UTC)",
                           display.utc_text(event.call_started_at),
                           display.ago(event.call_started_at),
                           display.utc_text(event.available_at))

    @admin.display(description="next try")
    def next_try_text(self, event):
        return next_try(event)

    @admin.display(description="source")
    def source_link(self, event):
        """The run and chunk whose statement wrote it, or the host."""
        if event.run_id is None:
            return event.source
        run = display.id_html(event.run_id, reverse("admin:cleanup_run_change",
                                                     args=[event.run_id]))
        if event.chunk_id is None:
            return run
        return format_html('<span class="nowrap">{} <a href="{}">#{}</a></span>', run,
                           reverse("admin:cleanup_event_chunk", args=[event.pk]),
                           event.chunk_id)

    @admin.display(description="last error")
    def error(self, event):
        """Why a dead event died, or why a pending one is being retried."""
        if not event.cause or event.state not in (Event.State.DEAD, Event.State.PENDING):
            return ""
        return format_html('<span title="{}">{}</span>', event.cause, shorten(event.cause, 60))

    @admin.display(description="dedup id")
    def dedup(self, event):
        return format_html("<code>{}</code>", event.dedup_id)
    dedup.help_text = ("What an effect outside the database carries (a mail's Message-ID): "
                       "the same on every delivery of this event.")

    @admin.display(description="last error")
    def last_error_text(self, event):
        # Scrolls sideways inside the page: a traceback's lines are as long as its code's.
        return (format_html('<pre class="traceback">{}</pre>', event.last_error)
                if event.last_error else "-")

    @admin.display(description="payload")
    def payload_json(self, event):
        return format_html('<pre class="payload">{}</pre>',
                           json.dumps(event.payload, indent=2, ensure_ascii=False))

    @admin.action(description="Requeue selected dead events", permissions=["requeue"])
    def requeue_events(self, request, queryset):
        return self.act(request, queryset, Action(
            "requeue_events", "Requeue events",
            "Each dead event goes back to pending, taken by the publisher's next run, "
            "its attempts kept: one more failure makes it dead again. Events that are "
            "not dead are left alone.",
            done=("%(count)d event requeued.", "%(count)d events requeued."),
            **LEFT_ALONE, logged="Requeued"),
            lambda events, _: dead_ones(events, outbox.requeue))

    @admin.action(description="Discard selected dead events", permissions=["discard"])
    def discard_events(self, request, queryset):
        return self.act(request, queryset, Action(
            "discard_events", "Discard events",
            "Only dead events are discarded: their handlers will not be called again. "
            "Other events are left alone.",
            done=("%(count)d event discarded.", "%(count)d events discarded."),
            **LEFT_ALONE, logged="Discarded: %(reason)s", form=EventDiscardForm),
            lambda events, given: dead_ones(
                events, lambda ids: outbox.discard(ids, given["reason"])))

    def changed_rows(self, pks):
        return super().changed_rows(pks).only("name", "key", "state")


LEFT_ALONE = {"skipped": "%(count)d event was not dead and was left alone.",
              "skipped_plural": "%(count)d events were not dead and were left alone."}


def dead_ones(events, move) -> ActionResult:
    """Move the selection's dead events; count the others as left alone."""
    selected = events.count()
    # Only dead events can move: the others are counted, not read (selecting across a
    # filter can hold thousands of delivered ones).
    result = move(list(events.filter(state=Event.State.DEAD).values_list("pk", flat=True)))
    return ActionResult(result.done, selected - result.done, result.affected)
