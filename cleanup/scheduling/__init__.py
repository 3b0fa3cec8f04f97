"""django-q2 schedules of the policies and the slot ledger of their slots."""
