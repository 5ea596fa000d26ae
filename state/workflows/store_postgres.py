"""The workflow store on Postgres: a claim, a peek and a success in one statement each
(data-modifying CTEs, prepared, autocommit).

- claim: running at revision + 1, returning the step and its dependencies' outputs;
- peek: the same, read without writing, for a step whose action is quick (it commits
  once: its success, guarded on the step still pending or retrying at its revision);
- succeed: success at revision + 1, dependents' unfinished counts decremented (row locks
  make concurrent siblings count down one after the other), the workflow's counters
  updated, the dependents that reached zero returned, and, when that was the last step
  of a session's workflow, ``workflow_finished`` appended to the session's event log;
  each released step a quick action may run comes back with what a peek would read
  (:data:`CARRY`), for its message to carry;
- succeed carried: a quick step run from what its message carried, the success bound to
  the row: it lands only if the step, as peek would read it now, is exactly what was
  carried (a forged or stale message commits nothing; the step is then read).
"""

from __future__ import annotations

import time
from dataclasses import replace
from enum import StrEnum
from functools import lru_cache, partial
from typing import Any, NamedTuple

from sqlalchemy import Engine

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.sessions.snapshot import CARRY_MAX_CHARS
from state.storage import prepared
from state.storage.db import autocommit_engine, retried_on_conflict
from state.workflows.guards import require_one
from state.workflows.records import (
    ClaimedStep,
    Completion,
    Finished,
    claimed_from_row,
    fits_carried,
)
from state.workflows.store import WorkflowStore

# The step as ClaimedStep needs it, with its dependencies' outputs, from a row ``c``.
_STEP_WITH_DEPS = """
SELECT c.action, c.inputs::text AS inputs, c.dependencies::text AS dependencies,
  c.dependents::text AS dependents, c.retry_count, c.max_retries, c.timeout_s, c.generation,
  (SELECT coalesce(jsonb_object_agg(e.dep, (
            SELECT d.outputs FROM workflow_steps d
             WHERE d.workflow_id = %(workflow_id)s AND d.step_id = e.dep)), '{}'::jsonb)::text
     FROM jsonb_array_elements_text(c.dependencies) AS e(dep)) AS dep_outputs"""

_CLAIM_UPDATE = """
WITH c AS (
  UPDATE workflow_steps SET status = 'running', revision = %(revision)s + 1,
      started_at = %(now)s, updated_at = %(now)s, lease_expires_at = %(lease)s,
      deadline_at = %(clock)s + timeout_s, last_task_id = %(task_id)s
  WHERE workflow_id = %(workflow_id)s AND step_id = %(step_id)s AND revision = %(revision)s
    AND status IN ('pending', 'retrying', 'running') AND remaining_deps = 0
    AND (not_before_s IS NULL OR ready_at <= %(clock)s)
    AND (approval IS NULL OR approval = 'approved')
    AND (%(cap)s <= 0 OR owner = '' OR status = 'running'
         OR (SELECT count(*) FROM workflow_steps r
              WHERE r.owner = workflow_steps.owner AND r.status = 'running') < %(cap)s)
  RETURNING action, inputs, dependencies, dependents, retry_count, max_retries, timeout_s,
    generation
)"""
CLAIM = "".join((_CLAIM_UPDATE, _STEP_WITH_DEPS, "\nFROM c"))

# A quick action's step runs from this read (no claim): the same runnable conditions,
# and none of a timer, an approval to wait for or a timeout (those need the claim).
PEEK = (
    _STEP_WITH_DEPS
    + """
FROM workflow_steps c
WHERE c.workflow_id = %(workflow_id)s AND c.step_id = %(step_id)s
  AND c.revision = %(revision)s AND c.status IN ('pending', 'retrying')
  AND c.remaining_deps = 0 AND c.not_before_s IS NULL AND c.timeout_s IS NULL
  AND (c.approval IS NULL OR c.approval = 'approved')"""
)


def _carry_object(row: str, dep_output: str) -> str:
    """What a quick step runs from (the peek's columns and its dependencies' outputs),
    as one jsonb object, from step row ``row``; ``dep_output``: a dependency ``e.dep``'s
    outputs. Only row and expression names are formatted in: values stay parameters."""
    return f"""jsonb_build_object('action', {row}.action, 'inputs', {row}.inputs,
    'dependencies', {row}.dependencies, 'dependents', {row}.dependents,
    'retry_count', {row}.retry_count, 'max_retries', {row}.max_retries,
    'generation', {row}.generation,
    'dep_outputs', (SELECT coalesce(jsonb_object_agg(e.dep, {dep_output}), '{{}}'::jsonb)
      FROM jsonb_array_elements_text({row}.dependencies) AS e(dep)))"""  # noqa: S608


