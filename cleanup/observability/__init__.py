"""What the ledger says about the engine: /metrics, /health, the overview's figures
and a run's progress."""
