"""Time travel: every revision of a session, the session as it was at one of them, and a
fork that goes another way from there.

Run it next to workers (docs/guides/events.md):

    python examples/time_travel.py

tests/e2e/test_events.py runs it against real workers.
"""

from __future__ import annotations

import uuid

from tasks.client import AgentClient


def main() -> None:
    agent = AgentClient()
    session_id = f"travel-{uuid.uuid4().hex[:8]}"
    agent.send_message(session_id, "what is 2+3?", user_id="alice")
    first = agent.wait_for_idle(session_id)
    agent.send_message(session_id, "what is 6*7?", user_id="alice")
    agent.wait_for_idle(session_id)

    for revision in agent.revisions(session_id):  # one per committed phase
        print(revision["revision"], revision["phase"], revision["trigger"])

    # The session exactly as get_session showed it after the first answer.
    then = agent.get_session(session_id, revision=first["revision"])
    assert then == first

    # A new session from that point: same user, state and history; resting; its own log.
    branch = agent.fork_session(session_id, first["revision"], f"{session_id}-b")
    agent.send_message(branch, "what is 10-4?", user_id="alice")
    print(agent.wait_for_idle(branch)["message_history"][-1]["content"])  # 10-4 = 6


if __name__ == "__main__":
    main()
