"""Prometheus exposition: the fleet, ingest, jobs and rules exporters and the metrics catalog."""
