"""``fleetwatch evidence NODE``: where the archive goes and what is said (issue 43)."""

from __future__ import annotations

import io
import stat
import urllib.request
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from cli import evidence as cli_evidence
from cli.api import ApiCallError
from collector.model.evidence_pack import BundleLimits, Evidence, Member, pack

if TYPE_CHECKING:
    from pathlib import Path

NAME = "fleetwatch-evidence-node-7-20251202T040000Z.tar.gz"


def archive(*, truncated: bool = False) -> bytes:
    inventory: dict[str, Any] = {"gpus": [], "ib_ports": [], "boot_id": "b"}
    inventory |= {"agent_version": "0.1.0", "driver_version": None, "reachable": True}
    evidence = Evidence(
        node="node-7",
        since_ms=0,
        inventory=inventory,
        events=Member([], truncated=truncated),
        kernel=Member([]),
        incidents=Member([]),
        actions=Member([]),
        preflight=Member([]),
        limits=BundleLimits(),
    )
    return pack(evidence, 1_764_648_000_000).data


@pytest.fixture(name="served")
def served_fixture(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str | None]]:
    """The collector answers with a bundle named NAME; the calls made are kept."""
    calls: list[tuple[str, str, str | None]] = []

    def download(api: str, node: str, since: str | None) -> tuple[bytes, str]:
        calls.append((api, node, since))
        return archive(), NAME

    monkeypatch.setattr(cli_evidence, "download", download)
    return calls


def fetch(tmp_path: Path, file: str | None = None, *, force: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    code = cli_evidence.fetch_and_write(
        "http://c:1", "node-7", since="30d", file=file, force=force, stdout=out
    )
    return code, out.getvalue()


@pytest.mark.usefixtures("served")
class TestWhereItGoes:
    def test_the_default_name_in_the_current_folder(self, served, tmp_path, monkeypatch):
        """One line says where, how many files, how big, and the rows of each line file."""
        monkeypatch.chdir(tmp_path)
        code, out = fetch(tmp_path)
        assert code == 0
        assert served == [("http://c:1", "node-7", "30d")]
        data = (tmp_path / NAME).read_bytes()
        assert data == archive()
        assert out.startswith(f"wrote {NAME}: 8 files, ")
        assert out.endswith(
            " KiB: 0 events, 0 kernel lines, 0 incidents, 0 actions, 0 pre-flight runs\n"
        )
        assert stat.S_IMODE((tmp_path / NAME).stat().st_mode) == 0o600

    def test_a_file_that_is_there_is_kept_unless_force(self, tmp_path):
        target = tmp_path / "rma.tar.gz"
        target.write_bytes(b"keep me")
        with pytest.raises(ValueError, match=r"rma\.tar\.gz is there already: --force writes over"):
            fetch(tmp_path, str(target))
        assert target.read_bytes() == b"keep me"
        code, out = fetch(tmp_path, str(target), force=True)
        assert (code, target.read_bytes()) == (0, archive())
        assert out.startswith(f"wrote {target}: ")

    def test_a_folder_that_is_not_there_is_one_line(self, tmp_path):
        with pytest.raises(ValueError, match=r"cannot write .*/nope/x.tar.gz: No such file"):
            fetch(tmp_path, str(tmp_path / "nope" / "x.tar.gz"))

    def test_dash_is_standard_output_and_the_line_goes_to_standard_error(self):
        raw = io.BytesIO()
        out, err = io.TextIOWrapper(raw), io.StringIO()
        code = cli_evidence.fetch_and_write(
            "http://c:1", "node-7", since=None, file="-", force=False, stdout=out, stderr=err
        )
        assert (code, raw.getvalue()) == (0, archive())
        assert err.getvalue().startswith(f"wrote {NAME} to standard output: 8 files, ")

    def test_dash_refuses_a_terminal(self, served):
        """Binary on a terminal helps nobody: nothing is fetched."""

        class Terminal(io.StringIO):
            def isatty(self) -> bool:
                return True

        with pytest.raises(ValueError, match="standard output is a terminal"):
            cli_evidence.fetch_and_write(
                "http://c:1", "node-7", since=None, file="-", force=False, stdout=Terminal()
            )
        assert served == []


class TestWhatCame:
    def test_what_is_no_archive_is_a_clear_error(self):
        with pytest.raises(ApiCallError, match="did not answer with an evidence bundle"):
            cli_evidence.read_manifest(b"<html>proxy error</html>", "http://c:1")

    def test_the_cut_files_are_named(self):
        manifest = cli_evidence.read_manifest(archive(truncated=True), "http://c:1")
        text = cli_evidence.describe(manifest, 3 * 1024 * 1024)
        assert text.startswith("8 files, 3.0 MiB: 0 events, ")
        assert text.endswith("(cut to the newest rows: events.jsonl)")

    @pytest.mark.parametrize(
        ("disposition", "name"),
        [
            (f'attachment; filename="{NAME}"', NAME),
            ('attachment; filename="../../etc/passwd"', ""),
            ('attachment; filename="fleetwatch-evidence-x/y.tar.gz"', ""),
            ('attachment; filename=".bashrc"', ""),
            ("", ""),
        ],
    )
    def test_only_a_bundles_own_name_is_taken(self, monkeypatch, disposition, name):
        """A name the collector gives is used only if it is a bundle's, with no folder in it."""

        class Answer(io.BytesIO):
            headers: ClassVar[dict[str, str]] = {"Content-Disposition": disposition}

        monkeypatch.setattr(urllib.request, "urlopen", lambda *_a, **_k: Answer(b"x"))
        data, got = cli_evidence.download("http://c:1", "node-7", None)
        assert (data, got) == (b"x", name)

    def test_a_fallback_name_is_safe_for_a_folder(self):
        name = cli_evidence.fallback_name("../x y")
        assert name.startswith("fleetwatch-evidence-.._x_y-")
        assert "/" not in name