_STORED_OUTPUTS = """(SELECT o.outputs FROM workflow_steps o
  WHERE o.workflow_id = %(workflow_id)s AND o.step_id = e.dep)"""
# A released step's message carries it when no timer, timeout or approval needs the claim,
# as Postgres's own text of the object: the bound commit compares that text exactly (not
# as jsonb, which would let ``1e2`` for ``100`` or reordered keys through to the action).
# The step committing now is not yet visible to the statement's reads: its outputs are
# the parameter. (A sibling that committed after this statement's snapshot is read as it
# was: that carried copy is stale, and the released step's bound commit refuses it.)
_RELEASED_DEP_OUTPUTS = f"""CASE WHEN e.dep = %(step_id)s THEN %(outputs)s::jsonb
  ELSE {_STORED_OUTPUTS} END"""
CARRY = f"""CASE WHEN d.not_before_s IS NULL AND d.timeout_s IS NULL
    AND (d.approval IS NULL OR d.approval = 'approved')
  THEN ({_carry_object("d", _RELEASED_DEP_OUTPUTS)})::text
END"""
_BOUND = f"""
    AND remaining_deps = 0 AND not_before_s IS NULL AND timeout_s IS NULL
    AND (approval IS NULL OR approval = 'approved')
    AND ({_carry_object("workflow_steps", _STORED_OUTPUTS)})::text = %(carried)s"""

# d: the dependents counted down (:func:`_counted_down`). {guard}: the step's status
# when its outputs commit: 'running' under a claim; pending or retrying for a quick
# action's step, which commits once (and so also starts then: {started}).
_SUCCEED_SQL = """
WITH s AS (
  UPDATE workflow_steps SET status = 'success', outputs = %(outputs)s::jsonb,
      revision = %(revision)s + 1, completed_at = %(now)s, updated_at = %(now)s,
      {started}
      lease_expires_at = NULL, deadline_at = NULL, error = NULL, last_task_id = %(task_id)s
  WHERE workflow_id = %(workflow_id)s AND step_id = %(step_id)s AND revision = %(revision)s
    AND status {guard}{bound}
  RETURNING 1
), {count_down}, w AS (
  UPDATE workflows SET remaining_steps = remaining_steps - 1, updated_at = %(now)s,
      status = CASE WHEN remaining_steps = 1
                    THEN CASE WHEN failed_steps > 0 THEN 'failed' ELSE 'success' END
                    ELSE status END,
      finished_at = CASE WHEN remaining_steps = 1 THEN %(now)s ELSE finished_at END
  WHERE workflow_id = %(workflow_id)s AND EXISTS (SELECT 1 FROM s)
  RETURNING remaining_steps, status, session_id, resume_revision
), se AS (
  UPDATE sessions SET event_seq = sessions.event_seq + 1
  FROM w WHERE w.remaining_steps = 0 AND sessions.session_id = w.session_id
  RETURNING sessions.session_id, sessions.event_seq, sessions.revision, sessions.phase, w.status
), ev AS (
  INSERT INTO events (session_id, seq, kind, revision, phase, at, data)
  SELECT session_id, event_seq, 'workflow_finished', revision, phase, %(now)s,
    jsonb_build_object('workflow_id', %(workflow_id)s::text, 'status', status)
  FROM se
)
SELECT (SELECT count(*) FROM s),
  (SELECT coalesce(json_agg(json_build_array(d.step_id, d.revision, d.action,
       CASE WHEN length(c.carried) <= {carry_max} THEN c.carried END)), '[]'::json)::text
     FROM d CROSS JOIN LATERAL (SELECT {carry} AS carried) AS c
     WHERE d.remaining_deps = 0 AND d.status = 'pending'
       AND (d.approval IS NULL OR d.approval = 'approved')),
  (SELECT row_to_json(w)::text FROM w)"""
_UNCLAIMED = {"guard": "IN ('pending', 'retrying')", "started": "started_at = %(now)s,"}


class SuccessGuard(StrEnum):
    """What a step's success is guarded on."""

    CLAIMED = "claimed"  # the claim it ran under
    UNCLAIMED = "unclaimed"  # a quick action's step, read by a peek
    CARRIED = "carried"  # bound to what its message carried


