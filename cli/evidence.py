"""``fleetwatch evidence NODE``: a node's evidence bundle, for an RMA or a ticket, in one file.

It fetches ``GET /api/v1/nodes/<node>/evidence[?since=]`` (a read: no token is sent), a gzip'd
tar of the node's inventory, events, kernel lines, incidents, actions and pre-flight results
with a manifest (``collector/model/evidence_pack.py`` lists its files). It writes the archive to
``-o FILE``, to standard output for ``-o -``, or else to the name the collector gives it
(``fleetwatch-evidence-<node>-<UTC time>.tar.gz``) in the current folder; it never writes over
a file that is there unless ``--force``, and makes the file readable by its owner only (it
says what the journal does). Then one line says where it wrote what: on standard output, or on
standard error when standard output holds the archive.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, TextIO

from cli.api import ApiCallError, query_string, refusal, unreachable

if TYPE_CHECKING:
    import argparse

TIMEOUT_S: Final = 60.0  # a node at the bundle's limits takes the collector a second or two
MAX_BYTES: Final = 256 * 1024 * 1024  # far above what the collector's limits allow
# The names the collector gives a bundle; any other Content-Disposition is not taken as a name.
_NAME: Final = re.compile(r"fleetwatch-evidence-[A-Za-z0-9._-]{1,300}\.tar\.gz")
_DISPOSITION: Final = re.compile(r'attachment; filename="([^"/\\]*)"')
_SHOWN_ROWS: Final = (
    ("events.jsonl", "event"),
    ("kernel.log", "kernel line"),
    ("incidents.jsonl", "incident"),
    ("actions.jsonl", "action"),
    ("preflight.jsonl", "pre-flight run"),
)
_KIB: Final = 1024


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``evidence`` to the CLI's subcommands."""
    evidence = sub.add_parser(
        "evidence",
        help="one archive of a node's inventory, events, kernel lines, incidents, actions and "
        "pre-flight results: what a vendor asks for with an RMA",
    )
    evidence.add_argument("node", help="the node")
    forms = "30m, 2h or 7d back from now, 2026-12-02T03:00 (UTC unless a zone is given), or Unix s"
    evidence.add_argument(
        "--since", metavar="WHEN", help=f"what happened from WHEN on (default 7d): {forms}"
    )
    evidence.add_argument(
        "-o",
        dest="file",
        metavar="FILE",
        help="where to write it; - for standard output (default: the bundle's own name, "
        "fleetwatch-evidence-NODE-TIME.tar.gz, here)",
    )
    evidence.add_argument("--force", action="store_true", help="write over FILE if it is there")


def run(args: argparse.Namespace) -> int:
    """Run ``fleetwatch evidence`` with the process's standard streams."""
    return fetch_and_write(
        args.api,
        args.node,
        since=args.since,
        file=args.file,
        force=args.force,
        stdout=sys.stdout,
    )


def fetch_and_write(  # noqa: PLR0913 - what to fetch, where to write it, where to say so
    api: str,
    node: str,
    *,
    since: str | None,
    file: str | None,
    force: bool,
    stdout: TextIO,
    stderr: TextIO | None = None,
) -> int:
    """Fetch ``node``'s bundle and write it where ``file`` says; one line says what was written.

    ApiCallError: the collector refused or could not be reached; ValueError: the file cannot
    be written (it is there and not ``force``, or the folder refuses it), or ``-`` is a terminal.
    """
    if file == "-" and stdout.isatty():
        msg = "standard output is a terminal: -o - is for a pipe or a file (| tar tzf -, > FILE)"
        raise ValueError(msg)
    data, name = download(api, node, since)
    manifest = read_manifest(data, api)
    if not name:
        name = fallback_name(str(manifest.get("node", node)))
    what = describe(manifest, len(data))
    if file == "-":
        binary: BinaryIO = stdout.buffer
        binary.write(data)
        binary.flush()
        print(f"wrote {name} to standard output: {what}", file=stderr or sys.stderr)
        return 0
    path = Path(file) if file else Path(name)
    write(path, data, force=force)
    print(f"wrote {path}: {what}", file=stdout)
    return 0


def download(api: str, node: str, since: str | None) -> tuple[bytes, str]:
    """The bundle's bytes, and the file name the collector gave it ("" when none usable)."""
    path = f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}/evidence"
    url = api.rstrip("/") + path + query_string({"since": since})
    if not url.startswith(("http://", "https://")):
        msg = f"the API address must start with http:// or https://, not {api!r}"
        raise ApiCallError(msg)
    req = urllib.request.Request(url, method="GET")  # noqa: S310 - scheme checked above
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            data = resp.read(MAX_BYTES + 1)
            disposition = resp.headers.get("Content-Disposition", "")
    except urllib.error.HTTPError as exc:
        raise refusal(exc, "GET", url, None) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise unreachable(api, exc) from exc
    if len(data) > MAX_BYTES:
        msg = f"GET {url}: the answer is larger than {MAX_BYTES} bytes: not an evidence bundle"
        raise ApiCallError(msg)
    found = _DISPOSITION.fullmatch(disposition.strip())
    name = found[1] if found and _NAME.fullmatch(found[1]) else ""
    return data, name


def read_manifest(data: bytes, api: str) -> dict[str, Any]:
    """The bundle's manifest.json; ApiCallError when ``data`` is no evidence bundle."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for info in tar:
                if info.isfile() and info.name.endswith("/manifest.json"):
                    member = tar.extractfile(info)
                    if member is not None:
                        manifest: Any = json.loads(member.read())
                        if isinstance(manifest, dict):
                            return manifest
                    break
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        msg = f"the collector at {api} did not answer with an evidence bundle: {exc}"
        raise ApiCallError(msg) from exc
    msg = f"the collector at {api} answered with an archive that has no manifest.json"
    raise ApiCallError(msg)


def fallback_name(node: str) -> str:
    """The bundle's name when the collector gave none: the node and this machine's UTC time."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node)[:253] or "node"
    return f"fleetwatch-evidence-{safe}-{stamp}.tar.gz"


def describe(manifest: dict[str, Any], size: int) -> str:
    """``8 files, 12.3 KiB: 40 events, 1 kernel line, ...`` and what was cut, from the manifest."""
    files = {str(f.get("name")): f for f in manifest.get("files", []) if isinstance(f, dict)}
    counts = [_plural(int(files[m].get("rows", 0)), word) for m, word in _SHOWN_ROWS if m in files]
    cut = [m for m, f in files.items() if f.get("truncated")]
    shown = f"{size / _KIB:.1f} KiB" if size < _KIB * _KIB else f"{size / _KIB / _KIB:.1f} MiB"
    text = f"{len(files) + 1} files, {shown}: {', '.join(counts)}"
    if cut:
        text += f" (cut to the newest rows: {', '.join(cut)})"
    return text


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def write(path: Path, data: bytes, *, force: bool) -> None:
    """Write ``data`` to ``path``, readable by its owner only; never over a file unless ``force``.

    ValueError says why it could not be written.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError as exc:
        msg = f"{path} is there already: --force writes over it, -o FILE names another"
        raise ValueError(msg) from exc
    except OSError as exc:
        msg = f"cannot write {path}: {exc.strerror or exc}"
        raise ValueError(msg) from exc
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except OSError as exc:  # a full disk: no half archive is left behind
        path.unlink(missing_ok=True)
        msg = f"cannot write {path}: {exc.strerror or exc}"
        raise ValueError(msg) from exc
