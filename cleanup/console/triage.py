"""Dead letters grouped by what made them fail, for triage a group at a time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Count, Max, Min
from django.urls import reverse

from cleanup.models import Chunk


@dataclass(frozen=True)
class DeadLetterGroup:
    failure_class: str
    cause: str
    count: int
    runs: int
    policies: list[str]
    first_at: datetime | None
    last_at: datetime | None
    verdict: str  # a poison group's verdict, as one of its chunks has it
    example_pk: int  # one chunk of the group: the admin's action needs one selected
    policy: str | None = None  # the policy the groups were counted for, if only one

    @property
    def chunks_url(self) -> str:
        """The chunk list filtered to exactly this group."""
        query = {"state": Chunk.State.DEAD_LETTERED, "failure_class": self.failure_class,
                 "cause": self.cause}
        if self.policy:
            query["run__policy"] = self.policy
        query = urlencode(query)
        return f"{reverse('admin:cleanup_chunk_changelist')}?{query}"

    @property
    def requeue_label(self) -> str:
        return f"Requeue {self.count:,}…"

    @property
    def discard_label(self) -> str:
        return f"Discard {self.count:,}…"

    @property
    def what(self) -> str:
        """The group's cause as the operator reads it."""
        return self.cause or (self.verdict.splitlines()[0] if self.verdict else
                              "no error recorded")


def dead_letters(policy: str | None = None):
    chunks = Chunk.objects.filter(state=Chunk.State.DEAD_LETTERED)
    return chunks.filter(run__policy=policy) if policy else chunks


def dead_letter_groups(policy: str | None = None) -> list[DeadLetterGroup]:
    """Dead letters by failure class and cause, the biggest group first."""
    rows = (
        dead_letters(policy).order_by().values("failure_class", "cause")
        .annotate(count=Count("pk"), runs=Count("run", distinct=True),
                  policies=ArrayAgg("run__policy", distinct=True, default=[]),
                  first_at=Min("dead_lettered_at"), last_at=Max("dead_lettered_at"),
                  verdict=Max("verdict"), example_pk=Min("pk"))
        .order_by("-count", "failure_class", "cause")
    )
    return [DeadLetterGroup(**row, policy=policy) for row in rows]
