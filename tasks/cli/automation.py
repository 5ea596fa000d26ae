"""Schedule and webhook commands: ``schedule add|list|show|pause|resume|rm`` and ``webhook
add|list|rm|deliveries|redeliver``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from state.errors import UsageError
from tasks.cli import progress
from tasks.cli.support import as_user, client, command, emit, group, reader

_SCHEDULE_COLUMNS = ("schedule_id", "user_id", "cron", "every_seconds", "timezone", "next_tick")
_RUN_COLUMNS = ("tick", "status", "message_id", "workflow_id", "reason")
_HOOK_COLUMNS = ("webhook_id", "url", "events", "user_id", "enabled")
_DELIVERY_COLUMNS = ("delivery_id", "event", "status", "tries", "last")


def add_schedule(sub: Any) -> None:
    """Register the ``schedule`` group."""
    schedule = group(sub, "schedule", "messages and workflows that start themselves")
    actions = schedule.add_subparsers(metavar="ACTION")
    add = command(actions, "add", cmd_schedule_add, "create a schedule")
    add.add_argument("schedule_id", metavar="SCHEDULE_ID")
    timing = add.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", metavar="EXPR", help="five fields, e.g. '0 9 * * 1-5'")
    timing.add_argument("--every", type=float, metavar="SECONDS", help="an interval (>= 1)")
    add.add_argument("--user", required=True, metavar="USER_ID", help="whose schedule it is")
    add.add_argument("--timezone", default="UTC", help="an IANA name (default UTC)")
    target = add.add_mutually_exclusive_group(required=True)
    target.add_argument("--text", help="the message each tick sends to --session")
    target.add_argument("--workflow", metavar="SPEC.json", help="a workflow spec per tick")
    add.add_argument("--session", metavar="SESSION_ID", help="the session the text goes to")
    add.add_argument("--catch-up", default="latest", choices=["latest", "none"])
    add.add_argument("--overlap", default="skip", choices=["skip", "enqueue"])
    listing = command(actions, "list", cmd_schedule_list, "list schedules and next ticks")
    listing.add_argument("--user", metavar="USER_ID", help="only this user's schedules")
    show = command(actions, "show", cmd_schedule_show, "a schedule and its latest ticks")
    for name, handler, text in (
        ("pause", cmd_schedule_pause, "stop a schedule's ticks"),
        ("resume", cmd_schedule_resume, "tick again from the next tick"),
        ("rm", cmd_schedule_rm, "delete a schedule and its ticks"),
    ):
        parser = command(actions, name, handler, text)
        parser.add_argument("schedule_id", metavar="SCHEDULE_ID")
        as_user(parser, "schedule")
    show.add_argument("schedule_id", metavar="SCHEDULE_ID")
    show.add_argument("--limit", type=int, default=20, help="ticks shown (default 20)")
    as_user(show, "schedule")


def cmd_schedule_add(args: argparse.Namespace) -> None:
    """Create a schedule."""
    workflow = None
    if args.workflow is not None:
        try:
            with open(args.workflow, encoding="utf-8") as spec:
                workflow = json.load(spec)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {args.workflow}: {exc}") from None
    doc = client().create_schedule(
        args.schedule_id,
        args.cron,
        every_seconds=args.every,
        user_id=args.user,
        session_id=args.session,
        text=args.text,
        workflow=workflow,
        timezone=args.timezone,
        catch_up=args.catch_up,
        overlap=args.overlap,
    )
    emit(args, doc, lambda: print(f"{doc['schedule_id']} next tick {doc['next_tick']}"))


def cmd_schedule_list(args: argparse.Namespace) -> None:
    """List schedules."""
    items = reader().list_schedules(user_id=args.user)
    emit(args, items, lambda: _table(items, _SCHEDULE_COLUMNS, "no schedules"))


def cmd_schedule_show(args: argparse.Namespace) -> None:
    """A schedule and its latest ticks."""
    found = reader()
    doc = found.get_schedule(args.schedule_id, user_id=args.user)
    if doc is None:
        raise_unknown("schedule", args.schedule_id)
    runs = found.schedule_runs(args.schedule_id, limit=args.limit, user_id=args.user)
    data = {**doc, "runs": runs}

    def human() -> None:
        for key in ("schedule_id", "user_id", "cron", "every_seconds", "timezone", "paused"):
            print(f"{key}: {doc[key]}")
        print(f"next_tick: {doc['next_tick']}")
        _table(runs, _RUN_COLUMNS, "no ticks yet")

    emit(args, data, human)


def cmd_schedule_pause(args: argparse.Namespace) -> None:
    doc = client().pause_schedule(args.schedule_id, user_id=args.user)
    emit(args, doc, lambda: print(f"{doc['schedule_id']} paused"))


def cmd_schedule_resume(args: argparse.Namespace) -> None:
    doc = client().resume_schedule(args.schedule_id, user_id=args.user)
    emit(args, doc, lambda: print(f"{doc['schedule_id']} next tick {doc['next_tick']}"))


def cmd_schedule_rm(args: argparse.Namespace) -> None:
    client().delete_schedule(args.schedule_id, user_id=args.user)
    emit(args, {"deleted": args.schedule_id}, lambda: print(f"{args.schedule_id} deleted"))


def add_webhook(sub: Any) -> None:
    """Register the ``webhook`` group."""
    webhook = group(sub, "webhook", "URLs told what happened, signed and retried")
    actions = webhook.add_subparsers(metavar="ACTION")
    add = command(actions, "add", cmd_webhook_add, "register a URL for some events")
    add.add_argument("url", metavar="URL")
    add.add_argument("events", nargs="+", metavar="EVENT", help="e.g. turn.completed")
    add.add_argument("--user", metavar="USER_ID", help="only this user's events (else all)")
    add.add_argument("--session", metavar="SESSION_ID", help="only this session's events")
    listing = command(actions, "list", cmd_webhook_list, "list webhooks")
    listing.add_argument("--user", metavar="USER_ID", help="only this user's webhooks")
    remove = command(actions, "rm", cmd_webhook_rm, "remove a webhook and its deliveries")
    remove.add_argument("webhook_id", metavar="WEBHOOK_ID")
    as_user(remove, "webhook")
    deliveries = command(actions, "deliveries", cmd_webhook_deliveries, "a webhook's deliveries")
    deliveries.add_argument("webhook_id", metavar="WEBHOOK_ID")
    deliveries.add_argument("--limit", type=int, default=50)
    as_user(deliveries, "webhook")
    again = command(actions, "redeliver", cmd_webhook_redeliver, "send a delivery again")
    again.add_argument("delivery_id", metavar="DELIVERY_ID")
    as_user(again, "delivery")


def cmd_webhook_add(args: argparse.Namespace) -> None:
    doc = client().add_webhook(args.url, args.events, user_id=args.user, session_id=args.session)
    emit(args, doc, lambda: print(f"{doc['webhook_id']} secret {doc['secret']}"))


def cmd_webhook_list(args: argparse.Namespace) -> None:
    items = reader().list_webhooks(user_id=args.user)
    emit(args, items, lambda: _table(items, _HOOK_COLUMNS, "no webhooks"))


def cmd_webhook_rm(args: argparse.Namespace) -> None:
    client().remove_webhook(args.webhook_id, user_id=args.user)
    emit(args, {"removed": args.webhook_id}, lambda: print(f"{args.webhook_id} removed"))


def cmd_webhook_deliveries(args: argparse.Namespace) -> None:
    items = reader().webhook_deliveries(args.webhook_id, limit=args.limit, user_id=args.user)
    rows = [{**d, "tries": len(d["attempts"]), "last": (d["attempts"] or [{}])[-1]} for d in items]
    emit(args, items, lambda: _table(rows, _DELIVERY_COLUMNS, "no deliveries"))


def cmd_webhook_redeliver(args: argparse.Namespace) -> None:
    doc = client().redeliver(args.delivery_id, user_id=args.user)
    emit(args, doc, lambda: print(f"{doc['delivery_id']} {doc['status']}"))


def raise_unknown(kind: str, object_id: str) -> None:
    from state.errors import NotFoundError

    raise NotFoundError(f"unknown {kind} {object_id!r}")


def _table(items: list[dict[str, Any]], columns: tuple[str, ...], empty: str) -> None:
    if not items:
        print(empty)
        return
    progress.print_table(items, columns)
