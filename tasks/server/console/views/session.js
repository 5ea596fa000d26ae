// One session: its conversation, each turn's path through the state machine under the
// reply it led to, the approval it waits for (with its buttons), a box to send the next
// message, all kept current by the session's event stream.

import { follow, get, post } from "../api.js";
import { failure } from "../app.js";
import { h, say, when } from "../dom.js";
import { TurnPaths } from "../paths.js";
import { decisionButtons } from "./approvals.js";

const HISTORY = 200;

export async function render(main, sessionId, context) {
  const paths = new TurnPaths(await context.machine());
  let doc = await get(`/v1/sessions/${encodeURIComponent(sessionId)}?history_limit=${HISTORY}`);
  const heading = h("h2", {}, `Session ${sessionId}`);
  const facts = h("p", { class: "facts", id: "session-facts" });
  const waiting = h("section", { id: "session-approval", "aria-label": "Approval" });
  const log = h("ol", { class: "conversation", id: "conversation", "aria-live": "polite", "aria-label": "Conversation" });
  const text = h("textarea", { id: "message-text", name: "text", rows: 2, required: true });
  const composer = h("form", { class: "composer", onsubmit: send },
    h("label", { for: "message-text" }, `Message as ${doc.user_id}`), text,
    h("button", { type: "submit" }, "Send"));
  main.append(heading, facts, waiting, log, composer);

  async function send(event) {
    event.preventDefault();
    const body = { text: text.value, user_id: doc.user_id };
    try {
      await post(`/v1/sessions/${encodeURIComponent(sessionId)}/messages`, body);
      text.value = "";
      say("Message sent.");
    } catch (error) {
      say(failure(error));
    }
  }

  function paint() {
    facts.replaceChildren(
      "User ", h("strong", {}, doc.user_id), " · phase ",
      h("span", { class: `phase phase-${doc.phase}`, id: "session-phase" }, doc.phase),
      ` · revision ${doc.revision} · ${doc.queued} queued`);
    log.replaceChildren(...doc.message_history.map(item));
    const open = [...paths.turns.values()].find((turn) => turn.outcome === "running");
    if (open && !doc.message_history.some((m) => m.metadata?.reply_to === open.id)) {
      log.append(h("li", { class: "turn running" }, pathOf(open)));
    }
  }

  function item(message) {
    const turn = message.role === "assistant" ? paths.of(message.metadata?.reply_to) : null;
    return h("li", { class: `message ${message.role}`, dataset: { seq: message.seq ?? "" } },
      h("div", { class: "who" }, message.role, " ", h("time", { datetime: message.timestamp }, when(message.timestamp))),
      h("div", { class: "text" }, message.content),
      turn ? pathOf(turn) : null);
  }

  async function refreshApproval() {
    waiting.replaceChildren();
    if (doc.phase !== "awaiting_approval") return;
    const pending = (await get("/v1/approvals")).filter((a) => a.session_id === sessionId);
    for (const approval of pending) {
      waiting.append(h("div", { class: "approval" },
        h("p", {}, "Waiting for approval: ", h("strong", {}, approval.action), " ", h("code", {}, JSON.stringify(approval.args))),
        decisionButtons(approval, refresh)));
    }
  }

  let pending = null;
  async function refresh() {
    doc = await get(`/v1/sessions/${encodeURIComponent(sessionId)}?history_limit=${HISTORY}`);
    paint();
    await refreshApproval();
  }
  function soon() {
    clearTimeout(pending);
    pending = setTimeout(() => refresh().catch((e) => say(failure(e))), 50);
  }

  paint();
  await refreshApproval();
  const stream = follow(sessionId, (event) => {
    paths.add(event);
    if (["message_accepted", "reply", "phase_committed", "approval_requested", "approval_decided", "turn_cancelled", "turn_failed"].includes(event.kind)) soon();
  }, (error) => say(failure(error)));
  return stream;
}

export function pathOf(turn) {
  const label = `Path of this turn: ${turn.path.join(" to ")}`;
  return h("ol", { class: "path", "aria-label": label, dataset: { message: turn.id, outcome: turn.outcome } },
    turn.path.map((phase, i) => h("li", { class: `phase phase-${phase}`, title: turn.triggers[i - 1] || "" }, phase)));
}
