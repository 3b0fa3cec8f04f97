from __future__ import annotations

from datetime import timedelta

import factory
from django.utils import timezone

from reservations.models import ReminderAttempt, SeatHold, Section, Tenant


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Institution {n}")


class SectionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Section

    tenant = factory.SubFactory(TenantFactory)
    title = factory.Sequence(lambda n: f"Section {n}")
    capacity = 100


class SeatHoldFactory(factory.django.DjangoModelFactory):
    """A held seat; ``expired=True`` makes it expire an hour ago."""

    class Meta:
        model = SeatHold

    class Params:
        expired = factory.Trait(
            expires_at=factory.LazyFunction(lambda: timezone.now() - timedelta(hours=1))
        )

    section = factory.SubFactory(SectionFactory)
    tenant = factory.SelfAttribute("section.tenant")
    learner_ref = factory.Sequence(lambda n: f"learner-{n}")
    status = SeatHold.Status.HELD
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=15))


class ReminderAttemptFactory(factory.django.DjangoModelFactory):
    """A reminder attempt; ``stale=True`` puts it past the retention period."""

    class Meta:
        model = ReminderAttempt

    class Params:
        stale = factory.Trait(
            sent_at=factory.LazyFunction(lambda: timezone.now() - timedelta(days=60))
        )

    tenant = factory.SubFactory(TenantFactory)
    hold_id = factory.Sequence(lambda n: n)
    learner_ref = factory.Sequence(lambda n: f"learner-{n}")
    sent_at = factory.LazyFunction(timezone.now)
