from datetime import datetime

from cleanup.display import ago, duration, number, utc_text
from cleanup.management.base import CleanupCommand, count, gone_policy_lines
from cleanup.observability.overview import BACKLOG_BUDGET_MS
from cleanup.observability.status import gone_policy_halts, policy_rows


class Command(CleanupCommand):
    help = ("List the registered policies: rule, schedule, window, last run and backlog "
            "(rows eligible now and how long the oldest has waited); then the halts still "
            "open of any policy no longer registered.")

    def run(self, **options) -> dict:
        return {"policies": policy_rows(), "gone_policy_halts": gone_policy_halts()}

    def describe(self, result: dict, verbosity: int) -> str:
        blocks = [] if result["policies"] else ["No policies are registered."]
        for policy in result["policies"]:
            schedule = policy["schedule"] or "none (manual runs only)"
            if policy["schedule"] and not policy["schedule_installed"]:
                schedule += " (not installed: run cleanup_schedule)"
            lines = [f"{policy['policy']} ({policy['mutation']} {policy['model']}, "
                     f"{policy['scheme']} chunks, window {policy['window']})",
                     f"  schedule  {schedule}"]
            last = policy["last_run"]
            if last is None:
                lines.append("  last run  none yet")
            else:
                created = datetime.fromisoformat(last["created_at"])
                lines.append(f"  last run  {last['run_id']} {last['state']}, dispatched "
                             f"{utc_text(created)} UTC ({ago(created)})")
            backlog = policy["backlog"]
            if backlog["eligible_rows"] is None:
                lines.append("  backlog   unknown: not counted within "
                             f"{number(BACKLOG_BUDGET_MS)} ms (is its table locked?)")
            elif backlog["eligible_rows"]:
                least = "at least " if backlog["capped"] else ""
                lines.append(f"  backlog   {least}{count(backlog['eligible_rows'], 'row')} "
                             "eligible, the oldest waiting "
                             f"{duration(backlog['oldest_age_seconds'] or 0)}")
            else:
                lines.append("  backlog   none")
            if policy["dead_letters"]:
                lines.append(f"  dead letters  {number(policy['dead_letters'])}")
            blocks.append("\n".join(lines))
        if gone := gone_policy_lines(result["gone_policy_halts"]):
            blocks.append("\n".join(gone))
        return "\n\n".join(blocks)
