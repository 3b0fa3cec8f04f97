from django_q.models import Schedule

from cleanup.management.base import CleanupCommand, count
from cleanup.observability import health
from cleanup.scheduling.schedules import DISPATCH_TASK, wanted_schedules


class Command(CleanupCommand):
    help = ("Say in one line whether the schedules are installed and a cluster takes work, "
            "and what to run when not (make serve prints it before it starts). Exits 0 "
            "either way.")

    def run(self, **options) -> dict:
        # Every schedule cleanup_schedule installs: the policies', the engine's and the
        # host's own tasks'.
        specs = wanted_schedules()
        wanted = list(specs)
        scheduled = [name for name, spec in specs.items() if spec["func"] == DISPATCH_TASK]
        installed = set(Schedule.objects.filter(name__in=wanted).values_list("name", flat=True))
        missing = [name for name in wanted if name not in installed]
        taking_work, details = health.report()
        policies_missing = sum(name in scheduled for name in missing)
        return {
            "ready": not missing and taking_work,
            "schedules_missing": missing,
            "cluster_taking_work": taking_work,
            "summary": _summary(len(wanted), missing, policies_missing, taking_work,
                                details.get("problem", "")),
        }

    def describe(self, result: dict, verbosity: int) -> str:
        return result["summary"]


def _summary(wanted: int, missing: list[str], policies_missing: int, taking_work: bool,
             problem: str) -> str:
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
        stopped = "" if problem == health.NOT_BEATING else f"{problem}; "
        missing_parts.append(f"no cluster takes work ({stopped}start manage.py qcluster, in a "
                             "terminal of its own: it runs in the foreground)")
        meanwhile.append("/health answers 503")
    return f"Not ready: {'; '.join(missing_parts)}. Until then {' and '.join(meanwhile)}."
