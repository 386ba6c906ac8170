// History page: ended sessions (TERMINATED, CANCELLED, ERROR), most recent first, a page
// at a time from GET /sessions?status=...&order=recent; the reason each ended and its logs.
// The API's role rules decide whose: a user's own, an admin's domain, a superadmin's all.

import { api } from "./api.js";
import { h, ownerCell } from "./format.js";
import { showLogs } from "./sessions.js";

const $ = (id) => document.getElementById(id);
export const ENDED_STATUSES = ["TERMINATED", "CANCELLED", "ERROR"];
export const PAGE_SIZE = 20;

/** When a date-time string was, in the browser's locale ("" when absent). */
function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

/** Why the session ended: its status info, the result and the exit code when known. */
export function endReason(session) {
  const parts = [];
  if (session.statusInfo) parts.push(session.statusInfo);
  if (session.result && session.result !== "UNDEFINED") parts.push(`result ${session.result}`);
  if (session.exitCode !== null && session.exitCode !== undefined) parts.push(`exit code ${session.exitCode}`);
  return parts.join(" · ") || "no reason recorded";
}

function historyRow(session) {
  const name = session.sessionName;
  const ended = session.terminationTime ?? session.statusChangedAt;
  return h(
    "tr",
    { dataset: { sessionId: session.sessionId, sessionName: name, status: session.status } },
    h("th", { scope: "row", class: "name" }, name),
    h(
      "td",
      { class: "status-cell" },
      h("span", { class: `badge status-${session.status}` }, session.status),
      h("p", { class: "reason" }, endReason(session)),
    ),
    h("td", { class: "image" }, session.image),
    h("td", { class: "ended" }, h("time", { datetime: ended ?? "" }, when(ended))),
    ownerCell(session),
    h(
      "td",
      { class: "actions" },
      h(
        "button",
        { type: "button", class: "secondary small", "aria-label": `Logs of ${name}`, onclick: () => showLogs(session) },
        "Logs",
      ),
    ),
  );
}

export function mountHistory() {
  const body = $("history-body");
  const empty = $("history-empty");
  const range = $("history-range");
  const newer = $("history-newer");
  const older = $("history-older");
  let offset = 0;
  let stopped = false;

  const load = async () => {
    const query = new URLSearchParams({
      status: ENDED_STATUSES.join(","),
      order: "recent",
      limit: String(PAGE_SIZE),
      offset: String(offset),
    });
    range.textContent = "Loading…";
    let answer;
    try {
      answer = await api("GET", `/sessions?${query}`);
    } catch (error) {
      if (!stopped) range.textContent = `Could not load the history: ${error.message}`;
      return;
    }
    if (stopped) return;
    const { items, total } = answer;
    if (items.length === 0 && offset > 0 && total > 0) {
      offset = Math.max(0, Math.floor((total - 1) / PAGE_SIZE) * PAGE_SIZE); // shrank meanwhile
      await load();
      return;
    }
    body.replaceChildren(...items.map(historyRow));
    empty.hidden = items.length > 0;
    range.textContent = items.length ? `${offset + 1}–${offset + items.length} of ${total}` : "";
    newer.disabled = offset === 0;
    older.disabled = offset + items.length >= total;
  };

  newer.onclick = () => {
    offset = Math.max(0, offset - PAGE_SIZE);
    load();
  };
  older.onclick = () => {
    offset += PAGE_SIZE;
    load();
  };
  $("history-refresh").onclick = load;
  load();
  return () => {
    stopped = true;
  };
}
