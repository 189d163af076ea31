"""The collector capacity benchmark's parts (bench/collector_ingest.py): load, recording, floor."""
