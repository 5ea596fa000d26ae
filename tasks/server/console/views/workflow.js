// One workflow: its DAG drawn with each step's status, and the same as a table (steps in
// dependency order); a button to cancel it while it runs, to retry it once it failed or
// was cancelled; kept current while it runs.

import { get, post } from "../api.js";
import { failure } from "../app.js";
import { MAX_DRAWN, draw, statusOf, topological } from "../dag.js";
import { h, say } from "../dom.js";

const POLL_MS = 1000;
const LEGEND = ["pending", "running", "retrying", "awaiting_approval", "success", "failed", "skipped"];

export async function render(main, workflowId) {
  const path = `/v1/workflows/${encodeURIComponent(workflowId)}`;
  const head = h("h2", {}, `Workflow ${workflowId}`);
  const facts = h("p", { class: "facts", id: "workflow-facts", "aria-live": "polite" });
  const actions = h("p", { class: "actions", id: "workflow-actions" });
  const graph = h("figure", { class: "graph", id: "workflow-graph" });
  const steps = h("div", { id: "workflow-steps" });
  main.append(head, facts, actions, graph, legend(), steps);
  let timer = null;

  function control(verb, label) {
    return h("button", { type: "button", id: `${verb}-workflow`, class: verb === "cancel" ? "reject" : "approve", onclick: async () => {
      try {
        await post(`${path}/${verb}`);
        say(`Workflow ${verb === "cancel" ? "cancelled" : "started again"}.`);
      } catch (error) {
        say(failure(error));
      }
      clearTimeout(timer);
      await refresh();
    } }, label);
  }

  async function refresh() {
    const wf = await get(path);
    actions.replaceChildren(
      wf.status === "running" ? control("cancel", "Cancel workflow") : null,
      ["failed", "cancelled"].includes(wf.status) ? control("retry", "Retry workflow") : null);
    facts.replaceChildren("Status ", h("span", { class: `wstatus status-${wf.status}`, id: "workflow-status" }, wf.status),
      wf.session_id ? [" · session ", h("a", { href: `#/sessions/${encodeURIComponent(wf.session_id)}` }, wf.session_id)] : "");
    const count = Object.keys(wf.steps).length;
    graph.replaceChildren(count <= MAX_DRAWN
      ? draw(wf)
      : h("p", {}, `${count} steps: too many to draw (the table below lists them).`),
    h("figcaption", {}, "Steps by dependency depth, left to right"));
    steps.replaceChildren(table(wf));
    if (wf.status === "running") timer = setTimeout(() => refresh().catch(() => {}), POLL_MS);
  }
  await refresh();
  return { stop: () => clearTimeout(timer) };
}

function legend() {
  return h("ul", { class: "legend", "aria-label": "Step statuses" },
    LEGEND.map((s) => h("li", { class: `status-${s}` }, s.replace("_", " "))));
}

function table(wf) {
  return h("table", { class: "list" },
    h("caption", {}, "Steps, each after those it depends on"),
    h("thead", {}, h("tr", {}, ["Step", "Action", "Status", "Depends on", "Retries", "Outputs or error"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, topological(wf.steps).map((id) => wf.steps[id]).map((step) => h("tr", { dataset: { step: step.step_id } },
      h("td", {}, step.step_id),
      h("td", {}, step.action),
      h("td", {}, h("span", { class: `wstatus status-${statusOf(step)}` }, statusOf(step).replace("_", " "))),
      h("td", {}, (step.dependencies || []).join(", ") || "—"),
      h("td", { class: "num" }, step.retry_count),
      h("td", {}, h("code", {}, step.error || JSON.stringify(step.outputs ?? null)))))));
}
