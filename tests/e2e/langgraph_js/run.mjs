// Drives agentstate's /lg door with the official LangGraph JavaScript SDK
// (@langchain/langgraph-sdk, pinned in package-lock.json): node run.mjs URL ALICE_KEY BOB_KEY.
// It records what the SDK returned and prints it as one JSON line; the pytest module asserts.
import { Client } from "@langchain/langgraph-sdk";

const [url, aliceKey, bobKey] = process.argv.slice(2);
// maxRetries 0: a refused request must surface as the SDK's error, not be sent again.
const alice = new Client({ apiUrl: url, apiKey: aliceKey, callerOptions: { maxRetries: 0 } });
const bob = new Client({ apiUrl: url, apiKey: bobKey, callerOptions: { maxRetries: 0 } });
const say = (content) => ({ messages: [{ role: "user", content }] });
const last = (values) => values.messages[values.messages.length - 1];
const seen = {};

async function refused(call) {
  try {
    await call();
  } catch (error) {
    return { name: error.name, status: error.status ?? null, text: error.text ?? error.message };
  }
  return null;
}

async function collect(parts) {
  const out = [];
  for await (const part of parts) out.push({ event: part.event, data: part.data });
  return out;
}

async function untilBusy(threadId) {
  // The slow graph's run has started once its thread reads busy (a window of seconds).
  const deadline = Date.now() + 30000;
  while ((await alice.threads.get(threadId)).status !== "busy" && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

seen.assistants = (await alice.assistants.search({ limit: 10 })).map((a) => a.graph_id);

const made = await alice.threads.create({ metadata: { js: "yes" } });
const tid = made.thread_id;
seen.created = { status: made.status, metadata: made.metadata, values: made.values };
seen.got = (await alice.threads.get(tid)).thread_id === tid;
seen.searched = (await alice.threads.search({ metadata: { js: "yes" } })).map((t) => t.thread_id);
seen.thread_id = tid;

seen.waited = last(await alice.runs.wait(tid, "echo", { input: say("hi") })).content;

const parts = await collect(
  alice.runs.stream(tid, "echo", {
    input: say("flow"),
    streamMode: ["values", "messages-tuple"],
  }),
);
seen.stream = {
  events: parts.map((p) => p.event),
  metadata: parts[0].data,
  chunks: parts.filter((p) => p.event === "messages").map((p) => p.data[0]),
  final: last(parts.filter((p) => p.event === "values").at(-1).data),
};

const slowThread = (await alice.threads.create()).thread_id;
const slow = await alice.runs.create(slowThread, "steps", { input: say("linger a bit") });
await untilBusy(slowThread);
seen.double_text = await refused(() => alice.runs.wait(slowThread, "steps", { input: say("x") }));
const joined = await collect(alice.runs.joinStream(slowThread, slow.run_id, { streamMode: "values" }));
seen.join_stream = {
  first: joined[0].event,
  run_id: joined[0].data.run_id,
  final: last(joined.at(-1).data).content,
  slow_run_id: slow.run_id,
};
seen.joined_status = (await alice.runs.get(slowThread, slow.run_id)).status;

const cancelled = await alice.runs.create(slowThread, "steps", { input: say("linger again") });
await untilBusy(slowThread);
await alice.runs.cancel(slowThread, cancelled.run_id, true, "interrupt");
seen.cancelled = (await alice.runs.get(slowThread, cancelled.run_id)).status;

const askThread = (await alice.threads.create()).thread_id;
const asked = await alice.runs.wait(askThread, "approve", { input: say("pay") });
seen.interrupt = {
  waited: asked.__interrupt__,
  status: (await alice.threads.get(askThread)).status,
  task: (await alice.threads.getState(askThread)).tasks[0].interrupts,
};
const decided = await alice.runs.wait(askThread, "approve", {
  command: { resume: { approved: true, note: "fine" } },
});
seen.resumed = { answer: last(decided).content, status: (await alice.threads.get(askThread)).status };

const state = await alice.threads.getState(tid);
const history = await alice.threads.getHistory(tid, { limit: 5 });
seen.state = {
  next: state.next,
  messages: state.values.messages.map((m) => [m.type, m.content]),
  checkpoint: state.checkpoint,
  history_first: history[0].values.messages.map((m) => [m.type, m.content]),
  history_len: history.length,
};

const stranger = new Client({ apiUrl: url, apiKey: "not-a-key", callerOptions: { maxRetries: 0 } });
seen.bad_key = await refused(() => stranger.threads.search({}));
seen.other_user = await refused(() => bob.threads.get(tid));
seen.other_user_run = await refused(() => bob.runs.wait(tid, "echo", { input: say("x") }));

console.log(JSON.stringify(seen));
