// Torpor's dashboard: read-only views over the API (Connect's JSON
// protocol, the same calls and the same token as the CLI). The token is
// kept in this tab's sessionStorage only.
"use strict";

const refreshEvery = 5000;
// Events are read per actor for the latency chart: bounded, so a large
// installation costs a bounded number of calls per refresh.
const chartActors = 50;
let token = sessionStorage.getItem("torpor-token") || "";
let selected = null; // "space/name" whose events are shown
let timer = null;

class AuthError extends Error {}

async function call(service, method, body) {
  const resp = await fetch(`/torpor.v1.${service}/${method}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "Authorization": "Bearer " + token },
    body: JSON.stringify(body || {}),
  });
  const data = await resp.json().catch(() => ({}));
  if (resp.status === 401) throw new AuthError(data.message || "the token was refused");
  if (!resp.ok) throw new Error(`${service}.${method}: ${data.message || resp.statusText}`);
  return data;
}

// list reads every page of a List call.
async function list(service, method, field, body) {
  const out = [];
  let pageToken = "";
  do {
    const page = await call(service, method, Object.assign({ pageToken }, body));
    out.push(...(page[field] || []));
    pageToken = page.nextPageToken || "";
  } while (pageToken);
  return out;
}

// enumName drops the type prefix: ACTOR_STATE_RUNNING → RUNNING.
function enumName(v, prefix) {
  return (v || "").startsWith(prefix) ? v.slice(prefix.length) : (v || "");
}

function ago(ts, now) {
  if (!ts) return "";
  const s = Math.max(0, Math.round((now - Date.parse(ts)) / 1000));
  if (s < 120) return s + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  if (s < 172800) return Math.round(s / 3600) + "h";
  return Math.round(s / 86400) + "d";
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function fill(tableId, rows, render) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows.map((r) => { const tr = document.createElement("tr"); render(tr, r); return tr; }));
}

async function refresh() {
  const now = Date.now();
  try {
    const [spaces, actors] = await Promise.all([
      list("SpaceService", "ListSpaces", "spaces"),
      list("ActorService", "ListActors", "actors"),
    ]);
    // Workers are the admin's: an API token of some spaces sees none.
    let workers = [], workersNote = "";
    try {
      workers = await list("WorkerService", "ListWorkers", "workers");
    } catch (e) {
      if (e instanceof AuthError) throw e;
      workersNote = e.message;
    }
    showLoggedIn(true);
    render(spaces, actors, workers, now);
    document.getElementById("status").textContent =
      `${actors.length} actors, ${workers.length} workers` + (workersNote ? ` (workers: ${workersNote})` : "") +
      ` — ${new Date(now).toLocaleTimeString()}`;
    await Promise.all([chart(actors), selected ? timeline(selected) : null]);
  } catch (e) {
    if (e instanceof AuthError) {
      logout(e.message);
      return;
    }
    document.getElementById("status").textContent = "error: " + e.message;
  }
}

function render(spaces, actors, workers, now) {
  const idle = {}; // actor uid → idle text, from the worker it runs on
  for (const w of workers) {
    const st = w.status || {};
    if (st.actor && st.actor.uid) {
      idle[st.actor.uid] = st.actorInFlight > 0 ? `serving ${st.actorInFlight}` : ago(st.actorLastActive, now);
    }
  }
  const perSpace = {};
  for (const a of actors) {
    const s = (perSpace[a.metadata.space] ||= { actors: 0, running: 0 });
    s.actors++;
    if (enumName(a.status && a.status.state, "ACTOR_STATE_") === "RUNNING") s.running++;
  }
  fill("spaces", spaces, (tr, s) => {
    const n = perSpace[s.metadata.name] || { actors: 0, running: 0 };
    cell(tr, s.metadata.name); cell(tr, n.actors); cell(tr, n.running);
  });
  fill("actors", actors, (tr, a) => {
    const st = a.status || {};
    const key = `${a.metadata.space}/${a.metadata.name}`;
    const state = enumName(st.state, "ACTOR_STATE_");
    tr.className = "actor" + (key === selected ? " selected" : "");
    tr.dataset.actor = key;
    cell(tr, key);
    cell(tr, st.currentTemplate || (a.spec && a.spec.template) || "");
    cell(tr, state, "state state-" + state);
    cell(tr, ago(st.stateTime, now));
    cell(tr, state === "RUNNING" ? (idle[a.metadata.uid] || "") : "");
    cell(tr, (st.worker && st.worker.name) || "");
    cell(tr, enumName(st.restoredBy, "RESTORE_SCOPE_"));
    tr.addEventListener("click", () => { selected = key; timeline(key); refresh(); });
  });
  fill("workers", workers, (tr, w) => {
    const st = w.status || {}, spec = w.spec || {};
    cell(tr, w.metadata.name); cell(tr, spec.node || ""); cell(tr, spec.pool || ""); cell(tr, spec.ip || "");
    cell(tr, st.actor ? `${st.actor.space}/${st.actor.name}` : "");
    cell(tr, st.actor ? (st.actorInFlight > 0 ? `serving ${st.actorInFlight}` : ago(st.actorLastActive, now)) : "");
  });
}

async function events(key) {
  const [space, name] = key.split("/");
  return (await call("ActorService", "ListActorEvents", { space, name })).events || [];
}

async function timeline(key) {
  const evs = await events(key);
  document.getElementById("timeline").hidden = false;
  document.getElementById("timeline-actor").textContent = key;
  document.getElementById("events").replaceChildren(...evs.map((e) => {
    const li = document.createElement("li");
    const t = document.createElement("time");
    t.textContent = new Date(Date.parse(e.time)).toLocaleString();
    li.appendChild(t);
    const what = `${enumName(e.fromState, "ACTOR_STATE_")} → ${enumName(e.toState, "ACTOR_STATE_")}`;
    const took = e.durationMs ? ` in ${e.durationMs} ms` : "";
    li.appendChild(document.createTextNode(`${what}${took}${e.reason ? ": " + e.reason : ""}`));
    return li;
  }));
}

// chart draws each resume (RESUMING → RUNNING) of the first chartActors
// actors as a point: time across, duration up.
async function chart(actors) {
  const all = await Promise.all(actors.slice(0, chartActors).map((a) =>
    events(`${a.metadata.space}/${a.metadata.name}`).catch(() => [])));
  const points = all.flat()
    .filter((e) => enumName(e.fromState, "ACTOR_STATE_") === "RESUMING" && enumName(e.toState, "ACTOR_STATE_") === "RUNNING")
    .map((e) => ({ t: Date.parse(e.time), ms: Number(e.durationMs || 0) }))
    .sort((a, b) => a.t - b.t);
  const box = document.getElementById("chart");
  const ns = "http://www.w3.org/2000/svg";
  const W = 800, H = 220, L = 48, R = 12, T = 10, B = 28;
  const svg = document.createElementNS(ns, "svg");
  svg.id = "latency-chart";
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `activation latency: ${points.length} resumes`);
  const el = (name, attrs, text) => {
    const e = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  if (points.length === 0) {
    el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no resumes yet");
    box.replaceChildren(svg);
    return;
  }
  const t0 = points[0].t, t1 = Math.max(points[points.length - 1].t, t0 + 1000);
  const top = Math.max(10, ...points.map((p) => p.ms)) * 1.1;
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  const y = (ms) => H - B - (H - B - T) * ms / top;
  for (let i = 0; i <= 4; i++) {
    const v = top * i / 4;
    el("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) });
    el("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, Math.round(v) + " ms");
  }
  el("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B });
  el("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B });
  el("text", { x: L, y: H - 8 }, new Date(t0).toLocaleTimeString());
  el("text", { x: W - R, y: H - 8, "text-anchor": "end" }, new Date(t1).toLocaleTimeString());
  el("polyline", { class: "line", points: points.map((p) => `${x(p.t)},${y(p.ms)}`).join(" ") });
  for (const p of points) {
    el("circle", { cx: x(p.t), cy: y(p.ms), r: 3 }).appendChild(
      Object.assign(document.createElementNS(ns, "title"), { textContent: `${p.ms} ms at ${new Date(p.t).toLocaleString()}` }));
  }
  box.replaceChildren(svg);
}

function showLoggedIn(yes) {
  document.getElementById("login").hidden = yes;
  document.getElementById("dashboard").hidden = !yes;
  document.getElementById("logout").hidden = !yes;
}

function logout(why) {
  token = "";
  sessionStorage.removeItem("torpor-token");
  clearInterval(timer);
  timer = null;
  showLoggedIn(false);
  document.getElementById("status").textContent = "";
  document.getElementById("login-error").textContent = why || "";
}

function start() {
  refresh();
  timer = setInterval(refresh, refreshEvery);
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("torpor-token", token);
  start();
});
document.getElementById("logout").addEventListener("click", () => logout(""));

if (token) start(); else showLoggedIn(false);
