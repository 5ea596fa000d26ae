"""The ``agentstate`` command line.

Exit status: 0 ok, 2 bad input (unknown ids, a missing database and bad AGENTSTATE_*
settings included) with a one-line message on stderr, 1 any other failure (a workflow
that failed included: ``workflow run --wait`` and ``workflow show`` both exit 1 for it,
printing it all the same, and so does ``send --wait`` for a turn answered with an apology;
an unexpected error prints its traceback too), 130 interrupted. A reader that stops
reading (``agentstate session list | head -1``) ends the command quietly, exit 0.
Commands run with the current folder importable, as ``celery`` runs them, so the modules
AGENTSTATE_AGENT and AGENTSTATE_ACTION_MODULES name are found there. A group without its
action (``agentstate db``) prints the group's help and exits 2.

``--json`` (after the subcommand) prints machine-readable output: stdout then carries
exactly one JSON document, the result or, when the command fails, ``{"error": "one line",
"kind": "..."}`` with kind one of bad_input, not_found (exit 2), unavailable, timeout,
failure (exit 1), interrupted (130). Nothing but progress and warnings goes to stderr.

``session events --follow --json`` is the one stream: one JSON object per event, one per
line (JSON Lines), printed as the events happen.

The read-only commands (``session show``, ``session events``, ``session history``,
``user show``, ``workflow show``) never create a database: a SQLite file that is not
there, or a database without the agentstate schema, is reported (exit 2), and an unknown
id names the database that was searched.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from celery.utils.imports import cwd_in_path

from config import get_settings
from config.urls import hide_secrets_in
from state.errors import BadInputError, UsageError, WorkflowSpecError
from state.events.stream import TokenWaiter
from state.ids import validate_id
from state.turns.double_texting import MultitaskStrategy
from tasks.cli import progress
from tasks.cli.approval import add_approval
from tasks.cli.automation import add_schedule, add_webhook
from tasks.cli.control import add_session_control, add_workflow_control
from tasks.cli.lifecycle import add_prune, add_user_erase
from tasks.cli.outcome import report_turn
from tasks.cli.serve import add_serve
from tasks.cli.support import (
    DISTRIBUTION,
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    as_user,
    client,
    command,
    database_label,
    emit,
    failure_of,
    group,
    installed_version,
    noting_a_new_database,
    positive_seconds,
    reader,
    reader_gone,
    report,
    stdout_gone,
    unexpected,
    unknown,
    whole_number,
)
from tasks.cli.timeline import add_timeline


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    arguments = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in arguments  # until the arguments are parsed
    hide_secrets_in(logging.getLogger())
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
        as_json = bool(getattr(args, "json", False))
        if getattr(args, "handler", None) is None:
            # `agentstate db` and the like: the help of the group that was named.
            getattr(args, "help_of", parser).print_help()
            return EXIT_BAD_INPUT
        result = run_handler(args)
        sys.stdout.flush()  # here, where a reader gone (`| head`) is still ours to handle
    except BrokenPipeError as exc:
        return reader_gone() if stdout_gone() else report(unexpected(exc), as_json)
    except (Exception, KeyboardInterrupt) as exc:
        return report(failure_of(exc) or unexpected(exc), as_json)
    return result if isinstance(result, int) else EXIT_OK


def run_handler(args: argparse.Namespace) -> Any:
    """Run the command with the current folder importable, as ``celery`` runs its
    commands: AGENTSTATE_AGENT and AGENTSTATE_ACTION_MODULES name modules there."""
    get_settings()  # a bad AGENTSTATE_* value is refused by every command, even one not using it
    with cwd_in_path(), noting_a_new_database():
        return args.handler(args)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are reported like every other bad input (one line, exit 2)."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every subcommand documents itself in --help)."""
    parser = _Parser(
        prog="agentstate",
        description="Durable agent state on Celery: send messages, inspect sessions and "
        "workflows, recover lost work, migrate stored state.",
        epilog="Configuration comes from AGENTSTATE_* environment variables "
        "(docs/reference/settings.md lists them).",
    )
    _add_version(parser)
    sub = parser.add_subparsers(metavar="COMMAND")
    _add_db(sub)
    _add_send(sub)
    _add_session(sub)
    _add_user(sub)
    _add_workflow(sub)
    add_approval(sub)
    add_schedule(sub)
    add_webhook(sub)
    add_serve(sub)
    command(sub, "recover", cmd_recover, "run one recovery sweep (what beat runs periodically)")
    add_prune(sub)
    migrate = command(sub, "migrate", cmd_migrate, "migrate all stored state to this version")
    migrate.add_argument("--dry-run", action="store_true", help="count, change nothing")
    migrate.add_argument("--batch", type=int, default=200, help="rows per batch (200)")
    fsm = group(sub, "fsm", "the agent state machine")
    fsm_sub = fsm.add_subparsers(metavar="ACTION")
    command(fsm_sub, "diagram", cmd_fsm_diagram, "print the FSM as a Mermaid diagram")
    demo = command(sub, "demo", cmd_demo, "a conversation and a workflow through real workers")
    demo.add_argument("--workers", type=int, default=2, help="worker processes to start (2)")
    demo.add_argument("--no-workers", action="store_true", help="use workers already running")
    demo.add_argument("--no-flower", action="store_true", help="do not start Flower")
    demo.add_argument("--flower-port", type=int, default=5555, help="Flower's port (5555)")
    return parser


