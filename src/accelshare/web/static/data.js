// Data page: the caller's storage folders (own, project, shared with them), the trash,
// invitations, and a file browser per folder (#/data/<folder>/<path>): listing in pages,
// sub-folders, new folder, rename / move, delete, uploads with tus straight to the storage
// proxy (with a progress bar), downloads by a token link (a folder as a zip), sharing.

import { api } from "./api.js";
import { h } from "./format.js";
import { formatBytes, joinPath, tusUpload } from "./transfer.js";

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const PAGE_SIZE = 100; // rows of a folder's listing shown at once
const TRASH = "delete-pending";

/** "Yours", "Project ml", "Shared by bob@example.com": whose folder this is. */
export function folderKind(folder) {
  if (folder.type === "group" || folder.ownership_type === "group") {
    return `Project ${folder.group_name || folder.group || ""}`.trim();
  }
  if (folder.is_owner) return "Yours";
  return folder.user_email ? `Shared by ${folder.user_email}` : "Shared with you";
}

const PERMISSIONS = { ro: "read-only", rw: "read-write", wd: "read-write-delete" };

/** A small modal that asks for one text value; resolves to the text, or null on cancel. */
function ask(title, label, value = "") {
  const dialog = $("data-ask-dialog");
  const input = $("data-ask-input");
  $("data-ask-title").textContent = title;
  $("data-ask-label").textContent = label;
  input.value = value;
  return new Promise((resolve) => {
    const done = (answer) => {
      dialog.close();
      resolve(answer);
    };
    $("data-ask-form").onsubmit = (event) => {
      event.preventDefault();
      const text = input.value.trim();
      if (text) done(text);
      else input.focus();
    };
    $("data-ask-cancel").onclick = () => done(null);
    dialog.oncancel = () => resolve(null);
    dialog.showModal();
    input.select();
  });
}

function confirmAction(title, text, okLabel) {
  const dialog = $("data-confirm-dialog");
  $("data-confirm-title").textContent = title;
  $("data-confirm-text").textContent = text;
  $("data-confirm-ok").textContent = okLabel;
  return new Promise((resolve) => {
    const done = (answer) => {
      dialog.close();
      resolve(answer);
    };
    $("data-confirm-ok").onclick = () => done(true);
    $("data-confirm-cancel").onclick = () => done(false);
    dialog.oncancel = () => resolve(false);
    dialog.showModal();
    $("data-confirm-cancel").focus();
  });
}

/** Start a download of ``path`` in ``folder`` (a directory as a zip): a ticket from the
 * manager, then a plain link to the storage proxy, so the browser streams it to disk
 * (with its own progress) instead of holding it in memory. */
