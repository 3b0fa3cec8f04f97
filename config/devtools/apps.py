from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    name = "config.devtools"
    label = "devtools"
    verbose_name = "Development tools"
