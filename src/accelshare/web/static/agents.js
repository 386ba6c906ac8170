// Agents page (admins): a cluster summary, then each agent with its slots and, per
// device, a bar of allocated/capacity, the sessions holding it and its live stats —
// all from GET /events/agents (live allocation maps and the plugins' node stats).
// A domain admin gets other domains' kernels as "hidden-N" with {hidden: true}: they
// are shown as "another domain's session", with their amounts (the bars still add up).

import { follow } from "./api.js";
import { age, displayNumber, formatAmount, h, orderedSlots, shortId, slotLabel, slotUnit } from "./format.js";

const $ = (id) => document.getElementById(id);
const INTRINSIC = new Set(["cpu", "mem"]);
export const HIDDEN_HOLDER = "another domain's session";

function amountPair(details, slot, allocated, capacity) {
  const unit = slotUnit(details, slot);
  const text = `${displayNumber(details, slot, allocated)} / ${displayNumber(details, slot, capacity)}`;
  return unit ? `${text} ${unit}` : text;
}

function meter(label, allocated, capacity, text) {
  const cap = Number(capacity);
  const used = Number(allocated);
  const percent = cap > 0 ? Math.min(100, (used / cap) * 100) : 0;
  const level = percent >= 100 ? "full" : percent >= 75 ? "high" : "ok";
  return h(
    "div",
    { class: "meter-row" },
    h(
      "div",
      {
        class: `meter level-${level}`,
        role: "meter",
        "aria-label": label,
        "aria-valuemin": "0",
        "aria-valuemax": String(cap),
        "aria-valuenow": String(used),
        "aria-valuetext": text,
      },
      h("div", { class: "fill", style: `width: ${percent.toFixed(1)}%` }),
    ),
    h("span", { class: "meter-text" }, text),
  );
}

function summary(ctx, items) {
  const total = {};
  const used = {};
  for (const { agent } of items) {
    if (agent.status !== "ALIVE") continue;
    for (const [slot, value] of Object.entries(agent.availableSlots)) total[slot] = (total[slot] ?? 0) + Number(value);
    for (const [slot, value] of Object.entries(agent.occupiedSlots)) used[slot] = (used[slot] ?? 0) + Number(value);
  }
  return orderedSlots(total).map((slot) => {
    const text = amountPair(ctx.details, slot, used[slot] ?? 0, total[slot]);
    return h(
      "div",
      { class: "summary-item", dataset: { slot } },
      h("h3", {}, `${slotLabel(ctx.details, slot)} `, h("span", { class: "muted mono" }, slot)),
      meter(`${slotLabel(ctx.details, slot)} used in the cluster`, used[slot] ?? 0, total[slot], text),
    );
  });
}

function statsOf(stats, key, deviceId) {
  const found = {};
  for (const metric of stats?.metrics ?? []) {
    if (metric.device_id !== deviceId || !metric.name.startsWith(`${key}_`)) continue;
    found[metric.name.slice(key.length + 1)] = metric;
  }
  return found;
}

function statsList(found) {
  const entries = [];
  const number = (m, digits = 0) => Number(m.value).toFixed(digits);
  if (found.util) entries.push(["Utilisation", `${number(found.util, 1)} %`]);
  if (found.mem) {
    const gib = (v) => (Number(v) / 2 ** 30).toFixed(2);
    entries.push(["Memory", found.mem.capacity ? `${gib(found.mem.value)} / ${gib(found.mem.capacity)} GiB` : `${gib(found.mem.value)} GiB`]);
  }
  if (found.power) entries.push(["Power", `${number(found.power)} W`]);
  if (found.temperature) entries.push(["Temperature", `${number(found.temperature)} °C`]);
  if (!entries.length) return null;
  return h(
    "dl",
    { class: "stats" },
    entries.map(([term, value]) => h("div", {}, h("dt", {}, term), h("dd", {}, value))),
  );
}

// A fractional holder's part of the whole device ("one session occupying about 25 % of
// the GPU"); whole devices and MIG slices are held entirely, so nothing is added.
function sharePart(device, amount) {
  const capacity = Number(device.capacity);
  if (!device.slot_name.endsWith(".shares") || !(capacity > 0)) return null;
  const percent = Math.round((Number(amount) / capacity) * 100);
  return h("span", { class: "holder-share muted" }, ` · ${percent} % of the device`);
}

