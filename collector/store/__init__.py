"""The journal: events, incidents, actions and peers on SQLite or PostgreSQL."""