_GUARDS = {
    SuccessGuard.CLAIMED: {"guard": "= 'running'", "started": "", "bound": ""},
    SuccessGuard.UNCLAIMED: {**_UNCLAIMED, "bound": ""},
    SuccessGuard.CARRIED: {**_UNCLAIMED, "bound": _BOUND},
}

# A dependent's updated_at (indexed, for the sweep's "ready but forgotten") moves only
# when it is released; the countdowns before that leave the indexes alone (a HOT update).
_COUNT_DOWN = """UPDATE workflow_steps SET remaining_deps = remaining_deps - 1,
      updated_at = CASE WHEN remaining_deps = 1 THEN %(now)s ELSE updated_at END
  WHERE workflow_id = %(workflow_id)s AND {dependent}
    AND EXISTS (SELECT 1 FROM s)
  RETURNING step_id, remaining_deps, status, revision, action, inputs, dependencies,
    dependents, retry_count, max_retries, timeout_s, not_before_s, approval, generation"""
# Up to this many dependents, each is counted down by its whole primary key.
KEYED_DEPENDENTS_MAX = 8


def _counted_down(dependents: int) -> str:
    """The CTEs counting down ``dependents`` dependents, ``d`` the rows they return.

    Each dependent is found by its whole primary key, in an update of its own: the one
    plan a key has. ``step_id = ANY($n)`` instead leaves the plan to the statistics, and
    the generic plan Postgres caches for a prepared statement found the workflow's rows
    by ``workflow_id`` alone and filtered them (every success of a 1,000-step workflow
    read its 1,000 steps). A wider fan-out, which is rare, takes the ``ANY``.
    """
    if dependents > KEYED_DEPENDENTS_MAX:
        return "d AS (" + _COUNT_DOWN.format(dependent="step_id = ANY(%(dependents)s)") + ")"
    if dependents == 0:
        return "d AS (" + _COUNT_DOWN.format(dependent="false") + ")"
    each = [
        f"d{i} AS (" + _COUNT_DOWN.format(dependent=f"step_id = %(dependent{i})s") + ")"
        for i in range(dependents)
    ]
    union = " UNION ALL ".join(f"SELECT * FROM d{i}" for i in range(dependents))  # noqa: S608
    return ", ".join([*each, f"d AS ({union})"])


def succeed_statement(guard: SuccessGuard, dependents: int) -> prepared.Prepared:
    """The success statement for a step with ``dependents`` dependents."""
    return _succeed_statement(guard, min(dependents, KEYED_DEPENDENTS_MAX + 1))


@lru_cache(maxsize=32)
def _succeed_statement(guard: SuccessGuard, keyed: int) -> prepared.Prepared:
    sql = _SUCCEED_SQL.format(
        **_GUARDS[guard], count_down=_counted_down(keyed), carry=CARRY, carry_max=CARRY_MAX_CHARS
    )
    shape = "many" if keyed > KEYED_DEPENDENTS_MAX else str(keyed)
    return prepared.prepare(f"agentstate_succeed_{guard.value}_step_{shape}", sql)


_CLAIM = prepared.prepare("agentstate_claim_step", CLAIM)
_PEEK = prepared.prepare("agentstate_peek_step", PEEK)


