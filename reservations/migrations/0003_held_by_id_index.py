from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built without locking out renewals on a live table.
    atomic = False

    dependencies = [
        ('reservations', '0002_held_by_tenant_index'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='seathold',
            index=models.Index(condition=models.Q(('status', 'held')), fields=['id'], include=('expires_at',), name='seathold_held_by_id'),
        ),
    ]
