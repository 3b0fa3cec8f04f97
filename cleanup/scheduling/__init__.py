"""django-q2 schedules of the policies and the trigger ledger of their slots."""
