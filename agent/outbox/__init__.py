"""What waits for the collector: numbered events (memory and disk spool), the newest samples."""
