"""The operator console on the admin site: Django autodiscovers this module, and it
registers the console's pages (each in cleanup.console) with the ledger they show, and
django-q2's task pages read-only in place of its own."""

from __future__ import annotations

from django.contrib import admin

from cleanup.console.chunks import ChunkAdmin
from cleanup.console.events import EventAdmin
from cleanup.console.orphans import OrphanMessageAdmin
from cleanup.console.overview import CleanupOverviewAdmin
from cleanup.console.queue import replace_task_admins
from cleanup.console.runs import RunAdmin
from cleanup.console.slots import SlotAdmin
from cleanup.models import Chunk, CleanupOverview, Event, OrphanMessage, Run, Slot

__all__ = ["ChunkAdmin", "CleanupOverviewAdmin", "EventAdmin", "OrphanMessageAdmin",
           "RunAdmin", "SlotAdmin"]

admin.site.register(Run, RunAdmin)
admin.site.register(Chunk, ChunkAdmin)
admin.site.register(Slot, SlotAdmin)
admin.site.register(OrphanMessage, OrphanMessageAdmin)
admin.site.register(Event, EventAdmin)
admin.site.register(CleanupOverview, CleanupOverviewAdmin)
replace_task_admins(admin.site)
