// Talking to the /v1 API: the API key, JSON requests, problem+json errors, the server-sent
// event stream and authenticated downloads.
//
// The key comes from the address fragment (#key=...: kept in sessionStorage, then removed
// from the address bar) or from the key form; it goes out as "Authorization: Bearer <key>"
// on every request, and only ever to this page's own origin. EventSource cannot send that
// header, so the event stream is read with fetch and parsed here.

const KEY_STORE = "comera.apiKey";
let memoryKey = null; // used when sessionStorage is unavailable

export class ApiError extends Error {
  constructor(status, title, detail) {
    super(detail ? `${title}: ${detail}` : title);
    this.status = status;
    this.title = title;
    this.detail = detail;
  }
}

export function getKey() {
  try {
    return sessionStorage.getItem(KEY_STORE) || memoryKey;
  } catch {
    return memoryKey;
  }
}

export function setKey(key) {
  memoryKey = key || null;
  try {
    if (key) sessionStorage.setItem(KEY_STORE, key);
    else sessionStorage.removeItem(KEY_STORE);
  } catch {
    // private mode or storage disabled: the in-memory copy lasts until the page closes
  }
}

/** The fragment's parameters (#key=...&job=...), with the key taken out and stored. */
export function takeFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("key")) {
    const key = params.get("key").trim();
    if (key) setKey(key);
    params.delete("key");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return params;
}

async function problem(resp) {
  let body = {};
  try {
    body = await resp.json();
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(resp.status, body.title || resp.statusText || "Error", body.detail || "");
}

/** fetch() on this origin with the key; a non-2xx answer throws an ApiError. */
export async function request(path, {params = {}, accept = "application/json", signal} = {}) {
  const url = new URL(path, location.origin);
  if (url.origin !== location.origin) throw new ApiError(0, "Refused", `not this origin: ${path}`);
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined) url.searchParams.set(name, value);
  }
  const headers = new Headers({Accept: accept});
  const key = getKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  let resp;
  try {
    resp = await fetch(url, {headers, signal, cache: "no-store", credentials: "omit"});
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "Network error", "the service could not be reached");
  }
  if (!resp.ok) throw await problem(resp);
  return resp;
}

async function getJson(path, params) {
  return (await request(path, {params})).json();
}

const jobPath = (id) => `/v1/jobs/${encodeURIComponent(id)}`;

export const api = {
  jobs: (limit = 50) => getJson("/v1/jobs", {limit}),
  job: (id) => getJson(jobPath(id)),
  metrics: (id, keys) => getJson(`${jobPath(id)}/metrics`, {keys: keys.join(","), max_points: 500}),
  ranks: (id) => getJson(`${jobPath(id)}/ranks`, {max_points: 500}),
  stageEvents: (id) => getJson(`${jobPath(id)}/events`, {kind: "stage", limit: 1000}),
  checkpoints: (id) => getJson(`${jobPath(id)}/checkpoints`),
  report: (id) => getJson(`${jobPath(id)}/report`),
};

/** Download with the key: {blob, filename} (a plain link could not carry the header). */
export async function download(path, signal) {
  const resp = await request(path, {accept: "application/octet-stream", signal});
  const blob = await resp.blob();
  const match = /filename="?([^";]+)"?/.exec(resp.headers.get("Content-Disposition") || "");
  return {blob, filename: match ? match[1] : "download.bin"};
}

/**
 * Follow a job's server-sent events after sequence number `after`; calls onEvent({id, event,
 * data}) for each, and resolves with the last id seen when the server ends the stream (it
 * does after the job's terminal state). Abort with `signal`.
 */
export async function streamEvents(jobId, {after = 0, onEvent, signal}) {
  const resp = await request(`${jobPath(jobId)}/events`, {params: {after},
                                                          accept: "text/event-stream", signal});
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let last = after;
  let msg = {id: null, event: "message", data: []};
  const line = (text) => {
    if (text === "") { // a blank line ends one message
      if (msg.data.length) {
        onEvent({id: msg.id, event: msg.event, data: JSON.parse(msg.data.join("\n"))});
      }
      msg = {id: null, event: "message", data: []};
      return;
    }
    if (text.startsWith(":")) return; // keep-alive comment
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    const value = colon < 0 ? "" : text.slice(colon + 1).replace(/^ /, "");
    if (field === "id") { msg.id = Number(value); last = msg.id; }
    else if (field === "event") msg.event = value;
    else if (field === "data") msg.data.push(value);
  };
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return last;
    buffer += value;
    const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length; // "\r" | "\n" later
    const lines = buffer.slice(0, cut).split(/\r\n|\n|\r/);
    buffer = lines.pop() + buffer.slice(cut);
    lines.forEach(line);
  }
}
