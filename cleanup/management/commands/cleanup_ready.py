from django_q.models import Schedule

from cleanup.management.base import CleanupCommand, count
from cleanup.observability import health
from cleanup.policies import all_policies
from cleanup.scheduling.schedules import ENGINE_SCHEDULES, NAME_PREFIX


class Command(CleanupCommand):
    help = ("Say in one line whether the schedules are installed and a cluster takes work, "
            "and what to run when not (make serve prints it before it starts). Exits 0 "
            "either way.")

    def run(self, **options) -> dict:
        scheduled = [f"{NAME_PREFIX}{policy.name}" for policy in all_policies()
                     if policy.schedule is not None]
        wanted = scheduled + [f"{NAME_PREFIX}{name}" for name in ENGINE_SCHEDULES]
        installed = set(Schedule.objects.filter(name__in=wanted).values_list("name", flat=True))
        missing = [name for name in wanted if name not in installed]
        taking_work, _ = health.report()
        policies_missing = sum(name in scheduled for name in missing)
        return {
            "ready": not missing and taking_work,
            "schedules_missing": missing,
            "cluster_taking_work": taking_work,
            "summary": _summary(len(wanted), missing, policies_missing, taking_work),
        }

    def describe(self, result: dict, verbosity: int) -> str:
        return result["summary"]


def _summary(wanted: int, missing: list[str], policies_missing: int, taking_work: bool) -> str:
    """One line: ready, or what is missing, what to run and what it shows meanwhile."""
    if not missing and taking_work:
        return (f"Ready: {count(wanted, 'schedule')} installed and a cluster takes work "
                "(/health answers 200).")
    missing_parts, meanwhile = [], []
    if missing:
        missing_parts.append(f"{len(missing)} of {count(wanted, 'schedule')} missing (run "
                             "manage.py cleanup_schedule)")
        if policies_missing:
            policies = "policy" if policies_missing == 1 else "policies"
            meanwhile.append(f"the console shows {policies_missing} {policies} 'Not installed'")
    if not taking_work:
        missing_parts.append("no cluster takes work (start manage.py qcluster, in a terminal "
                             "of its own: it runs in the foreground)")
        meanwhile.append("/health answers 503")
    return f"Not ready: {'; '.join(missing_parts)}. Until then {' and '.join(meanwhile)}."
