// A workflow's DAG as SVG: steps in columns by dependency depth (a step sits one column
// right of its deepest dependency), ordered in a column by where their dependencies sit,
// edges as curves from each dependency to its dependent.

import { s } from "./dom.js";

const W = 150;
const H = 46;
const GAP_X = 70;
const GAP_Y = 22;
const PAD = 16;
export const MAX_DRAWN = 400;

export function layout(steps) {
  const ids = Object.keys(steps);
  const depth = new Map();
  const visiting = new Set();
  const depthOf = (id) => {
    if (depth.has(id)) return depth.get(id);
    if (visiting.has(id)) return 0; // never for a stored workflow (cycles are refused)
    visiting.add(id);
    const deps = (steps[id].dependencies || []).filter((d) => d in steps);
    const value = deps.length ? 1 + Math.max(...deps.map(depthOf)) : 0;
    depth.set(id, value);
    return value;
  };
  ids.forEach(depthOf);
  const columns = [];
  for (const id of ids) (columns[depth.get(id)] ||= []).push(id);
  const row = new Map();
  columns.forEach((column, index) => {
    if (index > 0) {
      const centre = (id) => {
        const deps = (steps[id].dependencies || []).filter((d) => row.has(d));
        return deps.length ? deps.reduce((sum, d) => sum + row.get(d), 0) / deps.length : 0;
      };
      column.sort((a, b) => centre(a) - centre(b) || a.localeCompare(b));
    } else {
      column.sort((a, b) => a.localeCompare(b));
    }
    column.forEach((id, i) => row.set(id, i));
  });
  const tallest = Math.max(1, ...columns.map((c) => c.length));
  const place = new Map();
  columns.forEach((column, index) => {
    const offset = ((tallest - column.length) * (H + GAP_Y)) / 2;
    column.forEach((id, i) => {
      place.set(id, { x: PAD + index * (W + GAP_X), y: PAD + offset + i * (H + GAP_Y) });
    });
  });
  return {
    place,
    width: PAD * 2 + columns.length * W + Math.max(0, columns.length - 1) * GAP_X,
    height: PAD * 2 + tallest * H + (tallest - 1) * GAP_Y,
  };
}

// Step ids in dependency order: every step after each step it depends on, the steps that
// become ready together sorted by id, so that the order is the same at every refresh.
export function topological(steps) {
  const ids = Object.keys(steps);
  const unmet = new Map();
  const dependents = new Map();
  for (const id of ids) {
    const deps = (steps[id].dependencies || []).filter((d) => d in steps);
    unmet.set(id, deps.length);
    for (const dep of deps) {
      if (!dependents.has(dep)) dependents.set(dep, []);
      dependents.get(dep).push(id);
    }
  }
  const order = [];
  let ready = ids.filter((id) => unmet.get(id) === 0).sort();
  while (ready.length) {
    order.push(...ready);
    const next = [];
    for (const id of ready) {
      for (const child of dependents.get(id) || []) {
        unmet.set(child, unmet.get(child) - 1);
        if (unmet.get(child) === 0) next.push(child);
      }
    }
    ready = next.sort();
  }
  const placed = new Set(order);
  return order.concat(ids.filter((id) => !placed.has(id)).sort()); // a cycle: refused at start
}

export function statusOf(step) {
  return step.awaiting_approval ? "awaiting_approval" : step.status;
}

export function draw(workflow) {
  const steps = workflow.steps;
  const { place, width, height } = layout(steps);
  const svg = s("svg", {
    class: "dag",
    role: "img",
    "aria-labelledby": "dag-title",
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
  });
  svg.append(s("title", { id: "dag-title" }, `Workflow ${workflow.workflow_id}: ${Object.keys(steps).length} steps`));
  const defs = s("defs", {});
  defs.append(
    s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" })),
  );
  svg.append(defs);
  for (const [id, step] of Object.entries(steps)) {
    const to = place.get(id);
    for (const dep of step.dependencies || []) {
      const from = place.get(dep);
      if (!from) continue;
      const x1 = from.x + W, y1 = from.y + H / 2, x2 = to.x, y2 = to.y + H / 2;
      const mid = (x1 + x2) / 2;
      svg.append(s("path", {
        class: "edge",
        d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`,
        "marker-end": "url(#arrow)",
        "data-from": dep,
        "data-to": id,
      }));
    }
  }
  for (const [id, step] of Object.entries(steps)) {
    const { x, y } = place.get(id);
    const status = statusOf(step);
    const node = s("g", { class: `node status-${status}`, "data-step": id, "data-status": status, transform: `translate(${x} ${y})` });
    node.append(s("title", {}, `${id}: ${step.action}, ${status.replace("_", " ")}`));
    node.append(s("rect", { width: W, height: H, rx: 8 }));
    node.append(s("text", { x: 10, y: 19, class: "name" }, shorten(id, 18)));
    node.append(s("text", { x: 10, y: 36, class: "state" }, `${shorten(step.action, 10)} · ${status.replace("_", " ")}`));
    svg.append(node);
  }
  return svg;
}

function shorten(text, length) {
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}
