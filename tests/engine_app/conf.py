"""The test app's settings under LEASES_*, each read on every access (so the pytest
``settings`` fixture changes them), with its defaults. Its own: the engine's test app
imports nothing of the product."""

from django.conf import settings

DEFAULTS = {
    "EXPIRE_CHUNK_SIZE": 500,
    "FLAG_CHUNK_SIZE": 500,
    "PURGE_CHUNK_SIZE": 1000,
    # Lease logs are purged once older than this.
    "LOG_RETENTION_DAYS": 30,
}


class _Settings:
    def __getattr__(self, name: str):
        if name not in DEFAULTS:
            raise AttributeError(name)
        return getattr(settings, f"LEASES_{name}", DEFAULTS[name])


conf = _Settings()
