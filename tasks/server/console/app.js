// The console's shell: the key form, who the key is, and a route per view (#/sessions,
// #/sessions/ID, #/workflows, #/workflows/ID, #/approvals, #/schedules).

import { ApiError, get, getKey, setKey } from "./api.js";
import { clear, h, say } from "./dom.js";
import * as approvals from "./views/approvals.js";
import * as automation from "./views/automation.js";
import * as session from "./views/session.js";
import * as sessions from "./views/sessions.js";
import * as workflow from "./views/workflow.js";
import * as workflows from "./views/workflows.js";

const ROUTES = {
  sessions: (id) => (id ? session : sessions),
  workflows: (id) => (id ? workflow : workflows),
  approvals: () => approvals,
  schedules: () => automation,
};

let machine = null;
let open = null;
let me = Promise.resolve(null);

// Whom the key stands for ({user_id, operator}, from GET /v1/me; null without a valid key).
export function caller() {
  return me;
}

export async function stateMachine() {
  if (machine === null) machine = await get("/v1/fsm");
  return machine;
}

async function whoami() {
  const label = document.getElementById("whoami");
  try {
    const me = await get("/v1/me");
    label.textContent = me.operator ? "operator" : `user ${me.user_id}`;
    return me;
  } catch (error) {
    label.textContent = error instanceof ApiError && error.status === 401 ? "no valid key" : "";
    return null;
  }
}

async function route() {
  if (open && open.stop) open.stop();
  open = null;
  const [, section = "sessions", id = ""] = (location.hash || "#/sessions").split("/");
  const pick = ROUTES[section] || ROUTES.sessions;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const main = clear(document.getElementById("main"));
  say("");
  try {
    open = await pick(id).render(main, decodeURIComponent(id), { machine: stateMachine });
  } catch (error) {
    main.append(h("p", { class: "error", role: "alert" }, failure(error)));
  }
}

export function failure(error) {
  if (error instanceof ApiError && error.status === 401) {
    return "This needs a valid API key: paste one above.";
  }
  return error instanceof ApiError ? `${error.message} (${error.kind})` : String(error);
}

document.getElementById("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("api-key");
  setKey(input.value.trim());
  input.value = "";
  machine = null;
  me = whoami();
  await me;
  await route();
});

window.addEventListener("hashchange", route);
document.getElementById("api-key").placeholder = getKey()
  ? "a key is set for this tab"
  : "paste a key (kept for this tab only)";
me = whoami();
route();
