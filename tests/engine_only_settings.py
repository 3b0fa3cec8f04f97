"""The project's settings without the product app, django-prometheus or WhiteNoise: the
engine must stand alone, also where it is installed without the `site` extra (.ci/engine,
on a Django that django-prometheus does not allow yet; config.settings still reads
DATABASE_URL with dj-database-url, which .ci/engine installs)."""

from config.settings import *  # noqa: F403

# What only the host project uses (lower case: Django would take it for a setting).
host_only = ("reservations", "django_prometheus", "whitenoise")
INSTALLED_APPS = [app for app in INSTALLED_APPS  # noqa: F405
                  if app.split(".")[0] not in host_only]
MIDDLEWARE = [entry for entry in MIDDLEWARE  # noqa: F405
              if entry.split(".")[0] not in host_only]
