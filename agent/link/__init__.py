"""The stream to the collector: connecting, replaying the outbox, heartbeats, its commands."""
