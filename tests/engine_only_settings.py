"""The project's settings without the product app: the engine must stand alone.

Nor anything the `site` extra installs for the host project alone (django-prometheus,
WhiteNoise), so the engine's tests also run where the engine is installed without it
(.ci/engine, on a Django that django-prometheus does not allow yet; there the settings
still read DATABASE_URL with dj-database-url, which .ci/engine installs).
"""

from config.settings import *  # noqa: F403

HOST_ONLY = ("reservations", "django_prometheus", "whitenoise")
INSTALLED_APPS = [app for app in INSTALLED_APPS  # noqa: F405
                  if app.split(".")[0] not in HOST_ONLY]
MIDDLEWARE = [entry for entry in MIDDLEWARE  # noqa: F405
              if entry.split(".")[0] not in HOST_ONLY]
