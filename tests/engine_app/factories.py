from __future__ import annotations

from datetime import timedelta

import factory
from django.utils import timezone

from tests.engine_app.models import Account, Lease, LeaseLog


class AccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Account

    name = factory.Sequence(lambda n: f"Account {n}")


class LeaseFactory(factory.django.DjangoModelFactory):
    """An active lease; ``expired=True`` makes it expire an hour ago."""

    class Meta:
        model = Lease

    class Params:
        expired = factory.Trait(
            expires_at=factory.LazyFunction(lambda: timezone.now() - timedelta(hours=1))
        )

    account = factory.SubFactory(AccountFactory)
    holder = factory.Sequence(lambda n: f"holder-{n}")
    state = Lease.State.ACTIVE
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=15))


class LeaseLogFactory(factory.django.DjangoModelFactory):
    """A lease log; ``stale=True`` puts it past the retention period."""

    class Meta:
        model = LeaseLog

    class Params:
        stale = factory.Trait(
            recorded_at=factory.LazyFunction(lambda: timezone.now() - timedelta(days=60))
        )

    account = factory.SubFactory(AccountFactory)
    lease_id = factory.Sequence(lambda n: n)
    recorded_at = factory.LazyFunction(timezone.now)
