"""The fleet-wide cap of claimed steps, in-process (real database and Redis): however many
users (or the operator, with no user) run long steps, they never hold more than the live
workers' children less AGENTSTATE_CHILDREN_FOR_TURNS; a step beyond waits in the database
and is released as one finishes. Work of no owner is capped as one more owner."""

from __future__ import annotations

import time

import redis
from sqlalchemy import func, select, update

from config import Settings
from state.dispatch import RecordingDispatcher
from state.storage.backend import Backend
from state.storage.tables import steps
from state.workflows import fleet
from state.workflows.creation import insert_workflow
from state.workflows.engine import WorkflowEngine
from state.workflows.fairshare import park
from state.workflows.fleet import fleet_running
from state.workflows.store import WorkflowStore
from tasks.actions import get_action, known_actions
from tasks.worker.fleet import serves
from tests.support import uid


def _engine(settings: Settings, client: redis.Redis) -> WorkflowEngine:
    backend = Backend.build(settings)
    store = WorkflowStore.for_engine(backend.engine)
    workflows = WorkflowEngine(store, RecordingDispatcher(), get_action, settings)
    workflows.share.fleet = fleet.Fleet(client, settings.queue, settings.children_for_turns)
    return workflows


def _owned(workflows: WorkflowEngine, owner: str | None, n: int) -> str:
    spec = {
        "steps": [
            {"step_id": f"s{i}", "action": "sleep", "inputs": {"seconds": 0}} for i in range(n)
        ]
    }
    wf = workflows.validate(spec, known_actions())
    with workflows.store.engine.begin() as conn:
        insert_workflow(conn, wf, approval_ttl_s=60.0, user_id=owner)
    return wf.workflow_id


def test_what_live_workers_announce_makes_the_cap(redis_client: redis.Redis) -> None:
    queue = uid("q")
    assert fleet.live_cap(redis_client, queue, 1) == 0  # no worker known: no cap
    fleet.announce(redis_client, queue, "w1@h", 2, "both")
    fleet.announce(redis_client, queue, "w2@h", 2, "both")
    assert fleet.live_cap(redis_client, queue, 1) == 3  # four children, one kept for turns
    assert fleet.live_cap(redis_client, queue, 0) == 0  # none kept: no cap
    assert fleet.live_cap(redis_client, queue, 9) == 1  # steps still make progress
    fleet.leave(redis_client, queue, "w2@h")
    assert fleet.live_cap(redis_client, queue, 1) == 1
    # A worker not heard from lately stops counting.
    redis_client.zadd(f"agentstate:queue:{queue}:alive", {"w1@h": time.time() - 1})
    assert fleet.live_cap(redis_client, queue, 1) == 0
    # Turns with a pool of their own need no child kept among the steps' workers.
    fleet.announce(redis_client, queue, "steps@h", 4, "steps")
    fleet.announce(redis_client, queue, "turns@h", 2, "turns")
    assert fleet.live_cap(redis_client, queue, 1) == 0
    assert serves({"a", "a.steps"}, "a") == "both"
    assert serves({"a.steps"}, "a") == "steps"
    assert serves({"a"}, "a") == "turns"
    assert serves({"b"}, "a") is None