def _add_version(parser: argparse.ArgumentParser) -> None:
    text = f"agentstate {installed_version()} ({DISTRIBUTION})"
    parser.add_argument("--version", action="version", version=text, help="print the version")


def _add_db(sub: Any) -> None:
    db = group(sub, "db", "database schema")
    db_sub = db.add_subparsers(metavar="ACTION")
    command(db_sub, "upgrade", cmd_db_upgrade, "create or upgrade the schema (Alembic)")


def _add_send(sub: Any) -> None:
    send = command(sub, "send", cmd_send, "send a message to a session")
    send.add_argument("session_id", metavar="SESSION_ID")
    send.add_argument("text", metavar="TEXT")
    send.add_argument("--user", required=True, metavar="USER_ID", help="who sends it")
    send.add_argument(
        "--wait",
        action="store_true",
        help="wait for the reply, showing phases and chunks (or until the turn waits for an "
        "approval); exits 1 if the turn failed",
    )
    send.add_argument(
        "--multitask",
        choices=[str(strategy) for strategy in MultitaskStrategy],
        default=MultitaskStrategy.ENQUEUE.value,
        help="what the message does to a busy session (default: enqueue)",
    )
    send.add_argument("--timeout", type=positive_seconds, default=60.0, help="seconds to wait (60)")


def _add_session(sub: Any) -> None:
    session = group(sub, "session", "inspect sessions")
    session_sub = session.add_subparsers(metavar="ACTION")
    show = command(session_sub, "show", cmd_session_show, "show a session and its history")
    show.add_argument("session_id", metavar="SESSION_ID")
    add_session_control(session_sub)
    show.add_argument(
        "--revision", type=whole_number, metavar="N", help="the session as it was at revision N"
    )
    as_user(show, "session")
    add_timeline(session_sub)


def _add_user(sub: Any) -> None:
    user = group(sub, "user", "inspect users' persistent state, erase users")
    user_sub = user.add_subparsers(metavar="ACTION")
    show = command(
        user_sub, "show", cmd_user_show, "show a user's persistent state ({} if none yet)"
    )
    show.add_argument("user_id", metavar="USER_ID")
    add_user_erase(user_sub)


_FAILED_EXITS_1 = "exits 1 if the workflow failed (after printing it)"


def _add_workflow(sub: Any) -> None:
    workflow = group(sub, "workflow", "run and inspect workflows")
    wf_sub = workflow.add_subparsers(metavar="ACTION")
    run = command(wf_sub, "run", cmd_workflow_run, "start a workflow from a JSON spec file")
    run.add_argument("spec", metavar="SPEC.json", help="the spec file ('-' reads stdin)")
    run.add_argument(
        "--wait", action="store_true", help=f"wait, with a progress bar; {_FAILED_EXITS_1}"
    )
    run.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds to wait (600)"
    )
    as_user(run, "session (the spec's session_id)")
    show = command(wf_sub, "show", cmd_workflow_show, f"show a workflow's steps; {_FAILED_EXITS_1}")
    show.add_argument("workflow_id", metavar="WORKFLOW_ID")
    as_user(show, "workflow")
    add_workflow_control(wf_sub)


# -- commands ------------------------------------------------------------------


def cmd_db_upgrade(args: argparse.Namespace) -> None:
    """Create or upgrade the schema."""
    from state.storage.db import get_engine, upgrade_schema

    settings = get_settings()
    revision = upgrade_schema(get_engine(settings.database_url, pool_size=1, max_overflow=0))
    where = database_label(settings)
    emit(
        args,
        {"revision": revision, "database": where},
        lambda: print(f"schema at revision {revision} ({where})"),
    )


