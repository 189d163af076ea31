"""Training jobs: what ranks report, and what the collector makes of it."""
