# A chunk's WAL, where the server counts WAL for each session (cleanup/sql/wal_v1.sql).

from pathlib import Path

from django.db import migrations, models

WAL_V1 = (Path(__file__).resolve().parent.parent / "sql" / "wal_v1.sql").read_text()

DROP_WAL_V1 = """
DROP TRIGGER IF EXISTS cleanup_count_chunk_wal_v1 ON cleanup_chunk;
DROP FUNCTION IF EXISTS
    cleanup_wal_mark_v1(),
    cleanup_chunk_wal_v1(bigint, jsonb, jsonb, integer),
    cleanup_count_chunk_wal_v1();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0025_clusters_stop_steps_blocked_shared_readings'),
    ]

    operations = [
        migrations.AddField(
            model_name='chunk',
            name='wal_bytes',
            field=models.BigIntegerField(blank=True, help_text='WAL its committing transaction wrote, in bytes; empty where it was not measured (PostgreSQL before 18 keeps no per-session WAL counters).', null=True),
        ),
        migrations.RunSQL(WAL_V1, DROP_WAL_V1),
    ]
