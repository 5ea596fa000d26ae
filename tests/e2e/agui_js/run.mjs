// Drives POST /agui/{agent} with @ag-ui/client's HttpAgent (which checks every event the
// server sends against the protocol's rules) and prints what it saw as one JSON object:
// a run with streamed text, then an approval: the interrupt, and its resume.
// Usage: node run.mjs URL KEY THREAD_ID
import { randomUUID } from "node:crypto";
import { HttpAgent } from "@ag-ui/client";

const [url, key, threadId] = process.argv.slice(2);
const agent = new HttpAgent({ url, threadId, headers: { Authorization: `Bearer ${key}` } });

async function run(text, parameters = {}) {
  if (text !== null) agent.messages.push({ id: randomUUID(), role: "user", content: text });
  const types = [];
  let deltas = "";
  let finished = null;
  await agent.runAgent(parameters, {
    onEvent: ({ event }) => {
      types.push(event.type);
      if (event.type === "TEXT_MESSAGE_CONTENT") deltas += event.delta;
    },
    onRunFinishedEvent: ({ outcome, interrupts }) => {
      finished = { outcome, interrupts: (interrupts ?? []).map((i) => i.id) };
    },
  });
  const last = agent.messages[agent.messages.length - 1];
  return { types, deltas, finished, last: { role: last.role, content: last.content } };
}

const out = {};
out.plain = await run("what is 12*7?");
out.remembered = await run("remember that the sea is salty");
out.asked = await run("forget everything");
out.pending = agent.pendingInterrupts.map((i) => i.id);
const resume = out.pending.map((id) => ({ interruptId: id, status: "resolved", payload: { approve: true } }));
out.resumed = await run(null, { resume });
out.messages = agent.messages.map((m) => ({ id: m.id, role: m.role, content: m.content }));
console.log(JSON.stringify(out));
