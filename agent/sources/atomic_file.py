"""Replace a small file so that a crash leaves the old content or the new, never a torn one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, and rename it over ``path``.

    The directory is created if needed. Raises :class:`OSError` when any step fails; the old
    file is then as it was, and the temporary file is removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
