# The ledger's other transitions as the database's own functions
# (cleanup/sql/ledger_v1.sql), and the window's again (cleanup/sql/window_v1.sql): its
# top-up's opening takes the transaction's lock bound since (a database migrated to
# 0023 before has the opening without it, dropped here). The chunk's help text.

from pathlib import Path

from django.db import migrations, models

SQL = Path(__file__).resolve().parent.parent / "sql"
WINDOW_V1 = (SQL / "window_v1.sql").read_text()
LEDGER_V1 = (SQL / "ledger_v1.sql").read_text()

DROP_EARLIER_OPENING = "DROP FUNCTION IF EXISTS cleanup_top_up_open_v1(text, integer, integer);"

DROP_LEDGER_V1 = """
DROP FUNCTION IF EXISTS
    cleanup_run_created_v1(jsonb),
    cleanup_run_eligible_v1(uuid, bigint),
    cleanup_run_planning_failed_v1(uuid, text),
    cleanup_runs_sent_v1(jsonb),
    cleanup_chunks_enqueued_v1(bigint[], timestamptz),
    cleanup_chunks_reconciled_v1(bigint[], timestamptz),
    cleanup_chunk_acknowledged_v1(uuid, integer, timestamptz),
    cleanup_chunks_requeued_v1(bigint[], timestamptz),
    cleanup_chunks_discarded_v1(bigint[], text, timestamptz),
    cleanup_runs_cancelled_v1(uuid[], timestamptz);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0023_ledger_functions'),
    ]

    operations = [
        migrations.AlterField(
            model_name='chunk',
            name='chunk_id',
            field=models.PositiveIntegerField(help_text="The chunk's number within its run, in the order it was planned."),
        ),
        migrations.RunSQL(DROP_EARLIER_OPENING, migrations.RunSQL.noop),
        migrations.RunSQL(WINDOW_V1, migrations.RunSQL.noop),
        migrations.RunSQL(LEDGER_V1, DROP_LEDGER_V1),
    ]
