// Torpor's dashboard: views over the API (Connect's JSON protocol, the
// same calls and the same token as the CLI) and the actions a tenant
// needs (suspend, resume, delete, fork). An API token of some spaces sees
// those (ListSpaces lists them); nodes and workers are the admin's. The
// token is kept in this tab's sessionStorage only.
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

// stream makes a server-streaming call (Connect's enveloped JSON) and
// returns its messages once it ended.
async function stream(service, method, body) {
  const json = new TextEncoder().encode(JSON.stringify(body || {}));
  const req = new Uint8Array(5 + json.length);
  new DataView(req.buffer).setUint32(1, json.length);
  req.set(json, 5);
  const resp = await fetch(`/torpor.v1.${service}/${method}`, {
    method: "POST",
    headers: { "Content-Type": "application/connect+json", "Authorization": "Bearer " + token },
    body: req,
  });
  const buf = new Uint8Array(await resp.arrayBuffer());
  if (resp.status === 401) throw new AuthError("the token was refused");
  const out = [];
  for (let i = 0; i + 5 <= buf.length;) {
    const flags = buf[i], n = new DataView(buf.buffer, buf.byteOffset + i + 1, 4).getUint32(0);
    const msg = JSON.parse(new TextDecoder().decode(buf.subarray(i + 5, i + 5 + n)) || "{}");
    i += 5 + n;
    if (flags & 2) {
      if (msg.error) throw new Error(`${service}.${method}: ${msg.error.message || msg.error.code}`);
      break;
    }
    out.push(msg);
  }
  return out;
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

// perSpace lists one space-scoped collection in every space shown: an API
// token of some spaces may list only within one at a time.
async function perSpace(spaces, service, method, field) {
  const lists = await Promise.all(spaces.map((sp) => list(service, method, field, { space: sp.metadata.name })));
  return lists.flat();
}

// adminOnly reads what only the admin may (nodes, workers): for another
// token, none and a note why.
async function adminOnly(service, method, field) {
  try {
    return { items: await list(service, method, field), note: "" };
  } catch (e) {
    if (e instanceof AuthError) throw e;
    return { items: [], note: e.message };
  }
}

async function refresh() {
  const now = Date.now();
  try {
    const spaces = await list("SpaceService", "ListSpaces", "spaces");
    const [actors, templates, snapshots, tags, workers, nodes] = await Promise.all([
      perSpace(spaces, "ActorService", "ListActors", "actors"),
      perSpace(spaces, "TemplateService", "ListTemplates", "templates"),
      perSpace(spaces, "SnapshotService", "ListSnapshots", "snapshots"),
      perSpace(spaces, "SnapshotService", "ListSnapshotTags", "tags"),
      adminOnly("WorkerService", "ListWorkers", "workers"),
      adminOnly("NodeService", "ListNodes", "nodes"),
    ]);
    showLoggedIn(true);
    render({ spaces, actors, templates, snapshots, tags, workers: workers.items, nodes: nodes.items }, now);
    document.getElementById("workers-note").textContent = workers.note;
    document.getElementById("nodes-note").textContent = nodes.note;
    document.getElementById("status").textContent =
      `${spaces.length} spaces, ${actors.length} actors, ${templates.length} templates` + ` — ${new Date(now).toLocaleTimeString()}`;
    await Promise.all([chart(actors), selected ? showActor(selected) : null]);
  } catch (e) {
    if (e instanceof AuthError) {
      logout(e.message);
      return;
    }
    document.getElementById("status").textContent = "error: " + e.message;
  }
}

// templateOf is an actor's template as `actor list` shows it: the
// revision its spec names.
function templateOf(a) {
  const spec = a.spec || {};
  return `${spec.template || ""}@${spec.templateRevision || 0}`;
}

function button(td, label, action) {
  const b = document.createElement("button");
  b.textContent = label;
  b.className = "action";
  b.dataset.action = label;
  b.addEventListener("click", (ev) => { ev.stopPropagation(); action(b); });
  td.appendChild(b);
  return b;
}

// act runs an action on an actor and shows what came of it.
async function act(what, key, fn) {
  const out = document.getElementById("action-result");
  out.textContent = `${what} ${key}…`;
  try {
    await fn();
    out.textContent = `${what} ${key}: done`;
  } catch (e) {
    out.textContent = `${what} ${key}: ${e.message}`;
  }
  refresh();
}

function actions(td, a) {
  const space = a.metadata.space, name = a.metadata.name, key = `${space}/${name}`;
  const state = enumName(a.status && a.status.state, "ACTOR_STATE_");
  if (state === "RUNNING") {
    button(td, "suspend", () => act("suspend", key, () => call("ActorService", "SuspendActor", { space, name })));
  } else if (["SUSPENDED", "PAUSED", "CRASHED"].includes(state)) {
    button(td, "resume", () => act("resume", key, () => call("ActorService", "ResumeActor", { space, name })));
  }
  button(td, "fork", () => {
    const fork = `${name.slice(0, 50)}-fork-${Math.random().toString(36).slice(2, 6)}`;
    act("fork", key, () => call("ActorService", "CreateActor",
      { actor: { metadata: { space, name: fork }, spec: {} }, from: { actor: name } }));
  });
  // A delete asks once more: a running actor is stopped without a
  // snapshot (force), its state since the latest one lost.
  button(td, "delete", (b) => {
    if (b.dataset.armed) {
      act("delete", key, () => call("ActorService", "DeleteActor", { space, name, force: true }));
      return;
    }
    b.dataset.armed = "1";
    b.dataset.action = "confirm delete";
    b.textContent = state === "RUNNING" ? "confirm delete (stops it)" : "confirm delete";
  });
}

function render(v, now) {
  const idle = {}; // actor uid → idle text, from the worker it runs on
  for (const w of v.workers) {
    const st = w.status || {};
    if (st.actor && st.actor.uid) {
      idle[st.actor.uid] = st.actorInFlight > 0 ? `serving ${st.actorInFlight}` : ago(st.actorLastActive, now);
    }
  }
  const counts = {};
  for (const a of v.actors) {
    const s = (counts[a.metadata.space] ||= { actors: 0, running: 0 });
    s.actors++;
    if (enumName(a.status && a.status.state, "ACTOR_STATE_") === "RUNNING") s.running++;
  }
  fill("spaces", v.spaces, (tr, s) => {
    const n = counts[s.metadata.name] || { actors: 0, running: 0 };
    cell(tr, s.metadata.name); cell(tr, n.actors); cell(tr, n.running);
  });
  fill("templates", v.templates, (tr, t) => {
    const st = t.status || {};
    const phase = enumName(st.phase, "TEMPLATE_PHASE_");
    tr.dataset.template = `${t.metadata.space}/${t.metadata.name}`;
    cell(tr, `${t.metadata.space}/${t.metadata.name}`);
    cell(tr, st.revision || "");
    cell(tr, phase, "phase phase-" + phase);
    cell(tr, st.message || "", phase === "FAILED" ? "message error" : "message");
  });
  fill("actors", v.actors, (tr, a) => {
    const st = a.status || {};
    const key = `${a.metadata.space}/${a.metadata.name}`;
    const state = enumName(st.state, "ACTOR_STATE_");
    tr.className = "actor" + (key === selected ? " selected" : "");
    tr.dataset.actor = key;
    cell(tr, key);
    cell(tr, templateOf(a), "template");
    // Frozen is a condition of RUNNING (idlePolicy.freezeSeconds).
    cell(tr, st.frozenTime ? `${state} (frozen ${ago(st.frozenTime, now)})` : state, "state state-" + state);
    cell(tr, ago(st.stateTime, now));
    cell(tr, state === "RUNNING" ? (idle[a.metadata.uid] || "") : "");
    cell(tr, (st.worker && st.worker.name) || "");
    cell(tr, enumName(st.restoredBy, "RESTORE_SCOPE_"));
    actions(cell(tr, ""), a);
    tr.addEventListener("click", () => { selected = key; showActor(key); refresh(); });
  });
  const tagsOf = {};
  for (const t of v.tags) (tagsOf[`${t.metadata.space}/${t.snapshot}`] ||= []).push(t.metadata.name);
  fill("snapshots", v.snapshots, (tr, s) => {
    cell(tr, `${s.metadata.space}/${s.metadata.name}`);
    cell(tr, s.actorName || "(golden)");
    cell(tr, enumName(s.scope, "SNAPSHOT_SCOPE_"));
    cell(tr, s.templateName || "");
    cell(tr, s.node ? `local on ${s.node}` : "storage");
    cell(tr, bytes(Number(s.sizeBytes || 0)));
    cell(tr, (tagsOf[`${s.metadata.space}/${s.metadata.name}`] || []).join(", "), "tags");
    cell(tr, ago(s.metadata.createTime, now));
  });
  fill("nodes", v.nodes, (tr, n) => {
    cell(tr, n.metadata.name); cell(tr, n.address || ""); cell(tr, ago(n.heartbeatTime, now));
    cell(tr, v.workers.filter((w) => (w.spec || {}).node === n.metadata.name).length);
  });
  fill("workers", v.workers, (tr, w) => {
    const st = w.status || {}, spec = w.spec || {};
    cell(tr, w.metadata.name); cell(tr, spec.node || ""); cell(tr, spec.pool || ""); cell(tr, spec.ip || "");
    cell(tr, st.actor ? `${st.actor.space}/${st.actor.name}` : "");
    cell(tr, st.actor ? (st.actorInFlight > 0 ? `serving ${st.actorInFlight}` : ago(st.actorLastActive, now)) : "");
  });
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  for (; n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

async function events(key) {
  const [space, name] = key.split("/");
  return (await call("ActorService", "ListActorEvents", { space, name })).events || [];
}

// logLines are the last lines of an actor's log, read where the log is
// (reading does not wake the actor).
const logLines = 200;

async function showActor(key) {
  const [space, name] = key.split("/");
  const [evs, logs] = await Promise.all([
    events(key),
    stream("ActorService", "GetActorLogs", { space, name, tail: logLines }).catch((e) => e),
  ]);
  document.getElementById("timeline").hidden = false;
  document.getElementById("timeline-actor").textContent = key;
  // Newest first.
  document.getElementById("events").replaceChildren(...evs.slice().reverse().map((e) => {
    const li = document.createElement("li");
    const t = document.createElement("time");
    t.textContent = new Date(Date.parse(e.time)).toLocaleString();
    li.appendChild(t);
    const what = `${enumName(e.fromState, "ACTOR_STATE_")} → ${enumName(e.toState, "ACTOR_STATE_")}`;
    const took = e.durationMs ? ` in ${e.durationMs} ms` : "";
    li.appendChild(document.createTextNode(`${what}${took}${e.reason ? ": " + e.reason : ""}`));
    return li;
  }));
  const pre = document.getElementById("logs");
  if (logs instanceof Error) {
    pre.textContent = logs.message;
    return;
  }
  // Newest first too; a line cut into partial records is joined.
  const lines = [];
  const open = {};
  for (const r of logs.flatMap((m) => m.records || [])) {
    const who = r.stream === "torpor" ? "--" : (r.container || "");
    const k = `${r.container}/${r.stream}`;
    const text = new TextDecoder().decode(Uint8Array.from(atob(r.text || ""), (c) => c.charCodeAt(0)));
    if (open[k] !== undefined) lines[open[k]] += text;
    else lines.push(`${new Date(Date.parse(r.time)).toISOString()} ${who} ${text}`);
    if (r.partial) open[k] ??= lines.length - 1; else delete open[k];
  }
  pre.textContent = lines.reverse().join("\n");
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