export async function download(folder, path, archive = false) {
  const ticket = await api("POST", `/folders/${enc(folder)}/request-download`, { path, archive });
  const link = h("a", { href: `${ticket.url}?token=${enc(ticket.token)}`, download: "", hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
}

// -- the folder list ----------------------------------------------------------------------

function folderRow(folder, actions, trash) {
  const name = folder.name;
  const buttons = trash
    ? [
        h("button", { type: "button", class: "secondary small", "aria-label": `Restore ${name}`, onclick: () => actions.restore(folder) }, "Restore"),
        h("button", { type: "button", class: "danger small", "aria-label": `Purge ${name}`, onclick: () => actions.purge(folder) }, "Purge"),
      ]
    : [
        h("a", { class: "button-link", href: `#/data/${enc(name)}`, "aria-label": `Open ${name}` }, "Open"),
        folder.is_owner &&
          h("button", { type: "button", class: "secondary small", "aria-label": `Rename ${name}`, onclick: () => actions.rename(folder) }, "Rename"),
        folder.is_owner &&
          h("button", { type: "button", class: "danger small", "aria-label": `Delete ${name}`, onclick: () => actions.remove(folder) }, "Delete"),
        !folder.is_owner &&
          folder.type !== "group" &&
          h("button", { type: "button", class: "secondary small", "aria-label": `Leave ${name}`, onclick: () => actions.leave(folder) }, "Leave"),
      ];
  const quota = Number(folder.max_size) > 0 ? formatBytes(folder.max_size) : "no limit";
  return h(
    "tr",
    { dataset: { folder: name, folderId: folder.id } },
    h("th", { scope: "row", class: "name" }, name),
    h("td", { class: "kind" }, folderKind(folder)),
    h("td", { class: "perm", title: PERMISSIONS[folder.permission] ?? "" }, folder.permission),
    h("td", { class: "host mono" }, folder.host),
    h("td", { class: "used" }, trash ? "" : "…"),
    h("td", { class: "quota" }, quota),
    h("td", { class: "actions" }, ...buttons),
  );
}

function invitationItem(inv, actions) {
  return h(
    "li",
    { dataset: { invitation: inv.id } },
    h("span", {}, `${inv.inviter} invites you to `, h("strong", {}, inv.vfolder_name), ` (${inv.perm}) `),
    h("button", { type: "button", class: "small", "aria-label": `Accept ${inv.vfolder_name}`, onclick: () => actions.accept(inv) }, "Accept"),
    h("button", { type: "button", class: "secondary small", "aria-label": `Decline ${inv.vfolder_name}`, onclick: () => actions.decline(inv) }, "Decline"),
  );
}

function mountFolderList(ctx, root) {
  let trash = false;
  let folders = [];
  const error = h("p", { class: "form-error", id: "folders-error", role: "alert", hidden: true });
  const showError = (message) => {
    error.textContent = message || "";
    error.hidden = !message;
  };
  const body = h("tbody", { id: "folders-body" });
  const empty = h("p", { class: "empty", id: "folders-empty", hidden: true });
  const invitations = h("ul", { class: "invitations", id: "invitations-list" });
  const invitationsCard = h(
    "section",
    { class: "card", id: "invitations-card", "aria-labelledby": "invitations-title", hidden: true },
    h("h2", { id: "invitations-title" }, "Invitations"),
    invitations,
  );
  const tabFolders = h("button", { type: "button", class: "tab", id: "tab-folders", "aria-pressed": "true" }, "Folders");
  const tabTrash = h("button", { type: "button", class: "tab", id: "tab-trash", "aria-pressed": "false" }, "Trash");
  const hostSelect = h("select", { id: "folder-host", name: "host" });
  const createForm = h(
    "form",
    { id: "folder-create", class: "inline-form", novalidate: true },
    h("div", { class: "field" }, h("label", { for: "folder-name" }, "New folder"), h("input", { id: "folder-name", name: "name", autocomplete: "off", required: true })),
    h("div", { class: "field" }, h("label", { for: "folder-host" }, "Storage"), hostSelect),
    h(
      "div",
      { class: "field" },
      h("label", { for: "folder-group" }, "Project ", h("span", { class: "muted" }, "(optional)")),
      h("input", { id: "folder-group", name: "group", autocomplete: "off" }),
    ),
    h("button", { type: "submit", id: "folder-create-submit" }, "Create"),
  );
  const table = h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "data", id: "folders-table" },
      h("caption", { class: "visually-hidden" }, "Your storage folders"),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          ...["Name", "Owner", "Permission", "Storage", "Used", "Size limit"].map((t) => h("th", { scope: "col" }, t)),
          h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")),
        ),
      ),
      body,
    ),
  );
  root.replaceChildren(
    invitationsCard,
    h("div", { class: "tabs", role: "group", "aria-label": "Folders or trash" }, tabFolders, tabTrash),
    createForm,
    error,
    table,
    empty,
  );

  const render = () => {
    const shown = folders.filter((f) => (trash ? f.status === TRASH : !String(f.status).startsWith("delete-")));
    body.replaceChildren(...shown.map((f) => folderRow(f, actions, trash)));
    empty.textContent = trash ? "The trash is empty." : "No folders yet: create one above.";
    empty.hidden = shown.length > 0;
    createForm.hidden = trash;
    tabFolders.setAttribute("aria-pressed", String(!trash));
    tabTrash.setAttribute("aria-pressed", String(trash));
  };
  // each live folder's usage (GET /folders/{id}: the proxy's count), one at a time
  let usageRound = 0;
  const fillUsage = async () => {
    const round = (usageRound += 1);
    for (const tr of [...body.querySelectorAll("tr")]) {
      if (round !== usageRound || trash) return;
      const cell = tr.querySelector(".used");
      try {
        const info = await api("GET", `/folders/${enc(tr.dataset.folderId)}`);
        cell.textContent = `${formatBytes(info.used_bytes)} · ${info.num_files} files`;
      } catch {
        cell.textContent = "unknown";
      }
    }
  };
  const load = async () => {
    try {
      folders = await api("GET", "/folders");
      render();
      fillUsage();
    } catch (e) {
      showError(`Could not list the folders: ${e.message}`);
    }
    try {
      const answer = await api("GET", "/folders/invitations/list");
      const items = answer.invitations ?? [];
      invitations.replaceChildren(...items.map((inv) => invitationItem(inv, actions)));
      invitationsCard.hidden = items.length === 0;
    } catch {
      invitationsCard.hidden = true;
    }
  };
  const attempt = async (what, fn) => {
    showError("");
    try {
      await fn();
      await load();
      return true;
    } catch (e) {
      showError(`${what}: ${e.message}`);
      return false;
    }
  };
  const actions = {
    rename: async (folder) => {
      const name = await ask(`Rename ${folder.name}`, "New name", folder.name);
      if (!name || name === folder.name) return;
      await attempt(`Could not rename ${folder.name}`, () => api("POST", `/folders/${enc(folder.id)}/rename`, { new_name: name }));
    },
    remove: async (folder) => {
      const ok = await confirmAction(`Delete ${folder.name}?`, `${folder.name} goes to the trash; restore it from there, or purge it for good.`, "Move to trash");
      if (!ok) return;
      if (await attempt(`Could not delete ${folder.name}`, () => api("DELETE", "/folders", { id: folder.id }))) {
        ctx.toast(`${folder.name} is in the trash.`);
      }
    },
    restore: (folder) => attempt(`Could not restore ${folder.name}`, () => api("POST", "/folders/restore-from-trash-bin", { id: folder.id })),
    purge: async (folder) => {
      const ok = await confirmAction(`Purge ${folder.name}?`, `${folder.name} and every file in it are deleted for good.`, "Purge");
      if (!ok) return;
      await attempt(`Could not purge ${folder.name}`, () => api("POST", "/folders/delete-from-trash-bin", { id: folder.id }));
    },
    leave: async (folder) => {
      const ok = await confirmAction(`Leave ${folder.name}?`, `You will no longer see ${folder.name}; its owner keeps it.`, "Leave");
      if (!ok) return;
      await attempt(`Could not leave ${folder.name}`, () => api("POST", `/folders/${enc(folder.id)}/leave`, {}));
    },
    accept: (inv) => attempt(`Could not accept ${inv.vfolder_name}`, () => api("POST", "/folders/invitations/accept", { inv_id: inv.id })),
    decline: (inv) => attempt(`Could not decline ${inv.vfolder_name}`, () => api("DELETE", "/folders/invitations/delete", { inv_id: inv.id })),
  };
  tabFolders.onclick = () => {
    trash = false;
    render();
  };
  tabTrash.onclick = () => {
    trash = true;
    render();
  };
  createForm.onsubmit = async (event) => {
    event.preventDefault();
    const name = createForm.elements.name.value.trim();
    if (!name) {
      showError("Enter a name for the new folder.");
      createForm.elements.name.focus();
      return;
    }
    const body = { name };
    if (hostSelect.value) body.host = hostSelect.value;
    const group = createForm.elements.group.value.trim();
    if (group) body.group = group;
    const created = await attempt(`Could not create ${name}`, async () => {
      await api("POST", "/folders", body);
      // cleared before the list shows the new folder: the next name typed is kept
      createForm.reset();
      hostSelect.value = hostSelect.dataset.default ?? "";
    });
    if (created) ctx.toast(`Created ${name}.`);
  };
  api("GET", "/folders/_/hosts")
    .then((hosts) => {
      hostSelect.replaceChildren(...(hosts.allowed ?? []).map((host) => h("option", { value: host }, host)));
      hostSelect.value = hosts.default ?? "";
      hostSelect.dataset.default = hosts.default ?? "";
    })
    .catch(() => hostSelect.replaceChildren(h("option", { value: "" }, "default")));
  load();
  return () => {};
}

