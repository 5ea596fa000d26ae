// One session: its conversation, each turn's path through the state machine under the
// reply it led to, the reply of the running turn as it streams in (token chunks), the
// approval it waits for (with its buttons), a button to cancel the running turn, a box to
// send the next message, all kept current by the session's event stream.

import { follow, get, post } from "../api.js";
import { failure } from "../app.js";
import { h, say, when } from "../dom.js";
import { TurnPaths } from "../paths.js";
import { decisionButtons } from "./approvals.js";

const HISTORY = 200;
const RESTING = ["idle", "clarifying"];

export async function render(main, sessionId, context) {
  const paths = new TurnPaths(await context.machine());
  let doc = await get(`/v1/sessions/${encodeURIComponent(sessionId)}?history_limit=${HISTORY}`);
  const heading = h("h2", {}, `Session ${sessionId}`);
  const facts = h("p", { class: "facts", id: "session-facts" });
  const waiting = h("section", { id: "session-approval", "aria-label": "Approval" });
  const cancel = h("button", { type: "button", id: "cancel-turn", class: "reject", onclick: cancelTurn, hidden: true }, "Cancel turn");
  // The running turn's reply as its chunks come: message id -> {n, text} (chunks may come
  // again after a reconnect: each is taken once, in order).
  const streamed = new Map();
  const log = h("ol", { class: "conversation", id: "conversation", "aria-live": "polite", "aria-label": "Conversation" });
  const text = h("textarea", { id: "message-text", name: "text", rows: 2, required: true });
  const composer = h("form", { class: "composer", onsubmit: send },
    h("label", { for: "message-text" }, `Message as ${doc.user_id}`), text,
    h("button", { type: "submit" }, "Send"));
  main.append(heading, facts, cancel, waiting, log, composer);

  async function cancelTurn() {
    try {
      const answer = await post(`/v1/sessions/${encodeURIComponent(sessionId)}/cancel`);
      say(answer.cancelled === false ? "No turn was running." : "Turn cancelled.");
    } catch (error) {
      say(failure(error));
    }
    await refresh();
  }

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
    cancel.hidden = RESTING.includes(doc.phase);
    log.replaceChildren(...doc.message_history.map(item));
    const open = [...paths.turns.values()].find((turn) => turn.outcome === "running");
    if (open && !doc.message_history.some((m) => m.metadata?.reply_to === open.id)) {
      log.append(live(open));
    }
  }

  // The running turn: its path so far and, once chunks come, its reply as it grows.
  function live(turn) {
    const chunks = streamed.get(turn.id);
    if (!chunks) return h("li", { class: "turn running" }, pathOf(turn));
    return h("li", { class: "message assistant streaming", id: "live-reply", dataset: { message: turn.id } },
      h("div", { class: "who" }, "assistant ", h("span", { class: "typing" }, "writing…")),
      h("div", { class: "text" }, chunks.text),
      pathOf(turn));
  }

  function chunk(data) {
    const seen = streamed.get(data.message_id) || { n: 0, text: "" };
    if (data.n !== seen.n + 1) return; // already shown (a resumed stream sends them again)
    streamed.set(data.message_id, { n: data.n, text: seen.text + data.text });
    const shown = document.getElementById("live-reply");
    if (shown && shown.dataset.message === data.message_id) {
      shown.querySelector(".text").textContent = streamed.get(data.message_id).text;
    } else {
      paint();
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
    if (event.kind === "token") {
      chunk(event.data);
      return;
    }
    paths.add(event);
    if (["message_accepted", "reply", "phase_committed", "approval_requested", "approval_decided", "turn_cancelled", "turn_failed"].includes(event.kind)) soon();
  }, (error) => say(failure(error)), { tokens: true });
  return stream;
}

export function pathOf(turn) {
  const label = `Path of this turn: ${turn.path.join(" to ")}`;
  return h("ol", { class: "path", "aria-label": label, dataset: { message: turn.id, outcome: turn.outcome } },
    turn.path.map((phase, i) => h("li", { class: `phase phase-${phase}`, title: turn.triggers[i - 1] || "" }, phase)));
}
