"""The HTTP side: /metrics, the JSON API, its incident routes and who may change state."""