// -- one folder: the file browser -------------------------------------------------------

/** The listing's mtime (POSIX seconds, or an ISO text) as a local date and time. */
export function modifiedText(mtime) {
  if (mtime === null || mtime === undefined || mtime === "") return "";
  const date = typeof mtime === "number" ? new Date(mtime * 1000) : new Date(mtime);
  return Number.isNaN(date.getTime()) ? String(mtime) : date.toLocaleString();
}

function fileRow(entry, actions) {
  const isDir = entry.type === "DIR" || entry.type === "DIRECTORY";
  const name = entry.name;
  const nameCell = isDir
    ? h("button", { type: "button", class: "link", "aria-label": `Enter ${name}`, onclick: () => actions.enter(name) }, `${name}/`)
    : name;
  return h(
    "tr",
    { dataset: { file: name, type: isDir ? "dir" : "file" } },
    h("th", { scope: "row", class: "name" }, nameCell),
    h("td", { class: "size" }, isDir ? "—" : formatBytes(entry.size)),
    h("td", { class: "mtime" }, modifiedText(entry.mtime)),
    h(
      "td",
      { class: "actions" },
      h("button", { type: "button", class: "secondary small", "aria-label": `Download ${name}`, onclick: () => actions.download(entry, isDir) }, isDir ? "Zip" : "Download"),
      actions.writable && h("button", { type: "button", class: "secondary small", "aria-label": `Rename ${name}`, onclick: () => actions.rename(entry) }, "Rename"),
      actions.writable && h("button", { type: "button", class: "secondary small", "aria-label": `Move ${name}`, onclick: () => actions.move(entry) }, "Move"),
      actions.writable && h("button", { type: "button", class: "danger small", "aria-label": `Delete ${name}`, onclick: () => actions.remove(entry, isDir) }, "Delete"),
    ),
  );
}

