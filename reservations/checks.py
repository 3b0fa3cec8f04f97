"""System checks of the product's settings."""

from __future__ import annotations

from django.core import checks

from reservations.conf import conf


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
