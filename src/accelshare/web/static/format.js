// Pure helpers: exact decimal checks, slot formatting from the plugins' UI metadata, ages.
// Amounts arrive as decimal strings ("0.6", "2147483648"); they are never parsed into
// floats for a validity check, only for display.

const GIB = 2 ** 30;
const BINARY_UNITS = { KiB: 2 ** 10, MiB: 2 ** 20, GiB: GIB, TiB: 2 ** 40 };
const SLOT_ORDER = ["cpu", "mem"];

/** Split a decimal string into [BigInt digits, scale] ("0.25" -> [25n, 2]); null if not a decimal. */
export function parseDecimal(text) {
  const match = /^\s*(\d*)(?:\.(\d*))?\s*$/.exec(String(text));
  if (!match || (match[1] === "" && (match[2] ?? "") === "")) return null;
  const frac = match[2] ?? "";
  return [BigInt((match[1] || "0") + frac), frac.length];
}

function scaled([digits, scale], to) {
  return digits * 10n ** BigInt(to - scale);
}

function decimalText(units, scale) {
  const sign = units < 0n ? "-" : "";
  const abs = (units < 0n ? -units : units).toString().padStart(scale + 1, "0");
  if (scale === 0) return sign + abs;
  const text = `${abs.slice(0, -scale)}.${abs.slice(-scale)}`.replace(/\.?0+$/, "");
  return sign + text;
}

/** Is ``value`` a multiple of ``quantum`` (both decimal strings)?  Returns
 * ``{ok: true}`` or ``{ok: false, below, above}`` with the nearest valid amounts. */
export function checkQuantum(value, quantum) {
  const v = parseDecimal(value);
  const q = parseDecimal(quantum);
  if (!v || !q || q[0] === 0n) return { ok: true };
  const scale = Math.max(v[1], q[1]);
  const vs = scaled(v, scale);
  const qs = scaled(q, scale);
  const rest = vs % qs;
  if (rest === 0n) return { ok: true };
  return { ok: false, below: decimalText(vs - rest, scale), above: decimalText(vs - rest + qs, scale) };
}

export function isWholeNumber(value) {
  const v = parseDecimal(value);
  return v !== null && v[0] % 10n ** BigInt(v[1]) === 0n;
}

function meta(details, slot) {
  return (
    details?.[slot] ?? {
      slot_name: slot,
      human_readable_name: slot,
      display_unit: "",
      number_format: { binary: false, round_length: 0 },
    }
  );
}

/** The variant a slot name carries after ":" — "MIG 10g" for "cuda.device:10g-mig",
 * "" for "cuda.device" — so that slots sharing one human-readable name stay apart. */
export function slotVariant(slot) {
  const colon = String(slot).indexOf(":");
  if (colon === -1) return "";
  const variant = String(slot).slice(colon + 1);
  const mig = /^(.+)-mig$/i.exec(variant);
  return mig ? `MIG ${mig[1]}` : variant;
}

/** "CPU", "GPU", and for a variant slot the variant too: "MIG GPU 10g" (the plugin names
 * every MIG profile "MIG GPU"; three inputs labelled alike would be indistinguishable). */
export function slotLabel(details, slot) {
  const name = meta(details, slot).human_readable_name || slot;
  const variant = slotVariant(slot);
  if (!variant || name === slot) return name;
  // "MIG GPU" + "MIG 10g" -> "MIG GPU 10g"; "GPU" + "MIG 10g" -> "GPU MIG 10g".
  const words = variant.split(" ").filter((word) => !name.split(" ").includes(word));
  return words.length ? `${name} ${words.join(" ")}` : name;
}

export function slotUnit(details, slot) {
  return meta(details, slot).display_unit || "";
}

/** How many raw units one displayed unit is (1 GiB = 2^30 bytes for a binary GiB slot). */
export function unitScale(details, slot) {
  const m = meta(details, slot);
  if (m.number_format?.binary) return BINARY_UNITS[m.display_unit] ?? GIB;
  return 1;
}

/** A number in display units, with the slot's decimal places ("0.50", "2"). */
export function displayNumber(details, slot, raw) {
  const m = meta(details, slot);
  const places = Number(m.number_format?.round_length ?? 0);
  const value = Number(raw) / unitScale(details, slot);
  if (!Number.isFinite(value)) return String(raw);
  const fixed = value.toFixed(places);
  if (Number(fixed) === value) return fixed;
  // Rounding would hide part of the amount (1.5 GiB at round_length 0): show more places.
  return String(Number(value.toFixed(Math.max(places, 2))));
}

