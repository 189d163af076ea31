"""The rule file of the ``reset_gpu`` tests: an NVLink down resets the GPU; three such incidents
within an hour drain the node, and so does a reset that fails."""

from __future__ import annotations

RESET_RULES = """\
version: 1
rules:
  - name: link_down
    scope: gpu
    when: 'gpu.nvlinks_down > 0'
    severity: critical
    actions: [reset_gpu]
    escalate: {after: 3, within: 1h, actions: [drain_node]}
"""
