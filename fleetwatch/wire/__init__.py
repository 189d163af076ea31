"""The agent-collector wire contract: generated messages, validation and channel settings."""