/** "0.50 fGPU", "2 GiB", "1 Core"; a variant slot names its variant: "1 GPU (MIG 10g)". */
export function formatAmount(details, slot, raw) {
  const unit = slotUnit(details, slot);
  const number = displayNumber(details, slot, raw);
  const text = unit ? `${number} ${unit}` : number;
  const variant = slotVariant(slot);
  return variant ? `${text} (${variant})` : text;
}

export function orderedSlots(slots) {
  return Object.keys(slots).sort((a, b) => {
    const ia = SLOT_ORDER.indexOf(a);
    const ib = SLOT_ORDER.indexOf(b);
    if (ia !== -1 || ib !== -1) return (ia === -1 ? 99 : ia) - (ib === -1 ? 99 : ib);
    return a.localeCompare(b);
  });
}

/** [{slot, text}] for the non-zero amounts of a slot mapping, cpu and mem first. */
export function formatSlots(details, slots) {
  return orderedSlots(slots ?? {})
    .filter((slot) => Number(slots[slot]) !== 0)
    .map((slot) => ({ slot, text: formatAmount(details, slot, slots[slot]) }));
}

/** "42s", "5m", "2h 5m", "3d 4h" since ``iso`` at ``nowMs``. */
export function age(iso, nowMs = Date.now()) {
  if (!iso) return "";
  const seconds = Math.max(0, Math.floor((nowMs - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return `${hours}h ${minutes % 60}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

export function shortId(id) {
  return String(id).length > 13 ? `${String(id).slice(0, 8)}…${String(id).slice(-4)}` : String(id);
}

/** A tiny element builder: h("td", {class: "x"}, "text", child). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** The Owner cell of a session row (admins only): the owner's e-mail, with the access
 * key and the domain on hover (the key alone when the listing has no e-mail). */
export function ownerCell(session) {
  const key = session.accessKey ?? "";
  const title = session.domainName ? `${key} · domain ${session.domainName}` : key;
  if (!session.ownerEmail) return h("td", { class: "owner-col mono", title }, key);
  return h("td", { class: "owner-col", title }, session.ownerEmail);
}

/** "A", "A and B", "A, B and C". */
function andList(items) {
  if (items.length < 2) return items.join("");
  return `${items.slice(0, -1).join(", ")} and ${items[items.length - 1]}`;
}

/** One device shortage of the scheduler ({agent, slot, needs, devices: [{id, free,
 * capacity}]}) in words: "Needs 0.50 fGPU: GPU 0 and GPU 1 are full (0.00 of 1.00 fGPU
 * free each)."  A device is named by its place in the agent's list (as on the Agents
 * page); ``onAgent`` adds the agent's id when several agents are described. */
function shortageText(details, shortage, onAgent) {
  const slot = shortage.slot;
  const label = slotLabel(details, slot);
  const groups = new Map();
  (shortage.devices ?? []).forEach((device, index) => {
    const key = `${device.free}|${device.capacity}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(`${label} ${index}`);
  });
  const parts = [];
  for (const [key, names] of groups) {
    const [free, capacity] = key.split("|");
    const several = names.length > 1;
    const amounts = `${displayNumber(details, slot, free)} of ${formatAmount(details, slot, capacity)} free${several ? " each" : ""}`;
    parts.push(
      Number(free) === 0
        ? `${andList(names)} ${several ? "are" : "is"} full (${amounts})`
        : `${andList(names)} ${several ? "have" : "has"} ${amounts}`,
    );
  }
  const where = onAgent ? ` on ${shortage.agent}` : "";
  return `Needs ${formatAmount(details, slot, shortage.needs)}${where}: ${parts.join("; ")}.`;
}

/** Why a PENDING session waits, in the console's terms, when the scheduler recorded the
 * accelerator devices it could not get (``statusData.scheduler.devices``); null
 * otherwise (the scheduler's own text is shown then). */
export function pendingReason(details, scheduler) {
  const shortages = scheduler?.devices ?? [];
  if (scheduler?.kind !== "no-agent" || shortages.length === 0) return null;
  const several = new Set(shortages.map((s) => s.agent)).size > 1;
  return shortages.map((s) => shortageText(details, s, several)).join(" ");
}
