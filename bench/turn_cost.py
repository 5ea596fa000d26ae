"""The in-process cost of whole turns: every phase of each turn run one after the other
in this process by the turn engine (no broker, no worker), against Postgres and Redis.

Run as a script so that the code under ``PYTHONPATH`` is measured (``bench/eventlog.py``
runs it for this checkout and for one from before the event log)::

    python bench/turn_cost.py DATABASE_URL REDIS_URL TURNS [--no-push] [--no-carry]

It prints one JSON object: ``{"ms_per_turn", "cpu_ms_per_turn", "accept_ms_per_turn"}``
(the last is the client's part: accepting the message). It uses only
APIs the code before the event log has too (a snapshot a phase dispatch carried is
handed on only where the code has them).
"""

from __future__ import annotations

import json
import sys
import time
import uuid


def main() -> None:
    from config import Settings
    from state.agent import load_agent
    from state.dispatch import RecordingDispatcher
    from state.machine import Phase
    from state.storage.backend import Backend
    from state.turns.draft import Delivery
    from state.turns.engine import TurnEngine
    from state.turns.services import TurnServices

    database_url, redis_url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options: dict[str, bool] = {"events": False} if "--no-push" in sys.argv else {}
    if "--no-carry" in sys.argv:
        options["carry_snapshot"] = False
    settings = Settings(
        database_url=database_url, redis_url=redis_url, auto_migrate=False, **options
    )
    dispatcher = RecordingDispatcher()
    services = TurnServices.build(Backend.build(settings), dispatcher, lambda: [])
    engine = TurnEngine(services, load_agent(settings.agent))

    accepting = [0.0]

    def turns(session_id: str, n: int) -> None:
        for k in range(n):
            started = time.perf_counter()
            services.inbox.accept(session_id, "bench-user", f"hello number {k}")
            accepting[0] += time.perf_counter() - started
            delivery: Delivery | None = Delivery(Phase.UNDERSTANDING, session_id, None)
            while delivery is not None:
                dispatcher.sent.clear()
                engine.run_phase(delivery)
                phases = [args for kind, args in dispatcher.sent if kind == "phase"]
                delivery = None
                if phases:
                    phase, _, revision = phases[-1]
                    carried = getattr(dispatcher, "carried", {}).get((phase, session_id, revision))
                    extra = {"carried": carried} if carried is not None else {}
                    delivery = Delivery(Phase(str(phase)), session_id, revision, **extra)  # type: ignore[arg-type]

    turns(f"warm-{uuid.uuid4().hex[:8]}", 5)
    accepting[0] = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    turns(f"cost-{uuid.uuid4().hex[:8]}", count)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    found = {
        "ms_per_turn": wall / count * 1000,
        "cpu_ms_per_turn": cpu / count * 1000,
        # The part a client pays (send_message), not a worker.
        "accept_ms_per_turn": accepting[0] / count * 1000,
    }
    print(json.dumps(found))


if __name__ == "__main__":
    main()
