from django.apps import AppConfig


class SoakConfig(AppConfig):
    """Installed only in the soak's qcluster processes (config.devtools.soak.settings)."""

    name = "config.devtools.soak"
    label = "soak"
    verbose_name = "Soak"

    def ready(self) -> None:
        from config.devtools.soak.poison import register_poison_policy

        register_poison_policy()
