# Totals counted as each change commits (cleanup/sql/totals_v1.sql) replace the folding
# of chunks into LedgerTotal, its unfold trigger and the purge's roll-up; one table
# keeps the ledger's totals and the outbox's (EventTotal before).

from pathlib import Path

from django.db import migrations, models

TOTALS_V1 = (Path(__file__).resolve().parent.parent / "sql" / "totals_v1.sql").read_text()

DROP_TOTALS_V1 = """
DROP TRIGGER IF EXISTS cleanup_count_new_chunk_v1 ON cleanup_chunk;
DROP TRIGGER IF EXISTS cleanup_count_chunk_change_v1 ON cleanup_chunk;
DROP TRIGGER IF EXISTS cleanup_count_new_run_v1 ON cleanup_run;
DROP TRIGGER IF EXISTS cleanup_count_run_change_v1 ON cleanup_run;
DROP TRIGGER IF EXISTS cleanup_count_gone_chunks_v1 ON cleanup_chunk;
DROP TRIGGER IF EXISTS cleanup_count_gone_runs_v1 ON cleanup_run;
DROP FUNCTION IF EXISTS cleanup_count_chunk_v1(), cleanup_count_run_v1(),
    cleanup_count_gone_v1(), cleanup_chunk_change_v1(cleanup_chunk, cleanup_chunk),
    cleanup_run_change_v1(cleanup_run, cleanup_run), cleanup_total_add_v1(text, text, jsonb),
    cleanup_figures_sum_v1(jsonb, jsonb);
"""

# What the scrape summed until now, once: the totals rolled up and folded, the chunks not
# folded and every run; and the outbox's totals. Zeros are left out.
FIRST_TOTALS = """
INSERT INTO cleanup_total (family, subject, figures)
SELECT 'policy', policy, jsonb_object_agg(key, value)
FROM (
    SELECT policy, key, sum(value)::bigint AS value
    FROM (
        SELECT policy, key, value FROM cleanup_ledgertotal
        UNION ALL
        SELECT run.policy, figure.key, figure.value::bigint
        FROM cleanup_chunk AS chunk JOIN cleanup_run AS run ON run.id = chunk.run_id,
             jsonb_each_text(cleanup_chunk_change_v1(NULL, chunk)) AS figure
        WHERE NOT chunk.folded
        UNION ALL
        SELECT run.policy, figure.key, figure.value::bigint
        FROM cleanup_run AS run, jsonb_each_text(cleanup_run_change_v1(NULL, run)) AS figure
    ) AS parts
    GROUP BY policy, key
    HAVING sum(value) <> 0
) AS summed
GROUP BY policy;
INSERT INTO cleanup_total (family, subject, figures)
SELECT 'event', name, jsonb_object_agg(state, value)
FROM cleanup_eventtotal WHERE value <> 0 GROUP BY name;
"""

DROP_UNFOLD_TRIGGER = """
DROP TRIGGER IF EXISTS cleanup_chunk_unfold ON cleanup_chunk;
DROP FUNCTION IF EXISTS cleanup_chunk_unfold();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cleanup', '0021_run_in_process_gone'),
    ]

    operations = [
        migrations.CreateModel(
            name='Total',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('family', models.CharField(max_length=16)),
                ('subject', models.CharField(max_length=100)),
                ('figures', models.JSONField(default=dict)),
            ],
        ),
        migrations.AddConstraint(
            model_name='total',
            constraint=models.UniqueConstraint(fields=('family', 'subject'), name='total_unique_subject'),
        ),
        migrations.RunSQL(DROP_UNFOLD_TRIGGER, migrations.RunSQL.noop),
        migrations.RunSQL(TOTALS_V1, DROP_TOTALS_V1),
        migrations.RunSQL(FIRST_TOTALS, migrations.RunSQL.noop),
        migrations.DeleteModel(
            name='EventTotal',
        ),
        migrations.DeleteModel(
            name='LedgerTotal',
        ),
        migrations.RemoveIndex(
            model_name='chunk',
            name='chunk_not_folded',
        ),
        migrations.RemoveField(
            model_name='chunk',
            name='folded',
        ),
    ]
