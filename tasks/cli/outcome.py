"""How ``send --wait`` ends: with the reply (exit 0), with an apology because the turn
failed (exit 1, the cause on stderr), or with the turn resting until a person decides an
approval it asked for (exit 0, saying which approval and how to decide it)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from state.documents.codec import Document
from tasks.cli import progress
from tasks.cli.support import EXIT_FAILURE, EXIT_OK, emit

FAILED_KIND = "apology"  # the reply's metadata.kind when a turn ended in failure


def report_turn(args: argparse.Namespace, agent: Any, watcher: Any, data: Document) -> int:
    """Print what ``watcher`` saw of the turn (``data``: message_id, reply, path) and
    return the exit status."""
    if watcher.approval_id is not None:
        return _awaiting_approval(args, agent, watcher.approval_id, data)
    if watcher.reply_kind != FAILED_KIND:
        # In a terminal the reply streamed in on stderr: stdout then adds nothing. Piped,
        # stdout carries the reply as ever.
        shown = watcher.showed(data["reply"])
        emit(args, data, lambda: None if shown else print(progress.printable(data["reply"])))
        return EXIT_OK
    doc = agent.get_session(args.session_id, history_limit=1) or {}
    error = (doc.get("metadata") or {}).get("last_error") or {}
    emit(args, {**data, "failed": True, "error": error}, lambda: _print_failure(data, error))
    return EXIT_FAILURE


def _print_failure(data: Document, error: Document) -> None:
    print(progress.printable(data["reply"]))
    cause = f"{error.get('cause', 'error')} in {error.get('phase', '?')}: {error.get('detail')}"
    print(progress.printable(f"agentstate: the turn failed ({cause})"), file=sys.stderr)


def _awaiting_approval(
    args: argparse.Namespace, agent: Any, approval_id: str, data: Document
) -> int:
    pending = agent.approvals(user_id=args.user, pending=True)
    found = [a for a in pending if a["approval_id"] == approval_id]
    approval = found[0] if found else {"approval_id": approval_id}
    waiting = {key: approval.get(key) for key in ("approval_id", "action", "args", "expires_at")}
    emit(args, {**data, "awaiting_approval": waiting}, lambda: _print_approval(waiting))
    return EXIT_OK


def _print_approval(waiting: Document) -> None:
    approval_id = waiting["approval_id"]
    what = f"{waiting.get('action')} {json.dumps(waiting.get('args'), default=str)}"
    lines = (
        f"waiting for approval {approval_id}: {what} (expires {waiting.get('expires_at')})",
        f"  approve: agentstate approval approve {approval_id} --by NAME",
        f"  reject:  agentstate approval reject {approval_id} --by NAME",
    )
    for line in lines:
        print(progress.printable(line))
