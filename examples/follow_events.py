"""Streaming progress: print a turn's events as they happen, then resume from a seq.

Run it next to workers (docs/guides/events.md):

    python examples/follow_events.py

tests/e2e/test_events.py runs it against real workers.
"""

from __future__ import annotations

import uuid

from tasks.client import AgentClient


def main() -> None:
    agent = AgentClient()  # reads AGENTSTATE_* settings
    session_id = f"stream-{uuid.uuid4().hex[:8]}"
    agent.send_message(session_id, "what is 2+3?", user_id="alice")

    last_seq = 0
    # Pushed as each phase commits; ends at the reply (or after 30 s).
    for event in agent.events(session_id, follow=True, timeout=30):
        print(event["seq"], event["kind"], event["phase"], event["data"])
        last_seq = event["seq"]
        if event["kind"] == "reply":
            break

    # A follower that dropped out resumes where it stopped: nothing lost, nothing twice.
    agent.send_message(session_id, "what is 6*7?", user_id="alice")
    for event in agent.events(session_id, after=last_seq, follow=True, timeout=30):
        print(event["seq"], event["kind"], event["phase"], event["data"])
        if event["kind"] == "reply":
            break


if __name__ == "__main__":
    main()
