"""The ``agentstate`` command line.

Exit status: 0 ok, 2 bad input (unknown ids included) with a one-line message, 1 any
other failure. ``--json`` (after the subcommand) prints machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import OperationalError as DatabaseError

from config import get_settings, redact_url
from config.urls import hide_secrets_in, scrub
from state.errors import AgentStateError, BadInputError, NotFoundError, WorkflowSpecError
from state.ids import validate_id
from tasks import progress

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
Handler = Callable[[argparse.Namespace], Any]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    hide_secrets_in(logging.getLogger())
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        result = args.handler(args)
    except KeyboardInterrupt:
        return _fail(130, "interrupted")
    except Exception as exc:
        return _failure(exc)
    return result if isinstance(result, int) else EXIT_OK


def _failure(exc: Exception) -> int:
    """The exit status and one-line message for an error (no traceback when expected)."""
    if isinstance(exc, BadInputError):
        return _fail(EXIT_BAD_INPUT, str(exc))
    if isinstance(exc, TimeoutError | AgentStateError):
        return _fail(EXIT_FAILURE, str(exc))
    if isinstance(exc, redis.RedisError | BrokerError):
        return _fail(EXIT_FAILURE, f"cannot reach Redis: {exc} (check AGENTSTATE_REDIS_URL)")
    if isinstance(exc, DatabaseError):
        return _fail(
            EXIT_FAILURE, f"cannot reach the database: {exc.orig} (check AGENTSTATE_DATABASE_URL)"
        )
    raise exc


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2), like every other bad input."""

    def error(self, message: str) -> Any:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _fail(status: int, message: str) -> int:
    first_line = scrub(message).strip().splitlines()[0] if message.strip() else "failed"
    print(f"agentstate: error: {first_line}", file=sys.stderr)
    return status


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every subcommand documents itself in --help)."""
    parser = _Parser(
        prog="agentstate",
        description="Durable agent state on Celery: send messages, inspect sessions and "
        "workflows, recover lost work, migrate stored state.",
        epilog="Configuration comes from AGENTSTATE_* environment variables (see README).",
    )
    sub = parser.add_subparsers(metavar="COMMAND")
    _add_db(sub)
    _add_send(sub)
    _add_session(sub)
    _add_user(sub)
    _add_workflow(sub)
    _command(sub, "recover", cmd_recover, "run one recovery sweep (what beat runs periodically)")
    migrate = _command(sub, "migrate", cmd_migrate, "migrate all stored state to this version")
    migrate.add_argument("--dry-run", action="store_true", help="count, change nothing")
    migrate.add_argument("--batch", type=int, default=200, help="rows per batch (200)")
    fsm = sub.add_parser("fsm", help="the agent state machine")
    fsm_sub = fsm.add_subparsers(metavar="ACTION")
    _command(fsm_sub, "diagram", cmd_fsm_diagram, "print the FSM as a Mermaid diagram")
    demo = _command(sub, "demo", cmd_demo, "a conversation and a workflow through real workers")
    demo.add_argument("--workers", type=int, default=2, help="worker processes to start (2)")
    demo.add_argument("--no-workers", action="store_true", help="use workers already running")
    demo.add_argument("--no-flower", action="store_true", help="do not start Flower")
    return parser


def _command(sub: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
    command: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    command.add_argument("--json", action="store_true", help="machine-readable output")
    command.set_defaults(handler=handler)
    return command


def _add_db(sub: Any) -> None:
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(metavar="ACTION")
    _command(db_sub, "upgrade", cmd_db_upgrade, "create or upgrade the schema (Alembic)")


def _add_send(sub: Any) -> None:
    send = _command(sub, "send", cmd_send, "send a message to a session")
    send.add_argument("session_id", metavar="SESSION_ID")
    send.add_argument("text", metavar="TEXT")
    send.add_argument("--user", required=True, metavar="USER_ID", help="who sends it")
    send.add_argument("--wait", action="store_true", help="wait for the reply, showing phases")
    send.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (60)")


def _add_session(sub: Any) -> None:
    session = sub.add_parser("session", help="inspect sessions")
    session_sub = session.add_subparsers(metavar="ACTION")
    show = _command(session_sub, "show", cmd_session_show, "show a session and its history")
    show.add_argument("session_id", metavar="SESSION_ID")


def _add_user(sub: Any) -> None:
    user = sub.add_parser("user", help="inspect users' persistent state")
    user_sub = user.add_subparsers(metavar="ACTION")
    show = _command(user_sub, "show", cmd_user_show, "show a user's persistent state")
    show.add_argument("user_id", metavar="USER_ID")


def _add_workflow(sub: Any) -> None:
    workflow = sub.add_parser("workflow", help="run and inspect workflows")
    wf_sub = workflow.add_subparsers(metavar="ACTION")
    run = _command(wf_sub, "run", cmd_workflow_run, "start a workflow from a JSON spec file")
    run.add_argument("spec", metavar="SPEC.json", help="the spec file ('-' reads stdin)")
    run.add_argument("--wait", action="store_true", help="wait, with a progress bar")
    run.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (600)")
    show = _command(wf_sub, "show", cmd_workflow_show, "show a workflow's steps")
    show.add_argument("workflow_id", metavar="WORKFLOW_ID")


# -- commands ------------------------------------------------------------------


def _client() -> Any:
    from tasks.client import AgentClient

    return AgentClient()


def _emit(args: argparse.Namespace, data: Any, human: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        human()


def cmd_db_upgrade(args: argparse.Namespace) -> None:
    """Create or upgrade the schema."""
    from state.db import get_engine, upgrade_schema

    settings = get_settings()
    revision = upgrade_schema(get_engine(settings.database_url, pool_size=1, max_overflow=0))
    where = redact_url(settings.database_url)
    _emit(
        args,
        {"revision": revision, "database": where},
        lambda: print(f"schema at revision {revision} ({where})"),
    )


def cmd_send(args: argparse.Namespace) -> None:
    """Send a message (and optionally wait for its reply)."""
    client = _client()
    message_id = client.send_message(args.session_id, args.text, user_id=args.user)
    if not args.wait:
        _emit(args, {"message_id": message_id}, lambda: print(message_id))
        return
    watcher = progress.TurnWatcher(client, args.session_id, message_id, quiet=args.json)
    reply, path = watcher.wait(args.timeout)
    data = {"message_id": message_id, "reply": reply, "path": path}
    _emit(args, data, lambda: print(reply))


def cmd_session_show(args: argparse.Namespace) -> None:
    """Show a session."""
    doc = _client().get_session(args.session_id)
    if doc is None:
        raise NotFoundError(f"unknown session {args.session_id!r}")
    _emit(args, doc, lambda: progress.print_session(doc))


def cmd_user_show(args: argparse.Namespace) -> None:
    """Show a user's persistent state."""
    validate_id(args.user_id, "user")
    state = _client().load_user_state(args.user_id)
    print(json.dumps(state, indent=2, default=str))


