"""System checks of the product's settings."""

from __future__ import annotations

from numbers import Real

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from cleanup.host import conf as cleanup_conf
from reservations.conf import conf

# Reminder.attempts is a PositiveSmallIntegerField.
MAX_ATTEMPTS_LIMIT = 32767


@checks.register()
def check_learner_email(app_configs=None, **kwargs):
    """The reminder address format must take a learner_ref and give an address."""
    template = conf.LEARNER_EMAIL
    try:
        address = template.format(learner_ref="learner-1")
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        address, problem = None, f"it cannot be filled in ({exc!r})"
    else:
        problem = None if "@" in address else f"it gives {address!r}, not a mail address"
    if problem is None and "{learner_ref}" in template:
        return []
    return [checks.Error(
        f"RESERVATIONS_LEARNER_EMAIL {template!r} is not a reminder address: "
        f"{problem or 'it does not use {learner_ref}, so every learner gets one address'}.",
        hint="Give a format with {learner_ref}, e.g. '{learner_ref}@learners.example.edu'.",
        id="reservations.E001",
    )]


@checks.register()
def check_email_backend(app_configs=None, **kwargs):
    """EMAIL_BACKEND (DJANGO_EMAIL_BACKEND) must name a class that can be imported: the
    reminder sender would otherwise fail on every mail, in the workers."""
    path = settings.EMAIL_BACKEND
    try:
        import_string(path)
    except ImportError as exc:
        return [checks.Error(
            f"EMAIL_BACKEND {path!r} cannot be imported ({exc}), so no reminder can be sent.",
            hint="Set DJANGO_EMAIL_BACKEND to a Django email backend's dotted path, e.g. "
            "django.core.mail.backends.smtp.EmailBackend, or unset it for the profile's "
            "default.",
            id="reservations.E002",
        )]
    return []


@checks.register()
def check_reminder_sending(app_configs=None, **kwargs):
    """The sender's attempts must allow a send, and its claim lease must outlast one."""
    errors = []
    attempts = conf.REMINDER_MAX_ATTEMPTS
    if (isinstance(attempts, bool) or not isinstance(attempts, int)
            or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT):
        errors.append(checks.Error(
            f"RESERVATIONS_REMINDER_MAX_ATTEMPTS {attempts!r} is not a whole number from 1 "
            f"to {MAX_ATTEMPTS_LIMIT}: below, no reminder could ever be sent; above, a "
            "reminder's attempts would overflow their column.",
            hint="Give the sends a reminder may take before it fails, e.g. 5.",
            id="reservations.E003",
        ))
    lease = conf.REMINDER_CLAIM_SECONDS
    # django-q2 ends a task at its timeout: a claim older than that has no live sender.
    timeout = cleanup_conf.q_cluster.timeout or 0
    if isinstance(lease, bool) or not isinstance(lease, Real) or lease <= timeout:
        errors.append(checks.Error(
            f"RESERVATIONS_REMINDER_CLAIM_SECONDS {lease!r} is not a number of seconds "
            f"above django-q2's task timeout ({timeout} s): a run could take over a claim "
            "whose sender is still sending, and mail the reminder twice.",
            hint=f"Give more than {timeout}, e.g. 300.",
            id="reservations.E004",
        ))
    return errors


# An offer longer than a day keeps a freed seat from everyone else for that long.
MAX_OFFER_MINUTES = 1440


@checks.register()
def check_offer_window(app_configs=None, **kwargs):
    """An offered seat must stay held long enough to be confirmed, and not for days."""
    minutes = conf.OFFER_MINUTES
    if (isinstance(minutes, bool) or not isinstance(minutes, int)
            or not 1 <= minutes <= MAX_OFFER_MINUTES):
        return [checks.Error(
            f"RESERVATIONS_OFFER_MINUTES {minutes!r} is not a whole number of minutes from 1 "
            f"to {MAX_OFFER_MINUTES}: an offer must give its learner time to confirm, and "
            "must not keep a freed seat from the next learner for days.",
            hint="Give the minutes an offered seat stays held, e.g. 30.",
            id="reservations.E005",
        )]
    return []
