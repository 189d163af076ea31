"""The per-node agent: hardware sources, sampler, outbox and the stream to the collector."""