def cmd_workflow_run(args: argparse.Namespace) -> int:
    """Start a workflow from a spec file."""
    spec = _read_spec(args.spec)
    client = _client()
    workflow_id = client.start_workflow(spec)
    if not args.wait:
        _emit(args, {"workflow_id": workflow_id}, lambda: print(workflow_id))
        return EXIT_OK
    doc = progress.WorkflowWatcher(client, workflow_id, quiet=args.json).wait(args.timeout)
    _emit(args, doc, lambda: progress.print_workflow(doc))
    return EXIT_OK if doc["status"] == "success" else EXIT_FAILURE


def _read_spec(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowSpecError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkflowSpecError(f"{path} is not valid JSON: {exc}") from exc


def cmd_workflow_show(args: argparse.Namespace) -> None:
    """Show a workflow."""
    doc = _client().get_workflow(args.workflow_id)
    if doc is None:
        raise NotFoundError(f"unknown workflow {args.workflow_id!r}")
    _emit(args, doc, lambda: progress.print_workflow(doc))


def cmd_recover(args: argparse.Namespace) -> None:
    """One recovery sweep."""
    from tasks.runtime import runtime

    report = runtime().recovery.run().as_dict()
    summary = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in report.items())
    _emit(args, report, lambda: print(f"recovery sweep done ({summary})"))


def cmd_migrate(args: argparse.Namespace) -> None:
    """Migrate every stored document."""
    from state.bulk import migrate_sessions, migrate_users
    from tasks.runtime import runtime

    if args.batch < 1:
        raise BadInputError("--batch must be at least 1")
    rt = runtime()
    show = None if args.json else progress.count_printer()
    sessions = migrate_sessions(
        rt.turns.sessions, dry_run=args.dry_run, batch=args.batch, progress=show
    )
    users = migrate_users(rt.turns.users, dry_run=args.dry_run, batch=args.batch, progress=show)
    data = {"dry_run": args.dry_run, "sessions": sessions.as_dict(), "users": users.as_dict()}
    _emit(args, data, lambda: progress.print_migration(data))


def cmd_fsm_diagram(args: argparse.Namespace) -> None:
    """Print the FSM as Mermaid."""
    from state.machine import TRANSITIONS, mermaid_diagram

    _emit(
        args,
        {"mermaid": mermaid_diagram(), "transitions": TRANSITIONS},
        lambda: print(mermaid_diagram()),
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """The guided demo."""
    from tasks.demo import run_demo

    if args.workers < 1:
        raise BadInputError("--workers must be at least 1")
    return run_demo(workers=0 if args.no_workers else args.workers, flower=not args.no_flower)


if __name__ == "__main__":
    sys.exit(main())