function uploadItem(file) {
  const bar = h("progress", { max: String(Math.max(file.size, 1)), value: "0", "aria-label": `Upload of ${file.name}` });
  const text = h("span", { class: "upload-text" }, `${file.name}: waiting`);
  const li = h("li", { class: "upload", dataset: { upload: file.name } }, text, bar);
  return {
    li,
    progress(sent, total) {
      bar.value = String(sent);
      const pct = total ? Math.floor((sent * 100) / total) : 100;
      text.textContent = `${file.name}: ${formatBytes(sent)} of ${formatBytes(total)} (${pct}%)`;
    },
    done() {
      bar.value = bar.max;
      li.dataset.state = "done";
      text.textContent = `${file.name}: uploaded (${formatBytes(file.size)})`;
    },
    failed(message) {
      li.dataset.state = "failed";
      li.classList.add("failed");
      text.textContent = `${file.name}: ${message}`;
    },
  };
}

function mountBrowser(ctx, root, folderName, path) {
  let entries = [];
  let page = 0;
  let info = null;
  const here = (sub) => `#/data/${enc(folderName)}${sub ? `/${sub.split("/").map(enc).join("/")}` : ""}`;
  const crumbs = [h("a", { href: "#/data" }, "Folders"), " › ", h("a", { href: here("") }, folderName)];
  let walked = "";
  for (const part of path ? path.split("/") : []) {
    walked = joinPath(walked, part);
    crumbs.push(" › ", h("a", { href: here(walked) }, part));
  }
  const error = h("p", { class: "form-error", id: "browser-error", role: "alert", tabindex: "-1", hidden: true });
  const showError = (message) => {
    error.textContent = message || "";
    error.hidden = !message;
    if (message) error.focus();
  };
  const usage = h("p", { class: "muted", id: "browser-usage", role: "status" });
  const body = h("tbody", { id: "files-body" });
  const empty = h("p", { class: "empty", id: "files-empty", hidden: true }, "This folder is empty.");
  const range = h("span", { class: "muted", id: "files-range" });
  const prev = h("button", { type: "button", class: "secondary", id: "files-prev", disabled: true }, "Previous");
  const next = h("button", { type: "button", class: "secondary", id: "files-next", disabled: true }, "Next");
  const uploads = h("ul", { class: "uploads", id: "uploads", "aria-label": "Uploads" });
  const fileInput = h("input", { type: "file", id: "upload-input", multiple: true, class: "visually-hidden", hidden: true });
  const toolbar = h(
    "div",
    { class: "toolbar" },
    h("button", { type: "button", class: "secondary", id: "browser-mkdir", hidden: true }, "New folder"),
    fileInput,
    h("label", { class: "button-like", for: "upload-input", id: "upload-label", hidden: true }, "Upload files"),
    h("button", { type: "button", class: "secondary", id: "browser-zip" }, "Download all as zip"),
  );
  const shareCard = h("section", { class: "card", id: "share-card", "aria-labelledby": "share-title" });
  root.replaceChildren(
    h("nav", { class: "crumbs", "aria-label": "Folder path" }, ...crumbs),
    usage,
    toolbar,
    uploads,
    error,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "data", id: "files-table" },
        h("caption", { class: "visually-hidden" }, `Files in ${folderName}/${path}`),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ...["Name", "Size", "Modified"].map((t) => h("th", { scope: "col" }, t)),
            h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")),
          ),
        ),
        body,
      ),
    ),
    empty,
    h("nav", { class: "pager", "aria-label": "File pages" }, range, prev, next),
    shareCard,
  );

  let loaded = false;
  // write actions only once the folder's permission is known (and never for read-only)
  const writable = () => info !== null && info.permission !== "ro";
  const render = () => {
    const pages = Math.max(1, Math.ceil(entries.length / PAGE_SIZE));
    page = Math.min(page, pages - 1);
    const start = page * PAGE_SIZE;
    const shown = entries.slice(start, start + PAGE_SIZE);
    actions.writable = writable();
    body.replaceChildren(...shown.map((e) => fileRow(e, actions)));
    empty.hidden = !loaded || entries.length > 0;
    range.textContent = entries.length ? `${start + 1}–${start + shown.length} of ${entries.length}` : "";
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  };
  const loadInfo = async () => {
    try {
      info = await api("GET", `/folders/${enc(folderName)}`);
      const limit = Number(info.max_size) > 0 ? ` of ${formatBytes(info.max_size)}` : " (no size limit)";
      usage.textContent = `${formatBytes(info.used_bytes)} used${limit} · ${info.num_files} files · ${info.permission} · ${info.host}`;
      for (const el of [$("browser-mkdir"), $("upload-label"), fileInput]) el.hidden = !writable();
      renderSharing(ctx, shareCard, info);
      render();
    } catch (e) {
      usage.textContent = "";
      showError(`Could not open ${folderName}: ${e.message}`);
    }
  };
  const load = async () => {
    try {
      const answer = await api("GET", `/folders/${enc(folderName)}/files?path=${enc(path || ".")}`);
      const items = answer.items ?? [];
      const dirFirst = (e) => (e.type === "DIR" || e.type === "DIRECTORY" ? 0 : 1);
      entries = items.sort((a, b) => dirFirst(a) - dirFirst(b) || a.name.localeCompare(b.name));
      loaded = true;
      render();
    } catch (e) {
      showError(`Could not list ${folderName}/${path}: ${e.message}`);
    }
  };
  const attempt = async (what, fn) => {
    showError("");
    try {
      await fn();
      await load();
      loadInfo();
    } catch (e) {
      showError(`${what}: ${e.message}`);
    }
  };
  const actions = {
    writable: true,
    enter: (name) => {
      location.hash = here(joinPath(path, name));
    },
    download: (entry, isDir) =>
      download(folderName, joinPath(path, entry.name), isDir).catch((e) => showError(`Could not download ${entry.name}: ${e.message}`)),
    rename: async (entry) => {
      const name = await ask(`Rename ${entry.name}`, "New name", entry.name);
      if (!name || name === entry.name) return;
      await attempt(`Could not rename ${entry.name}`, () =>
        api("POST", `/folders/${enc(folderName)}/rename-file`, { target_path: joinPath(path, entry.name), new_name: name }),
      );
    },
    move: async (entry) => {
      const target = await ask(`Move ${entry.name}`, `New path inside ${folderName}`, joinPath(path, entry.name));
      if (!target) return;
      await attempt(`Could not move ${entry.name}`, () =>
        api("POST", `/folders/${enc(folderName)}/move-file`, { src: joinPath(path, entry.name), dst: target }),
      );
    },
    remove: async (entry, isDir) => {
      const ok = await confirmAction(
        `Delete ${entry.name}?`,
        isDir ? `${entry.name} and everything in it are deleted.` : `${entry.name} is deleted.`,
        "Delete",
      );
      if (!ok) return;
      await attempt(`Could not delete ${entry.name}`, () =>
        api("DELETE", `/folders/${enc(folderName)}/delete-files`, { files: [joinPath(path, entry.name)], recursive: isDir }),
      );
    },
  };
  $("browser-mkdir").onclick = async () => {
    const name = await ask("New folder", `Name of the new folder in ${folderName}/${path}`);
    if (!name) return;
    await attempt(`Could not create ${name}`, async () => {
      const answer = await api("POST", `/folders/${enc(folderName)}/mkdir`, { path: joinPath(path, name) });
      const failed = answer?.results?.failed ?? [];
      if (failed.length) throw new Error(failed.map((f) => f.msg ?? JSON.stringify(f)).join("; "));
    });
  };
  $("browser-zip").onclick = () =>
    download(folderName, path || ".", true).catch((e) => showError(`Could not download ${folderName}: ${e.message}`));
  fileInput.onchange = async () => {
    const files = [...fileInput.files];
    fileInput.value = "";
    showError("");
    for (const file of files) {
      const item = uploadItem(file);
      uploads.append(item.li);
      try {
        await tusUpload(folderName, joinPath(path, file.name), file, item.progress);
        item.done();
      } catch (e) {
        item.failed(e.message);
        showError(`Could not upload ${file.name}: ${e.message}`);
      }
    }
    await load();
    loadInfo();
  };
  prev.onclick = () => {
    page -= 1;
    render();
  };
  next.onclick = () => {
    page += 1;
    render();
  };
  loadInfo();
  load();
  return () => {};
}

