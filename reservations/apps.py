from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    verbose_name = "Reservations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from reservations.policies import register_policies

        register_policies()
