// Sessions page: the caller's sessions, live from GET /events/sessions; destroy; logs.

import { api, follow } from "./api.js";
import { age, formatSlots, h, ownerCell, pendingReason } from "./format.js";
import { openLaunchDialog } from "./launch.js";

const $ = (id) => document.getElementById(id);
const FINAL = new Set(["TERMINATED", "CANCELLED"]);

// A PENDING session's reason in the console's terms where the scheduler recorded the
// devices it waits for ("GPU 0 and GPU 1 are full"); the scheduler's exact text, with the
// device ids, stays on hover (and in `session why --json`).
function statusCell(ctx, session) {
  const cell = h(
    "td",
    { class: "status-cell" },
    h("span", { class: `badge status-${session.status}` }, session.status),
  );
  const waiting = session.status === "PENDING" ? pendingReason(ctx.details, session.statusData?.scheduler) : null;
  if (waiting) {
    cell.append(h("p", { class: "reason", title: session.statusInfo ?? "" }, waiting));
  } else if (session.status === "PENDING" && session.statusInfo) {
    cell.append(h("p", { class: "reason" }, session.statusInfo));
  } else if (session.statusInfo && !["RUNNING"].includes(session.status)) {
    cell.append(h("p", { class: "reason muted" }, session.statusInfo));
  }
  return cell;
}

function resourcesCell(ctx, session) {
  const slots =
    Object.keys(session.occupiedSlots ?? {}).length > 0 ? session.occupiedSlots : session.requestedSlots;
  return h(
    "td",
    { class: "resources" },
    h(
      "ul",
      { class: "chips", "aria-label": "Resources" },
      formatSlots(ctx.details, slots).map(({ slot, text }) =>
        h("li", { class: "chip", title: slot, dataset: { slot } }, text),
      ),
    ),
  );
}

// A RUNNING session: its web terminal and one link per app service (both proxied by the
// manager, opened in a new tab; rel=noopener so they cannot reach this page).  Only its
// owner and a superadmin may enter a session (a domain admin is refused: 4403), so the
// links are not offered to anyone else.
function mayEnter(ctx, session) {
  return ctx.isSuperadmin || session.userId === ctx.me?.user_id;
}

const APP_TITLES = { jupyter: "Jupyter" }; // a button's text for well-known apps

function runningLinks(ctx, session) {
  if (session.status !== "RUNNING" || !mayEnter(ctx, session)) return [];
  const id = encodeURIComponent(session.sessionId);
  const name = session.sessionName;
  const link = (href, label, text) =>
    h("a", { class: "button-link", href, target: "_blank", rel: "noopener", "aria-label": label }, text);
  return [
    link(`terminal.html#${id}`, `Terminal of ${name}`, "Terminal"),
    ...(session.servicePorts ?? []).map((app) =>
      link(`/session/${id}/apps/${encodeURIComponent(app.name)}/`, `App ${app.name} of ${name}`, APP_TITLES[app.name] ?? app.name),
    ),
  ];
}

/** The storage folders the session mounts: "data → /home/work/data (read-only)". */
function mountsList(session) {
  const mounts = session.mounts ?? [];
  if (!mounts.length) return null;
  return h(
    "ul",
    { class: "mounts-list", "aria-label": `Folders mounted in ${session.sessionName}` },
    mounts.map((m) =>
      h("li", { dataset: { mount: m.name } }, `${m.name} → ${m.kernel_path}${m.read_only ? " (read-only)" : ""}`),
    ),
  );
}

function row(ctx, session, actions) {
  const name = session.sessionName;
  const live = !FINAL.has(session.status) && session.status !== "TERMINATING";
  return h(
    "tr",
    { dataset: { sessionId: session.sessionId, sessionName: name, status: session.status } },
    h("th", { scope: "row", class: "name" }, name, mountsList(session)),
    statusCell(ctx, session),
    h("td", { class: "image" }, session.image),
    resourcesCell(ctx, session),
    h("td", { class: "age", dataset: { created: session.creationTime ?? "" } }, age(session.creationTime)),
    ownerCell(session),
    h(
      "td",
      { class: "actions" },
      ...runningLinks(ctx, session),
      h(
        "button",
        { type: "button", class: "secondary small", "aria-label": `Logs of ${name}`, onclick: () => actions.logs(session) },
        "Logs",
      ),
      h(
        "button",
        {
          type: "button",
          class: "danger small",
          "aria-label": `Destroy ${name}`,
          disabled: !live,
          onclick: () => actions.destroy(session),
        },
        "Destroy",
      ),
    ),
  );
}

