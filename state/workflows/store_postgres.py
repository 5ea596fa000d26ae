"""Workflow steps on Postgres in one statement each (data-modifying CTEs, autocommit).

- claim: running at revision + 1, returning the step and its dependencies' outputs;
- succeed: success at revision + 1, dependents' unfinished counts decremented (row locks
  make concurrent siblings count down one after the other), the workflow's counters
  updated, and the dependents that reached zero returned.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine

from state.documents import codec
from state.session import utcnow
from state.storage import prepared as pg_prepared

Document = dict[str, Any]

CLAIM = """
WITH c AS (
  UPDATE workflow_steps SET status = 'running', revision = %(revision)s + 1,
      started_at = %(now)s, updated_at = %(now)s, lease_expires_at = %(lease)s,
      last_task_id = %(task_id)s
  WHERE workflow_id = %(workflow_id)s AND step_id = %(step_id)s AND revision = %(revision)s
    AND status IN ('pending', 'retrying', 'running') AND remaining_deps = 0
  RETURNING action, inputs, dependencies, dependents, retry_count, max_retries
)
SELECT c.action, c.inputs::text AS inputs, c.dependencies::text AS dependencies,
  c.dependents::text AS dependents, c.retry_count, c.max_retries,
  (SELECT coalesce(jsonb_object_agg(e.dep, (
            SELECT d.outputs FROM workflow_steps d
             WHERE d.workflow_id = %(workflow_id)s AND d.step_id = e.dep)), '{}'::jsonb)::text
     FROM jsonb_array_elements_text(c.dependencies) AS e(dep)) AS dep_outputs
FROM c"""

SUCCEED = """
WITH s AS (
  UPDATE workflow_steps SET status = 'success', outputs = %(outputs)s::jsonb,
      revision = %(revision)s + 1, completed_at = %(now)s, updated_at = %(now)s,
      lease_expires_at = NULL, error = NULL, last_task_id = %(task_id)s
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
)
SELECT (SELECT count(*) FROM s),
  (SELECT coalesce(json_agg(json_build_array(step_id, revision)), '[]'::json)::text
     FROM d WHERE remaining_deps = 0 AND status = 'pending'),
  (SELECT row_to_json(w)::text FROM w)"""


_CLAIM = pg_prepared.prepare("agentstate_claim_step", CLAIM)
_SUCCEED = pg_prepared.prepare("agentstate_succeed_step", SUCCEED)


def claim(
    autocommit: Engine,
    *,
    workflow_id: str,
    step_id: str,
    revision: int,
    lease_s: float,
    task_id: str | None,
) -> tuple[Any, Document] | None:
    """The claimed row and its dependencies' outputs, or None if not claimable."""
    params = {
        "workflow_id": workflow_id,
        "step_id": step_id,
        "revision": revision,
        "now": utcnow(),
        "lease": time.time() + lease_s,
        "task_id": task_id,
    }
    with autocommit.connect() as conn:
        row = pg_prepared.execute(conn, _CLAIM, params).first()
    if row is None:
        return None
    return row, codec.loads(row.dep_outputs)


def succeed(
    autocommit: Engine,
    *,
    workflow_id: str,
    step_id: str,
    revision: int,
    outputs: Document,
    task_id: str | None,
    dependents: list[str],
) -> tuple[bool, list[tuple[str, int]], Document | None]:
    """(applied, ready dependents, the workflow row if this finished it)."""
    params = {
        "dependents": dependents,
        "workflow_id": workflow_id,
        "step_id": step_id,
        "revision": revision,
        "now": utcnow(),
        "outputs": codec.dumps(outputs),
        "task_id": task_id,
    }
    with autocommit.connect() as conn:
        applied, ready, workflow = tuple(pg_prepared.execute(conn, _SUCCEED, params).one())
    if not applied:
        return False, [], None
    finished = codec.loads(workflow) if workflow else None
    if finished is not None and finished["remaining_steps"] > 0:
        finished = None
    return True, [(sid, int(v)) for sid, v in codec.loads(ready)], finished
