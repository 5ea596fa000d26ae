"""Every Redis key agentstate uses.

Keys of one session share a hash tag (``{session_id}``) so that the scripts touching
the lock and the cache together also work on Redis Cluster. Ids never contain braces.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFIX = "agentstate"


def session_lock(session_id: str) -> str:
    """The lock that serializes work on one session."""
    return f"{PREFIX}:session:{{{session_id}}}:lock"


def session_cache(session_id: str) -> str:
    """The hot copy of a session's state document (without its history)."""
    return f"{PREFIX}:session:{{{session_id}}}:cache"


def session_events(session_id: str) -> str:
    """The pub/sub channel that wakes followers of the session's event log."""
    return f"{PREFIX}:session:{{{session_id}}}:events"


def session_tokens(session_id: str) -> str:
    """The pub/sub channel that carries the session's token chunks (``ctx.stream``)."""
    return f"{PREFIX}:session:{{{session_id}}}:tokens"


def session_stream(session_id: str) -> str:
    """The hash saying whose chunks :func:`session_chunks` holds (``message_id``) and how
    many bytes they are (``bytes``): the message being answered, until its reply."""
    return f"{PREFIX}:session:{{{session_id}}}:stream"


def session_chunks(session_id: str) -> str:
    """The list of the chunks streamed so far for the message being answered (chunk n is
    item n - 1), read by a follower that connects mid-answer."""
    return f"{PREFIX}:session:{{{session_id}}}:chunks"


def steps_held(owner: str) -> str:
    """A hint that ``owner`` has quick steps held back at a workflow's start (the database
    says which; without the hint a finished step looks for none, and the sweep puts it
    back while any are held)."""
    return f"{PREFIX}:steps-held:{{{owner}}}"


def workflow_events(workflow_id: str) -> str:
    """The pub/sub channel that wakes those waiting for the workflow to finish."""
    return f"{PREFIX}:workflow:{{{workflow_id}}}:events"


def user_state_cache(user_id: str) -> str:
    """The hot copy of a user's persistent state."""
    return f"{PREFIX}:user:{{{user_id}}}:cache"


def sweep_lock() -> str:
    """Held while one recovery sweep runs, so that two beats never sweep at once."""
    return f"{PREFIX}:sweep:lock"


def baseline_counter(name: str) -> str:
    """A counter the bare baseline tasks (benchmarks, tests) bump or stamp."""
    return f"{PREFIX}:baseline:{name}"


def unscraped_turns(outcome: str) -> str:
    """Turns that ended with ``outcome`` (a cancel) in a process serving no metrics (the
    CLI, an app), until a worker's or ``agentstate serve``'s metrics endpoint counts them."""
    return f"{PREFIX}:metrics:turns:{outcome}"


def fleet_children(queue: str) -> str:
    """The worker children each live worker serving ``queue`` runs (a hash: node name ->
    children), written by each worker's main process (state.workflows.fleet)."""
    return f"{PREFIX}:queue:{queue}:children"


def fleet_alive(queue: str) -> str:
    """When each worker serving ``queue`` stops counting unless it says so again (a
    sorted set: node name by expiry time)."""
    return f"{PREFIX}:queue:{queue}:alive"


def house_beat(queue: str, entry: str) -> str:
    """Held for one period of a periodic task (``entry`` of the beat schedule) by the worker
    that sent it: one worker of the fleet serving ``queue`` sends each, with no beat."""
    return f"{PREFIX}:queue:{queue}:beat:{entry}"


def workers_database(queue: str) -> str:
    """Which database the workers serving ``queue`` last started with (apps compare)."""
    return f"{PREFIX}:queue:{queue}:database"


def owned(
    session_ids: Iterable[str] = (), user_id: str | None = None, workflow_ids: Iterable[str] = ()
) -> list[str]:
    """Every key that names one of these sessions, this user or these workflows (what
    erasing them deletes). A new key naming a session, user or workflow must be listed
    here, or erasure leaves it behind (the lifecycle tests scan with :func:`owner_of`)."""
    found: list[str] = []
    for session_id in session_ids:
        found += [
            session_lock(session_id),
            session_cache(session_id),
            session_stream(session_id),
            session_chunks(session_id),
        ]
    if user_id is not None:
        found.append(user_state_cache(user_id))
    # A workflow names only a pub/sub channel (workflow_events), which is not a key.
    del workflow_ids
    return found


def owner_of(key: str) -> tuple[str, str] | None:
    """``(kind, id)`` of the session, user or workflow ``key`` names (kind ``"session"``,
    ``"user"`` or ``"workflow"``), or None for a key that names none."""
    head, _, rest = key.partition(":{")
    kind = head.removeprefix(f"{PREFIX}:")
    if not rest or head == kind or kind not in _OWNER_KINDS:
        return None
    owner, closed, _ = rest.partition("}")
    return (kind, owner) if closed else None


_OWNER_KINDS = frozenset({"session", "user", "workflow"})


def everything() -> str:
    """A SCAN pattern matching every key above."""
    return f"{PREFIX}:*"
