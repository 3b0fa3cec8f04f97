"""Messages no chunk took: kept, with what they named, where operators look for them.

State changes of chunks and runs live in cleanup.engine.transitions."""

from __future__ import annotations

import json
from typing import Any

import structlog

from cleanup.models import OrphanMessage

log = structlog.get_logger("cleanup.ledger")
CHUNK_ID_MAX = 2**31 - 1  # PositiveIntegerField on PostgreSQL


def record_orphan(raw: Any, reason: str, *, run_id: str | None = None,
                  chunk_id: int | None = None) -> OrphanMessage:
    """Keep a message no chunk took, with its raw text and what it named."""
    try:
        text = raw if isinstance(raw, str) else json.dumps(raw, default=repr)
    except (TypeError, ValueError):
        text = repr(raw)
    # PostgreSQL text cannot hold NUL; keep it visible as JSON writes it.
    text, reason = (part.replace("\x00", "\\u0000") for part in (text, reason))
    # A chunk id no chunk can have (negative, past the column) stays in the raw text only.
    if not (isinstance(chunk_id, int) and 0 <= chunk_id <= CHUNK_ID_MAX):
        chunk_id = None
    orphan = OrphanMessage.objects.create(raw=text, error=reason, run_id=run_id,
                                          chunk_id=chunk_id)
    log.warning("orphan message dead-lettered", policy="unknown", outcome="dead_lettered",
                orphan_id=orphan.pk, run_id=run_id, chunk_id=chunk_id, reason=reason)
    return orphan