/** The logs dialog for ``session`` (also the history page's): the agent's output, read
 * again on Refresh; an ended session shows what its agent kept, if anything. */
export async function showLogs(session) {
  const dialog = $("logs-dialog");
  const text = $("logs-text");
  $("logs-title").textContent = `Logs of ${session.sessionName}`;
  const load = async () => {
    text.textContent = "Loading…";
    try {
      const answer = await api("GET", `/session/${encodeURIComponent(session.sessionId)}/logs`);
      const ended = FINAL.has(session.status) || session.status === "ERROR";
      text.textContent = answer?.result?.logs || (ended ? "(no logs kept for this session)" : "(no output yet)");
    } catch (error) {
      text.textContent = `Could not read the logs: ${error.message}`;
    }
  };
  $("logs-refresh").onclick = load;
  $("logs-close").onclick = () => dialog.close();
  dialog.showModal();
  await load();
}

function confirmDestroy(session) {
  const dialog = $("confirm-dialog");
  $("confirm-text").textContent =
    session.status === "PENDING"
      ? `${session.sessionName} is still pending; it will be cancelled.`
      : `${session.sessionName} will be stopped and its resources released.`;
  return new Promise((resolve) => {
    const done = (answer) => {
      dialog.close();
      resolve(answer);
    };
    $("confirm-ok").onclick = () => done(true);
    $("confirm-cancel").onclick = () => done(false);
    dialog.oncancel = () => resolve(false);
    dialog.showModal();
    $("confirm-cancel").focus();
  });
}

export function mountSessions(ctx) {
  const body = $("sessions-body");
  const empty = $("sessions-empty");
  const live = $("sessions-live");
  let items = [];

  const actions = {
    logs: showLogs,
    async destroy(session) {
      if (!(await confirmDestroy(session))) return;
      try {
        const answer = await api("DELETE", `/session/${encodeURIComponent(session.sessionId)}`);
        ctx.toast(`${session.sessionName}: ${answer.status}`);
      } catch (error) {
        ctx.toast(`Could not destroy ${session.sessionName}: ${error.message}`);
      }
    },
  };

  // Rows are rebuilt only when their session changed, and the focused button keeps the
  // focus across an update (a keyboard user is not thrown back to the top).
  let rendered = new Map(); // sessionId -> {json, el}
  // When the focused button goes (its session destroyed: the row is gone, or its button
  // disabled), the focus moves to the same button of the row now in its place (else the
  // row before), or to the page's heading; never to <body>.
  const refocus = (lost) => {
    const rows = [...body.children].filter((tr) => tr.dataset.sessionId !== lost.sessionId);
    const order = [...rows.slice(lost.index), ...rows.slice(0, lost.index).reverse()];
    for (const tr of order) {
      const button = tr.querySelector(`button.${lost.kind}:not(:disabled)`);
      if (button) {
        button.focus();
        return;
      }
    }
    $("sessions-title").focus();
  };
  const render = () => {
    const active = body.contains(document.activeElement) ? document.activeElement : null;
    const focused = active?.getAttribute("aria-label") ?? null;
    const activeRow = active?.closest("tr");
    const lost = activeRow
      ? {
          sessionId: activeRow.dataset.sessionId,
          index: [...body.children].indexOf(activeRow),
          kind: active.classList.contains("danger") ? "danger" : "secondary",
        }
      : null;
    const next = new Map();
    const rows = items.map((session) => {
      const json = JSON.stringify(session);
      const old = rendered.get(session.sessionId);
      const el = old && old.json === json ? old.el : row(ctx, session, actions);
      next.set(session.sessionId, { json, el });
      return el;
    });
    const same = rows.length === body.children.length && rows.every((el, i) => body.children[i] === el);
    if (!same) body.replaceChildren(...rows);
    rendered = next;
    empty.hidden = items.length > 0;
    if (focused && !body.contains(document.activeElement)) {
      for (const button of body.querySelectorAll("button")) {
        if (button.getAttribute("aria-label") === focused && !button.disabled) button.focus();
      }
      if (!body.contains(document.activeElement) && lost) refocus(lost);
    }
  };

  const close = follow(
    "/events/sessions",
    "sessions",
    (data) => {
      items = data.items;
      render();
    },
    (state) => {
      live.textContent = state;
      live.dataset.state = state;
    },
  );
  const ticker = setInterval(() => {
    for (const cell of body.querySelectorAll("td.age")) cell.textContent = age(cell.dataset.created);
  }, 5000);
  $("open-launch").onclick = () => openLaunchDialog(ctx);

  return () => {
    close();
    clearInterval(ticker);
  };
}
