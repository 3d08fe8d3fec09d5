"""The base of the API's plain ASGI middlewares: Starlette's BaseHTTPMiddleware costs a task
and a stream per request. See docs/performance.md."""

from __future__ import annotations

from abc import ABC, abstractmethod

from starlette.types import ASGIApp, Receive, Scope, Send


class HTTPMiddleware(ABC):
    """Sees the HTTP requests; everything else (the lifespan's messages) passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    @abstractmethod
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None: ...
