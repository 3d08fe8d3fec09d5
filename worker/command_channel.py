"""The thread on which an RQ worker hears its command channel (rq:pubsub:<worker>): RQ's,
made to stop at once and to outlast Redis errors. See worker.rq_worker."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from redis.exceptions import RedisError
from rq import Worker

log = logging.getLogger("trainq.worker")

COMMAND_WAIT_S = 1.0  # the command channel's thread looks at its stop flag this often
COMMAND_STOP_S = 2.0  # a stopping worker waits this long at most for that thread to end
COMMAND_RETRY_S = 2.0  # Redis away: the command channel's thread listens again after this


class CommandChannel(Worker):
    """RQ's forking worker, its command channel's thread made to stop at once."""

    def subscribe(self) -> None:
        """RQ's, but the thread that hears the command channel waits at most COMMAND_WAIT_S
        for a message (RQ's waits a minute; a message is heard as it comes either way). RQ's
        teardown stops that thread and redis-py's stop waits for it: once the thread had read
        its unsubscription, a stopping worker waited the whole minute, past docker stop's
        10 s grace, and was killed."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=COMMAND_WAIT_S,
            daemon=True,
            exception_handler=self._pubsub_exception_handler,
        )

    def _pubsub_exception_handler(self, exc: Exception, pubsub: Any, pubsub_thread: Any) -> None:
        """RQ's handler waits and listens again after a refused connection but ends the
        thread on any other Redis error: a host that stopped answering (a connect that timed
        out) left the worker deaf to stop-job for good. Any Redis error now waits and listens
        again; anything else ends the thread, as RQ's does."""
        if not isinstance(exc, RedisError):
            raise exc
        log.warning("the command channel lost Redis (%s); listening again soon", exc)
        time.sleep(COMMAND_RETRY_S)

    def unsubscribe(self) -> None:
        """RQ's, bounded: a stopping worker waits at most COMMAND_STOP_S for the command
        channel's thread (a daemon; the process ends at once after) however Redis answers."""
        thread, self.pubsub_thread = self.pubsub_thread, None
        if thread is None:
            return
        self.log.info("Worker %s: unsubscribing from %s", self.name, self.pubsub_channel_name)
        with contextlib.suppress(RedisError):
            self.pubsub.unsubscribe()
        thread.stop(timeout=COMMAND_STOP_S)
        if not thread.is_alive():
            with contextlib.suppress(RedisError, OSError):
                self.pubsub.close()
