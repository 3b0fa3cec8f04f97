# The ledger's transitions as the database's own functions: a chunk's delivery
# (cleanup/sql/delivery_v1.sql) and the window (cleanup/sql/window_v1.sql); and a
# chunk's planned rows marked where they were estimated rather than counted.

from pathlib import Path

from django.db import migrations, models

SQL = Path(__file__).resolve().parent.parent / "sql"
DELIVERY_V1 = (SQL / "delivery_v1.sql").read_text()
WINDOW_V1 = (SQL / "window_v1.sql").read_text()

DROP_DELIVERY_V1 = """
DROP FUNCTION IF EXISTS
    cleanup_history_add_v1(jsonb, jsonb, integer),
    cleanup_history_end_v1(jsonb, integer, jsonb),
    cleanup_delivery_end_v1(timestamptz, text, integer, integer, integer, text),
    cleanup_delivery_start_v1(uuid, integer, text, timestamptz, timestamptz, integer, integer),
    cleanup_chunk_begin_v1(bigint, integer, integer, integer, text, text, text, text, boolean,
                           integer),
    cleanup_chunk_committed_v1(bigint, integer, integer, integer, integer, integer, integer,
                               integer, timestamptz),
    cleanup_chunk_noop_v1(bigint, integer, integer, text, timestamptz),
    cleanup_chunk_retrying_v1(bigint, integer, text, text, integer, timestamptz),
    cleanup_chunk_dead_lettered_v1(bigint, integer, text, text, text, text, timestamptz);
"""

DROP_WINDOW_V1 = """
DROP FUNCTION IF EXISTS
    cleanup_run_latest_v1(uuid, integer),
    cleanup_run_lock_v1(uuid, integer),
    cleanup_top_up_open_v1(text, integer, integer),
    cleanup_top_up_open_v1(text, integer, integer, integer),
    cleanup_run_settle_v1(uuid, timestamptz),
    cleanup_run_planned_v1(uuid, jsonb, jsonb, jsonb, timestamptz);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0022_totals'),
    ]

    operations = [
        migrations.AddField(
            model_name='chunk',
            name='rows_estimated',
            field=models.BooleanField(db_default=False, default=False, help_text="Its planned rows were estimated from the run's density, not counted."),
        ),
        migrations.RunSQL(DELIVERY_V1, DROP_DELIVERY_V1),
        migrations.RunSQL(WINDOW_V1, DROP_WINDOW_V1),
    ]
