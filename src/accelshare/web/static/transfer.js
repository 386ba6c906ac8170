// Moving bytes between the browser and the storage proxy: tus uploads (the manager
// hands out a ticket {token, url}; the bytes go straight to the proxy, on its own
// origin, allowed by its `cors-origins`), plus the pure helpers the Data page and the
// launch dialog's mount picker use.

import { api, ApiError } from "./api.js";

export const CHUNK_BYTES = 8 * 2 ** 20; // one PATCH: 8 MiB
const RETRIES = 5; // network errors in a row before an upload gives up

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/** "0 B", "512 B", "1.5 KiB", "2 GiB": binary units, at most one decimal. */
export function formatBytes(bytes) {
  let value = Number(bytes);
  if (!Number.isFinite(value) || value < 0) return String(bytes);
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const text = unit === 0 ? String(value) : value.toFixed(1).replace(/\.0$/, "");
  return `${text} ${UNITS[unit]}`;
}

/** "a/b" + "c" -> "a/b/c"; "" + "c" -> "c"; "." counts as the folder's root. */
export function joinPath(dir, name) {
  const parts = [...String(dir).split("/"), ...String(name).split("/")].filter((p) => p && p !== ".");
  return parts.join("/");
}

/** "a/b/c" -> "a/b"; "c" -> "". */
export function parentPath(path) {
  const parts = String(path).split("/").filter(Boolean);
  return parts.slice(0, -1).join("/");
}

/** The create request's mount fields from the picker's choices
 * ``[{name, path, readOnly}]``, as the session API reads them: ``mounts`` (names),
 * ``mount_map`` (name -> path, for the ones given a path) and ``mount_options``
 * (name -> {permission: "ro"}, for the read-only ones). {} when nothing is picked. */
export function mountFields(choices) {
  if (!choices.length) return {};
  const fields = { mounts: choices.map((c) => c.name) };
  const map = {};
  const options = {};
  for (const choice of choices) {
    if (choice.path) map[choice.name] = choice.path;
    if (choice.readOnly) options[choice.name] = { permission: "ro" };
  }
  if (Object.keys(map).length) fields.mount_map = map;
  if (Object.keys(options).length) fields.mount_options = options;
  return fields;
}

/** "" when ``path`` is a usable mount path (empty: /home/work/<name>), else why not. */
export function mountPathProblem(path) {
  if (!path) return "";
  if (path.includes("\0") || path.split("/").includes("..")) return "A mount path cannot contain '..'.";
  if (path.replace(/\/+$/, "") === "/home/work" || path.replace(/\/+$/, "") === "") {
    return "Choose a path below /home/work, or another absolute path.";
  }
  if (/\s/.test(path)) return "A mount path cannot contain spaces.";
  return "";
}

/** One tus request with XMLHttpRequest (fetch reports no upload progress). */
function tusRequest(method, url, { offset, body, onProgress } = {}) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(method, url);
    xhr.setRequestHeader("Tus-Resumable", "1.0.0");
    if (body !== undefined) {
      xhr.setRequestHeader("Upload-Offset", String(offset));
      xhr.setRequestHeader("Content-Type", "application/offset+octet-stream");
      if (onProgress) xhr.upload.onprogress = (event) => onProgress(event.loaded);
    }
    xhr.onload = () => resolve(xhr);
    xhr.onerror = () => reject(new TypeError("network error"));
    xhr.onabort = () => reject(new TypeError("aborted"));
    xhr.send(body ?? null);
  });
}

function proxyError(xhr) {
  let body = xhr.responseText;
  try {
    body = JSON.parse(body);
  } catch {
    // plain text
  }
  return new ApiError(xhr.status, body || `the storage proxy answered ${xhr.status}`);
}

/** Upload ``file`` to ``path`` in ``folder``: a ticket from the manager, then PATCHes of
 * CHUNK_BYTES to the proxy, each continuing at the offset the proxy reports.  A network
 * error or an offset conflict asks the proxy where it stands (HEAD) and resumes there.
 * ``onProgress(sent, total)`` follows the bytes.  Throws an ApiError with the server's
 * reason (over quota, a bad name, ...). */
export async function tusUpload(folder, path, file, onProgress = () => {}) {
  const ticket = await api("POST", `/folders/${encodeURIComponent(folder)}/request-upload`, {
    path,
    size: file.size,
  });
  const url = `${ticket.url}?token=${encodeURIComponent(ticket.token)}`;
  let offset = 0;
  let failures = 0;
  onProgress(0, file.size);
  while (offset < file.size) {
    const end = Math.min(offset + CHUNK_BYTES, file.size);
    let xhr;
    try {
      const at = offset;
      xhr = await tusRequest("PATCH", url, {
        offset,
        body: file.slice(offset, end),
        onProgress: (loaded) => onProgress(Math.min(at + loaded, file.size), file.size),
      });
    } catch (error) {
      failures += 1;
      if (failures > RETRIES) throw new Error(`the upload stopped at byte ${offset}: ${error.message}`);
      offset = await resumeOffset(url, offset);
      continue;
    }
    if (xhr.status === 409) {
      failures += 1;
      if (failures > RETRIES) throw proxyError(xhr);
      offset = await resumeOffset(url, offset);
      continue;
    }
    if (xhr.status !== 204 && xhr.status !== 200) throw proxyError(xhr);
    const reported = Number(xhr.getResponseHeader("Upload-Offset"));
    if (!Number.isInteger(reported) || reported <= offset) {
      throw new Error(`the storage proxy did not move the upload on (Upload-Offset ${xhr.getResponseHeader("Upload-Offset")})`);
    }
    offset = reported;
    failures = 0;
    onProgress(offset, file.size);
  }
  onProgress(file.size, file.size);
}

async function resumeOffset(url, fallback) {
  try {
    const xhr = await tusRequest("HEAD", url);
    const offset = Number(xhr.getResponseHeader("Upload-Offset"));
    if (xhr.status === 200 && Number.isInteger(offset)) return offset;
  } catch {
    // the proxy is unreachable for now: try the same offset again
  }
  return fallback;
}
