"""Registry addresses in one canonical form, and the network prefixes rules count by (pure).

"One address, one node" (ARCHITECTURE.md §3.1) holds only if one endpoint has one spelling:
`localhost:7000`, `127.1:7000`, `[::ffff:127.0.0.1]:7000`, `2130706433:7000`, `127.0.0.1.:7000`
and `LOCALHOST:7000` all reach the same socket, so a registry comparing strings would let one
machine hold six registrations, and let an attacker register a second record for a victim's
endpoint. So an address on the chain is an IP literal and a port, exactly as `canonical` writes
it (IPv4 dotted quad; IPv6 in brackets, compressed, lower case; an IPv4-mapped IPv6 address as
its IPv4 address), checked by the stdlib `ipaddress` module, which refuses short and integer
forms and leading zeros. Names are refused, not resolved: what a name points to is not the
committee's to know, and it can change after the check.

The same parsed address gives the prefixes Sybil rules count by: the registry caps relays per
IPv4 /24 and IPv6 /48 (`cap_prefix`, limits in the genesis), and a path never takes two relays
of one IPv4 /16 or IPv6 /32 (`path_prefix`), as Tor does for its circuits.
"""

from __future__ import annotations

import ipaddress

MAX_ADDRESS_CHARS = 64  # "[" + 39 + "]:" + 5 is the longest canonical address
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


class AddressError(ValueError):
    """An address that is malformed, not an IP literal, or that nobody could dial."""


def parse(address: str) -> tuple[IPAddress, int]:
    """(IP, port) of `host:port` with an IP literal host ([...] for IPv6); AddressError if not."""
    if not isinstance(address, str) or not 0 < len(address) <= 3 * MAX_ADDRESS_CHARS or not address.isascii():
        raise AddressError(f"address must be IP:PORT, got {str(address)[:64]!r}")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or port.startswith("0") or not 0 < int(port) < 65536:
        raise AddressError(f"address must be IP:PORT with a port in 1..65535, got {address[:64]!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise AddressError(f"address {address[:64]!r}: the host must be an IP address (a name can point "
                           "anywhere and two names can name one node; register the IP peers reach)") from None
    if getattr(ip, "scope_id", None):
        raise AddressError(f"address {address[:64]!r}: a scoped IPv6 address means nothing to other machines")
    if (ip.version == 6) != bracketed:
        raise AddressError(f"address {address[:64]!r}: an IPv6 host is written in brackets, an IPv4 host without")
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(port)


def unroutable_reason(ip: IPAddress) -> str:
    """Why no other node could dial `ip`, or "" if it could."""
    if ip.is_unspecified:
        return "it is a wildcard address (listen there, but register the address peers reach)"
    if ip.is_multicast:
        return "it is a multicast address"
    if ip.version == 4 and (ip == _BROADCAST or ip in _THIS_NETWORK):
        return "it is a broadcast or 'this network' address"
    return ""


def format_address(ip: IPAddress, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def canonical(address: str) -> str:
    """The one spelling of `address` (AddressError if it has none or nobody could dial it)."""
    ip, port = parse(address)
    reason = unroutable_reason(ip)
    if reason:
        raise AddressError(f"address {address[:64]!r} cannot be dialled by other nodes: {reason}")
    return format_address(ip, port)


def is_canonical(address: str) -> bool:
    try:
        return canonical(address) == address
    except AddressError:
        return False


def cap_prefix(address: str) -> str:
    """The network the registry caps relays by: the IPv4 /24 or IPv6 /48 of `address`."""
    ip, _ = parse(address)
    return str(ipaddress.ip_network(f"{ip}/{24 if ip.version == 4 else 48}", strict=False))


def path_prefix(address: str) -> str:
    """The network a path takes at most one relay of: the IPv4 /16 or IPv6 /32 of `address`."""
    ip, _ = parse(address)
    return str(ipaddress.ip_network(f"{ip}/{16 if ip.version == 4 else 32}", strict=False))
