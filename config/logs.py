"""structlog on top of stdlib logging: console lines by default, JSON lines on demand."""

from __future__ import annotations

import structlog

SHARED_PROCESSORS = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]

structlog.configure(
    processors=[
        *SHARED_PROCESSORS,
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)


def logging_config(*, json_lines: bool, queue_level: str = "INFO") -> dict:
    """Return a LOGGING dict whose handler renders structlog and stdlib records alike.

    ``queue_level`` is django-q2's own logger's: at INFO (the default profile) qcluster
    says at start-up what it runs, and logs each task it processes.
    """
    renderer = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processors": [
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    renderer,
                ],
                "foreign_pre_chain": SHARED_PROCESSORS,
            },
        },
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "structured"},
        },
        "root": {"handlers": ["console"], "level": "WARNING"},
        "loggers": {
            "cleanup": {"level": "INFO"},
            "reservations": {"level": "INFO"},
            "django-q": {"level": queue_level},
        },
    }
