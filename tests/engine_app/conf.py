"""The test app's settings under LEASES_*, read like the product's."""

from cleanup.conf import PrefixedSettings

conf = PrefixedSettings(
    "LEASES",
    {
        "EXPIRE_CHUNK_SIZE": 500,
        "FLAG_CHUNK_SIZE": 500,
        "PURGE_CHUNK_SIZE": 1000,
        # Lease logs are purged once older than this.
        "LOG_RETENTION_DAYS": 30,
    },
)
