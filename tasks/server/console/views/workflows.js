// Workflows, newest first, by status.

import { get, query } from "../api.js";
import { h, when } from "../dom.js";

const STATUSES = ["running", "success", "failed", "cancelled"];

export async function render(main) {
  const status = h("select", { id: "workflow-status", name: "status" },
    h("option", { value: "" }, "any status"), STATUSES.map((s) => h("option", { value: s }, s)));
  const results = h("div", { id: "workflow-results" });
  main.append(
    h("h2", {}, "Workflows"),
    h("form", { class: "search", role: "search", "aria-label": "Filter workflows", onsubmit: (e) => { e.preventDefault(); list(); } },
      h("label", { for: "workflow-status" }, "Status"), status, h("button", { type: "submit" }, "Filter")),
    results);
  async function list() {
    const page = await get(`/v1/workflows${query({ status: status.value, limit: 100 })}`);
    if (!page.items.length) {
      results.replaceChildren(h("p", { class: "empty" }, "No workflow matches."));
      return;
    }
    results.replaceChildren(h("table", { class: "list" },
      h("caption", {}, "Workflows, newest first"),
      h("thead", {}, h("tr", {}, ["Workflow", "Session", "Status", "Steps done", "Created"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, page.items.map((w) => h("tr", {},
        h("td", {}, h("a", { href: `#/workflows/${encodeURIComponent(w.workflow_id)}` }, w.workflow_id)),
        h("td", {}, w.session_id ? h("a", { href: `#/sessions/${encodeURIComponent(w.session_id)}` }, w.session_id) : "—"),
        h("td", {}, h("span", { class: `wstatus status-${w.status}` }, w.status)),
        h("td", { class: "num" }, `${w.done_steps}/${w.total_steps}`),
        h("td", {}, when(w.created_at)))))));
  }
  await list();
  return null;
}
