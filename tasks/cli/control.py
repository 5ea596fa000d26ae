"""Run-control commands: ``session cancel|list`` and ``workflow cancel|retry|list``."""

from __future__ import annotations

import argparse
from typing import Any

from state.ids import validate_id
from tasks.cli import progress
from tasks.cli.support import as_user, client, command, emit, reader, unknown


def add_session_control(session_sub: Any) -> None:
    """Register ``session cancel`` and ``session list``."""
    cancel = command(session_sub, "cancel", cmd_session_cancel, "end a session's running turn")
    cancel.add_argument("session_id", metavar="SESSION_ID")
    as_user(cancel, "session")
    listing = command(session_sub, "list", cmd_session_list, "list sessions, newest first")
    listing.add_argument("--user", metavar="USER_ID", help="only this user's sessions")
    listing.add_argument("--phase", metavar="PHASE", help="only sessions in this phase")
    _paging(listing)


def add_workflow_control(wf_sub: Any) -> None:
    """Register ``workflow cancel``, ``workflow retry`` and ``workflow list``."""
    cancel = command(wf_sub, "cancel", cmd_workflow_cancel, "cancel a running workflow")
    cancel.add_argument("workflow_id", metavar="WORKFLOW_ID")
    as_user(cancel, "workflow")
    retry = command(wf_sub, "retry", cmd_workflow_retry, "run a failed or cancelled workflow again")
    retry.add_argument("workflow_id", metavar="WORKFLOW_ID")
    as_user(retry, "workflow")
    listing = command(wf_sub, "list", cmd_workflow_list, "list workflows, newest first")
    listing.add_argument("--user", metavar="USER_ID", help="only the workflows this user owns")
    listing.add_argument("--session", metavar="SESSION_ID", help="only this session's")
    listing.add_argument("--status", metavar="STATUS", help="running|success|failed|cancelled")
    _paging(listing)


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=50, help="items per page (50)")
    parser.add_argument("--cursor", help="the next_cursor of the previous page")


def cmd_session_cancel(args: argparse.Namespace) -> None:
    """End the running turn of a session."""
    validate_id(args.session_id, "session")
    agent = client()
    if agent.get_session(args.session_id, user_id=args.user, history_limit=0) is None:
        raise unknown("session", args.session_id)
    cancelled = agent.cancel_turn(args.session_id, user_id=args.user)
    text = "turn cancelled" if cancelled else "no turn was running"
    emit(args, {"session_id": args.session_id, "cancelled": cancelled}, lambda: print(text))


def cmd_session_list(args: argparse.Namespace) -> None:
    """List sessions."""
    page = reader().list_sessions(
        user_id=args.user, phase=args.phase, limit=args.limit, cursor=args.cursor
    )
    emit(args, page, lambda: _print_page(page, ("session_id", "user_id", "phase", "status")))


def cmd_workflow_cancel(args: argparse.Namespace) -> None:
    """Cancel a workflow."""
    validate_id(args.workflow_id, "workflow")
    doc = client().cancel_workflow(args.workflow_id, user_id=args.user)
    emit(args, doc, lambda: progress.print_workflow(doc))


def cmd_workflow_retry(args: argparse.Namespace) -> None:
    """Retry a workflow from where it stopped."""
    validate_id(args.workflow_id, "workflow")
    doc = client().retry_workflow(args.workflow_id, user_id=args.user)
    emit(args, doc, lambda: progress.print_workflow(doc))


def cmd_workflow_list(args: argparse.Namespace) -> None:
    """List workflows."""
    page = reader().list_workflows(
        session_id=args.session,
        status=args.status,
        limit=args.limit,
        cursor=args.cursor,
        user_id=args.user,
    )
    columns = ("workflow_id", "status", "done_steps", "total_steps")
    emit(args, page, lambda: _print_page(page, columns))


def _print_page(page: dict[str, Any], columns: tuple[str, ...]) -> None:
    if page["items"]:
        progress.print_table(page["items"], columns)
    if page["next_cursor"]:
        print(f"(more: --cursor {page['next_cursor']})")
