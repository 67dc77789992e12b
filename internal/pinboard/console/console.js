// The pinboard console: reads the registry API of the admin listener it is
// served from, every 2 s. Every call carries the deployment token in the
// Authorization header (asked once, kept in this tab's sessionStorage),
// never in a cookie, so no page of another origin can make them.
"use strict";

const TOKEN_KEY = "pinboard.console.token";
const REFRESH_MS = 2000;
const ARM_MS = 4000; // a destructive button asks for a second click within this
const SEGMENT = /^[A-Za-z0-9_~@:+=-][A-Za-z0-9._~@:+=-]{0,255}$/; // the id grammar

let token = sessionStorage.getItem(TOKEN_KEY) || "";
let hotNamespace = "";
let refreshing = false;
const armed = new Map(); // action key -> time it disarms

const $ = (sel) => document.querySelector(sel);

// el builds an element; text only ever goes in as text, never as HTML.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function setStatus(text, cls) {
  const s = $("#status");
  s.textContent = text;
  s.className = cls || "";
}

// flash reports the outcome of an action until the next one.
function flash(text, cls) {
  const f = $("#flash");
  f.textContent = text;
  f.className = cls || "";
}

class Unauthorized extends Error {}

async function api(method, path, body) {
  const init = { method, cache: "no-store", credentials: "omit", headers: { Authorization: "Bearer " + token } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  let data = null;
  try { data = await r.json(); } catch (e) { /* not JSON */ }
  if (r.status === 401) throw new Unauthorized((data && data.error) || "the token was refused");
  return { status: r.status, data };
}

function errorText(res) {
  return (res.data && res.data.error) ? res.data.error : "HTTP " + res.status;
}

// ---- token ----

function askToken(message) {
  token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  $("#main").hidden = true;
  $("#forget").hidden = true;
  $("#token-box").hidden = false;
  $("#token-error").textContent = message || "";
  $("#token-input").focus();
  setStatus("not connected");
}

$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("#token-input").value.trim();
  $("#token-input").value = "";
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#token-box").hidden = true;
  $("#main").hidden = false;
  $("#forget").hidden = false;
  refresh();
});

$("#forget").addEventListener("click", () => askToken(""));

// ---- buttons that need a second click ----

function actionButton(key, label, armedLabel, action) {
  const b = el("button", { type: "button", "data-action": key }, label);
  if ((armed.get(key) || 0) > Date.now()) {
    b.classList.add("armed");
    b.textContent = armedLabel;
  }
  b.addEventListener("click", async () => {
    if ((armed.get(key) || 0) <= Date.now()) {
      armed.set(key, Date.now() + ARM_MS);
      b.classList.add("armed");
      b.textContent = armedLabel;
      return;
    }
    armed.delete(key);
    b.disabled = true;
    try {
      await action();
    } catch (e) {
      handleError(e);
    }
    refresh();
  });
  return b;
}

async function push(clientId, type) {
  const res = await api("POST", "/registry/push", { clientId, type });
  if (res.status === 202) flash(type + " queued for " + clientId + ": delivered on its next heartbeat", "ok");
  else flash(type + " for " + clientId + " failed: " + errorText(res), "error");
}

function placementPath(ns, id) {
  return "/registry/placements/" + ns.slice(1) + "/" + id;
}

async function evict(ns, id) {
  const res = await api("DELETE", placementPath(ns, id));
  if (res.status === 202) {
    const how = res.data.released ? "its holder had ended: placement deleted" : "the holder closes it on its next heartbeat";
    flash("evict " + ns + "/" + id + ": " + how, "ok");
  } else {
    flash("evict " + ns + "/" + id + " failed: " + errorText(res), "error");
  }
  if ($("#lookup-result").dataset.name === ns + "/" + id) lookup(ns, id);
}

// ---- rendering ----

function ago(ms) {
  if (!ms) return "—";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 60 ? s.toFixed(1) + " s ago" : Math.round(s / 60) + " min ago";
}

function num(v, digits) {
  return el("td", { class: "num" }, digits === undefined ? String(v) : Number(v).toFixed(digits));
}

function renderWorkers(workers, rates) {
  const body = $("#workers tbody");
  body.replaceChildren();
  const now = Date.now();
  for (const w of workers) {
    const live = Object.values(w.placements || {}).reduce((a, b) => a + b, 0);
    const left = Math.max(0, (w.expiresAtMs - now) / 1000);
    let draining = w.draining ? "draining" : "no";
    if (w.draining && w.drainDeadline) draining += " (deadline " + new Date(w.drainDeadline).toLocaleTimeString() + ")";
    const tr = el("tr", { "data-client": w.clientId, "data-session": w.sessionId },
      el("td", { class: "mono" }, w.clientId),
      el("td", { class: "mono", title: w.sessionId }, w.sessionId.slice(0, 10) + "…"),
      el("td", { class: "mono" }, w.advertiseUrl),
      el("td", {}, (w.namespaces || []).join(", ")),
      num(w.headroom),
      num(live),
      el("td", { class: "draining" + (w.draining ? " warn" : "") }, draining + (w.superseded ? ", superseded" : "")),
      el("td", { class: "num" }, left.toFixed(1) + " s"),
      el("td", {}, ago(w.lastHeartbeatMs)),
      num(rates.get(w.sessionId) || 0, 1),
      el("td", {},
        actionButton("drain:" + w.clientId, "Drain", "Confirm drain", () => push(w.clientId, "drain")),
        " ",
        actionButton("wind_down:" + w.clientId, "Wind down", "Confirm wind down", () => push(w.clientId, "wind_down"))));
    body.append(tr);
  }
  if (workers.length === 0) body.append(el("tr", {}, el("td", { colSpan: 11, class: "note" }, "no live worker")));
}

