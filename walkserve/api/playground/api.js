// Same-origin calls to the walkserve API: the bearer key from this tab's session, errors as their message.

const KEY = "walkserve.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

function headers(extra) {
  const out = { ...extra };
  const key = apiKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

// The API's error envelope says {"error": {"message"}}; anything else is reported by its status.
async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = `${response.status}: ${body.error.message}`;
  } catch (_) { /* not JSON: keep the status line */ }
  return new Error(message);
}

export async function call(path, { json, form, method } = {}) {
  const init = { method: method || (json || form ? "POST" : "GET"), credentials: "same-origin" };
  if (json !== undefined) {
    init.headers = headers({ "Content-Type": "application/json" });
    init.body = JSON.stringify(json);
  } else {
    init.headers = headers({});
    if (form) init.body = form;
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response;
}

// Server-sent events of a streamed answer: calls onEvent with each parsed `data:` payload (not [DONE]).
export async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data || data === "[DONE]") continue;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message || "the stream failed");
      onEvent(event);
    }
  }
}

// A short note naming the request's trace, when the server returned a W3C traceparent header.
export function traceNote(response) {
  const parent = response.headers.get("traceparent");
  if (!parent) return "";
  const id = parent.split("-")[1];
  return id ? ` · trace ${id}` : "";
}
