// Each turn's path through the agent state machine, from the session's events: a turn
// starts with turn_started, each commit says the phase it left, the triggers it fired
// ("receive_input+intent_clear") and the phase it reached; the machine's table fills in
// the phases a commit passed through.

export class TurnPaths {
  constructor(machine) {
    this.machine = machine;
    this.turns = new Map(); // message_id -> {path, triggers, outcome, replyKind}
    this.current = null;
    this.lastSeq = 0;
  }

  add(event) {
    if (event.seq !== null && event.seq !== undefined) this.lastSeq = event.seq;
    const data = event.data || {};
    if (event.kind === "turn_started") {
      this.current = { id: data.message_id, path: [], triggers: [], outcome: "running" };
      this.turns.set(data.message_id, this.current);
    } else if (event.kind === "phase_committed" && this.current) {
      const turn = this.current;
      if (!turn.path.length) turn.path.push(data.from);
      let phase = data.from;
      for (const trigger of String(data.trigger || "").split("+").filter(Boolean)) {
        const next = this.destination(phase, trigger);
        if (next === null) break;
        turn.triggers.push(trigger);
        phase = next;
        if (phase !== event.phase) turn.path.push(phase);
      }
      turn.path.push(event.phase);
      if (["idle", "clarifying"].includes(event.phase) && turn.outcome === "running") {
        turn.outcome = "done";
      }
    } else if (event.kind === "reply" && this.current) {
      this.current.outcome = data.kind || "reply";
    } else if (event.kind === "turn_failed" && this.current) {
      this.current.outcome = "failed";
    } else if (event.kind === "turn_cancelled" && this.current) {
      this.current.outcome = "cancelled";
    }
  }

  destination(phase, trigger) {
    for (const row of this.machine.transitions) {
      if (row.trigger === trigger && (row.source === phase || row.source === "*")) return row.dest;
    }
    return null;
  }

  of(messageId) {
    return this.turns.get(messageId) || null;
  }
}
