"""Every error agentstate raises, under one root."""

from __future__ import annotations


class AgentStateError(Exception):
    """Base of every agentstate error."""


class BadInputError(AgentStateError):
    """The caller asked for something invalid; nothing was changed."""


class InvalidIdError(BadInputError):
    """An id is not 1-128 characters of letters, digits and ``._:-``."""


class MessageTooLargeError(BadInputError):
    """A message is larger than AGENTSTATE_MAX_MESSAGE_BYTES."""


class EmptyMessageError(BadInputError):
    """A message has no text: it is empty or only whitespace (nothing to answer)."""


class InvalidPayloadError(BadInputError):
    """A payload is not the JSON object it must be."""


class UserStateTooLargeError(InvalidPayloadError):
    """A user's state is larger than AGENTSTATE_MAX_USER_STATE_BYTES."""


class StepOutputTooLargeError(InvalidPayloadError):
    """A workflow step's outputs are larger than AGENTSTATE_MAX_STEP_IO_BYTES."""

    retryable = False  # running the same action again would only produce the same outputs


class WorkflowSpecError(BadInputError):
    """A workflow spec is malformed, cyclic, dangling or names an unknown action."""


class NotFoundError(BadInputError):
    """The session, workflow or user named does not exist (or, given ``user_id=``, is
    another user's: that reads exactly as an unknown id)."""


class WorkflowSessionNotFoundError(NotFoundError, WorkflowSpecError):
    """A workflow spec names a session that does not exist, or that is not the caller's
    (``user_id=``); nothing was stored."""


class QuotaExceededError(BadInputError):
    """A per-inbox or per-user quota (``AGENTSTATE_MAX_QUEUED_MESSAGES``,
    ``AGENTSTATE_MAX_PENDING_APPROVALS``) is full; the message names the setting and
    nothing was stored."""


class IdempotencyConflictError(BadInputError):
    """The idempotency key (or workflow id) was used before for a different request."""


class WorkflowIdConflictError(IdempotencyConflictError, WorkflowSpecError):
    """A workflow with this id already exists, started from another spec."""


class ScheduleSpecError(BadInputError):
    """A schedule cannot be used as given (its cron, interval, timezone, target or policy);
    nothing was stored."""


class WebhookSpecError(BadInputError):
    """A webhook cannot be registered as given (its URL, events or secret); nothing was
    stored."""


class RunStateError(BadInputError):
    """The run cannot be controlled that way now (cancel a finished workflow, retry a
    successful one); nothing was changed."""


class ApprovalAlreadyDecidedError(RunStateError):
    """The approval was decided already (the first decision wins; it says by whom)."""


class ApprovalExpiredError(ApprovalAlreadyDecidedError):
    """The approval's ``expires_at`` has passed: it is recorded rejected ``by="expired"``
    (in the same guarded commit as the refused decision, if nobody had yet)."""


class SessionBusyError(RunStateError):
    """``send_message(..., multitask_strategy="reject")`` found the session busy (a turn
    running, or messages waiting); nothing was stored."""


class DatabaseNotFoundError(NotFoundError):
    """The configured database (or its agentstate schema) does not exist; reading never
    creates one."""


class UsageError(BadInputError):
    """A command line that does not parse (unknown command, missing or bad argument)."""


class SessionOwnershipError(NotFoundError):
    """The session belongs to another user (it reads as an unknown id: nothing is said
    of whose it is)."""


class MalformedTaskMessageError(BadInputError):
    """A broker message is not a well-formed task message; it is refused, never run."""


class ConfigurationError(BadInputError):
    """A setting's value cannot be used (the message names it, never its secrets)."""


class InvalidTransitionError(AgentStateError):
    """The trigger is not allowed from the machine's current state."""


class UnknownTriggerError(InvalidTransitionError):
    """A PhaseResult names a trigger that does not exist (raised where it is built, with
    the nearest trigger's name)."""


class UnstorableResultError(AgentStateError):
    """A handler's result cannot be committed (its user-state change raised, its workflow
    id is taken, ...): the turn ends with an apology instead of being retried."""