function holders(ctx, device, kernels) {
  const entries = Object.entries(device.kernels ?? {});
  if (!entries.length) return h("p", { class: "holders muted" }, "free");
  return h(
    "ul",
    { class: "holders", "aria-label": "Held by" },
    entries.map(([kernelId, amount]) => {
      const who = kernels[kernelId];
      const name = who?.hidden
        ? h("span", { class: "holder-name hidden-holder muted" }, HIDDEN_HOLDER)
        : h("span", { class: "holder-name", title: `kernel ${kernelId}` }, who?.sessionName ?? shortId(kernelId));
      return h(
        "li",
        { dataset: { kernelId } },
        name,
        " ",
        h("span", { class: "muted" }, formatAmount(ctx.details, device.slot_name, amount)),
        sharePart(device, amount),
      );
    }),
  );
}

function deviceRow(ctx, key, device, stats, kernels) {
  const label = `${device.model_name || key} ${shortId(device.device_id)}`;
  const text = amountPair(ctx.details, device.slot_name, device.allocated, device.capacity);
  return h(
    "li",
    { class: "device", dataset: { deviceId: device.device_id, slot: device.slot_name } },
    h(
      "div",
      { class: "device-head" },
      h("span", { class: "device-name", title: device.device_id }, label),
      h("span", { class: "muted mono" }, device.slot_name),
      device.numa_node != null ? h("span", { class: "muted" }, `NUMA ${device.numa_node}`) : null,
    ),
    meter(`Allocation of ${label}`, device.allocated, device.capacity, text),
    holders(ctx, device, kernels),
    statsList(statsOf(stats, key, device.device_id)),
  );
}

function intrinsicRow(ctx, key, map) {
  let allocated = 0;
  let capacity = 0;
  for (const device of map.devices) {
    allocated += Number(device.allocated);
    capacity += Number(device.capacity);
  }
  const slot = map.devices[0]?.slot_name ?? key;
  const text = amountPair(ctx.details, slot, allocated, capacity);
  return h(
    "li",
    { class: "device intrinsic", dataset: { slot } },
    h("div", { class: "device-head" }, h("span", { class: "device-name" }, slotLabel(ctx.details, slot)), h("span", { class: "muted" }, `${map.devices.length} device(s)`)),
    meter(`Allocation of ${slotLabel(ctx.details, slot)}`, allocated, capacity, text),
  );
}

function agentCard(ctx, view, kernels) {
  const { agent, allocMap, stats } = view;
  const maps = allocMap?.maps ?? {};
  const plugins = Object.keys(maps).sort((a, b) => Number(!INTRINSIC.has(a)) - Number(!INTRINSIC.has(b)) || a.localeCompare(b));
  const slots = orderedSlots(agent.availableSlots).map((slot) =>
    h("li", { class: "chip", dataset: { slot } }, `${slotLabel(ctx.details, slot)}: ${amountPair(ctx.details, slot, agent.occupiedSlots[slot] ?? 0, agent.availableSlots[slot])}`),
  );
  return h(
    "article",
    { class: "card agent", dataset: { agentId: agent.id }, "aria-labelledby": `agent-${agent.id}` },
    h(
      "header",
      { class: "agent-head" },
      h("h2", { id: `agent-${agent.id}` }, agent.id),
      h("span", { class: `badge status-${agent.status}` }, agent.status),
      h("span", { class: "muted" }, `${agent.scalingGroup} · ${agent.address} · heartbeat ${age(agent.lastHeartbeat)} ago`),
    ),
    h("ul", { class: "chips", "aria-label": `Slots of ${agent.id}` }, slots),
    allocMap
      ? plugins.map((key) =>
          h(
            "section",
            { class: "plugin", dataset: { plugin: key } },
            h("h3", {}, `${key} `, h("span", { class: "muted" }, `${maps[key].kind}${maps[key].quantum ? `, quantum ${maps[key].quantum}` : ""}`)),
            h(
              "ul",
              { class: "devices" },
              INTRINSIC.has(key)
                ? intrinsicRow(ctx, key, maps[key])
                : maps[key].devices.map((device) => deviceRow(ctx, key, device, stats, kernels)),
            ),
          ),
        )
      : h("p", { class: "muted" }, "No live allocation map (the agent is not alive)."),
    allocMap?.source === "heartbeat" ? h("p", { class: "muted" }, "The agent did not answer; showing its last heartbeat.") : null,
  );
}

export function mountAgents(ctx) {
  const list = $("agents-list");
  const live = $("agents-live");
  const close = follow(
    "/events/agents",
    "agents",
    (data) => {
      $("cluster-summary").replaceChildren(...summary(ctx, data.items));
      list.replaceChildren(...data.items.map((view) => agentCard(ctx, view, data.kernels ?? {})));
      $("agents-empty").hidden = data.items.length > 0;
    },
    (state) => {
      live.textContent = state;
      live.dataset.state = state;
    },
  );
  ctx.refreshSlots().catch(() => {});
  return close;
}
