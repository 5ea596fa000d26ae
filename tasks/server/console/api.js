// The API of the same origin, with the key this tab was given (sessionStorage only).

const KEY = "agentstate.key";

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  const sent = { ...extra };
  const key = getKey();
  if (key) sent.Authorization = `Bearer ${key}`;
  return sent;
}

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
    this.kind = body && body.kind ? body.kind : "failure";
  }
}

export async function call(method, path, body) {
  const options = { method, headers: headers() };
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body ?? {});

export function query(params) {
  const found = Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined);
  return found.length ? `?${new URLSearchParams(found)}` : "";
}

// Server-Sent Events over fetch (EventSource cannot send the Authorization header).
// Reconnects after each stream ends, resuming with Last-Event-ID; stop() ends it. With
// tokens, the reply's chunks come too, as they are produced (seq null, no id).
export function follow(sessionId, onEvent, onError, { tokens = false } = {}) {
  let lastId = null;
  let stopped = false;
  let controller = null;

  async function once() {
    controller = new AbortController();
    const extra = lastId === null ? {} : { "Last-Event-ID": lastId };
    const path = `/v1/sessions/${encodeURIComponent(sessionId)}/events${tokens ? "?tokens=true" : ""}`;
    const response = await fetch(path, {
      headers: headers(extra),
      signal: controller.signal,
    });
    if (!response.ok) {
      const text = await response.text();
      throw new ApiError(response.status, text ? JSON.parse(text) : null);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const message = parse(block);
        if (message.id !== null) lastId = message.id;
        if (message.data !== null) onEvent(JSON.parse(message.data));
      }
    }
  }

  (async () => {
    while (!stopped) {
      try {
        await once();
      } catch (error) {
        if (stopped) return;
        if (onError) onError(error);
        if (error instanceof ApiError && error.status < 500) return;
      }
      if (!stopped) await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  })();

  return {
    stop() {
      stopped = true;
      if (controller) controller.abort();
    },
  };
}

function parse(block) {
  let id = null;
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("id:")) id = line.slice(3).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  return { id, data: data.length ? data.join("\n") : null };
}
