"""The push that wakes those who wait: after a commit, a PUBLISH on the session's channel
(and on the workflow's when a workflow finishes).

A push carries nothing a follower needs: it only says "look again". Followers read the
event log (or the rows they wait on) from the database, so a push that never arrives
(Redis down or flushed mid-wait, a worker killed between its commit and its publish)
delays them until their slow fallback poll, and loses or repeats nothing. A phase's
commit pushes in the same Redis round trip that writes the cache and releases the lock
(``state.lock.DistributedStateSync.publish_and_release``); other writers call
:class:`Notifier`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from types import TracebackType
from typing import Any

import redis

from state.storage import keys

logger = logging.getLogger(__name__)

# Without pushes (Redis unreachable), a waiter looks again this often.
FALLBACK_POLL_S = 0.5
# With the push switched off (AGENTSTATE_EVENTS=false), waiters poll as they did before
# there was one: quickly at first, then every _MAX_POLL_S.
_FIRST_POLL_S = 0.01
_MAX_POLL_S = 0.1
_SUBSCRIBE_WAIT_S = 2.0


class Notifier:
    """Publishes the pushes of writers other than a phase's commit."""

    def __init__(self, client: redis.Redis, enabled: bool = True) -> None:
        self.redis = client
        self.enabled = enabled

    def session(self, session_id: str) -> None:
        """Wake the followers of the session's events."""
        self._publish(keys.session_events(session_id))

    def workflow(self, workflow_id: str) -> None:
        """Wake those waiting for the workflow."""
        self._publish(keys.workflow_events(workflow_id))

    def _publish(self, channel: str) -> None:
        if not self.enabled:
            return
        try:
            self.redis.publish(channel, "1")
        except redis.RedisError as exc:
            # The change is committed; followers find it on their fallback poll.
            logger.debug("push on %s failed: %s", channel, exc)


class Waiter:
    """Waits for a push on some channels, or for the fallback poll, whichever is first.

    Subscribe (enter the context) before the first look at what you wait for: a push
    sent after that look is then never missed.
    """

    def __init__(self, client: redis.Redis, channels: list[str], enabled: bool = True) -> None:
        self.redis = client
        self.channels = channels
        self.enabled = enabled
        self.pubsub: Any = None
        self._delay = _FIRST_POLL_S

    def __enter__(self) -> Waiter:
        if self.enabled:
            self._subscribe()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Drop the subscription (and its connection)."""
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                pubsub.close()

    def wait(self, timeout: float) -> bool:
        """Block until a push arrives (True) or up to ``timeout`` seconds pass (False);
        without a subscription, sleep one poll interval."""
        timeout = max(0.0, timeout)
        if not self.enabled:
            pause = min(timeout, self._delay)
            self._delay = min(_MAX_POLL_S, self._delay * 2)
            time.sleep(pause)
            return False
        if self.pubsub is None and not self._subscribe():
            time.sleep(min(timeout, FALLBACK_POLL_S))
            return False
        try:
            woken = self._message(min(timeout, FALLBACK_POLL_S))
            while woken and self._message(0.0):
                pass  # several pushes since the last look: one look covers them all
        except (redis.RedisError, OSError, ValueError) as exc:
            logger.debug("push channel lost, polling until it is back: %s", exc)
            self.close()
            return False
        return woken

    def _message(self, timeout: float) -> bool:
        message = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        return message is not None

    def _subscribe(self) -> bool:
        try:
            pubsub = self.redis.pubsub()  # type: ignore[no-untyped-call]
            pubsub.subscribe(*self.channels)
            # Wait for the server's confirmations: only then is a push certain to reach us.
            confirmed = 0
            deadline = time.monotonic() + _SUBSCRIBE_WAIT_S
            while confirmed < len(self.channels) and time.monotonic() < deadline:
                message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                if message is not None and message.get("type") == "subscribe":
                    confirmed += 1
        except (redis.RedisError, OSError) as exc:
            logger.debug("cannot subscribe to %s, polling instead: %s", self.channels, exc)
            return False
        if confirmed < len(self.channels):
            pubsub.close()
            return False
        self.pubsub = pubsub
        return True
