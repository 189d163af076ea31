"""The benchmarks: one script per figure, their shared parts in ``helpers/`` and ``ingest/``."""
