"""The project's settings without the product app: the engine must stand alone."""

from config.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "reservations"]  # noqa: F405
