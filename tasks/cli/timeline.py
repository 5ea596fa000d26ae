"""The command line's timeline commands: ``session events``, ``session history`` and
``session fork`` (``session show --revision`` is in ``tasks.cli.main``). They report errors,
``--json`` and exit codes exactly as the other commands do."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from state.ids import validate_id
from tasks.cli import progress
from tasks.cli.support import (
    as_user,
    command,
    emit,
    positive_seconds,
    reader,
    unknown,
    whole_number,
)
from tasks.cli.terminal import line_printer


def add_timeline(session_sub: Any) -> None:
    """Add the timeline commands to the ``session`` group."""
    events = command(
        session_sub,
        "events",
        cmd_session_events,
        "print a session's events; with --follow, new ones as they happen "
        "(with --json, one JSON object per line)",
    )
    events.add_argument("session_id", metavar="SESSION_ID")
    events.add_argument(
        "--after", type=whole_number, default=0, metavar="N", help="only events after seq N"
    )
    events.add_argument("--follow", action="store_true", help="wait for new events")
    as_user(events, "session")
    events.add_argument(
        "--timeout", type=positive_seconds, help="stop following after this many seconds"
    )
    history = command(session_sub, "history", cmd_session_history, "list a session's revisions")
    history.add_argument("session_id", metavar="SESSION_ID")
    as_user(history, "session")
    fork = command(
        session_sub, "fork", cmd_session_fork, "a new session as another was at a revision"
    )
    fork.add_argument("session_id", metavar="SESSION_ID")
    fork.add_argument("--at", type=whole_number, required=True, metavar="N", help="the revision")
    fork.add_argument("--to", required=True, metavar="NEW_SESSION_ID", help="the new session")
    as_user(fork, "session")


def _session_reader(session_id: str, user_id: str | None) -> Any:
    """A read-only client, after checking that ``session_id`` names a session (of
    ``user_id``, if given)."""
    validate_id(session_id, "session")
    agent = reader()
    found = agent.feed.owner(session_id)
    if found is None or (user_id is not None and found[0] != user_id):
        raise unknown("session", session_id)
    return agent


def cmd_session_events(args: argparse.Namespace) -> None:
    """Print a session's events (and follow them)."""
    client = _session_reader(args.session_id, args.user)
    found = client.events(args.session_id, args.after, args.follow, args.timeout, user_id=args.user)
    if args.json and not args.follow:
        print(json.dumps(list(found), indent=2, default=str))
        return
    show = line_printer()  # an event's data is cut at the terminal's width, not wrapped
    for event in found:
        if args.json:
            print(json.dumps(event, default=str))
        else:
            show(progress.event_line(event))
        sys.stdout.flush()


def cmd_session_history(args: argparse.Namespace) -> None:
    """List a session's revisions."""
    found = _session_reader(args.session_id, args.user).revisions(
        args.session_id, user_id=args.user
    )
    emit(args, found, lambda: progress.print_revisions(found))


def cmd_session_fork(args: argparse.Namespace) -> None:
    """Fork a session at a revision."""
    new_id = _session_reader(args.session_id, args.user).fork_session(
        args.session_id, args.at, args.to, user_id=args.user
    )
    data = {"session_id": new_id, "forked_from": args.session_id, "revision": args.at}
    emit(args, data, lambda: print(new_id))
