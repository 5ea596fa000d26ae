"""What the CLI shows while it waits, and how it prints sessions and workflows."""

from __future__ import annotations

import json
import sys
import time
import unicodedata
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TextIO

from state.documents.codec import Document
from state.errors import NotFoundError
from state.events.stream import TokenMerge, TokenWaiter
from state.machine import Phase
from state.workflows.records import WorkflowProgress
from tasks.cli.terminal import line_printer

_POLL_S = 0.03
_BAR_WIDTH = 30
# Shown as they are: the rest of the control characters could drive the terminal.
_KEPT = frozenset("\n\t")
# Unicode's bidirectional overrides and isolates reorder what the operator reads.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(value: object) -> str:
    """``str(value)`` safe for a terminal: control characters escaped (``\\x1b``),
    newlines and tabs kept, so stored text cannot retitle or recolour the operator's
    terminal, or hide what it says."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(_escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    if ch in _KEPT or (unicodedata.category(ch) != "Cc" and ch not in _BIDI):
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class TurnWatcher:
    """Follows one message's turn through the FSM, printing each phase as it happens.

    After :meth:`wait`, ``reply_kind`` is the reply's ``metadata.kind`` (``"apology"`` for
    a failed turn, None for a plain reply), and ``approval_id`` is set when the turn
    rests waiting for a person's decision instead (there is no reply yet).
    """

    def __init__(
        self,
        client: Any,
        session_id: str,
        message_id: str,
        *,
        quiet: bool = False,
        out: TextIO | None = None,
        chunks: TokenWaiter | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.message_id = message_id
        self.out = None if quiet else (out or sys.stderr)
        self.shown = 0
        self.reply_kind: str | None = None
        self.approval_id: str | None = None
        # Subscribed to the session's chunks: they are shown as they come, woken by them.
        self.chunks = chunks
        self.merge = TokenMerge()
        self.streamed = False
        self.streamed_text = ""  # every chunk of this message's reply shown so far

    def wait(self, timeout: float) -> tuple[str | None, list[str]]:
        """Block until the message is answered, or its turn waits for an approval (reply
        None, ``approval_id`` set); return (reply, phases of its turn)."""
        deadline = time.monotonic() + timeout
        path: list[str] = []
        looked_at = -1
        while time.monotonic() < deadline:
            found, revision = self._look()
            path = found or path
            self._show(path)
            # The history only changes with the revision: read it only when that moved.
            reply = self._reply() if revision != looked_at else None
            looked_at = revision
            if reply is not None:
                # The reply may have landed after the path was read: read it once more
                # (the reply and the turn's last phase commit together).
                path = self._look()[0] or path
                self._pause(0.0)  # the chunks that came before the reply's commit
                self._show(path)
                self._finish()
                return reply, path
            if self.approval_id is not None:
                self._finish()
                return None, path
            self._pause()
        self._finish()
        raise TimeoutError(
            f"no reply to {self.message_id} within {timeout:g}s "
            "(are workers running? `celery -A tasks worker`)"
        )

    def _look(self) -> tuple[list[str] | None, int]:
        """The phases this message's turn went through so far (None: not started yet, or
        a later message's turn already replaced it), and the session's revision."""
        snapshot = self.client.sessions.load_from_database(self.session_id)
        if snapshot is None:
            return None, -1
        turn = (snapshot.doc.get("metadata") or {}).get("turn") or {}
        if turn.get("message_id") != self.message_id:
            return None, snapshot.revision
        if snapshot.phase == Phase.AWAITING_APPROVAL:
            self.approval_id = (snapshot.doc.get("context_window") or {}).get("approval_id")
        return list(turn.get("path", [])), snapshot.revision

    def _reply(self) -> str | None:
        for item in reversed(self.client.sessions.history(self.session_id, last=50)):
            if item["metadata"].get("reply_to") == self.message_id:
                self.reply_kind = item["metadata"].get("kind")
                return str(item["content"])
        return None

    def _pause(self, seconds: float = _POLL_S) -> None:
        """Wait a poll interval, or less while chunks of the answer come (shown as they
        do)."""
        if self.chunks is None or self.chunks.pubsub is None:
            time.sleep(seconds)
            return
        self.chunks.wait(seconds)
        for item in self.chunks.take():
            chunk = None if item is None or item[0] != self.message_id else self.merge.chunk(*item)
            if chunk is not None and self.out is not None:
                self.out.write(
                    ("\n  " if not self.streamed else "") + printable(chunk["data"]["text"])
                )
                self.out.flush()
                self.streamed = True
                self.streamed_text += chunk["data"]["text"]

    def _show(self, path: list[str]) -> None:
        if self.out is None or len(path) <= self.shown:
            return
        new = path[self.shown :]
        prefix = "  " if self.shown == 0 else " \u2192 "
        if self.streamed:
            prefix, self.streamed = "\n  \u2192 ", False
        self.out.write(prefix + " \u2192 ".join(new))
        self.out.flush()
        self.shown = len(path)

    def showed(self, reply: str) -> bool:
        """Whether ``reply`` has been shown whole, as it streamed, on the terminal that
        stdout prints to as well (then printing it again there would show it twice)."""
        terminal = self.out is not None and self.out.isatty() and sys.stdout.isatty()
        return terminal and bool(reply) and self.streamed_text == reply

    def _finish(self) -> None:
        if self.out is not None and self.shown:
            self.out.write("\n")
            self.out.flush()


class WorkflowWatcher:
    """Polls a workflow's counts and draws a progress bar (done/total, failures); the
    workflow itself, inputs and outputs, is read once, when it has finished."""

    def __init__(
        self, client: Any, workflow_id: str, *, quiet: bool = False, out: TextIO | None = None
    ) -> None:
        self.client = client
        self.workflow_id = workflow_id
        self.out = None if quiet else (out or sys.stderr)
        self.last_line = ""

    def wait(self, timeout: float) -> Document:
        """Block until the workflow finishes; return it."""
        deadline = time.monotonic() + timeout
        while True:
            progress = self.client.workflows.store.progress(self.workflow_id, step_counts=True)
            if progress is None:
                raise NotFoundError(f"unknown workflow {self.workflow_id!r}")
            self._draw(progress)
            if progress.finished:
                self._newline()
                return dict(self.client.get_workflow(self.workflow_id))
            if time.monotonic() >= deadline:
                self._newline()
                raise TimeoutError(f"workflow {self.workflow_id} unfinished after {timeout:g}s")
            time.sleep(0.1)

    def _draw(self, progress: WorkflowProgress) -> None:
        if self.out is None:
            return
        line = progress_line(progress)
        if line == self.last_line:
            return
        tty = self.out.isatty()
        self.out.write(("\r" + line) if tty else line + "\n")
        self.out.flush()
        self.last_line = line

    def _newline(self) -> None:
        if self.out is not None and self.out.isatty():
            self.out.write("\n")


def progress_line(progress: WorkflowProgress) -> str:
    """``[#####-----] 12/40 done, 1 failed, 3 running``.

    The counts by status are read apart from the done count, a moment later or earlier:
    what is still running or retrying is shown only up to the steps not done (none once
    all are), so the line never says "3/3 done, 1 running"."""
    counts = progress.step_counts or {}
    total = progress.total_steps
    done = progress.done
    filled = int(_BAR_WIDTH * done / total) if total else _BAR_WIDTH
    bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
    open_steps = 0 if progress.finished else max(total - done, 0)
    shown = {s: counts.get(s, 0) for s in ("failed", "skipped")}
    for status in ("running", "retrying"):
        shown[status] = min(counts.get(status, 0), open_steps)
        open_steps -= shown[status]
    extras = [f"{n} {status}" for status, n in shown.items() if n]
    return f"[{bar}] {done}/{total} done" + (", " + ", ".join(extras) if extras else "")


_CELL_CHARS = 60


def print_table(
    items: Sequence[Document], columns: Sequence[str], out: TextIO | None = None
) -> None:
    """``items`` as aligned columns under a header row (the column names in capitals);
    a missing value shows as ``-``, an object or list as compact JSON cut at 60
    characters, an id whole (it is what the next command takes); stored text made
    printable; in a terminal, each row cut to its width."""
    show = line_printer(out)
    rows = [[_cell(item.get(column)) for column in columns] for item in items]
    header = [column.upper() for column in columns]
    widths = [max(map(len, cells)) for cells in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        show("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if not isinstance(value, dict | list):
        return printable(str(value))
    text = printable(json.dumps(value, default=str))
    return text if len(text) <= _CELL_CHARS else text[: _CELL_CHARS - 3] + "..."


def print_session(doc: Document, out: TextIO | None = None) -> None:
    """A session as text: a header, then its history (stored text made printable)."""
    show = partial(print, file=out or sys.stdout)
    show(
        printable(
            f"session {doc['session_id']}  user {doc['user_id']}  phase {doc['phase']}  "
            f"status {doc['status']}  revision {doc['revision']}  v{doc['_version']}  "
            f"queued {doc.get('queued', 0)}"
        )
    )
    path = (doc.get("metadata") or {}).get("turn", {}).get("path")
    if path:
        show(printable("last turn: " + " \u2192 ".join(map(str, path))))
    error = (doc.get("metadata") or {}).get("last_error")
    if error:
        show(printable(f"last error: {error['cause']} in {error['phase']}: {error['detail']}"))
    for item in doc["message_history"]:
        show(printable(f"  [{item['role']}] {item['content']}"))


def print_workflow(doc: Document, out: TextIO | None = None) -> None:
    """A workflow as a table of steps (stored text made printable; in a terminal, each
    row cut to its width)."""
    show = line_printer(out)
    show(
        printable(
            f"workflow {doc['workflow_id']}  status {doc['status']}  "
            f"{doc['total_steps'] - doc['remaining_steps']}/{doc['total_steps']} done"
        )
    )
    show(f"  {'STEP':<20} {'ACTION':<12} {'STATUS':<9} {'RETRIES':>7}  OUTPUT / ERROR")
    for step in doc["steps"].values():
        detail = step["error"] if step["status"] in ("failed", "skipped") else step["outputs"]
        text = printable(detail)
        text = text if len(text) <= 60 else text[:57] + "..."
        show(
            printable(
                f"  {step['step_id']:<20} {step['action']:<12} {step['status']:<9} "
                f"{step['retry_count']:>7}  "
            )
            + text
        )


def event_line(event: Document) -> str:
    """One event as a line: ``seq  at  kind  r<revision> phase  data`` (made printable)."""
    data = json.dumps(event["data"], ensure_ascii=False, default=str)
    return printable(
        f"{event['seq']:>6}  {event['at']}  {event['kind']:<18} r{event['revision']:<5} "
        f"{event['phase']:<12} {data}"
    )


def print_revisions(found: list[Document], out: TextIO | None = None) -> None:
    """A session's revisions as a table (in a terminal, each row cut to its width)."""
    show = line_printer(out)
    show(f"  {'REV':>5}  {'AT':<32}  {'PHASE':<12}  TRIGGER")
    for item in found:
        show(
            printable(
                f"  {item['revision']:>5}  {item['at']:<32}  {item['phase']:<12}  "
                f"{item['trigger'] or ''}"
            )
        )


def print_migration(data: Document) -> None:
    """The migrate command's report."""
    verb = "would migrate" if data["dry_run"] else "migrated"
    for kind in ("sessions", "users"):
        r = data[kind]
        print(
            f"{kind}: {r['scanned']} scanned, {r['current']} current, {verb} {r['migrated']}, "
            f"{r['refused_newer']} newer than this code (left alone), "
            f"{r['quarantined']} unreadable" + ("" if data["dry_run"] else " (quarantined)")
        )


def count_printer(out: TextIO | None = None) -> Callable[[str, int], None]:
    """A progress callback printing ``sessions: 400 scanned`` as batches go by."""
    stream = out or sys.stderr

    def show(kind: str, count: int) -> None:
        stream.write(f"  {kind}: {count} scanned\n")
        stream.flush()

    return show
