"""trainq's light client: what another service needs to submit and follow jobs over HTTP
(`Client`), or to enqueue them straight onto the queue for a key's owner (`owner_for_key`),
without torch or the server's dependencies.
See docs/queue.md."""

from client.http import ApiError, Client
from core.owners import owner_id as owner_for_key

__all__ = ["ApiError", "Client", "owner_for_key"]
