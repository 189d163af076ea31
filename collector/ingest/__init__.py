"""The gRPC ingest: the server, one agent's stream session and its events, budgets, TLS."""
