from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: the chunk table of a busy install holds millions of rows, and
    # a plain CREATE INDEX would stop every worker's commit while it builds.
    atomic = False

    dependencies = [
        ("cleanup", "0016_chunk_history"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="chunk",
            index=models.Index(condition=models.Q(("committed_at__isnull", False)),
                               fields=["committed_at"], name="chunk_committed_at"),
        ),
    ]
