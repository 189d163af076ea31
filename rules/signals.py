"""Which signals a rule of each scope may name, so rule files can be checked against them.

The names are the vocabulary of :mod:`fleetwatch.signals`; a rule sees its own target's signals
and its node's.
"""

from __future__ import annotations

from typing import Final

from fleetwatch.signals import GPU, IB_PORT, NODE, NVLINK, OPEN_PREFIXES
from rules.model import Scope

# The signals a rule of each scope may name in ``signals.x``, ``rate()``, ``increase()`` or
# ``rises()``.
BY_SCOPE: Final[dict[Scope, frozenset[str]]] = {
    Scope.NODE: NODE,
    Scope.GPU: GPU | NODE,
    Scope.NVLINK: NVLINK | GPU | NODE,
    Scope.IB_PORT: IB_PORT | NODE,
    Scope.FLEET: IB_PORT | GPU | NODE,
}


def known(scope: Scope, signal: str) -> bool:
    """Whether a rule of ``scope`` may name ``signal``."""
    return signal in BY_SCOPE[scope] or (
        scope in (Scope.IB_PORT, Scope.FLEET) and signal.startswith(OPEN_PREFIXES)
    )
