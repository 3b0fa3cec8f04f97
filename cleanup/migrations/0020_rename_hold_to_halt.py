# The engine's word for a policy that plans nothing new (paused, under pressure or
# failing) was "hold", which read like the product's seat holds; it is "halt" now.
# Renaming the table takes a brief ACCESS EXCLUSIVE lock on a table of a few rows.
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("cleanup", "0019_event_settled_and_totals"),
    ]

    operations = [
        migrations.RenameModel(old_name="Hold", new_name="Halt"),
        migrations.RemoveConstraint(model_name="halt", name="hold_one_open_per_reason"),
        migrations.AddConstraint(
            model_name="halt",
            constraint=models.UniqueConstraint(
                condition=models.Q(("ended_at__isnull", True)), fields=("policy", "reason"),
                name="halt_one_open_per_reason"),
        ),
    ]
