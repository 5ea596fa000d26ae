"""Many users on one deployment: every call names its user, and another user's session,
workflow or approval answers exactly as an unknown id does.

Run it next to the reference agent's workers (docs/guides/multi-user.md):

    python examples/multi_user.py

tests/e2e/test_tenancy.py runs it against real workers.
"""

from __future__ import annotations

import uuid

from state.errors import NotFoundError
from tasks.client import AgentClient


def main() -> None:
    agent = AgentClient()
    alice, mallory = f"alice-{uuid.uuid4().hex[:8]}", f"mallory-{uuid.uuid4().hex[:8]}"
    session_id = f"shared-{uuid.uuid4().hex[:8]}"

    agent.send_message(session_id, "remember that the door code is 4711", user_id=alice)
    agent.wait_for_idle(session_id, user_id=alice)
    agent.send_message(session_id, "forget everything", user_id=alice)
    agent.wait_for_idle(session_id, user_id=alice)  # waits for a person's approval
    (request,) = agent.approvals(user_id=alice)

    # Mallory knows the ids, and that changes nothing: each is unknown to her.
    assert agent.get_session(session_id, user_id=mallory) is None
    assert agent.approvals(user_id=mallory) == []
    for attempt in (
        lambda: agent.decide(request["approval_id"], True, by=mallory, user_id=mallory),
        lambda: agent.cancel_turn(session_id, user_id=mallory),
        lambda: agent.send_message(session_id, "forget it all", user_id=mallory),
    ):
        try:
            attempt()
        except NotFoundError as exc:
            print("mallory:", exc)

    # Alice decides her own request; her turn goes on.
    agent.decide(request["approval_id"], False, by=alice, note="keep them", user_id=alice)
    done = agent.wait_for_idle(session_id, user_id=alice)
    print("alice:", done["message_history"][-1]["content"])


if __name__ == "__main__":
    main()
