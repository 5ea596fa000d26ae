// Approvals waiting for a person, with buttons to approve or reject each.

import { get, post } from "../api.js";
import { caller, failure } from "../app.js";
import { h, say, when } from "../dom.js";

const BY = "agentstate.by";

// Who decides: a user's key decides as its own user (the service refuses any other
// name); the operator names whom it decides for (kept for this tab).
async function decider() {
  const me = await caller();
  if (me && !me.operator) return { by: me.user_id, fixed: true };
  return { by: sessionStorage.getItem(BY) || "console", fixed: false };
}

export async function render(main) {
  const who = await decider();
  const by = h("input", { id: "decide-as", name: "by", value: who.by, readonly: who.fixed, onchange: (e) => sessionStorage.setItem(BY, e.target.value) });
  const list = h("div", { id: "approval-list" });
  main.append(
    h("h2", {}, "Pending approvals"),
    h("p", {}, h("label", { for: "decide-as" }, "Decide as "), by),
    list);
  async function refresh() {
    const items = await get("/v1/approvals");
    if (!items.length) {
      list.replaceChildren(h("p", { class: "empty" }, "Nothing is waiting for a decision."));
      return;
    }
    list.replaceChildren(h("table", { class: "list" },
      h("caption", {}, "Approvals waiting for a decision, newest first"),
      h("thead", {}, h("tr", {}, ["Action", "Arguments", "For", "Expires", "Decision"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, items.map((a) => h("tr", { dataset: { approval: a.approval_id } },
        h("td", {}, a.action),
        h("td", {}, h("code", {}, JSON.stringify(a.args))),
        h("td", {}, a.session_id
          ? h("a", { href: `#/sessions/${encodeURIComponent(a.session_id)}` }, `session ${a.session_id}`)
          : h("a", { href: `#/workflows/${encodeURIComponent(a.workflow_id)}` }, `step ${a.step_id} of ${a.workflow_id}`)),
        h("td", {}, when(a.expires_at)),
        h("td", {}, decisionButtons(a, refresh)))))));
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), 3000);
  return { stop: () => clearInterval(timer) };
}

export function decisionButtons(approval, after) {
  const decide = (approve) => async () => {
    const { by } = await decider();
    try {
      await post(`/v1/approvals/${encodeURIComponent(approval.approval_id)}`, { approve, by });
      say(`${approve ? "Approved" : "Rejected"} ${approval.action}.`);
    } catch (error) {
      say(failure(error));
    }
    await after();
  };
  const what = `${approval.action} (${approval.approval_id})`;
  return h("span", { class: "decide" },
    h("button", { type: "button", class: "approve", onclick: decide(true), "aria-label": `Approve ${what}` }, "Approve"),
    h("button", { type: "button", class: "reject", onclick: decide(false), "aria-label": `Reject ${what}` }, "Reject"));
}
