"""Where a webhook may go: a URL's host resolved, and every address it resolves to checked,
before the API takes the URL and again before each delivery connects (to that address and
no other: core.webhooks.sender). Loopback, private, link-local (the cloud metadata address
among them), multicast, unspecified, shared (CGNAT) and reserved addresses are refused,
IPv6 forms that carry one of them too, unless the admin setting TRAINQ_WEBHOOK_ALLOW_HOSTS
names the host or a range that holds the address. See docs/api.md ("Webhooks")."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# A host and port to the addresses they resolve to (socket.getaddrinfo, or a test's own).
Resolver = Callable[[str, int], Sequence[str]]

MAX_URL_LENGTH = 2048
SCHEMES = {"http": 80, "https": 443}
SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, RFC 6598
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: an IPv4 address in its low bits


class UnsafeUrl(ValueError):
    """A webhook URL that trainq will not call; the message says why, and what to do."""


@dataclass(frozen=True)
class Target:
    """A URL taken apart: what is connected to (`address`, checked) and what is asked for."""

    scheme: str
    host: str  # as the URL names it: the Host header and, over https, the TLS server name
    port: int
    path: str  # with its query
    address: IP

    @property
    def pinned_url(self) -> str:
        """The URL with the checked address in place of the host: nothing resolves it again."""
        at = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{self.scheme}://{at}:{self.port}{self.path}"

    @property
    def host_header(self) -> str:
        named = f"[{self.host}]" if ":" in self.host else self.host
        return named if self.port == SCHEMES[self.scheme] else f"{named}:{self.port}"


@dataclass(frozen=True)
class AddressPolicy:
    """The addresses a webhook may reach: any global one, and the internal ones the admin
    allowed by host name or range."""

    hosts: frozenset[str] = frozenset()
    ranges: tuple[Network, ...] = ()

    @classmethod
    def from_setting(cls, allow: str) -> AddressPolicy:
        """TRAINQ_WEBHOOK_ALLOW_HOSTS: host names and ranges (`10.0.0.0/8`, `127.0.0.1`)."""
        hosts, ranges = set(), []
        for item in (part.strip() for part in allow.split(",")):
            if not item:
                continue
            try:
                ranges.append(
                    ipaddress.ip_network(item.replace("[", "").replace("]", ""), strict=False)
                )
            except ValueError:
                with contextlib.suppress(UnsafeUrl):  # as a URL's host is compared
                    item = ascii_host(item)
                hosts.add(item.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(ranges))

    def refusal(self, host: str, address: IP) -> str | None:
        """Why `address` (which `host` resolved to) may not be called, or None."""
        if host.lower().rstrip(".") in self.hosts:
            return None
        plain = _embedded_ipv4(address) or address
        if any(plain in r for r in self.ranges if r.version == plain.version):
            return None
        why = internal(plain)
        if why is None:
            return None
        shown = str(address) if plain is address else f"{address} ({plain})"
        return (
            f"{host} resolves to {shown} ({why}): webhooks go only to public addresses "
            "(an admin may allow this one with TRAINQ_WEBHOOK_ALLOW_HOSTS)"
        )


def internal(address: IP) -> str | None:
    """What kind of internal address this is, or None for a public one."""
    kinds = [
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local (cloud metadata)"),
        (address.is_multicast, "multicast"),
        (address.version == 4 and address in SHARED, "shared (carrier-grade NAT)"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "non-global"),
    ]
    return next((why for hit, why in kinds if hit), None)


def _embedded_ipv4(address: IP) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries and reaches: mapped (::ffff:a.b.c.d), 6to4,
    NAT64; None for any other (Teredo's range is refused whole, as non-global)."""
    if address.version == 4:
        return None
    v6 = ipaddress.IPv6Address(address)
    if v6.ipv4_mapped is not None:
        return v6.ipv4_mapped
    if v6.sixtofour is not None:
        return v6.sixtofour
    if v6 in NAT64:
        return ipaddress.IPv4Address(int(v6) & 0xFFFFFFFF)
    return None


def parse(url: str) -> SplitResult:
    """The URL's parts, or UnsafeUrl for one that is not an absolute http(s) URL."""
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeUrl(f"the URL is {len(url)} characters long; at most {MAX_URL_LENGTH}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError as e:
        raise UnsafeUrl(f"not a URL: {e}") from e
    if parts.scheme not in SCHEMES:
        raise UnsafeUrl("a webhook URL starts with https:// (or http://)")
    if not parts.hostname:
        raise UnsafeUrl("the URL names no host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("a webhook URL carries no user or password: sign-in is the signature")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise UnsafeUrl("the URL holds spaces or control characters")
    return parts


def system_resolver(host: str, port: int) -> Sequence[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def ascii_host(host: str) -> str:
    """The host as HTTP headers and TLS carry it: a name beyond ASCII in its IDNA (punycode)
    form; UnsafeUrl for one that has none."""
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError as e:
        raise UnsafeUrl(f"{host} is not a host name IDNA can spell in ASCII: {e}") from e


def checked_target(url: str, policy: AddressPolicy, resolve: Resolver = system_resolver) -> Target:
    """The URL's target, resolved once: every address the host resolves to must pass the
    policy (one internal address among public ones refuses the URL), and the first is the
    one to connect to. UnsafeUrl otherwise."""
    parts = parse(url)
    host = ascii_host(str(parts.hostname))
    port = parts.port or SCHEMES[parts.scheme]
    try:
        found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolve(host, port)]
    except (OSError, ValueError) as e:  # UnicodeError is a ValueError
        raise UnsafeUrl(f"{host} does not resolve: {e}") from e
    if not found:
        raise UnsafeUrl(f"{host} resolves to no address")
    for address in found:
        why = policy.refusal(host, address)
        if why is not None:
            raise UnsafeUrl(why)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, host, port, path, found[0])
