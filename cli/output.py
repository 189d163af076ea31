"""How the CLI prints: tables, text cut to a width unless ``-o wide``, JSON, ``--watch``.

``-o table`` (the default) cuts free text (evidence, details) at :data:`WIDTH` characters;
``-o wide`` adds columns (GPU UUIDs, ids) and cuts nothing; ``-o json`` prints the API's JSON
as it came.
"""

from __future__ import annotations

import io
import json
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["WIDTH", "cut", "gpu_names", "print_json", "table", "watch"]

WIDTH: Final = 72
CLEAR: Final = "\x1b[H\x1b[2J"
_UUID_TEXT = r"GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
_UUID = re.compile(_UUID_TEXT)
# A UUID with the words before it that already say "GPU" ("GPU 5 GPU-...", "GPU GPU-...").
_NAMED = re.compile(rf"(?:GPU (?P<said>\d+) |GPU )?(?P<uuid>{_UUID_TEXT})")


def table(rows: list[list[str]], out: TextIO) -> None:
    """Print ``rows`` (the first is the header) as aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def cut(text: object, output: str) -> str:
    """``text`` as shown in ``output``: cut at :data:`WIDTH` (with an ellipsis) unless wide."""
    shown = str(text)
    if output == "wide" or len(shown) <= WIDTH:
        return shown
    return shown[: WIDTH - 1] + "\N{HORIZONTAL ELLIPSIS}"


def print_json(data: object, out: TextIO) -> None:
    """The API's answer as indented JSON."""
    print(json.dumps(data, indent=2), file=out)


def gpu_names(text: str, indexes: Mapping[str, int], output: str) -> str:
    """GPU UUIDs in ``text`` named by index (``GPU 3``); in wide output with the UUID beside."""

    def name(match: re.Match[str]) -> str:
        uuid = match.group("uuid")
        index = indexes.get(uuid)
        said = match.group("said")
        if index is None or (said is not None and int(said) != index):
            return match.group(0)
        return f"GPU {index} ({uuid})" if output == "wide" else f"GPU {index}"

    return _NAMED.sub(name, text)


def has_gpu_uuid(text: str) -> bool:
    """Whether ``text`` names a GPU by its UUID."""
    return _UUID.search(text) is not None


def watch(
    run: Callable[[], int],
    every_s: float,
    out: TextIO,
    *,
    sleep: Callable[[float], Any] = time.sleep,
    rounds: int | None = None,
) -> int:
    """Run ``run`` every ``every_s`` seconds, each time on a clean screen, until Ctrl-C.

    What one round printed is shown at once (no flicker of a half-drawn table); on a terminal
    the screen is cleared first. A round that fails ends the watch with its status.
    ``rounds`` bounds the rounds (tests); None: until interrupted.
    """
    if every_s <= 0:
        msg = f"--watch takes a positive number of seconds, not {every_s:g}"
        raise ValueError(msg)
    done = 0
    try:
        while rounds is None or done < rounds:
            buffer = io.StringIO()
            status = _captured(run, buffer)
            stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            clear = CLEAR if out.isatty() else ""
            out.write(f"{clear}every {every_s:g} s, {stamp}\n\n{buffer.getvalue()}")
            out.flush()
            if status != 0:
                return status
            done += 1
            if rounds is None or done < rounds:
                sleep(every_s)
    except KeyboardInterrupt:
        return 0
    return 0


def _captured(run: Callable[[], int], buffer: io.StringIO) -> int:
    import contextlib  # noqa: PLC0415
    import sys  # noqa: PLC0415

    with contextlib.redirect_stdout(buffer):
        status = run()
    sys.stdout.flush()
    return status