class ReservedContextKeyError(UnstorableResultError):
    """A handler's result changes a key of the turn's context that the engine owns
    (``state.agent.ENGINE_CONTEXT_KEYS``); the turn ends with an apology naming it."""


class AgentDefinitionError(AgentStateError):
    """The module named by AGENTSTATE_AGENT is not a usable agent (no phase at all, or a
    function whose name is a near miss of a phase); a worker refuses to start."""


class PhaseTimeLimitError(AgentStateError):
    """A handler (other than executing's) ran past AGENTSTATE_PHASE_TIME_LIMIT: its result
    is refused and its turn ends with an apology."""


class StaleStateError(AgentStateError):
    """The state changed (or the lock was lost) since it was read; nothing was written."""


class LockLostError(StaleStateError):
    """The writer's lock expired or was taken before it committed (a pause, a network
    partition): another worker may own the turn now; nothing was written."""


class StateLockAcquisitionError(AgentStateError):
    """The state lock stayed busy through every retry."""


class MigrationError(AgentStateError):
    """A stored document cannot be migrated to the running code's schema version."""


class FutureVersionError(MigrationError):
    """A stored document is newer than the running code; it is refused and left as is."""


class CorruptStateError(AgentStateError):
    """A stored document is not valid state and has been quarantined."""


class ServiceUnavailableError(AgentStateError):
    """Redis or the database did not answer within the retry budget."""


class TooManyRequestsError(AgentStateError):
    """One caller holds or asks for more than its share (AGENTSTATE_MAX_STREAMS_PER_KEY);
    HTTP answers 429 with Retry-After."""


class PoolerInTransactionModeError(ServiceUnavailableError):
    """A transaction's prepared statements met a pooler in transaction mode without
    AGENTSTATE_DB_POOLER set; the process goes on unprepared, the transaction runs again."""


class UnknownActionError(WorkflowSpecError):
    """A workflow step names an action that is not registered."""


class CalculationError(AgentStateError):
    """An expression is not safe arithmetic, or has no finite value in range."""

    # The same expression fails the same way every time: a workflow step that raises it
    # fails at once instead of being retried (see PermanentActionError).
    retryable = False


class StepTimeoutError(AgentStateError):
    """A workflow step ran longer than its ``timeout_s`` (a failed attempt, retried)."""


class ActionFailed(AgentStateError):
    """A workflow action gave up; its step is retried under ``max_retries``."""


class PermanentActionError(ActionFailed):
    """A workflow action failed in a way no retry can fix: its step fails at once.

    Raise it from an action (``from state.errors import PermanentActionError``) when the
    same inputs would fail the same way every time (bad inputs, a 4xx answer, a broken
    expression). The step ends ``failed`` without a retry, its ``error`` is
    ``"PermanentActionError: <message>"`` and its dependents are skipped. The engine asks
    ``retryable`` of whatever an action raises, so an app's own exception class with
    ``retryable = False`` behaves the same.
    """

    retryable = False


class ActionRegistrationError(AgentStateError):
    """An action was registered without a name, or under a name already taken."""


class SessionExistsError(BadInputError):
    """A session with that id already exists (a fork needs a new id)."""


class RequestTooLargeError(BadInputError):
    """An HTTP request body is larger than AGENTSTATE_MAX_REQUEST_BYTES (HTTP 413)."""


class UnauthorizedError(AgentStateError):
    """An HTTP request without a valid ``Authorization: Bearer KEY`` (HTTP 401)."""


class ForbiddenError(AgentStateError):
    """A user's key asked for what only an operator key may do (HTTP 403)."""


class MissingDependencyError(AgentStateError):
    """An optional part of agentstate needs packages that are not installed (an extra,
    such as ``pip install 'agentstate[server]'`` for ``agentstate serve``)."""


class WorkFailedError(AgentStateError):
    """Raised by a task whose work ended failed once its effects are committed: a turn
    that ended with an apology, a step that ended ``failed``. Celery, and Flower, then
    show the task as FAILURE with this error. Nothing is retried: the failure is the
    committed outcome."""
