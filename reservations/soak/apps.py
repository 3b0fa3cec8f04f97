from django.apps import AppConfig


class SoakConfig(AppConfig):
    """Installed only in the soak's qcluster processes (reservations.soak.settings)."""

    name = "reservations.soak"
    label = "soak"
    verbose_name = "Soak"

    def ready(self) -> None:
        from reservations.soak.poison import register_poison_policy

        register_poison_policy()
