// Sessions, newest first, searched by user and phase; or opened by id.

import { get, query } from "../api.js";
import { h, when } from "../dom.js";

export async function render(main, _id, context) {
  const machine = await context.machine();
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const results = h("div", { id: "session-results" });
  const user = h("input", { id: "search-user", name: "user_id", value: params.get("user_id") || "", placeholder: "any user" });
  const phase = h("select", { id: "search-phase", name: "phase" },
    h("option", { value: "" }, "any phase"),
    machine.states.map((state) => h("option", { value: state, selected: state === params.get("phase") }, state)));
  const openId = h("input", { id: "open-session", name: "session_id", placeholder: "session id" });
  main.append(
    h("h2", {}, "Sessions"),
    h("form", { class: "search", role: "search", "aria-label": "Search sessions", onsubmit: (e) => { e.preventDefault(); search(); } },
      h("label", { for: "search-user" }, "User"), user,
      h("label", { for: "search-phase" }, "Phase"), phase,
      h("button", { type: "submit" }, "Search")),
    h("form", { class: "search", "aria-label": "Open a session", onsubmit: (e) => { e.preventDefault(); if (openId.value.trim()) location.hash = `#/sessions/${encodeURIComponent(openId.value.trim())}`; } },
      h("label", { for: "open-session" }, "Open session"), openId,
      h("button", { type: "submit" }, "Open")),
    results,
  );

  async function search(cursor = null) {
    const page = await get(`/v1/sessions${query({ user_id: user.value.trim(), phase: phase.value, limit: 50, cursor })}`);
    if (!cursor) results.replaceChildren(table(page.items));
    else results.querySelector("tbody").append(...page.items.map(rowOf));
    results.querySelector(".more")?.remove();
    if (page.next_cursor) {
      results.append(h("button", { class: "more", onclick: () => search(page.next_cursor) }, "More sessions"));
    }
  }

  await search();
  return null;
}

function table(items) {
  if (!items.length) return h("p", { class: "empty" }, "No session matches.");
  return h("table", { class: "list" },
    h("caption", {}, "Sessions, newest first (by when each was created)"),
    h("thead", {}, h("tr", {}, ["Session", "User", "Phase", "Status", "Revision", "Created"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, items.map(rowOf)));
}

function rowOf(item) {
  return h("tr", {},
    h("td", {}, h("a", { href: `#/sessions/${encodeURIComponent(item.session_id)}` }, item.session_id)),
    h("td", {}, item.user_id),
    h("td", {}, h("span", { class: `phase phase-${item.phase}` }, item.phase)),
    h("td", {}, item.status),
    h("td", { class: "num" }, item.revision),
    h("td", { title: item.updated_at ? `last change ${when(item.updated_at)}` : null },
      h("time", { datetime: item.created_at || "" }, when(item.created_at))));
}
