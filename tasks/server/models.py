"""The request and response bodies of the HTTP API: together with the routes they are the
OpenAPI document (``/openapi.json``).

Requests are strict (``"true"`` is not a boolean, unknown fields are refused) so that what
a client in another language sends means one thing. Responses list the fields agentstate
documents and allow more, so that a document that grows a field stays valid.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

ID_PATTERN = r"^[A-Za-z0-9._:\-]{1,128}$"
MAX_TEXT_CHARS = 1 << 20  # the byte limit (AGENTSTATE_MAX_MESSAGE_BYTES) is checked after


class MultitaskStrategy(StrEnum):
    """What a message to a busy session does (a turn running, or messages waiting)."""

    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Document(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- requests --------------------------------------------------------------------------


class MessageIn(_Request):
    """A message from a user. With a user's key, ``user_id`` must be that user."""

    text: str = Field(max_length=MAX_TEXT_CHARS, examples=["what is 12*7?"])
    user_id: str = Field(pattern=ID_PATTERN, examples=["alice"])
    multitask_strategy: MultitaskStrategy = Field(MultitaskStrategy.ENQUEUE, strict=False)
    agent: str | None = Field(
        None,
        max_length=64,
        examples=["default"],
        description="The agent of a new session (`GET /v1/agents`); a session keeps the agent "
        "of its first message, and naming another one answers 400.",
    )


class AgentOut(BaseModel):
    """One of the deployment's agents."""

    name: str = Field(examples=["default"])
    kind: str = Field(examples=["phases"], description="`phases`, `langgraph` or `pydantic-ai`")


class DecisionIn(_Request):
    """A person's decision on an approval. The first decision wins."""

    approve: bool
    by: str = Field(min_length=1, max_length=128, examples=["ops@example.com"])
    note: str | None = Field(None, max_length=2000)


class StepSpec(BaseModel):
    """One step of a workflow spec (see docs/guides/workflows.md); the engine checks the rest."""

    model_config = ConfigDict(extra="allow")

    step_id: str = Field(pattern=ID_PATTERN, examples=["a"])
    action: str = Field(min_length=1, max_length=128, examples=["calculate"])
    inputs: dict[str, Any] = Field(default_factory=dict, examples=[{"expression": "2+3"}])
    dependencies: list[str] = Field(default_factory=list)
    max_retries: int | None = Field(None, ge=0)
    timeout_s: float | None = Field(None, gt=0)
    not_before_s: float | None = Field(None, ge=0)
    approval: bool | None = None


class WorkflowSpec(BaseModel):
    """A workflow: steps and their dependencies (a DAG). A ``workflow_id`` that exists
    with the same spec answers with that id and re-runs nothing."""

    model_config = ConfigDict(extra="allow")

    workflow_id: str | None = Field(None, pattern=ID_PATTERN)
    session_id: str | None = Field(None, pattern=ID_PATTERN)
    context: dict[str, Any] = Field(default_factory=dict)
    steps: list[StepSpec] = Field(min_length=1)


# -- responses -------------------------------------------------------------------------


class ErrorOut(BaseModel):
    """Every error: one line, and its kind."""

    error: str
    kind: str = Field(
        examples=["bad_input"],
        description="bad_input | not_found | conflict | unauthorized | forbidden | "
        "unavailable | timeout | failure",
    )


class MessageAccepted(BaseModel):
    """The message is durable; workers answer it."""

    message_id: str


class WorkflowAccepted(BaseModel):
    """The workflow is stored and its ready steps are on their way."""

    workflow_id: str


class Cancelled(BaseModel):
    """Whether a turn was running (and is now ended)."""

    cancelled: bool


class HistoryItem(_Document):
    role: str
    content: str
    timestamp: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    seq: int | None = None


class SessionOut(_Document):
    """A session: the seed's SessionState fields, ``phase`` (the FSM state),
    ``revision``, ``queued`` and its history (paged with ``history_limit``)."""

    session_id: str
    user_id: str
    phase: str
    status: str
    revision: int
    queued: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    message_history: list[HistoryItem] = Field(default_factory=list)


class SessionSummary(_Document):
    session_id: str
    user_id: str
    phase: str
    status: str
    revision: int
    created_at: str | None = None
    updated_at: str | None = None


class SessionPage(BaseModel):
    items: list[SessionSummary]
    next_cursor: str | None


class RevisionOut(_Document):
    revision: int
    phase: str
    trigger: str | None = None
    at: str | None = None


class StepOut(_Document):
    step_id: str
    action: str
    status: str
    dependencies: list[str] = Field(default_factory=list)
    outputs: dict[str, Any] | None = None
    retry_count: int = 0
    error: str | None = None
    awaiting_approval: bool = False


class WorkflowOut(_Document):
    """A workflow and every step's status."""

    workflow_id: str
    session_id: str | None = None
    status: str
    steps: dict[str, StepOut]


class WorkflowSummary(_Document):
    workflow_id: str
    session_id: str | None = None
    status: str
    total_steps: int
    done_steps: int
    failed_steps: int


class WorkflowPage(BaseModel):
    items: list[WorkflowSummary]
    next_cursor: str | None


class ApprovalOut(_Document):
    """A request for a person's decision (of a turn, or of a workflow step)."""

    approval_id: str
    session_id: str | None = None
    workflow_id: str | None = None
    step_id: str | None = None
    action: str
    args: dict[str, Any] = Field(default_factory=dict)
    expires_at: str | None = None
    decision: str | None = None
    by: str | None = None
    note: str | None = None


class Transition(BaseModel):
    trigger: str
    source: str
    dest: str


class MachineOut(BaseModel):
    """The agent state machine: its states and transitions (for drawing turn paths)."""

    states: list[str]
    transitions: list[Transition]


class CallerOut(BaseModel):
    """Whom the key stands for: a user, or an operator (``user_id`` null)."""

    user_id: str | None
    operator: bool


class Erased(RootModel[dict[str, Any]]):
    """Rows deleted per kind (``{"sessions": 2, "messages": 14, ...}``)."""


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
