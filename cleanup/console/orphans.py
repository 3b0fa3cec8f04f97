"""The page of messages no chunk took: when, what they named, why, and how they began."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from cleanup import display
from cleanup.console.base import LedgerAdmin, shorten

# An orphan's raw text can be a whole items message (about 100 KB): the list shows its start.
RAW_PREVIEW = 100


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
            len(orphan.raw)), shorten(orphan.raw, RAW_PREVIEW))
