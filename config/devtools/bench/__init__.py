"""cleanup_bench: the pipeline side by side with a single DELETE, on the same data."""
