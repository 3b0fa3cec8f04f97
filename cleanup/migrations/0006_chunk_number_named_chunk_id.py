from django.db import migrations, models


class Migration(migrations.Migration):
    """A chunk's number within its run is chunk_id everywhere: model, messages, commands."""

    dependencies = [
        ('cleanup', '0005_streaming_runs'),
    ]

    operations = [
        migrations.RemoveConstraint(model_name='chunk', name='chunk_unique_seq'),
        migrations.RenameField(model_name='chunk', old_name='seq', new_name='chunk_id'),
        migrations.AlterField(
            model_name='chunk',
            name='chunk_id',
            field=models.PositiveIntegerField(help_text="The chunk's id within its run (#12)."),
        ),
        migrations.AlterModelOptions(name='chunk', options={'ordering': ['run', 'chunk_id']}),
        migrations.AddConstraint(
            model_name='chunk',
            constraint=models.UniqueConstraint(fields=('run', 'chunk_id'),
                                               name='chunk_unique_id_in_run'),
        ),
    ]
