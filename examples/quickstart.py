"""The quick start of the README and of docs/getting-started.md, whole.

Run it next to workers (`celery -A tasks worker` in another terminal):

    python examples/quickstart.py

tests/e2e/test_docs_examples.py runs it against real workers.
"""

from __future__ import annotations

from tasks.client import AgentClient

agent = AgentClient()  # reads the AGENTSTATE_* settings, like the workers

# A turn: the message is durable when send_message returns; a worker answers it.
agent.send_message("quickstart", "what is 12*7?", user_id="alice")
session = agent.wait_for_idle("quickstart", timeout=60)
print(session["message_history"][-1]["content"])  # 12*7 = 84

# A workflow: step b runs after step a, with a's output ("a" stands for its value).
workflow_id = agent.start_workflow(
    {
        "steps": [
            {"step_id": "a", "action": "calculate", "inputs": {"expression": "2+3"}},
            {
                "step_id": "b",
                "action": "calculate",
                "inputs": {"expression": "a*10"},
                "dependencies": ["a"],
            },
        ]
    }
)
workflow = agent.wait_for_workflow(workflow_id, timeout=60)
print(workflow["status"], workflow["steps"]["b"]["outputs"])  # success {'value': 50}