function renderNamespaces(namespaces) {
  const body = $("#namespaces tbody");
  body.replaceChildren();
  for (const ns of Object.keys(namespaces).sort()) {
    const o = namespaces[ns];
    body.append(el("tr", { "data-namespace": ns }, el("td", { class: "mono" }, ns),
      num(o.workers || 0), num(o.availableWorker || 0), num(o.headroom || 0), num(o.placements || 0)));
  }
  const sel = $("#hot-ns");
  const names = Object.keys(namespaces).sort();
  if (!names.includes(hotNamespace)) hotNamespace = names[0] || "";
  sel.replaceChildren(...names.map((n) => el("option", { value: n, selected: n === hotNamespace }, n)));
}

function renderHot(hot, clients) {
  const body = $("#hot tbody");
  body.replaceChildren();
  $("#hot-bound").textContent = String(hot ? hot.errorBound : 0);
  for (const r of (hot && hot.ids) || []) {
    body.append(el("tr", { "data-id": r.id }, el("td", { class: "mono" }, r.id), num(r.requests), num(r.perSecond, 1),
      num(r.p99Ms, 2), num(r.bytes), el("td", { class: "mono", title: r.holder }, clients.get(r.holder) || r.holder.slice(0, 10)),
      el("td", {}, actionButton("evict:" + hot.namespace + "/" + r.id, "Evict", "Confirm evict", () => evict(hot.namespace, r.id)))));
  }
  if (!hot || hot.ids.length === 0) body.append(el("tr", {}, el("td", { colSpan: 7, class: "note" }, "no traffic in the last minute")));
}

function renderAnswers(traffic) {
  const body = $("#answers tbody");
  body.replaceChildren();
  for (const a of traffic.notOk) body.append(el("tr", {}, num(a.status || "—"), el("td", { class: "mono" }, a.reason || "—"), num(a.count)));
  if (traffic.notOk.length === 0) body.append(el("tr", {}, el("td", { colSpan: 3, class: "note" }, "none")));
}

// ---- lookup ----

async function lookup(ns, id) {
  const out = $("#lookup-result");
  out.dataset.name = ns + "/" + id;
  if (!ns.startsWith("/") || !SEGMENT.test(ns.slice(1)) || !SEGMENT.test(id)) {
    out.replaceChildren(el("p", { class: "error" }, "a namespace is /name and an id is 1–256 of A-Z a-z 0-9 . _ ~ @ : + = - (not starting with a dot)"));
    return;
  }
  const res = await api("GET", placementPath(ns, id));
  if (res.status === 404) {
    out.replaceChildren(el("p", { class: "not-placed" }, ns + "/" + id + " is not placed: its next request activates it on a worker."));
    return;
  }
  if (res.status !== 200) {
    out.replaceChildren(el("p", { class: "error" }, errorText(res)));
    return;
  }
  const p = res.data;
  const row = (k, v, cls) => [el("dt", {}, k), el("dd", { class: cls || "" }, v)];
  out.replaceChildren(el("dl", {},
    ...row("placement", p.namespace + "/" + p.id, "mono"),
    ...row("holder", p.live ? p.clientId : "(session ended: re-placed on its next request)", "holder mono"),
    ...row("session", p.sessionId, "session mono"),
    ...row("address", p.advertiseUrl || "—", "mono"),
    ...row("epoch", p.epoch ? String(p.epoch) : "—"),
    ...row("placed since", p.since ? new Date(p.since).toLocaleString() : "—")),
  el("p", {}, actionButton("evict:" + p.namespace + "/" + p.id, "Evict", "Confirm evict", () => evict(p.namespace, p.id))));
}

$("#lookup-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  lookup($("#lookup-ns").value.trim(), $("#lookup-id").value.trim()).catch(handleError);
});

$("#hot-ns").addEventListener("change", (ev) => {
  hotNamespace = ev.target.value;
  refresh();
});

// ---- refresh loop ----

function handleError(e) {
  if (e instanceof Unauthorized) askToken(e.message);
  else setStatus("cannot reach the pinboard: " + e.message, "error");
}

async function refresh() {
  if (!token || refreshing) return;
  refreshing = true;
  try {
    const [overview, traffic] = await Promise.all([api("GET", "/registry/overview"), api("GET", "/registry/traffic")]);
    if (overview.status !== 200) throw new Error(errorText(overview));
    const rates = new Map();
    const clients = new Map();
    if (traffic.status === 200) for (const h of traffic.data.holders) rates.set(h.sessionId, h.perSecond);
    for (const w of overview.data.workers) clients.set(w.sessionId, w.clientId);
    renderWorkers(overview.data.workers, rates);
    renderNamespaces(overview.data.namespaces);
    let hot = null;
    if (hotNamespace) {
      const res = await api("GET", "/registry/hot?namespace=" + encodeURIComponent(hotNamespace) + "&n=20");
      if (res.status === 200) hot = res.data;
    }
    renderHot(hot, clients);
    if (traffic.status === 200) renderAnswers(traffic.data);
    const shown = $("#lookup-result").dataset.name;
    if (shown) { // keep the lookup current: a placement moves when evicted or re-placed
      const cut = shown.indexOf("/", 1);
      await lookup(shown.slice(0, cut), shown.slice(cut + 1));
    }
    setStatus("protocol " + overview.data.protocolVersion + ", " + overview.data.sessions + " sessions, updated " + new Date().toLocaleTimeString());
  } catch (e) {
    handleError(e);
  } finally {
    refreshing = false;
  }
}

if (token) {
  $("#main").hidden = false;
  $("#forget").hidden = false;
  refresh();
} else {
  askToken("");
}
setInterval(refresh, REFRESH_MS);
