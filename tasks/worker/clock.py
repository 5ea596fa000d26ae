"""The once-a-tick look of ``celery -A tasks beat`` (AGENTSTATE_TICK_INTERVAL): schedule
ticks that are due fire, webhook deliveries that are due go to senders. Both are safe to run
from several beats (or workers) at once: each row is taken by one look only
(``state.schedules.ticks``, ``state.webhooks.deliveries``)."""

from __future__ import annotations

from typing import Any

from state import observe
from tasks.app import app
from tasks.worker.base import AgentStateTask, stale_result
from tasks.worker.runtime import Runtime, runtime

TICK_TASK = "agentstate.clock.tick"
DELIVER_TASK = "agentstate.webhooks.deliver"
# Deliveries handed to senders per look (the rest wait for the next look, a tick later).
DELIVERIES_PER_LOOK = 500


@app.task(name=TICK_TASK, base=AgentStateTask, bind=True)
def tick(self: AgentStateTask) -> Any:
    """Fire due schedule ticks; send due webhook deliveries."""
    return self.attempt(lambda: look(runtime()), stale_result())


def look(rt: Runtime) -> dict[str, Any]:
    """One look (callable from anywhere: a beat's task, a worker's own loop)."""
    report = rt.clock.run(rt.dispatcher, rt.workflows)
    observe.current.ticked(report.fired, report.skipped)
    claimed = rt.courier.due(DELIVERIES_PER_LOOK)
    for delivery_id, claim in claimed:
        rt.dispatcher.webhook(delivery_id, claim)
    return {**report.as_dict(), "deliveries": len(claimed)}


@app.task(name=DELIVER_TASK, base=AgentStateTask, bind=True)
def deliver(self: AgentStateTask, delivery_id: str, claim: str) -> Any:
    """One attempt of a webhook delivery (dropped if its claim was taken over)."""
    status = self.attempt(lambda: runtime().courier.deliver(delivery_id, claim), stale_result())
    observe.current.webhook_attempted(str(status))
    return {"delivery_id": delivery_id, "status": status}
