"""The collector: gRPC ingest, fleet model, journal, liveness, Prometheus and JSON API."""
