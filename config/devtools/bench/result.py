"""What one contender of the benchmark reports."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Result:
    name: str
    label: str
    rows: int
    seconds: float
    extrapolated: bool = False
    chunks: int | None = None
    chunk_size: int | None = None  # a pipeline's: the size its run reached
    first_chunk_size: int | None = None
    window: int | None = None
    chunk_p99_ms: float | None = None
    chunk_max_ms: float | None = None
    # A pipeline run's chunk_size is its chunks' median; this, the size it ended at.
    last_chunk_size: int | None = None
    dispatch_seconds: float | None = None
    dispatcher_rss_mb: float | None = None
    # The largest resident memory of any of the queue's processes during a pipeline run.
    worker_rss_mb: float | None = None
    dispatch_ms_per_chunk: float | None = None
    # Where a pipeline run's wall time went: until its first chunk started, and the
    # chunks' transactions summed over the workers.
    first_chunk_after_s: float | None = None
    command_to_first_chunk_s: float | None = None
    in_transactions_s: float | None = None
    delete_statements: int | None = None
    # The share of the wall time a chunk statement was executing, and where each
    # chunk's time went (config.devtools.bench.efficiency).
    time_efficiency: float | None = None
    per_chunk_ms: dict | None = None
    renewals: dict = field(default_factory=dict)
    # Seconds a vacuum worked on each table during the contender (probes.VacuumProbe).
    vacuum_seconds: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    # WAL the server wrote from the contender's start to its end (probes.wal_written):
    # the whole server's, the renewals' included.
    wal_bytes: int | None = None
    # A pipeline's calls of the ledger's functions and their time per call
    # (probes.function_times_since); None where the server did not count them.
    functions: dict | None = None

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def wal_bytes_per_row(self) -> float | None:
        return self.wal_bytes / self.rows if self.wal_bytes is not None and self.rows else None
