// The web terminal: xterm.js over WS /session/{id}/terminal (the login cookie
// authenticates the handshake; the manager relays to the agent).  Protocol:
// binary frames are terminal bytes both ways; text frames are JSON control
// messages ({"type": "resize", cols, rows} from us; {"type": "exit", code} when the
// shell exited, {"type": "ended", detail} when the session ended under it (close code
// 4410), or {"type": "error", detail} from the server).  Opened as terminal.html#<session id>.

const $ = (id) => document.getElementById(id);
const sessionId = decodeURIComponent(location.hash.slice(1));
const CLOSE_REASONS = {
  4401: "Not logged in: log in to the console, then reconnect.",
  4403: "Not allowed to open this session's terminal.",
  4404: "No such running session (it may have ended).",
  4409: "The session is not running yet.",
  4410: "The session ended.",
  4502: "The session's agent cannot be reached.",
};

const term = new Terminal({ cursorBlink: true, convertEol: false, scrollback: 5000 });
const fit = new FitAddon.FitAddon();
term.loadAddon(fit);
term.open($("term"));
fit.fit();
// Fit again once the style sheets and fonts are in (the first fit may measure too early).
window.addEventListener("load", () => fit.fit());
document.fonts?.ready.then(() => fit.fit());
window.accelshareTerminal = term; // the browser tests read the screen through it

const encoder = new TextEncoder();
let socket = null;

function setState(text, state) {
  $("term-state").textContent = text;
  $("term-state").dataset.state = state;
  // An ended session has no terminal to reconnect to.
  $("term-reconnect").hidden = ["live", "connecting", "ended"].includes(state);
}

function sendResize() {
  if (socket?.readyState === WebSocket.OPEN) {
    socket.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
  }
}

function connect() {
  if (!sessionId) {
    setState("No session given (terminal.html#SESSION_ID).", "error");
    return;
  }
  setState("Connecting…", "connecting");
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/session/${encodeURIComponent(sessionId)}/terminal?cols=${term.cols}&rows=${term.rows}`;
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  socket = ws;
  let opened = false;
  ws.onmessage = (event) => {
    if (event.data instanceof ArrayBuffer) {
      if (!opened) {
        opened = true;
        setState("Live", "live");
      }
      term.write(new Uint8Array(event.data));
      return;
    }
    const message = JSON.parse(event.data);
    if (message.type === "exit") {
      term.write(`\r\n[the shell exited with code ${message.code}]\r\n`);
    } else if (message.type === "ended") {
      term.write("\r\n[the session ended]\r\n");
    } else if (message.type === "error") {
      term.write(`\r\n[${message.detail}]\r\n`);
    }
  };
  ws.onopen = () => {
    setState("Live", "live");
    sendResize();
    term.focus();
  };
  ws.onclose = (event) => {
    if (socket !== ws) return;
    const why = CLOSE_REASONS[event.code] || (event.code === 1000 ? "Closed." : `Disconnected (${event.code}).`);
    setState(`${why}`, event.code === 4410 ? "ended" : "closed");
  };
}

term.onData((data) => {
  if (socket?.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
});
term.onResize(sendResize);
window.addEventListener("resize", () => fit.fit());
$("term-reconnect").onclick = () => {
  socket?.close();
  term.reset();
  connect();
};
// Titled by the session's name (the id's first characters until it is known).
function showTitle(name) {
  document.title = `Terminal of ${name} · accelshare`;
  $("term-title").textContent = `Terminal of ${name}`;
}
showTitle(sessionId.slice(0, 8));
async function loadName() {
  if (!sessionId) return;
  try {
    const response = await fetch(`/session/${encodeURIComponent(sessionId)}`, {
      headers: { Accept: "application/json" },
      credentials: "same-origin",
    });
    if (!response.ok) return;
    const session = await response.json();
    if (session?.sessionName) showTitle(session.sessionName);
  } catch {
    // the id stays in the title
  }
}
loadName();
connect();
