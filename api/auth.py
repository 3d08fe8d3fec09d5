"""API keys: each key an owner that sees its own jobs, admin keys all; compared in constant
time, checked before routing and before any body is read. See docs/api.md."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api.middleware import HTTPMiddleware
from core.owners import digest_owner_id, key_digest, owner_id

HASHED = "sha256:"
UNAUTHORIZED = "missing or unknown API key: send 'Authorization: Bearer <key>'"
# What loads without a key: the health check, the dashboard's page and files (the page asks
# for the key itself), and the API docs with their assets.
PUBLIC_PATHS = frozenset(
    {"/", "/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
)
PUBLIC_PREFIXES = ("/static/", "/docs/assets/")


@dataclass(frozen=True)
class Caller:
    owner: str  # a stable, non-secret id derived from the key
    admin: bool

    def can_see(self, owner: str | None) -> bool:
        """The access policy, for jobs and data sets alike: an admin sees everything, any
        other key only what it owns (an owner-less job, enqueued straight onto the queue
        without one, is an admin's)."""
        return self.admin or owner == self.owner

    @property
    def quota_owner(self) -> str | None:
        """The owner whose quotas (core.quotas) bind this caller's requests: none bind an
        admin's."""
        return None if self.admin else self.owner


class KeyRing:
    def __init__(self, keys: list[str], admin_keys: list[str]) -> None:
        entries = [(k, False) for k in keys] + [(k, True) for k in admin_keys]
        if not entries:
            raise ValueError("no API keys configured: set TRAINQ_API_KEYS")
        # Everything is compared as a sha256 digest: fixed length, constant time.
        self._digests = [
            (k.removeprefix(HASHED).lower() if k.startswith(HASHED) else key_digest(k), admin)
            for k, admin in entries
        ]

    def admin_owners(self) -> set[str]:
        """The owner ids of the admin keys (those configured as digests too)."""
        return {digest_owner_id(digest) for digest, admin in self._digests if admin}

    def from_header(self, authorization: str) -> Caller | None:
        """The caller an `Authorization: Bearer <key>` header names, if the key is known."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.check(token.strip())

    def check(self, presented: str) -> Caller | None:
        digest = key_digest(presented)
        found: Caller | None = None
        for known, admin in self._digests:  # no early exit: the time does not depend on which
            if hmac.compare_digest(known, digest):
                found = Caller(owner=owner_id(presented), admin=admin)
        return found


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


class RequireKey(HTTPMiddleware):
    """Finds the caller from the headers alone and answers 401 to a request for a non-public
    path that has none, without reading its body, and asks the client to close (an upload
    that goes on is not read either). The caller is kept in the scope's state for
    `api.deps.get_caller`."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        super().__init__(app)
        self.keys = keys

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        caller = self.keys.from_header(Headers(scope=scope).get("authorization", ""))
        scope.setdefault("state", {})["caller"] = caller
        if caller is None and not is_public(scope["path"]):
            refusal = JSONResponse(
                {"detail": UNAUTHORIZED},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer", "Connection": "close"},
            )
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