def cmd_send(args: argparse.Namespace) -> int:
    """Send a message (and optionally wait for its reply; exit 1 if the turn failed)."""
    from tasks.client.control import checked_message

    # Refused before the client opens (and may create) the database.
    checked_message(
        get_settings(), args.session_id, args.text, args.user, None, strategy=args.multitask
    )
    agent = client()
    send = partial(
        agent.send_message,
        args.session_id,
        args.text,
        user_id=args.user,
        multitask_strategy=args.multitask,
    )
    if not args.wait:
        message_id = send()
        emit(args, {"message_id": message_id}, lambda: print(message_id))
        return EXIT_OK
    # Subscribed before sending, so no chunk of the answer can come before we listen.
    chunks = TokenWaiter(agent.backend.redis, args.session_id, agent.settings.events)
    with chunks:
        message_id = send()
        watcher = progress.TurnWatcher(
            agent, args.session_id, message_id, quiet=args.json, chunks=chunks
        )
        reply, path = watcher.wait(args.timeout)
    data = {"message_id": message_id, "reply": reply, "path": path}
    return report_turn(args, agent, watcher, data)


def cmd_session_show(args: argparse.Namespace) -> None:
    """Show a session (as it was at ``--revision``, if given)."""
    validate_id(args.session_id, "session")
    doc = reader().get_session(args.session_id, user_id=args.user, revision=args.revision)
    if doc is None:
        raise unknown("session", args.session_id)
    emit(args, doc, lambda: progress.print_session(doc))


def cmd_user_show(args: argparse.Namespace) -> None:
    """Show a user's persistent state (JSON either way)."""
    from state.storage.db import read_connection
    from state.storage.user_rows import read_row

    validate_id(args.user_id, "user")
    agent = reader()
    with read_connection(agent.backend.engine) as conn:
        stored = read_row(conn, args.user_id) is not None
    if not stored and not agent.list_sessions(user_id=args.user_id, limit=1)["items"]:
        raise unknown("user", args.user_id)
    state = agent.load_user_state(args.user_id)  # {} for a user with sessions only
    print(json.dumps(state, indent=2, default=str))


def cmd_workflow_run(args: argparse.Namespace) -> int:
    """Start a workflow from a spec file."""
    spec = _read_spec(args.spec)
    agent = client()
    workflow_id = agent.start_workflow(spec, user_id=args.user)
    if not args.wait:
        emit(args, {"workflow_id": workflow_id}, lambda: print(workflow_id))
        return EXIT_OK
    doc = progress.WorkflowWatcher(agent, workflow_id, quiet=args.json).wait(args.timeout)
    return _show_workflow(args, doc)


def _read_spec(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowSpecError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise WorkflowSpecError(f"{path} is not UTF-8 text: {exc.reason}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkflowSpecError(f"{path} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise WorkflowSpecError(f"{path} is nested too deeply") from exc


def cmd_workflow_show(args: argparse.Namespace) -> int:
    """Show a workflow."""
    validate_id(args.workflow_id, "workflow")
    doc = reader().get_workflow(args.workflow_id, user_id=args.user)
    if doc is None:
        raise unknown("workflow", args.workflow_id)
    return _show_workflow(args, doc)


def _show_workflow(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    """Print the workflow; exit 1 if it failed (one rule for `run --wait` and `show`)."""
    emit(args, doc, lambda: progress.print_workflow(doc))
    if doc["status"] != "failed":
        return EXIT_OK
    if not args.json:
        print(f"agentstate: workflow {doc['workflow_id']} failed", file=sys.stderr)
    return EXIT_FAILURE


def cmd_recover(args: argparse.Namespace) -> None:
    """One recovery sweep."""
    from tasks.worker.runtime import runtime

    report = runtime().recovery.run().as_dict()
    summary = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in report.items())
    emit(args, report, lambda: print(f"recovery sweep done ({summary})"))


def cmd_migrate(args: argparse.Namespace) -> None:
    """Migrate every stored document."""
    from state.documents.bulk import migrate_sessions, migrate_users
    from tasks.worker.runtime import runtime

    if args.batch < 1:
        raise BadInputError("--batch must be at least 1")
    rt = runtime()
    show = None if args.json else progress.count_printer()
    sessions = migrate_sessions(
        rt.services.sessions, dry_run=args.dry_run, batch=args.batch, progress=show
    )
    users = migrate_users(rt.services.users, dry_run=args.dry_run, batch=args.batch, progress=show)
    data = {"dry_run": args.dry_run, "sessions": sessions.as_dict(), "users": users.as_dict()}
    emit(args, data, lambda: progress.print_migration(data))


def cmd_fsm_diagram(args: argparse.Namespace) -> None:
    """Print the FSM as Mermaid."""
    from state.machine import TRANSITIONS, mermaid_diagram

    emit(
        args,
        {"mermaid": mermaid_diagram(), "transitions": TRANSITIONS},
        lambda: print(mermaid_diagram()),
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """The guided demo."""
    from tasks.cli.demo import run_demo

    if args.workers < 1:
        raise BadInputError("--workers must be at least 1")
    if not 0 < args.flower_port < 65536:
        raise BadInputError("--flower-port must be between 1 and 65535")
    return run_demo(
        workers=0 if args.no_workers else args.workers,
        flower=not args.no_flower,
        flower_port=args.flower_port,
        as_json=args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