class PostgresWorkflowStore(WorkflowStore):
    """WorkflowStore whose claim and success are one prepared statement each."""

    def __init__(self, engine: Engine, statements: prepared.Statements = prepared.PREPARED) -> None:
        super().__init__(engine)
        self.autocommit = autocommit_engine(engine)
        self.statements = statements

    def claim(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        lease_s: float,
        task_id: str | None = None,
        *,
        cap: int = 0,
        owner: str = "",
        fleet_cap: int = 0,
    ) -> ClaimedStep | None:
        """Mark the step running if it is still at ``revision`` (and its owner runs
        fewer than ``cap`` steps, the fleet fewer than ``fleet_cap``); the dependencies'
        outputs come back with the claim."""
        if cap or fleet_cap:
            # A capped claim counts running steps under the owner's (and the fleet's)
            # lock, in a transaction of its own (the portable claim): two at once cannot
            # both fit.
            return super().claim(
                workflow_id,
                step_id,
                revision,
                lease_s,
                task_id,
                cap=cap,
                owner=owner,
                fleet_cap=fleet_cap,
            )
        clock = time.time()
        params = {
            "workflow_id": workflow_id,
            "step_id": step_id,
            "revision": revision,
            "now": utcnow(),
            "clock": clock,
            "lease": clock + lease_s,
            "task_id": task_id,
            "cap": cap,
        }
        row = prepared.first(self.statements.rows(self.autocommit, [(_CLAIM, params)]))
        return None if row is None else _claimed(workflow_id, step_id, revision + 1, row)

    def succeed(self, claimed: ClaimedStep, outputs: Document) -> Completion:
        """running -> success, dependents counted down, the workflow's totals updated."""
        if claimed.dependents is None:
            return super().succeed(claimed, outputs)  # not claimed through this store
        return self._succeed_with(SuccessGuard.CLAIMED, claimed, outputs)

    def peek(self, workflow_id: str, step_id: str, revision: int) -> ClaimedStep | None:
        """The step to run a quick action from, with its dependencies' outputs (one read)."""
        params = {"workflow_id": workflow_id, "step_id": step_id, "revision": revision}
        row = prepared.first(self.statements.rows(self.autocommit, [(_PEEK, params)]))
        return None if row is None else _claimed(workflow_id, step_id, revision, row)

    def succeed_unclaimed(self, peeked: ClaimedStep, outputs: Document) -> Completion:
        """pending|retrying -> success in one statement, like :meth:`succeed`."""
        return self._succeed_with(SuccessGuard.UNCLAIMED, peeked, outputs)

    @property
    def verifies_carried(self) -> bool:
        """The success of a step run from its message binds what it carried to the row."""
        return True

    def succeed_carried(self, step: ClaimedStep, carried: str, outputs: Document) -> Completion:
        """pending|retrying -> success for a quick step run from ``carried`` (what its
        message carried), only if the row still holds exactly that; else StaleStateError
        and nothing is written."""
        return self._succeed_with(SuccessGuard.CARRIED, step, outputs, carried)

    def _succeed_with(
        self,
        guard: SuccessGuard,
        claimed: ClaimedStep,
        outputs: Document,
        carried: str | None = None,
    ) -> Completion:
        # One order for every success: two siblings lock their shared dependents alike.
        dependents = sorted(claimed.dependents or [])
        statement = succeed_statement(guard, len(dependents))
        params: dict[str, Any] = {
            "dependents": dependents,
            "workflow_id": claimed.workflow_id,
            "step_id": claimed.step_id,
            "revision": claimed.revision,
            "now": utcnow(),
            "outputs": codec.dumps(outputs),
            "task_id": claimed.task_id,
            "carried": carried,
        }
        params.update((f"dependent{i}", step_id) for i, step_id in enumerate(dependents))
        # A success is one statement in autocommit: when Postgres ends it to break a
        # deadlock (a cancel or a decision locking the workflow's rows the other way
        # round), nothing was written and it is sent again. Raised instead, it would
        # reach the task's retry, which runs the action again: a second side effect.
        run = partial(self.statements.rows, self.autocommit, [(statement, params)])
        ((applied, ready, workflow),) = retried_on_conflict(run)
        require_one(int(applied), claimed)
        released = codec.loads(ready)
        return Completion(
            claimed.workflow_id,
            [(sid, int(rev)) for sid, rev, _, _ in released],
            _finished(claimed.workflow_id, codec.loads(workflow) if workflow else None),
            {sid: action for sid, _, action, _ in released},
            {sid: text for sid, _, _, text in released if fits_carried(text)},
        )


class _StepWithDeps(NamedTuple):
    """The columns of :data:`_STEP_WITH_DEPS`, in its order (the driver's rows are bare
    tuples)."""

    action: str
    inputs: str
    dependencies: str
    dependents: str
    retry_count: int
    max_retries: int
    timeout_s: float | None
    generation: int
    dep_outputs: str


def _claimed(workflow_id: str, step_id: str, revision: int, values: Any) -> ClaimedStep:
    """A ClaimedStep from a row of :data:`_STEP_WITH_DEPS`."""
    row = _StepWithDeps._make(values)
    claimed = claimed_from_row(workflow_id, step_id, revision, row)
    return replace(
        claimed, dep_outputs=codec.loads(row.dep_outputs), dependents=codec.loads(row.dependents)
    )


def _finished(workflow_id: str, row: Document | None) -> Finished | None:
    if row is None or row["remaining_steps"] > 0:
        return None
    return Finished(workflow_id, row["status"], row["session_id"], row["resume_revision"])