/** The owner's sharing card: invite users (a user folder) or share with project members
 * (a project folder), read-only or read-write; take a share back by e-mail. */
function renderSharing(ctx, card, info) {
  if (!info.is_owner) {
    card.replaceChildren(
      h("h2", { id: "share-title" }, "Sharing"),
      h("p", { class: "muted" }, `You have ${PERMISSIONS[info.permission] ?? info.permission} access to this folder.`),
    );
    return;
  }
  const project = info.type === "group";
  const emails = h("input", { id: "share-emails", name: "emails", autocomplete: "off", placeholder: "bob@example.com, carol@example.com" });
  const perm = h(
    "select",
    { id: "share-perm", name: "perm" },
    h("option", { value: "ro" }, "read-only"),
    h("option", { value: "rw" }, "read-write"),
  );
  const status = h("p", { id: "share-status", role: "status", class: "muted" });
  const error = h("p", { id: "share-error", class: "form-error", role: "alert", hidden: true });
  const list = () => emails.value.split(/[\s,;]+/).filter(Boolean);
  const run = async (fn) => {
    error.hidden = true;
    status.textContent = "";
    if (!list().length) {
      error.textContent = "Enter one or more e-mail addresses.";
      error.hidden = false;
      emails.focus();
      return;
    }
    try {
      status.textContent = await fn(list());
      emails.value = "";
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    }
  };
  const name = enc(info.id);
  const form = h(
    "form",
    { id: "share-form", class: "inline-form", novalidate: true },
    h("div", { class: "field" }, h("label", { for: "share-emails" }, project ? "Share with project members (e-mail)" : "Invite users (e-mail)"), emails),
    h("div", { class: "field" }, h("label", { for: "share-perm" }, "Permission"), perm),
    h("button", { type: "submit", id: "share-submit" }, project ? "Share" : "Invite"),
    h("button", { type: "button", class: "secondary", id: "unshare-submit" }, "Remove access"),
  );
  form.onsubmit = (event) => {
    event.preventDefault();
    run(async (users) => {
      if (project) {
        const answer = await api("POST", `/folders/${name}/share`, { permission: perm.value, emails: users });
        return `Shared with ${(answer.shared_emails ?? []).join(", ") || "nobody new"}.`;
      }
      const answer = await api("POST", `/folders/${name}/invite`, { perm: perm.value, user_ids: users });
      return `Invited ${(answer.invited_ids ?? []).join(", ") || "nobody new"}.`;
    });
  };
  form.querySelector("#unshare-submit").onclick = () =>
    run(async (users) => {
      const answer = await api("DELETE", `/folders/${name}/unshare`, { emails: users });
      return `Removed the access of ${(answer.unshared_emails ?? []).join(", ") || "nobody"}.`;
    });
  card.replaceChildren(h("h2", { id: "share-title" }, "Sharing"), form, error, status);
}

export function mountData(ctx) {
  const root = $("data-root");
  const parts = location.hash.replace(/^#\/?/, "").split("/").slice(1).map(decodeURIComponent);
  const [folder, ...rest] = parts.filter(Boolean);
  $("data-title").textContent = folder ? folder : "Data";
  if (folder) return mountBrowser(ctx, root, folder, rest.join("/"));
  return mountFolderList(ctx, root);
}
