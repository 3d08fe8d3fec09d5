"""trainq's light client: what another service needs to submit and follow jobs over HTTP
(`Client`), without torch or the server's dependencies."""

from client.http import ApiError, Client

__all__ = ["ApiError", "Client"]
