// Entry point: who is logged in, the hash router (#/sessions, #/history, #/data, #/agents), the login page.

import { api, hasCsrfToken, login, logout, recoverCsrfToken, setUnauthorizedHandler } from "./api.js";
import { mountAgents } from "./agents.js";
import { mountData } from "./data.js";
import { mountHistory } from "./history.js";
import { mountSessions } from "./sessions.js";

const $ = (id) => document.getElementById(id);
const PAGES = { sessions: mountSessions, history: mountHistory, data: mountData, agents: mountAgents };
const TITLES = { sessions: "Sessions", history: "History", data: "Data", agents: "Agents" };

const ctx = {
  me: null, // GET /whoami
  details: {}, // GET /config/resource-slots/details
  slotTypes: {}, // GET /config/resource-slots
  limits: {}, // GET /config/resource-slots/limits
  toast,
  async refreshSlots() {
    const [types, details, limits] = await Promise.all([
      api("GET", "/config/resource-slots"),
      api("GET", "/config/resource-slots/details"),
      api("GET", "/config/resource-slots/limits"),
    ]);
    Object.assign(ctx, { slotTypes: types, details, limits });
  },
  get isSuperadmin() {
    return ctx.me?.role === "superadmin";
  },
  get isAdmin() {
    return ctx.me?.role === "admin" || ctx.me?.role === "superadmin";
  },
};

let unmount = null;
let toastTimer = null;

function toast(text) {
  const el = $("toast");
  el.textContent = text;
  el.classList.add("shown");
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.classList.remove("shown"), 4000);
}

function showOnly(id) {
  for (const page of document.querySelectorAll("main > section.page")) page.hidden = page.id !== id;
  $("booting").hidden = true;
}

function showLogin(message) {
  if (unmount) unmount();
  unmount = null;
  ctx.me = null;
  $("nav").hidden = true;
  $("who").hidden = true;
  showOnly("login-page");
  const error = $("login-error");
  error.hidden = !message;
  error.textContent = message || "";
  document.title = "Log in · accelshare";
  $("login-email").focus();
}

function currentPage() {
  const name = location.hash.replace(/^#\/?/, "").split("/")[0] || "sessions";
  if (name === "agents" && !ctx.isAdmin) return "sessions"; // the API answers 403 too
  return PAGES[name] ? name : "sessions";
}

function route() {
  if (!ctx.me) return;
  const name = currentPage();
  if (unmount) unmount();
  showOnly(`${name}-page`);
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.page === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${TITLES[name]} · accelshare`;
  unmount = PAGES[name](ctx);
}

// After the login the focused button is gone with its page: start the keyboard's way
// again from the top, so that the first Tab reaches the skip link (not <body>'s middle).
function focusTop() {
  const body = document.body;
  body.setAttribute("tabindex", "-1");
  body.focus({ preventScroll: true });
  body.removeAttribute("tabindex");
}

async function enter(me) {
  ctx.me = me;
  await ctx.refreshSlots();
  $("who-email").textContent = me.email;
  $("who-role").textContent = me.role;
  $("who").hidden = false;
  $("nav").hidden = false;
  $("nav-agents").hidden = !ctx.isAdmin;
  document.body.classList.toggle("is-admin", ctx.isAdmin);
  route();
}

async function boot() {
  setUnauthorizedHandler((error) => showLogin(error.message || "Please log in again."));
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const email = $("login-email").value.trim();
    const password = $("login-password").value;
    if (!email || !password) {
      showLogin("Enter your email and password.");
      return;
    }
    try {
      await login(email, password);
      $("login-password").value = "";
      await enter(await api("GET", "/whoami"));
      focusTop();
    } catch (error) {
      showLogin(error.message);
    }
  });
  $("logout").addEventListener("click", async () => {
    await logout().catch(() => {});
    showLogin("You are logged out.");
  });
  window.addEventListener("hashchange", route);
  // The cookie may still be valid (a reload, or a new tab: the terminal's brand link);
  // a new tab has no CSRF token yet and reads it again with the cookie (GET /auth/csrf).
  // Without either, the console asks for the password.
  if (!hasCsrfToken() && !(await recoverCsrfToken())) {
    showLogin("");
    return;
  }
  try {
    await enter(await api("GET", "/whoami"));
  } catch {
    showLogin("");
  }
}

boot();
