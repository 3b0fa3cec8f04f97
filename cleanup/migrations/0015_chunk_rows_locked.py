from django.db import migrations, models


def install_unfold_trigger(apps, schema_editor):
    """Installed the trigger that unfolded a folded chunk before it changed. Folding is
    gone since 0022 (totals are counted as each change commits), which drops the
    trigger where an earlier release installed it: a database migrated now never needs
    it."""


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
