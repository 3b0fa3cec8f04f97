from django.apps import AppConfig


class CleanupConfig(AppConfig):
    name = "cleanup"
    verbose_name = "Cleanup"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from cleanup import checks, receivers  # noqa: F401  (registers checks and signals)
        from cleanup.observability.metrics import register_collector
        from cleanup.retention import register_policies

        register_collector()
        register_policies()
