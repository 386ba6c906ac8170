// The public API, authenticated by the login cookie (HttpOnly) plus the CSRF token the
// login answer returns (kept in sessionStorage; unsafe methods must send it back).

const CSRF_KEY = "accelshare.csrf";

export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && typeof body === "object" ? body.detail || body.title : body;
    super(detail || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

/** Called with the error when the server answers 401 (the console shows the login). */
let onUnauthorized = () => {};
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

export function hasCsrfToken() {
  return Boolean(sessionStorage.getItem(CSRF_KEY));
}

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const csrf = sessionStorage.getItem(CSRF_KEY);
  if (method !== "GET" && method !== "HEAD" && csrf) headers["X-CSRF-Token"] = csrf;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401 && path !== "/auth/login") onUnauthorized(error);
    throw error;
  }
  return data;
}

export async function login(email, password) {
  const answer = await api("POST", "/auth/login", { email, password });
  sessionStorage.setItem(CSRF_KEY, answer.csrf_token);
  return answer;
}

/** A tab opened from another (the terminal's brand link, a link opened in a new tab)
 * starts without the CSRF token: read it again with the login cookie, if there is one.
 * True when the token is back; no 401 handler (no login is not an error here). */
export async function recoverCsrfToken() {
  try {
    const response = await fetch("/auth/csrf", { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) return false;
    const answer = await response.json();
    if (!answer?.csrf_token) return false;
    sessionStorage.setItem(CSRF_KEY, answer.csrf_token);
    return true;
  } catch {
    return false;
  }
}

export async function logout() {
  try {
    await api("POST", "/auth/logout");
  } finally {
    sessionStorage.removeItem(CSRF_KEY);
  }
}

/** Follow a server-sent event stream: ``onData(data)`` per ``event``, ``onState(text)``
 * as the connection goes up and down.  EventSource reconnects by itself after a network
 * error; after a refusal (a non-200 answer closes it for good) the login is checked —
 * a 401 shows the login page — and the stream is opened again a little later.
 * Returns a function that closes it. */
export function follow(path, event, onData, onState, retryMs = 3000) {
  let source = null;
  let timer = null;
  let stopped = false;
  const open = () => {
    source = new EventSource(path, { withCredentials: true });
    source.addEventListener("open", () => onState("Live"));
    source.addEventListener(event, (message) => {
      onState("Live");
      onData(JSON.parse(message.data));
    });
    source.addEventListener("error", (message) => {
      if (message.data) {
        // The server ended the stream on purpose (credentials revoked): log in again.
        stopped = true;
        source.close();
        onState("Disconnected");
        onUnauthorized(new ApiError(401, JSON.parse(message.data)));
        return;
      }
      if (source.readyState !== EventSource.CLOSED) {
        onState("Reconnecting…");
        return;
      }
      onState("Disconnected");
      const retry = () => {
        if (!stopped) timer = setTimeout(open, retryMs);
      };
      api("GET", "/whoami")
        .then(retry)
        .catch((error) => {
          if (error.status !== 401) retry(); // a 401 already went to the login page
        });
    });
  };
  open();
  return () => {
    stopped = true;
    clearTimeout(timer);
    source.close();
  };
}
