"""The poll: every source read once per interval into samples and events (``sampler``)."""
