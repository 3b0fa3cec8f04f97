from django.apps import AppConfig


class EngineAppConfig(AppConfig):
    """A small app of leases on which the tests pin the engine's own rules, apart from
    the product's."""

    name = "tests.engine_app"
    label = "engine_app"
    verbose_name = "Engine test app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tests.engine_app.policies import register_policies

        register_policies()
