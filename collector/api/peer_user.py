"""Who is on the other end of a loopback TCP connection, as the kernel says (identd's answer).

The kernel gives peer credentials on Unix sockets only, but it lists every TCP socket of the
network namespace in ``/proc/net/tcp`` and ``/proc/net/tcp6`` with the uid of the process that
opened it. A client on loopback holds the socket whose local address is the client's address
and whose remote address is ours: its uid is the local user who made the request. Nothing the
client sends is read, so it cannot claim to be someone else; a client in another network
namespace (a container reaching us through a forwarded port) is simply not found.

The tables are read only for a change (a silence, a release), not for every request.
"""

from __future__ import annotations

import ipaddress
import pwd
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pathlib import Path

_TABLES: Final = ("net/tcp", "net/tcp6")
_ESTABLISHED: Final = "01"
_UID_FIELD: Final = 7
_MAX_LINES: Final = 1_000_000  # a host with more sockets than this: give up, say nothing


def _address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """``0100007F:1F90`` (words in the host's byte order, the port in hex) as (ip, port)."""
    host, _, port = text.partition(":")
    try:
        packed = b"".join(
            int(host[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(host), 8)
        )
        ip = ipaddress.ip_address(packed) if len(packed) in (4, 16) else None
        number = int(port, 16)
    except ValueError:
        return None
    if ip is None:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, number
    return ip, number


def _parsed(host: str, port: int) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, port
    return ip, port


def peer_uid(client: tuple[str, int], server: tuple[str, int], proc_root: Path) -> int | None:
    """The uid owning the socket ``client`` -> ``server`` on this host, or None when not found.

    ``client`` and ``server`` are (address, port) as the server's socket sees them. A table
    that cannot be read or a line that does not parse is passed over.
    """
    try:
        want_local, want_remote = _parsed(*client), _parsed(*server)
    except ValueError:
        return None
    for table in _TABLES:
        try:
            with (proc_root / table).open(encoding="ascii", errors="replace") as lines:
                next(lines, None)  # the header
                for count, line in enumerate(lines):
                    if count >= _MAX_LINES:
                        return None
                    fields = line.split()
                    if len(fields) <= _UID_FIELD or fields[3] != _ESTABLISHED:
                        continue
                    if _address(fields[1]) == want_local and _address(fields[2]) == want_remote:
                        return int(fields[_UID_FIELD]) if fields[_UID_FIELD].isdigit() else None
        except OSError:
            continue
    return None


def user_name(uid: int) -> str:
    """``alice`` for a uid with a passwd entry, else ``uid 1234``."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"