def test_users_long_steps_together_leave_children_for_turns(
    pg_settings: Settings, redis_client: redis.Redis
) -> None:
    settings = pg_settings.model_copy(update={"queue": uid("q"), "user_step_concurrency": 2})
    workflows = _engine(settings, redis_client)
    # Steps other tests left running count too: the fleet is this database's.
    already = fleet_running(workflows.store.engine)
    fleet.announce(redis_client, settings.queue, "w1@h", already + 2, "both")
    fleet.announce(redis_client, settings.queue, "w2@h", 2, "both")
    assert workflows.share.fleet_cap() == already + 3
    alice, bob = _owned(workflows, uid("alice"), 3), _owned(workflows, uid("bob"), 3)
    cap = {"cap": 2, "fleet_cap": workflows.share.fleet_cap()}
    held = [
        workflows.store.claim(alice, "s0", 0, 60.0, "a0", owner=_owner(workflows, alice), **cap),
        workflows.store.claim(alice, "s1", 0, 60.0, "a1", owner=_owner(workflows, alice), **cap),
        workflows.store.claim(bob, "s0", 0, 60.0, "b0", owner=_owner(workflows, bob), **cap),
    ]
    assert all(held)
    # Both within their own share, but the fleet's is full: bob's second step waits.
    assert workflows.run_step(bob, "s1", 0, "b1") == "waiting"
    running = fleet_running(workflows.store.engine)
    print(f"\nfleet cap {workflows.share.fleet_cap()}, running {running}")
    # One of alice's steps finishes: bob's waiting step gets its place.
    first = held[0]
    assert first is not None
    workflows.follow(workflows.store.succeed(first, {}))
    released = [r for r in workflows.share.release(alice) if r[0] in (alice, bob)]
    assert [(wf, sid) for wf, sid, _ in released] == [(bob, "s1")]
    assert workflows.run_step(bob, "s1", released[0][2], "b1-again") == "success"
    # A lost worker's step stops counting once its lease ran out.
    with workflows.store.engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.workflow_id == alice, steps.c.step_id == "s1")
            .values(lease_expires_at=time.time() - 1)
        )
    assert workflows.run_step(bob, "s2", 0, "b2") == "success"
    _finish(workflows, alice, bob)


def test_work_without_an_owner_is_capped_as_one_more_owner(
    pg_settings: Settings, redis_client: redis.Redis
) -> None:
    settings = pg_settings.model_copy(
        update={"queue": uid("q"), "user_step_concurrency": 2, "children_for_turns": 0}
    )
    workflows = _engine(settings, redis_client)
    assert workflows.share.fleet_cap() == 0
    nightly = _owned(workflows, None, 3)
    assert _owner(workflows, nightly) == ""
    # Another test's ownerless steps may run: count from what runs already.
    running = [
        workflows.store.claim(nightly, f"s{i}", 0, 60.0, f"n{i}", cap=2, owner="") for i in range(2)
    ]
    assert all(running) or _ownerless_running(workflows) >= 2
    assert workflows.run_step(nightly, "s2", 0, "n2") == "waiting"
    _finish(workflows, nightly)


def _finish(workflows: WorkflowEngine, *workflow_ids: str) -> None:
    """Leave no step of these running: the fleet (this database) is shared by the tests."""
    with workflows.store.engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.workflow_id.in_(workflow_ids), steps.c.status == "running")
            .values(status="success")
        )


def _owner(workflows: WorkflowEngine, workflow_id: str) -> str:
    return workflows.share.owner(workflow_id)


def _ownerless_running(workflows: WorkflowEngine) -> int:
    with workflows.store.engine.connect() as conn:
        count = conn.execute(
            select(func.count()).where(steps.c.owner == "", steps.c.status == "running")
        ).scalar()
    return int(count or 0)


def test_an_owner_at_its_cap_does_not_hold_the_fleets_room_from_others(
    pg_settings: Settings, redis_client: redis.Redis
) -> None:
    settings = pg_settings.model_copy(update={"queue": uid("q"), "user_step_concurrency": 1})
    workflows = _engine(settings, redis_client)
    already = fleet_running(workflows.store.engine)
    # Room for two claimed steps in the fleet: alice's running one, and one more.
    fleet.announce(redis_client, settings.queue, "w1@h", already + 3, "both")
    alice, bob = _owned(workflows, uid("alice"), 2), _owned(workflows, uid("bob"), 1)
    owner = workflows.share.owner(alice)
    cap = {"cap": 1, "fleet_cap": workflows.share.fleet_cap()}
    assert workflows.store.claim(alice, "s0", 0, 60.0, "a0", owner=owner, **cap)
    # Alice's second step waits for her share (the longest waiting owner from now on).
    assert workflows.run_step(alice, "s1", 0, "a1") == "waiting"
    assert park(workflows.store.engine, bob, "s0", 0)
    released = [r for r in workflows.share.release(alice) if r[0] in (alice, bob)]
    # The fleet has room for one; alice has none, bob has: his step goes, hers waits.
    assert [(wf, sid) for wf, sid, _ in released] == [(bob, "s0")]
    _finish(workflows, alice, bob)
