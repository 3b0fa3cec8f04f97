"""Events written by the database from a statement's own rows: a statement-level
trigger that reads the transition table of a DELETE and inserts one event per row into
the outbox, in the statement's transaction.

A chunk stays one ORM statement with its whole predicate (invariant 2), and the events
its rows cause commit with it or not at all; a chunk delivered twice deletes nothing
the second time, so it writes no event twice, and the event's key would refuse a
second one anyway (``ON CONFLICT DO NOTHING``). A host's own statement (a learner
releasing a hold) fires the same trigger in the learner's transaction.

Where an event came from is read from the transaction: a chunk's transaction names
itself (``cleanup.source``, ``cleanup.run_id``, ``cleanup.chunk_id``, set locally in
the statement that bounds it, cleanup.engine.worker); any other transaction is the
host's. The host writes the trigger into a migration of its own with ``install_sql``
and ``drop_sql``::

    RunSQL(*events_on_delete("reservations_seathold", "seat.freed",
                             key="'seathold:' || gone.id",
                             ordering_key="'section:' || gone.section_id",
                             payload="jsonb_build_object('hold_id', gone.id)",
                             when="gone.status = 'held'"))

Every expression is SQL over ``gone``, the statement's deleted rows. They are the host's
own text, written in its migration, never input.
"""

from __future__ import annotations

import re

from cleanup.outbox import events
from cleanup.outbox.emitting import event_name

# The settings a chunk's transaction sets (cleanup_chunk_begin_v1 in
# cleanup/sql/delivery_v1.sql).
SOURCE = "cleanup.source"
RUN_ID = "cleanup.run_id"
CHUNK_ID = "cleanup.chunk_id"

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


def events_on_delete(table: str, event: str, *, key: str, payload: str,
                     ordering_key: str = "''", when: str = "true",
                     name: str | None = None) -> tuple[str, str]:
    """The SQL that installs (and the SQL that drops) a trigger writing one ``event``
    per row a DELETE on ``table`` removes (those for which ``when`` holds)."""
    name = name or f"{table}_delete_events"
    if not _NAME.match(table) or not _NAME.match(name):
        raise ValueError(f"table and trigger names are lower-case identifiers: {table!r}, "
                         f"{name!r}")
    # emit's rule for a name, checked before the migration runs any SQL (BadEvent).
    event_text = event_name(event).replace("'", "''")
    insert = events.insert_per_row(
        "gone_rows AS gone", when,
        name=f"'{event_text}'", key=key, ordering_key=ordering_key, payload=payload,
        # A chunk's transaction names itself; any other is the host's.
        source=f"coalesce(nullif(current_setting('{SOURCE}', true), ''), 'host')",
        run_id=f"nullif(current_setting('{RUN_ID}', true), '')::uuid",
        chunk_id=f"nullif(current_setting('{CHUNK_ID}', true), '')::integer")
    install = f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{insert};
    RETURN NULL;
END $$;
CREATE TRIGGER {name} AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS gone_rows FOR EACH STATEMENT EXECUTE FUNCTION {name}();
"""
    drop = f"DROP TRIGGER IF EXISTS {name} ON {table}; DROP FUNCTION IF EXISTS {name}();"
    return install, drop
