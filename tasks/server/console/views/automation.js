// Schedules with their next ticks, and webhooks with their latest deliveries.

import { get } from "../api.js";
import { h, when } from "../dom.js";

export async function render(main) {
  const [schedules, hooks] = await Promise.all([get("/v1/schedules"), get("/v1/webhooks")]);
  main.append(h("h2", {}, "Schedules"), scheduleTable(schedules), h("h2", {}, "Webhooks"));
  if (!hooks.length) main.append(h("p", { class: "empty" }, "No webhook."));
  for (const hook of hooks) {
    const deliveries = await get(`/v1/webhooks/${encodeURIComponent(hook.webhook_id)}/deliveries?limit=20`);
    main.append(h("h3", {}, `${hook.url} (${hook.enabled ? "enabled" : "disabled"})`), deliveryTable(hook, deliveries));
  }
  return null;
}

function scheduleTable(schedules) {
  if (!schedules.length) return h("p", { class: "empty" }, "No schedule.");
  return h("table", { class: "list", id: "schedules" },
    h("caption", {}, "Schedules and their next ticks"),
    h("thead", {}, h("tr", {}, ["Schedule", "User", "When", "Time zone", "Next tick"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, schedules.map((s) => h("tr", {},
      h("td", {}, s.schedule_id),
      h("td", {}, s.user_id),
      h("td", {}, s.cron ? s.cron : `every ${s.every_seconds}s`),
      h("td", {}, s.timezone),
      h("td", {}, s.paused ? "paused" : when(s.next_tick))))));
}

function deliveryTable(hook, deliveries) {
  if (!deliveries.length) return h("p", { class: "empty" }, "No delivery yet.");
  return h("table", { class: "list" },
    h("caption", {}, `Deliveries of ${hook.webhook_id}, newest first`),
    h("thead", {}, h("tr", {}, ["webhook-id", "Event", "Status", "Attempts", "Last answer"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, deliveries.map((d) => {
      const last = d.attempts[d.attempts.length - 1] || {};
      return h("tr", {},
        h("td", {}, d.delivery_id),
        h("td", {}, d.event),
        h("td", {}, d.status),
        h("td", { class: "num" }, String(d.attempts.length)),
        h("td", {}, last.status_code ? String(last.status_code) : (last.error || "—")));
    })));
}
