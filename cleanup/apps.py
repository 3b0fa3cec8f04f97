from django.apps import AppConfig


class CleanupConfig(AppConfig):
    name = "cleanup"
    verbose_name = "Cleanup"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from cleanup import checks, receivers  # noqa: F401  (registers checks and signals)
        from cleanup.observability.metrics import register_collector
        from cleanup.retention import register_policies

        _log_through_logging()
        register_collector()
        register_policies()


def _log_through_logging() -> None:
    """Send the engine's log lines through the standard library's logging where the host
    has not configured structlog: its LOGGING then decides what is shown, and a
    command's quiet default holds (structlog left unconfigured prints every line,
    INFO too, to stdout). A host that configures structlog keeps its own setup."""
    import structlog

    if structlog.is_configured():
        return
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, structlog.contextvars.merge_contextvars,
                    structlog.processors.format_exc_info,
                    structlog.processors.KeyValueRenderer(key_order=["event"])],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
