"""The run engine: plan a run, send its chunks through the window, apply them, and
settle the ledger; replay and reconcile what went wrong."""
