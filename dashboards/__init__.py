"""Grafana dashboards built from code (see README.md in this folder)."""
