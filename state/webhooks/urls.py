"""Where a webhook may point: an http(s) URL whose host resolves only to public addresses
(unless AGENTSTATE_WEBHOOK_ALLOW_PRIVATE). Checked when a hook is added and again at every
send, where the request then goes to the very address checked, so a DNS answer that
changes after the check cannot point the request elsewhere."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from state.errors import WebhookSpecError

MAX_URL_CHARS = 2048
ALLOW_SETTING = "AGENTSTATE_WEBHOOK_ALLOW_PRIVATE"
_PORTS = {"http": 80, "https": 443}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Target:
    """A checked URL and the address a request to it connects to."""

    url: str
    scheme: str
    host: str
    port: int
    path: str
    address: str


def parse(url: object) -> SplitResult:
    """``url`` split, if it is an absolute http(s) URL with a host and no credentials."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise WebhookSpecError(
            f"a webhook url must be an http(s) URL of at most {MAX_URL_CHARS} characters"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise WebhookSpecError(f"not a valid URL: {url[:100]!r}") from None
    if parts.scheme not in _PORTS or not parts.hostname:
        raise WebhookSpecError(
            f"a webhook url must be http:// or https:// with a host: {url[:100]!r}"
        )
    if parts.username or parts.password:
        raise WebhookSpecError("a webhook url may not carry a user name or password")
    if any(ord(c) < 33 for c in url):
        raise WebhookSpecError("a webhook url may not contain spaces or control characters")
    return parts


def resolve(url: str, allow_private: bool) -> Target:
    """The target of ``url``: its first address, every one of which must be public
    (WebhookSpecError naming the setting otherwise, or if the host does not resolve)."""
    parts = parse(url)
    host = str(parts.hostname)
    port = parts.port or _PORTS[parts.scheme]
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise WebhookSpecError(f"the webhook host {host!r} does not resolve") from None
    addresses = [str(info[4][0]) for info in found]
    if not addresses:
        raise WebhookSpecError(f"the webhook host {host!r} does not resolve")
    if not allow_private:
        for address in addresses:
            if not is_public(ipaddress.ip_address(address.split("%", 1)[0])):
                raise WebhookSpecError(
                    f"the webhook host {host!r} resolves to {address}, a loopback, private or "
                    f"link-local address; set {ALLOW_SETTING}=true to allow it"
                )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(url, parts.scheme, host, port, path, addresses[0])


def is_public(address: Address) -> bool:
    """Whether ``address`` is on the public internet (an IPv4 address mapped into IPv6 is
    judged as itself)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )
