// The launch dialog: image (a picker of the catalogue's versions, or a typed name), the
// apps (services) the image declares, a slider + number per known slot (display unit, decimal
// places and the fractional quantum from the API) or a checkbox per unique slot (a MIG
// slice: requested as exactly 1 or not at all), how many sessions, advanced resource
// options; every field is checked before anything is sent.

import { api } from "./api.js";
import {
  checkQuantum,
  displayNumber,
  isWholeNumber,
  orderedSlots,
  parseDecimal,
  slotLabel,
  slotUnit,
  unitScale,
  h,
} from "./format.js";
import { mountFields, mountPathProblem } from "./transfer.js";

const $ = (id) => document.getElementById(id);
const MAX_COUNT = 10;
const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const DEFAULTS = { cpu: "1", mem: "1" }; // in display units; accelerators start at 0
const INTRINSIC = new Set(["cpu", "mem"]);

const fieldId = (slot) => `res-${slot.replace(/[^A-Za-z0-9]/g, "-")}`;

/** What one slot's inputs need: label, unit, step, range, and how to send the value. */
function slotSpec(ctx, slot) {
  const details = ctx.details;
  const meta = details[slot] ?? {};
  const places = Number(meta.number_format?.round_length ?? 0);
  const limit = ctx.limits[slot] ?? {};
  const quantum = limit.quantum ?? null;
  const scale = unitScale(details, slot);
  const max = limit.max_per_agent != null ? Number(limit.max_per_agent) / scale : null;
  return {
    slot,
    unique: ctx.slotTypes[slot] === "unique", // a whole device slice: exactly 1, or 0
    id: fieldId(slot),
    label: slotLabel(details, slot),
    unit: slotUnit(details, slot),
    quantum,
    step: quantum ?? (places > 0 ? (10 ** -places).toFixed(places) : "1"),
    whole: quantum === null && places === 0 && ctx.slotTypes[slot] !== "bytes",
    required: INTRINSIC.has(slot), // the API refuses cpu=0 / mem=0 ("must be positive")
    scale,
    max,
    maxText: max != null ? displayNumber(details, slot, limit.max_per_agent) : null,
  };
}

/** A unique slot (a MIG slice) is one checkbox: checked sends exactly 1. */
function uniqueField(spec) {
  const box = h("input", {
    id: spec.id,
    name: spec.slot,
    type: "checkbox",
    value: "1",
    disabled: spec.max != null && spec.max < 1,
    "aria-describedby": `err-${spec.id} hint-${spec.id} unused-${spec.id}`,
  });
  const available = spec.maxText ? ` · the largest agent has ${spec.maxText}` : "";
  return h(
    "div",
    { class: "slot-field unique", dataset: { slot: spec.slot } },
    h("div", { class: "check" }, box, h("label", { for: spec.id }, `${spec.label} `, h("span", { class: "muted" }, "(one slice)"))),
    h("p", { class: "hint", id: `hint-${spec.id}` }, `${spec.slot} · a whole slice: requested as exactly 1${available}`),
    h("p", { class: "hint unused", id: `unused-${spec.id}`, hidden: true }),
    h("p", { class: "field-error", id: `err-${spec.id}`, hidden: true }),
  );
}

/** The value a slot's input holds, as a decimal string in display units. */
function valueOf(spec) {
  const input = $(spec.id);
  if (spec.unique) return input.checked ? "1" : "0";
  return input.value.trim();
}

function slotField(spec) {
  if (spec.unique) return uniqueField(spec);
  const number = h("input", {
    id: spec.id,
    name: spec.slot,
    type: "number",
    inputmode: "decimal",
    min: "0",
    max: spec.max ?? false,
    step: spec.step,
    value: DEFAULTS[spec.slot] && (spec.max == null || spec.max >= Number(DEFAULTS[spec.slot])) ? DEFAULTS[spec.slot] : "0",
    "aria-describedby": `err-${spec.id} hint-${spec.id} unused-${spec.id}`,
  });
  const range = h("input", {
    type: "range",
    id: `${spec.id}-range`,
    min: "0",
    max: String(spec.max ?? Math.max(16, Number(number.value))),
    step: spec.step,
    value: number.value,
    "aria-label": `${spec.label} (${spec.unit || spec.slot}) slider`,
  });
  range.addEventListener("input", () => {
    number.value = range.value;
    number.dispatchEvent(new Event("input", { bubbles: true }));
  });
  number.addEventListener("input", () => {
    if (number.value !== "") range.value = number.value;
  });
  const hints = [];
  if (spec.quantum) hints.push(`steps of ${spec.quantum}`);
  if (spec.maxText) hints.push(`up to ${spec.maxText} ${spec.unit} per agent`);
  return h(
    "div",
    { class: "slot-field", dataset: { slot: spec.slot } },
    h("label", { for: spec.id }, `${spec.label} `, h("span", { class: "muted" }, `(${spec.unit || spec.slot})`)),
    h("div", { class: "slot-inputs" }, range, number, h("span", { class: "unit", "aria-hidden": "true" }, spec.unit)),
    h("p", { class: "hint", id: `hint-${spec.id}` }, `${spec.slot}${hints.length ? ` · ${hints.join(" · ")}` : ""}`),
    h("p", { class: "hint unused", id: `unused-${spec.id}`, hidden: true }),
    h("p", { class: "field-error", id: `err-${spec.id}`, hidden: true }),
  );
}

function setError(input, errorEl, message) {
  errorEl.textContent = message || "";
  errorEl.hidden = !message;
  if (message) input.setAttribute("aria-invalid", "true");
  else input.removeAttribute("aria-invalid");
}

/** Check one slot's value (a string in display units); "" when fine. */
export function slotProblem(spec, value) {
  const who = fieldName(spec);
  if (value === "" || parseDecimal(value) === null) {
    return Number(value) < 0 ? `${who} cannot be negative.` : `${who}: enter a number.`;
  }
  if (spec.required && Number(value) <= 0) return `${who} must be more than 0.`;
  if (spec.unique && value !== "0" && value !== "1") {
    return `${who} is a whole slice: request exactly 1, or 0 for none.`;
  }
  if (spec.quantum) {
    const check = checkQuantum(value, spec.quantum);
    if (!check.ok) {
      const options = Number(check.below) > 0 ? `${check.below} or ${check.above}` : check.above;
      return `${value} ${spec.unit} is not a multiple of the quantum ${spec.quantum}: use ${options}.`;
    }
  }
  if (spec.whole && !isWholeNumber(value)) return `${who} must be a whole number.`;
  if (spec.max != null && Number(value) > spec.max) {
    return `${who}: at most ${spec.maxText} ${spec.unit} fits on one agent.`;
  }
  return "";
}

function validate(form, specs) {
  const problems = [];
  const image = imageInput(form);
  const imageProblem = pickedImage(form) ? "" : "Pick an image, or type the name of another one.";
  setError(image, $("err-image"), imageProblem);
  if (imageProblem) problems.push(image);

  const name = form.elements.name;
  const nameProblem =
    name.value.trim() === "" || NAME_RE.test(name.value.trim())
      ? ""
      : "A name is 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit.";
  setError(name, $("err-name"), nameProblem);
  if (nameProblem) problems.push(name);

  const count = form.elements.count;
  const n = Number(count.value);
  const countProblem =
    Number.isInteger(n) && n >= 1 && n <= MAX_COUNT && count.value !== ""
      ? ""
      : `Launch between 1 and ${MAX_COUNT} sessions at once.`;
  setError(count, $("err-count"), countProblem);
  if (countProblem) problems.push(count);

  for (const spec of specs) {
    const input = $(spec.id);
    const problem = slotProblem(spec, valueOf(spec));
    setError(input, $(`err-${spec.id}`), problem);
    if (problem) problems.push(input);
  }
  return problems;
}

/** The catalogue image ``name`` stands for (an alias or a reference), or undefined. */
function resolveImage(catalogue, name) {
  return (
    catalogue.find((img) => img.aliases.includes(name)) ?? catalogue.find((img) => img.ref === name)
  );
}

/** One line about what the typed image resolves to (shown under the field). */
function describeImage(catalogue, name) {
  if (!name) return "";
  const img = resolveImage(catalogue, name);
  if (!img) return catalogue.length ? "Not in the image catalogue: sent as typed." : "";
  const parts = [name === img.ref ? img.ref : `${name} → ${img.ref}`];
  if (img.description) parts.push(img.description);
  parts.push(`accelerators: ${img.accelerators.length ? img.accelerators.join(", ") : "none"}`);
  const minimum = Object.entries(img.min_slots ?? {});
  if (minimum.length) parts.push(`minimum: ${minimum.map(([k, v]) => `${k}=${v}`).join(" ")}`);
  return parts.join(" · ");
}

/** The name the dialog gives a slot's field: "GPU (fGPU)". */
const fieldName = (spec) => `${spec.label} (${spec.unit || spec.slot})`;

/** Accelerator fields the picked image cannot use ("accelerators: none", or another
 * device family) are disabled at 0, with the reason under them; an image not in the
 * catalogue leaves every field as it is (the server decides). */
function applyImageAccelerators(specs, img) {
  for (const spec of specs) {
    if (INTRINSIC.has(spec.slot)) continue;
    const family = spec.slot.split(".")[0];
    const unused = Boolean(img) && !img.accelerators.includes(family);
    const inputs = [$(spec.id), $(`${spec.id}-range`)].filter(Boolean);
    const note = $(`unused-${spec.id}`);
    const field = $(spec.id).closest(".slot-field");
    if (unused && !field.classList.contains("not-used")) {
      for (const input of inputs) {
        input.dataset.before = input.type === "checkbox" ? String(input.checked) : input.value;
        if (input.type === "checkbox") input.checked = false;
        else input.value = "0";
        input.dataset.wasDisabled = String(input.disabled);
        input.disabled = true;
      }
      setError($(spec.id), $(`err-${spec.id}`), "");
    } else if (!unused && field.classList.contains("not-used")) {
      for (const input of inputs) {
        if (input.type === "checkbox") input.checked = input.dataset.before === "true";
        else input.value = input.dataset.before ?? "0";
        input.disabled = input.dataset.wasDisabled === "true";
      }
    }
    field.classList.toggle("not-used", unused);
    note.hidden = !unused;
    note.textContent = unused
      ? `Not used by ${img.ref} (accelerators: ${img.accelerators.length ? img.accelerators.join(", ") : "none"}).`
      : "";
  }
}

/** A server refusal of one slot (``field`` config.resources.<slot>), in the dialog's
 * words: the slot's name becomes the field's ("cuda.shares" -> "GPU (fGPU)"). */
function slotRefusal(specs, error) {
  const field = error.body?.field ?? "";
  const spec = specs.find((s) => field === `config.resources.${s.slot}`);
  if (!spec) return null;
  return { spec, message: error.message.split(spec.slot).join(fieldName(spec)) };
}

// -- the image picker and the apps (declared services) ----------------------------------

const OTHER = "__other__"; // the picker's "another image" entry: a name typed by hand
const SERVICE_PORTS_LABEL = "ai.backend.service-ports"; // "jupyter:http:8888,..."
const APP_TITLES = { jupyter: "Jupyter" };

/** The app services an image declares (its ``ai.backend.service-ports`` label). */
export function declaredServices(img) {
  const text = img?.labels?.[SERVICE_PORTS_LABEL] ?? "";
  const found = [];
  for (const part of text.split(",")) {
    const [name, protocol, port] = part.trim().split(":");
    if (name && protocol === "http" && /^[0-9]+$/.test(port ?? "")) {
      found.push({ name, protocol, port: Number(port) });
    }
  }
  return found;
}

/** The picker: one group per image name, one option per version (its reference),
 * saying its aliases and accelerators; then "Another image…". */
function imagePicker(catalogue) {
  const groups = new Map();
  for (const img of [...catalogue].sort((a, b) => a.ref.localeCompare(b.ref, undefined, { numeric: true }))) {
    const name = img.name ?? img.ref.split(":")[0];
    if (!groups.has(name)) groups.set(name, []);
    groups.get(name).push(img);
  }
  const children = [];
  for (const [name, images] of groups) {
    const options = images.map((img) => {
      const accel = img.accelerators.length ? img.accelerators.join(", ") : "CPU only";
      const alias = img.aliases.length ? ` (${img.aliases.join(", ")})` : "";
      return h("option", { value: img.ref }, `${img.ref}${alias} · ${accel}`);
    });
    children.push(h("optgroup", { label: name }, ...options));
  }
  children.push(h("option", { value: OTHER }, "Another image (type its name)…"));
  return children;
}

/** The field that holds the image's name: the picker, or the typed name's input. */
function imageInput(form) {
  return form.elements.image.value === OTHER ? form.elements.imageOther : form.elements.image;
}

/** The image name to send: the picked reference, or the typed name. */
function pickedImage(form) {
  return form.elements.image.value === OTHER
    ? form.elements.imageOther.value.trim()
    : form.elements.image.value;
}

/** The picker's first choice: the image aliased ``python``, else the first one. */
function defaultImage(catalogue) {
  return (resolveImage(catalogue, "python") ?? catalogue[0])?.ref ?? OTHER;
}

/** One checkbox per app the image declares (checked: the session gets that service). */
function showApps(img) {
  const services = declaredServices(img);
  $("launch-apps").hidden = services.length === 0;
  $("launch-apps-list").replaceChildren(
    ...services.map((service) =>
      h(
        "div",
        { class: "check" },
        h("input", {
          type: "checkbox",
          id: `app-${service.name}`,
          name: "apps",
          value: service.name,
          checked: true,
          dataset: { port: String(service.port) },
        }),
        h("label", { for: `app-${service.name}` }, `${APP_TITLES[service.name] ?? service.name} `,
          h("span", { class: "muted" }, `(${service.name}, port ${service.port})`)),
      ),
    ),
  );
}

/** ``config.service_ports`` of the ticked apps. */
function pickedApps() {
  return [...document.querySelectorAll('#launch-apps-list input[name="apps"]:checked')].map((box) => ({
    name: box.value,
    protocol: "http",
    port: Number(box.dataset.port),
  }));
}

function resourcesOf(specs) {
  const resources = {};
  for (const spec of specs) {
    const value = valueOf(spec);
    if (Number(value) === 0) continue;
    resources[spec.slot] = spec.scale === 1 ? value : String(Math.round(Number(value) * spec.scale));
  }
  return resources;
}

// -- the mount picker: storage folders to mount (its own section; see transfer.js) --------

/** One row per usable folder: a checkbox, read-only / read-write, an optional path. A
 * folder shared read-only can only be mounted read-only. */
function mountRow(folder, index) {
  const id = `mount-${index}`;
  const readOnlyOnly = folder.permission === "ro";
  const box = h("input", { type: "checkbox", id, dataset: { folder: folder.name }, "aria-describedby": "err-mounts" });
  const mode = h(
    "select",
    { id: `${id}-mode`, "aria-label": `Access to ${folder.name}`, disabled: readOnlyOnly },
    h("option", { value: "rw", disabled: readOnlyOnly }, "read-write"),
    h("option", { value: "ro", selected: readOnlyOnly }, "read-only"),
  );
  if (readOnlyOnly) mode.value = "ro";
  const path = h("input", {
    id: `${id}-path`,
    autocomplete: "off",
    placeholder: `/home/work/${folder.name}`,
    "aria-label": `Mount path of ${folder.name}`,
  });
  return h(
    "div",
    { class: "mount-row", dataset: { folder: folder.name } },
    box,
    h("label", { for: id }, folder.name),
    path,
    mode,
  );
}

/** Fill the picker with the caller's folders (not those in the trash). */
async function loadMountPicker() {
  const list = $("launch-mount-list");
  $("err-mounts").hidden = true;
  let folders = [];
  try {
    folders = (await api("GET", "/folders")).filter((f) => ["ready", "mounted"].includes(f.status));
  } catch {
    list.replaceChildren(h("p", { class: "hint" }, "Your storage folders could not be read."));
    return;
  }
  $("launch-mounts").hidden = folders.length === 0;
  list.replaceChildren(...folders.map(mountRow));
}

/** The picked folders as the create request's mount fields, or {problem, input}. */
function pickedMounts() {
  const choices = [];
  for (const row of document.querySelectorAll("#launch-mount-list .mount-row")) {
    const box = row.querySelector("input[type=checkbox]");
    if (!box.checked) continue;
    const pathInput = row.querySelector("input:not([type])");
    const path = pathInput.value.trim();
    const problem = mountPathProblem(path);
    if (problem) return { problem: `${row.dataset.folder}: ${problem}`, input: pathInput };
    choices.push({ name: row.dataset.folder, path, readOnly: row.querySelector("select").value === "ro" });
  }
  return { fields: mountFields(choices) };
}

export async function openLaunchDialog(ctx) {
  const dialog = $("launch-dialog");
  const form = $("launch-form");
  await ctx.refreshSlots().catch(() => {});
  const specs = orderedSlots(ctx.slotTypes).map((slot) => slotSpec(ctx, slot));
  $("launch-slots").replaceChildren(...specs.map(slotField));
  form.reset();
  for (const el of form.querySelectorAll(".field-error, #launch-error")) el.hidden = true;
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  const catalogue = await api("GET", "/images")
    .then((answer) => answer.items ?? [])
    .catch(() => []);
  form.elements.image.replaceChildren(...imagePicker(catalogue));
  form.elements.image.value = defaultImage(catalogue);
  await loadMountPicker();
  let shownImage = null;
  const showImage = () => {
    const other = form.elements.image.value === OTHER;
    $("launch-image-other-field").hidden = !other;
    const typed = pickedImage(form);
    const img = typed ? resolveImage(catalogue, typed) : undefined;
    $("hint-image").textContent = describeImage(catalogue, typed);
    applyImageAccelerators(specs, img);
    if (shownImage !== (img?.ref ?? null)) {
      shownImage = img?.ref ?? null;
      showApps(img);
    }
  };
  showImage();
  let tried = false;

  form.oninput = () => {
    showImage();
    if (tried) {
      validate(form, specs);
      setError($("launch-mount-list"), $("err-mounts"), pickedMounts().problem);
    }
  };
  $("launch-cancel").onclick = () => dialog.close();
  form.onsubmit = async (event) => {
    event.preventDefault();
    tried = true;
    const launchError = $("launch-error");
    launchError.hidden = true;
    const problems = validate(form, specs);
    const mounts = pickedMounts();
    setError($("launch-mount-list"), $("err-mounts"), mounts.problem);
    if (mounts.problem) problems.push(mounts.input);
    if (problems.length) {
      problems[0].focus();
      return;
    }
    const count = Number(form.elements.count.value);
    const name = form.elements.name.value.trim();
    const fragmentation = form.elements.fragmentation.value;
    const config = { resources: resourcesOf(specs), ...mounts.fields };
    // the ticked apps; with the Apps group shown, none ticked is none (absent: the image's)
    if (!$("launch-apps").hidden) config.service_ports = pickedApps();
    if (fragmentation) {
      config.resource_opts = { allow_fractional_resource_fragmentation: fragmentation === "allow" };
    }
    const submit = $("launch-submit");
    submit.disabled = true;
    const failures = [];
    let launched = 0;
    try {
      for (let i = 1; i <= count; i += 1) {
        const body = { image: pickedImage(form), type: "interactive", config };
        if (name) body.name = count > 1 ? `${name}-${i}` : name;
        try {
          await api("POST", "/session", body);
          launched += 1;
        } catch (error) {
          const refusal = slotRefusal(specs, error);
          if (refusal) {
            // one slot refused (e.g. an accelerator the image has no use for): said in
            // the dialog's words, under that field too; the next sessions would be too
            failures.push(`${body.name ?? `session ${i}`}: ${refusal.message}`);
            setError($(refusal.spec.id), $(`err-${refusal.spec.id}`), refusal.message);
            break;
          }
          failures.push(`${body.name ?? `session ${i}`}: ${error.message}`);
          if (/^(config\.)?mount/.test(error.body?.field ?? "")) {
            // a folder that cannot be mounted (not found, no access): the next would fail too
            setError($("launch-mount-list"), $("err-mounts"), error.message);
            break;
          }
          if (error.body?.field === "image") {
            // the image itself was refused (unknown, or no agent can run it): the next
            // sessions would be too; the reason goes under the field as well
            setError(imageInput(form), $("err-image"), error.message);
            break;
          }
        }
      }
    } finally {
      submit.disabled = false;
    }
    if (failures.length) {
      const refused = count - launched;
      launchError.textContent = `${launched} launched, ${refused} refused — ${failures.join("; ")}`;
      launchError.hidden = false;
      launchError.focus(); // a keyboard or screen-reader user lands on the server's reason
      return;
    }
    dialog.close();
    ctx.toast(`Launched ${launched} session${launched === 1 ? "" : "s"}.`);
  };
  dialog.showModal();
  imageInput(form).focus();
}
