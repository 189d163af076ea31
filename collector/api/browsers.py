"""What a web page could make a browser send to the API, and the checks that stop it.

Any page a browser on the collector's host (or anywhere that reaches port 9470) opens can make
the browser send requests to any address, loopback included. The browser keeps the page from
reading answers of another origin, but the requests still arrive. Three checks close what that
leaves open:

- **DNS rebinding.** The page's own name is made to resolve to the collector, so the browser
  takes the collector's answers as the page's own and lets it read them. Such a request's
  ``Host`` header carries the page's name: every request but ``/healthz`` must name the
  collector (:class:`HostNames`).
- **Cross-origin changes.** A form or ``fetch`` from a page sends its ``Origin``; a change whose
  ``Origin`` is not the collector's own is refused (:meth:`HostNames.origin_refusal`).
- **Simple requests.** A page may POST a form or ``text/plain`` body without the browser asking
  the server first; an ``application/json`` body from another origin needs a CORS preflight,
  which the collector never grants. So a change must be ``application/json``
  (:func:`content_type_refusal`).

Refusals are :class:`~collector.api.auth.Refusal` values; the server counts and logs them.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from collector.api.auth import Refusal
from fleetwatch.config_file import short_repr

if TYPE_CHECKING:
    from collections.abc import Iterable

ANY_HOST: Final = "*"
JSON_TYPE: Final = "application/json"
_NAME: Final = re.compile(r"[a-z0-9_]([a-z0-9_.-]{0,252})")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_WILDCARDS: Final = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - listen addresses, not bound


def _ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _clean_name(name: str) -> str | None:
    """``name`` lower-cased without a trailing dot; None when it is no host name or address."""
    name = name.lower()
    if name.endswith(".") and not name.endswith(".."):
        name = name[:-1]
    if _ip(name) or _NAME.fullmatch(name):
        return name
    return None


def split_authority(text: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``).

    The name is lower-cased, without a trailing dot; None when the header is malformed.
    """
    text = text.strip()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
        if not _ip(name):
            return None
    elif ":" in text:
        name, _, port_text = text.partition(":")
    else:
        name, port_text = text, None
    port = None
    if port_text is not None:
        if not (port_text.isascii() and port_text.isdecimal() and len(port_text) <= 5):  # noqa: PLR2004
            return None
        port = int(port_text)
    clean = _clean_name(name)
    return None if clean is None else (clean, port)


def check_allowed_hosts(value: object) -> tuple[str, ...]:
    """The ``http_allowed_hosts`` config value as a tuple; ValueError says what is wrong."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        msg = f"http_allowed_hosts must be a list of host names, got {short_repr(value)}"
        raise ValueError(msg)  # noqa: TRY004 - the config turns every ValueError into ConfigError
    names: list[str] = []
    for item in value:
        if item == ANY_HOST:
            names.append(item)
            continue
        name = _clean_name(item.strip("[]")) if isinstance(item, str) else None
        if name is None:
            msg = (
                f"http_allowed_hosts: {short_repr(item)} is not a host name or address "
                "(write it without scheme or port, e.g. fleet.example.com)"
            )
            raise ValueError(msg)
        names.append(name)
    return tuple(names)


@dataclass(frozen=True, slots=True)
class HostNames:
    """The names a request may call the collector by, in ``Host`` and in ``Origin``.

    Always accepted in ``Host``: IP addresses (a page cannot rebind an address; a page of that
    address is the collector itself), ``localhost`` and ``*.localhost`` (browsers resolve them to
    loopback themselves), the name in ``http`` and the host's own names (``local``). ``extra`` is
    the operator's ``http_allowed_hosts`` (a proxy's public name, DNS aliases), also accepted as
    the host of an ``Origin`` (for a proxy that rewrites ``Host``); ``*`` there turns the ``Host``
    check off.
    """

    local: frozenset[str]
    extra: frozenset[str]

    @classmethod
    def build(
        cls, *, listen_host: str, allowed: Iterable[str] = (), local_names: Iterable[str] = ()
    ) -> HostNames:
        """Names from the ``http`` address, the host's own names and ``http_allowed_hosts``."""
        local = {n for n in (_clean_name(x) for x in local_names) if n}
        if listen_host not in _WILDCARDS and (name := _clean_name(listen_host.strip("[]"))):
            local.add(name)
        return cls(local=frozenset(local), extra=frozenset(allowed))

    def _known(self, name: str) -> bool:
        return (
            _ip(name)
            or name == "localhost"
            or name.endswith(".localhost")
            or name in self.local
            or name in self.extra
        )

    def host_refusal(self, header: str | None) -> Refusal | None:
        """None when ``Host`` names the collector (or is absent: no browser sends none)."""
        if header is None or ANY_HOST in self.extra:
            return None
        authority = split_authority(header)
        if authority is not None and self._known(authority[0]):
            return None
        return Refusal(
            HTTPStatus.FORBIDDEN,
            "bad_host",
            f"Host {short_repr(header, 80)} is not a name of this collector (a web page using "
            "DNS rebinding sends its own); to reach the collector by that name, list it in "
            "http_allowed_hosts in [collector]",
        )

    def origin_refusal(self, origin: str | None, host: str | None) -> Refusal | None:
        """None when a change has no ``Origin`` (not from a page) or the collector's own.

        The collector's own: the scheme's host and port are the request's ``Host`` (a port left
        out is the scheme's default), or the host is one of ``http_allowed_hosts``.
        """
        if origin is None or self._same_origin(origin, host):
            return None
        return Refusal(
            HTTPStatus.FORBIDDEN,
            "cross_origin",
            f"changes from a web page of another origin ({short_repr(origin, 80)}) are refused",
        )

    def _same_origin(self, origin: str, host: str | None) -> bool:
        try:
            parts = urlsplit(origin.strip())
            default = _DEFAULT_PORTS.get(parts.scheme)
            name, port = _clean_name(parts.hostname or ""), parts.port or default
        except ValueError:  # a port that is no number, or out of range
            return False
        if default is None or name is None or parts.path or parts.query:
            return False  # "null" (a sandboxed page, a file), another scheme, not an origin
        if name in self.extra:
            return True
        authority = split_authority(host) if host is not None else None
        if authority is None:
            return False
        host_name, host_port = authority
        return (host_name, host_port or default) == (name, port)


def content_type_refusal(method: str, content_type: str | None, length: int) -> Refusal | None:
    """None when a change is ``application/json``: every POST, and any request with a body.

    A DELETE without a body needs none (a page cannot send one cross-origin without a preflight).
    """
    if method != "POST" and length == 0:
        return None
    media = (content_type or "").partition(";")[0].strip().lower()
    if media == JSON_TYPE:
        return None
    shown = short_repr(content_type, 60) if content_type is not None else "none"
    return Refusal(
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        "not_json",
        f"a change must be sent as Content-Type: {JSON_TYPE} (got {shown})",
    )
