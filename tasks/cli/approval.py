"""Approval commands: ``approval list [--user U] [--all]``, ``approval approve ID --by NAME
[--note TEXT]`` and ``approval reject ID --by NAME [--note TEXT]``."""

from __future__ import annotations

import argparse
from typing import Any

from state.ids import validate_id
from tasks.cli import progress
from tasks.cli.support import as_user, client, command, emit, group, reader

_COLUMNS = ("approval_id", "action", "args", "session_id", "workflow_id", "step_id", "expires_at")


def add_approval(sub: Any) -> None:
    """Register the ``approval`` group."""
    approval = group(sub, "approval", "list and decide human approvals")
    approval_sub = approval.add_subparsers(metavar="ACTION")
    listing = command(
        approval_sub, "list", cmd_approval_list, "list approvals waiting for a decision"
    )
    listing.add_argument("--user", metavar="USER_ID", help="only this user's approvals")
    listing.add_argument(
        "--all", action="store_true", help="decided ones too (who decided, when, the note)"
    )
    for name, approve in (("approve", True), ("reject", False)):
        verb = "approve: the turn or step goes on" if approve else "reject: it will not run"
        decide = command(approval_sub, name, cmd_approval_decide, verb)
        decide.add_argument("approval_id", metavar="APPROVAL_ID")
        decide.add_argument("--by", required=True, metavar="NAME", help="who decides (kept)")
        decide.add_argument("--note", metavar="TEXT", help="why (kept with the decision)")
        as_user(decide, "approval")
        decide.set_defaults(approve=approve)


def cmd_approval_list(args: argparse.Namespace) -> None:
    """List approvals."""
    items = reader().approvals(user_id=args.user, pending=not args.all)
    columns = (*_COLUMNS, "decision", "by") if args.all else _COLUMNS
    emit(args, items, lambda: _print(items, columns))


def cmd_approval_decide(args: argparse.Namespace) -> None:
    """Approve or reject an approval (the first decision wins; a second exits 2)."""
    validate_id(args.approval_id, "approval")
    doc = client().decide(
        args.approval_id, args.approve, by=args.by, note=args.note, user_id=args.user
    )
    text = f"{doc['approval_id']} {doc['decision']} by {doc['by']}"
    emit(args, doc, lambda: print(progress.printable(text)))


def _print(items: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    if not items:
        print("no approvals")
        return
    progress.print_table(items, columns)
