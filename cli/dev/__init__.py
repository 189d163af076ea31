"""Servers for trying fleetwatch out on one machine: a throwaway PostgreSQL, a webhook receiver."""
