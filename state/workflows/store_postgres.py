"""The workflow store on Postgres: a claim and a success in one statement each
(data-modifying CTEs, prepared, autocommit).

- claim: running at revision + 1, returning the step and its dependencies' outputs;
- succeed: success at revision + 1, dependents' unfinished counts decremented (row locks
  make concurrent siblings count down one after the other), the workflow's counters
  updated, the dependents that reached zero returned, and, when that was the last step
  of a session's workflow, ``workflow_finished`` appended to the session's event log.
"""

from __future__ import annotations

import time
from dataclasses import replace

from sqlalchemy import Engine

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.storage import prepared
from state.storage.db import autocommit_engine
from state.workflows.records import ClaimedStep, Completion, Finished, claimed_from_row
from state.workflows.store import WorkflowStore, require_one

CLAIM = """
WITH c AS (
  UPDATE workflow_steps SET status = 'running', revision = %(revision)s + 1,
      started_at = %(now)s, updated_at = %(now)s, lease_expires_at = %(lease)s,
      deadline_at = %(clock)s + timeout_s, last_task_id = %(task_id)s
  WHERE workflow_id = %(workflow_id)s AND step_id = %(step_id)s AND revision = %(revision)s
    AND status IN ('pending', 'retrying', 'running') AND remaining_deps = 0
    AND (not_before_s IS NULL OR ready_at <= %(clock)s)
    AND (approval IS NULL OR approval = 'approved')
  RETURNING action, inputs, dependencies, dependents, retry_count, max_retries, timeout_s
)
SELECT c.action, c.inputs::text AS inputs, c.dependencies::text AS dependencies,
  c.dependents::text AS dependents, c.retry_count, c.max_retries, c.timeout_s,
  (SELECT coalesce(jsonb_object_agg(e.dep, (
            SELECT d.outputs FROM workflow_steps d
             WHERE d.workflow_id = %(workflow_id)s AND d.step_id = e.dep)), '{}'::jsonb)::text
     FROM jsonb_array_elements_text(c.dependencies) AS e(dep)) AS dep_outputs
FROM c"""

SUCCEED = """
WITH s AS (
  UPDATE workflow_steps SET status = 'success', outputs = %(outputs)s::jsonb,
      revision = %(revision)s + 1, completed_at = %(now)s, updated_at = %(now)s,
      lease_expires_at = NULL, deadline_at = NULL, error = NULL, last_task_id = %(task_id)s
  WHERE workflow_id = %(workflow_id)s AND step_id = %(step_id)s AND revision = %(revision)s
    AND status = 'running'
  RETURNING 1
), d AS (
  UPDATE workflow_steps SET remaining_deps = remaining_deps - 1, updated_at = %(now)s
  WHERE workflow_id = %(workflow_id)s AND step_id = ANY(%(dependents)s)
    AND EXISTS (SELECT 1 FROM s)
  RETURNING step_id, remaining_deps, status, revision
), w AS (
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
  (SELECT coalesce(json_agg(json_build_array(step_id, revision)), '[]'::json)::text
     FROM d WHERE remaining_deps = 0 AND status = 'pending'),
  (SELECT row_to_json(w)::text FROM w)"""


_CLAIM = prepared.prepare("agentstate_claim_step", CLAIM)
_SUCCEED = prepared.prepare("agentstate_succeed_step", SUCCEED)


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
    ) -> ClaimedStep | None:
        """Mark the step running if it is still at ``revision``; the dependencies'
        outputs come back with the claim."""
        clock = time.time()
        params = {
            "workflow_id": workflow_id,
            "step_id": step_id,
            "revision": revision,
            "now": utcnow(),
            "clock": clock,
            "lease": clock + lease_s,
            "task_id": task_id,
        }
        with self.autocommit.connect() as conn:
            row = self.statements.execute(conn, _CLAIM, params).first()
        if row is None:
            return None
        claimed = claimed_from_row(workflow_id, step_id, revision + 1, row)
        return replace(
            claimed,
            dep_outputs=codec.loads(row.dep_outputs),
            dependents=codec.loads(row.dependents),
        )

    def succeed(self, claimed: ClaimedStep, outputs: Document) -> Completion:
        """running -> success, dependents counted down, the workflow's totals updated."""
        if claimed.dependents is None:
            return super().succeed(claimed, outputs)  # not claimed through this store
        params = {
            "dependents": claimed.dependents,
            "workflow_id": claimed.workflow_id,
            "step_id": claimed.step_id,
            "revision": claimed.revision,
            "now": utcnow(),
            "outputs": codec.dumps(outputs),
            "task_id": claimed.task_id,
        }
        with self.autocommit.connect() as conn:
            applied, ready, workflow = tuple(self.statements.execute(conn, _SUCCEED, params).one())
        require_one(int(applied), claimed)
        return Completion(
            claimed.workflow_id,
            [(sid, int(rev)) for sid, rev in codec.loads(ready)],
            _finished(claimed.workflow_id, codec.loads(workflow) if workflow else None),
        )


def _finished(workflow_id: str, row: Document | None) -> Finished | None:
    if row is None or row["remaining_steps"] > 0:
        return None
    return Finished(workflow_id, row["status"], row["session_id"], row["resume_revision"])
