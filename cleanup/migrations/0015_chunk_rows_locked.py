from django.db import migrations, models


def install_unfold_trigger(apps, schema_editor):
    # The trigger takes a folded chunk's counters back out of LedgerTotal: compiled
    # again, it takes rows_locked out too.
    from cleanup.observability.counters import install_unfold_trigger

    install_unfold_trigger(schema_editor)


class Migration(migrations.Migration):

    dependencies = [
        ("cleanup", "0014_lease"),
    ]

    operations = [
        migrations.AddField(
            model_name="chunk",
            name="rows_locked",
            field=models.PositiveIntegerField(default=0, help_text="Eligible rows another transaction kept locked past the row lock wait: left for a later pass (skipped: locked)."),
        ),
        migrations.AddField(
            model_name="hold",
            name="cause",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.RunPython(install_unfold_trigger, migrations.RunPython.noop, elidable=False),
    ]
