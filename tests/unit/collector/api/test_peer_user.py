import os
import pwd
import socket
from pathlib import Path

import pytest

from collector.api.peer_user import peer_uid, user_name

HEADER_V4 = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout"
    " inode\n"
)
HEADER_V6 = (
    "  sl  local_address                         remote_address                        st"
    " tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
)


def table(root: Path, name: str, header: str, *rows: str) -> None:
    (root / "net").mkdir(exist_ok=True)
    (root / "net" / name).write_text(header + "".join(rows))


def row(local: str, remote: str, state: str, uid: int) -> str:
    """One line as the kernel writes it (x86-64: 127.0.0.1 is 0100007F)."""
    return (
        f"   1: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  {uid:5d}"
        "        0 81231 1 0000000000000000 20 4 30 10 -1\n"
    )


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="little-endian rows")
class TestTables:
    def test_the_client_side_of_an_established_v4_socket(self, tmp_path):
        """The client's row (its address local, ours remote) names its uid; the server's own
        row, the listener and a socket in another state do not count."""
        table(
            tmp_path,
            "tcp",
            HEADER_V4,
            row("0100007F:1F90", "00000000:0000", "0A", 0),  # our listener on 8080
            row("0100007F:1F90", "0100007F:9C40", "01", 0),  # our side of the connection
            row("0100007F:9C41", "0100007F:1F90", "06", 1002),  # TIME_WAIT, another port
            row("0100007F:9C40", "0100007F:1F90", "01", 1001),  # the client: 40000 -> 8080
        )
        assert peer_uid(("127.0.0.1", 40000), ("127.0.0.1", 8080), tmp_path) == 1001
        assert peer_uid(("127.0.0.1", 40001), ("127.0.0.1", 8080), tmp_path) is None

    def test_a_v6_row_and_an_ipv4_mapped_one(self, tmp_path):
        table(tmp_path, "tcp", HEADER_V4)
        table(
            tmp_path,
            "tcp6",
            HEADER_V6,
            row(
                "00000000000000000000000001000000:B3A3",  # ::1
                "00000000000000000000000001000000:1F90",
                "01",
                1003,
            ),
            row(
                "0000000000000000FFFF00000100007F:B3A4",  # ::ffff:127.0.0.1
                "0000000000000000FFFF00000100007F:1F90",
                "01",
                1004,
            ),
        )
        assert peer_uid(("::1", 0xB3A3), ("::1", 8080), tmp_path) == 1003
        assert peer_uid(("::ffff:127.0.0.1", 0xB3A4), ("::ffff:127.0.0.1", 8080), tmp_path) == 1004
        assert peer_uid(("127.0.0.1", 0xB3A4), ("127.0.0.1", 8080), tmp_path) == 1004

    def test_broken_lines_and_missing_tables_say_nothing(self, tmp_path):
        assert peer_uid(("127.0.0.1", 40000), ("127.0.0.1", 8080), tmp_path) is None
        table(
            tmp_path,
            "tcp",
            HEADER_V4,
            "garbage\n",
            "   2: ZZZZ:1F90 0100007F:1F90 01 0 0 0 x\n",
            row("0100007F:9C40", "0100007F:1F90", "01", 1001).replace(" 1001 ", " -7 "),
        )
        assert peer_uid(("127.0.0.1", 40000), ("127.0.0.1", 8080), tmp_path) is None
        assert peer_uid(("not an address", 1), ("127.0.0.1", 8080), tmp_path) is None


def test_a_real_loopback_connection_is_ours(tmp_path):
    """Against this host's own /proc: a socket this test opens belongs to this test's uid."""
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as client,
    ):
        accepted, peer = server.accept()
        with accepted:
            ours = accepted.getsockname()
            assert peer_uid(peer, ours, Path("/proc")) == os.getuid()
            assert peer_uid(peer, ours, tmp_path) is None
            assert client.getsockname() == peer


def test_user_names():
    assert user_name(os.getuid()) == pwd.getpwuid(os.getuid()).pw_name
    assert user_name(2**31 - 7) == f"uid {2**31 - 7}"
