"""``agentstate user erase ID --yes`` and ``agentstate prune``: the data lifecycle on the
command line (``state.lifecycle``)."""

from __future__ import annotations

import argparse
from typing import Any

from state.errors import UsageError
from state.ids import validate_id
from tasks.cli.support import client, command, emit


def add_user_erase(user_sub: Any) -> None:
    """``user erase USER_ID --yes``."""
    erase = command(
        user_sub,
        "erase",
        cmd_user_erase,
        "delete every row and Redis key of a user: sessions (forks included), history, "
        "events, revisions, approvals, workflows, state; cannot be undone",
    )
    erase.add_argument("user_id", metavar="USER_ID")
    erase.add_argument("--yes", action="store_true", help="required: confirms the erasure")


def add_prune(sub: Any) -> None:
    """``prune``: one retention run, to completion."""
    command(
        sub,
        "prune",
        cmd_prune,
        "delete everything past its retention (AGENTSTATE_*_RETAIN_DAYS) now, until nothing "
        "is due (what beat runs periodically)",
    )


def cmd_user_erase(args: argparse.Namespace) -> None:
    """Erase a user (refused without --yes, before anything is read)."""
    validate_id(args.user_id, "user")
    if not args.yes:
        raise UsageError(
            f"erasing user {args.user_id!r} deletes all of their data for good; "
            "add --yes to confirm"
        )
    counts = client().erase_user(args.user_id)
    emit(args, counts, lambda: print(_summary(f"user {args.user_id} erased", counts)))


def cmd_prune(args: argparse.Namespace) -> None:
    """One retention run to completion."""
    from state.lifecycle.retention import prune_all

    agent = client()
    counts = prune_all(agent.backend.engine, agent.backend.redis, agent.settings)
    emit(args, counts, lambda: print(_summary("pruned", counts)))


def _summary(head: str, counts: dict[str, int]) -> str:
    parts = [f"{kind.replace('_', ' ')}: {n}" for kind, n in counts.items()]
    return f"{head} ({', '.join(parts)})"
