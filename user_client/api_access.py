"""Who may use the user node's HTTP API (pure): Host, Origin and an optional bearer key.

Whoever reaches the API asks as this user and reads its status (node id, every path's relays
in order) and its sessions. A web page in the user's own browser reaches 127.0.0.1 too, in
two ways this policy closes:

- CSRF: a page POSTs a "simple" request (`Content-Type: text/plain`, no preflight) to
  http://127.0.0.1:PORT. The browser sends its `Origin`; only no Origin (curl, the SDKs,
  `gt-user ask`), the API's own origin (its chat page) and origins the operator allowed with
  `--cors-origin` are served.
- DNS rebinding: the page's own name is made to resolve to 127.0.0.1, so its requests are
  same-origin for the browser and can read the answers. They still carry the page's name in
  `Host`; only loopback names and the configured listen host are served.

An optional bearer key (`--api-key`, as vLLM's `--api-key`: `Authorization: Bearer KEY`)
guards every route but the chat page's files and the liveness probes; a wildcard listen
address (reachable from other machines) is refused without one (`check_listen`). Behind a
key, any Host is served: a page cannot learn the key, so rebinding gains it nothing.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from urllib.parse import urlsplit

#: names that always mean this machine (RFC 6761 `localhost`, the loopback addresses)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})
#: routes served without the key: liveness probes and the chat page's static files (the page
#: asks for the key itself, and sends it on every call it makes)
OPEN_PATHS = frozenset({"/health", "/ping", "/", "/favicon.ico", "/docs", "/openapi.json"})
OPEN_PREFIXES = ("/static/",)


class AccessDenied(Exception):
    """A request this API does not serve: HTTP status, OpenAI error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def host_name(host_header: str) -> str:
    """The host of a Host header, lower-case, without port or IPv6 brackets."""
    text = host_header.strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text[1:]
    name, sep, port = text.rpartition(":")
    return name if sep and port.isdigit() else text


def origin_of(url: str) -> str:
    """scheme://host[:port] of a URL, lower-case (what a browser's Origin header says)."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"{url!r} is not an origin such as http://localhost:3000")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in WILDCARD_HOSTS


def check_listen(listen: str, api_key: str | None) -> None:
    """A wildcard listen address serves every machine that can reach this one: only with a key."""
    host = listen.rpartition(":")[0]
    if is_wildcard(host) and not api_key:
        raise ValueError(f"the API address {listen} listens on every interface, so anyone who can reach this "
                         "machine would ask as you: listen on 127.0.0.1, or give --api-key KEY (clients then send "
                         "`Authorization: Bearer KEY`)")


@dataclass(frozen=True)
class ApiAccess:
    """The API's access policy: the listen host, the key (or none), allowed foreign origins."""

    listen_host: str = "127.0.0.1"
    api_key: str | None = None
    cors_origins: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def make(cls, listen: str, api_key: str | None = None, cors_origins=()) -> "ApiAccess":
        return cls(host_name(listen.rpartition(":")[0] or "127.0.0.1"), api_key or None,
                   frozenset(origin_of(o) for o in cors_origins))

    def allowed_host(self, host_header: str | None) -> bool:
        if self.api_key:  # behind a key the name does not matter (see the module's docstring)
            return True
        name = host_name(host_header or "")
        return name in LOOPBACK_HOSTS or (name == self.listen_host and not is_wildcard(name))

    def allowed_origin(self, origin: str | None, host_header: str | None) -> bool:
        """No Origin (not a browser, or a same-origin GET), the API's own origin, or one allowed."""
        if origin is None:
            return True
        if origin.strip().lower() == "null":  # sandboxed frames, file:// pages: never the API's own
            return bool(self.cors_origins) and "null" in self.cors_origins
        try:
            asked = origin_of(origin)
        except ValueError:
            return False
        return asked in self.cors_origins or asked == f"http://{(host_header or '').strip().lower()}"

    def cors_headers(self, origin: str | None) -> dict[str, str]:
        """CORS response headers for an allowed foreign origin (none for the API's own)."""
        if origin is None:
            return {}
        try:
            asked = origin_of(origin)
        except ValueError:
            return {}
        if asked not in self.cors_origins:
            return {}
        return {"Access-Control-Allow-Origin": origin.strip(), "Vary": "Origin",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "600"}

    def needs_key(self, path: str) -> bool:
        return bool(self.api_key) and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES)

    def check(self, method: str, path: str, headers) -> None:
        """Raise AccessDenied unless this request may be served (preflights are the caller's)."""
        host, origin = headers.get("Host"), headers.get("Origin")
        if not self.allowed_host(host):
            raise AccessDenied(403, "host_not_allowed",
                               f"Host {host!r} is not this node's address: this API answers requests to "
                               "localhost/127.0.0.1 (or its --api-listen address) only (DNS rebinding defence)")
        if not self.allowed_origin(origin, host):
            raise AccessDenied(403, "origin_not_allowed",
                               f"requests from web pages of {origin} are refused: a page may use this API only "
                               "when started with --cors-origin for it")
        if method != "OPTIONS" and self.needs_key(path) and not self.key_matches(headers.get("Authorization")):
            raise AccessDenied(401, "invalid_api_key",
                               "this user node needs an API key: send `Authorization: Bearer KEY` (the key it was "
                               "started with, --api-key)")

    def key_matches(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                   (self.api_key or "").encode())
