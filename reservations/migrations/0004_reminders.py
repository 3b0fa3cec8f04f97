import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

# The database deletes a hold's reminder with it, once per statement: one set-based
# DELETE over the rows the statement removed (its transition table). Django knows of
# no cascade, so the hold DELETE stays one statement; a foreign key with ON DELETE
# CASCADE would have checked each deleted hold on its own, which made the DELETE of
# 200,000 expired holds 7-10 times slower, even with no reminders at all.
REMINDERS_FOLLOW_HOLDS = """
CREATE FUNCTION reservations_delete_reminders_of_gone_holds() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM reservations_reminder AS reminder USING gone
    WHERE reminder.hold_id = gone.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER reservations_seathold_deletes_reminders
    AFTER DELETE ON reservations_seathold
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION reservations_delete_reminders_of_gone_holds();
"""
DROP_REMINDERS_FOLLOW_HOLDS = """
DROP TRIGGER reservations_seathold_deletes_reminders ON reservations_seathold;
DROP FUNCTION reservations_delete_reminders_of_gone_holds();
"""


def remind_current_holds(apps, schema_editor):
    """Held seats that have not expired get their reminder, as if hold_seat had made it."""
    from reservations.conf import conf

    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO reservations_reminder (tenant_id, hold_id, learner_ref, due_at, state,
                                               created_at, updated_at)
            SELECT tenant_id, id, learner_ref, expires_at - %s * interval '1 minute',
                   'pending', now(), now()
            FROM reservations_seathold WHERE status = 'held' AND expires_at > now()
            """,
            [conf.REMINDER_LEAD_MINUTES],
        )


class Migration(migrations.Migration):

    dependencies = [
        ('reservations', '0003_held_by_id_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='reminderattempt',
            name='message_id',
            field=models.CharField(blank=True, db_default='', max_length=200),
        ),
        migrations.CreateModel(
            name='Reminder',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('learner_ref', models.CharField(max_length=100)),
                ('due_at', models.DateTimeField()),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('ready', 'Ready to send'), ('sent', 'Sent'), ('cancelled', 'Cancelled')], default='pending', max_length=10)),
                ('ready_at', models.DateTimeField(blank=True, null=True)),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('hold', models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='reservations.seathold')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='reservations.tenant')),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('state', 'pending')), fields=['due_at', 'id'], name='reminder_pending_by_due'), models.Index(condition=models.Q(('state', 'pending')), fields=['id'], include=('due_at',), name='reminder_pending_by_id'), models.Index(condition=models.Q(('state', 'ready')), fields=['due_at', 'id'], name='reminder_ready_by_due')],
            },
        ),
        migrations.RunSQL(REMINDERS_FOLLOW_HOLDS, DROP_REMINDERS_FOLLOW_HOLDS),
        migrations.RunPython(remind_current_holds, migrations.RunPython.noop),
    ]
