"""What ``rma_ticket`` sends: the incident, its node and GPU, and the node's evidence bundle.

The bundle (:mod:`collector.model.evidence`) reads the journal through the reader's own
connections and packs a gzip'd tar: both block, so :func:`read_bundle` runs it in a worker
thread (``asyncio.to_thread``), never on the event loop and never on the journal's writer
thread (which would hold every event's commit behind it), one bundle at a time per collector.
:func:`attachment` puts it in the request base64-encoded with its name, size and sha256 when it
fits the receiver's ``max_bundle_bytes``; a larger one is sent as its manifest only, and the
request says so (the whole bundle stays one ``GET /api/v1/nodes/<node>/evidence`` away).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog

from collector.actions.guards import UnsafeArgumentError, parse_target
from collector.model.evidence import DEFAULT_SINCE_S, UnknownNodeError
from collector.model.evidence_pack import MEDIA_TYPE

if TYPE_CHECKING:
    from collector.model.evidence_pack import Bundle
    from collector.model.state import NodeState

__all__ = [
    "RMA_KIND",
    "BuildBundle",
    "BundleReads",
    "attachment",
    "gpu_identity",
]

log = structlog.get_logger("collector.actions")

RMA_KIND: Final = "rma_request"


class BuildBundle(Protocol):
    """Reads and packs one node's bundle, blocking (``build_bundle`` with its reader and fleet)."""

    def __call__(self, node: str, *, since_ms: int, now_ms: int) -> Bundle:
        """The bundle of ``node`` from ``since_ms``, generated at ``now_ms``."""
        ...


def gpu_identity(node: str, target: str, state: NodeState | None) -> dict[str, Any] | None:
    """The GPU an incident's target names: index, UUID, serial, PCI bus id, model.

    None for a target above a GPU (the node, an IB port). What the fleet model does not hold
    (the node is gone) is None; ``serial`` always is: no agent reads it (the NVML probe masks
    what names one board), so the vendor matches the board by UUID and bus id.
    """
    try:
        ref = parse_target(node, target)
    except UnsafeArgumentError:
        return None
    if ref.gpu is None:
        return None
    gpus = state.gpus.values() if state is not None else ()
    gpu = next((g for g in gpus if g.index == ref.gpu), None)
    uuid, bus, model = (gpu.uuid, gpu.pci_bus_id, gpu.model) if gpu is not None else ("", "", "")
    return {
        "index": ref.gpu,
        "uuid": uuid or None,
        "serial": None,
        "pci_bus_id": bus or None,
        "model": model or None,
    }


def attachment(bundle: Bundle | None, max_bytes: int, why: str = "") -> dict[str, Any]:
    """The request's ``bundle`` field: the archive itself up to ``max_bytes``, else its manifest.

    ``why``: what kept a bundle from being built (``bundle`` is None).
    """
    if bundle is None:
        return {"attached": False, "why": why or "no evidence bundle was built"}
    size = len(bundle.data)
    shown: dict[str, Any] = {
        "name": bundle.name,
        "media_type": MEDIA_TYPE,
        "bytes": size,
        "sha256": hashlib.sha256(bundle.data).hexdigest(),
        "manifest": bundle.manifest,
    }
    if size > max_bytes:
        node = bundle.manifest.get("node", "")
        shown["attached"] = False
        shown["why"] = (
            f"the bundle is {size} bytes, over max_bundle_bytes ({max_bytes}): only its manifest "
            f"is sent; GET /api/v1/nodes/{node}/evidence gives the whole bundle"
        )
        return shown
    shown["attached"] = True
    shown["data_base64"] = base64.b64encode(bundle.data).decode("ascii")
    return shown


class BundleReads:
    """Builds the evidence bundles tickets carry, one at a time, off the event loop."""

    def __init__(self, build: BuildBundle, since_s: float = DEFAULT_SINCE_S) -> None:
        """Build through ``build``; a bundle reaches ``since_s`` back."""
        self._build = build
        self._since_ms = round(since_s * 1000)
        self._gate: asyncio.Semaphore | None = None  # made on the loop, at the first read

    async def read(self, node: str, now_ms: int) -> tuple[Bundle | None, str]:
        """``node``'s bundle as of ``now_ms``, or (None, why it could not be built).

        A second ticket waits for the first's bundle: each reads up to the bundle's limits
        from the journal, and the worker threads are shared with the webhooks.
        """
        if self._gate is None:
            self._gate = asyncio.Semaphore(1)
        async with self._gate:
            try:
                bundle = await asyncio.to_thread(
                    self._build, node, since_ms=now_ms - self._since_ms, now_ms=now_ms
                )
            except UnknownNodeError as exc:
                return None, str(exc)
            except Exception as exc:
                log.exception("evidence_bundle_failed", node=node)
                return None, f"the evidence bundle could not be built: {type(exc).__name__}: {exc}"
        return bundle, ""
