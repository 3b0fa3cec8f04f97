from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    verbose_name = "Reservations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from cleanup import register_handler, register_task
        from reservations import checks  # noqa: F401  (registers the system checks)
        from reservations.conf import conf
        from reservations.metrics import register_collector
        from reservations.policies import register_policies
        from reservations.timestamps import install_loaders
        from reservations.waitlist import SEAT_FREED, offer_freed_seat

        register_policies()
        register_collector()
        # Before anything can emit it: an event with no handler is dead at once.
        register_handler(SEAT_FREED, offer_freed_seat)
        register_task("send-reminders", "reservations.reminders.send_ready_reminders",
                      conf.REMINDER_SEND_SCHEDULE)
        connection_created.connect(install_loaders, dispatch_uid="reservations.timestamps")
