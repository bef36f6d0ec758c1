// The operator's page of `vramctl run` (controller/interfaces/ui): polls the API's GET routes and
// draws what they answer. It computes no figure of its own: every number on the page
// is a field of an answer (null is drawn as "unknown", never 0); widths of the bars are
// only the layout of those numbers. A set of answers is drawn only when all of them
// come from the same cycle, so the page never mixes two moments.
"use strict";

const POLL_MS = 1000;
const UNKNOWN = "unknown";
const TOKEN_KEY = "vramctl.token";
const RESIDENCIES = ["resident", "evictable", "on-demand"];

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") Object.assign(node.style, v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const mib = (v) => (v === null || v === undefined ? UNKNOWN : String(v));
const signed = (v) => (v === null || v === undefined ? UNKNOWN : (v > 0 ? "+" : "") + v);
const secs = (v) => (v === null || v === undefined ? UNKNOWN : `${Math.round(v)} s`);
const when = (epoch) =>
  epoch === null || epoch === undefined ? UNKNOWN : new Date(epoch * 1000).toLocaleTimeString();

// a figure, tagged with the API field it shows
function fig(field, value, fmt = mib) {
  const text = fmt(value);
  return el("span", { class: "fig" + (text === UNKNOWN ? " unknown" : ""), "data-field": field,
    "data-value": value === null || value === undefined ? "null" : String(value) }, text);
}

// ── fetching ─────────────────────────────────────────────────────────────────

class ApiError extends Error {
  constructor(path, status, message) {
    super(`${path}: ${status}${message ? ": " + message : ""}`);
    this.status = status;
  }
}

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function getJSON(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store", credentials: "omit" });
  let body = null;
  try { body = await r.json(); } catch (_) { /* not JSON: reported below */ }
  if (!r.ok) throw new ApiError(path, r.status, body && body.error);
  if (body === null) throw new ApiError(path, r.status, "not JSON");
  return body;
}

async function fetchMoment() {
  // healthz, ledger, serves and plans from one cycle: ask again when the loop cycled
  // between two of the answers
  for (let attempt = 0; attempt < 5; attempt++) {
    const [health, ledger, serves, plans] = await Promise.all(
      ["/healthz", "/v1/ledger", "/v1/serves", "/v1/plans?limit=8"].map(getJSON));
    const cycles = [health.cycles, ledger.cycles, serves.cycles, plans.cycles];
    const at = [ledger.observed_at, serves.observed_at, plans.observed_at];
    if (cycles.every((c) => c === cycles[0]) && at.every((a) => a === at[0])) {
      return { health, ledger, serves, plans };
    }
  }
  return null; // the loop cycles faster than the answers come back: keep the last drawing
}

// ── drawing ──────────────────────────────────────────────────────────────────

function servesByName(serves) {
  const m = new Map();
  for (const s of serves.serves) m.set(s.serve, s);
  return m;
}

function segmentClass(s) {
  if (!s) return "seg res-undeclared";
  const res = RESIDENCIES.includes(s.residency) ? s.residency : "other";
  return `seg res-${res} life-${s.lifecycle}`;
}

function drawRole(role, byName, ledger) {
  const known = role.committed_mib !== null && role.committed_mib !== undefined;
  // the bar's scale: the card, or more when it is observed over budget
  const scale = Math.max(role.capacity_mib,
    known ? role.committed_mib + role.reserve_mib : 0,
    role.nvml_used_mib || 0, role.nvml_total_mib || 0) || 1;
  const pct = (v) => `${(100 * v) / scale}%`;
  const bar = el("div", { class: "bar", "data-role-bar": role.gpu_role });
  if (known) {
    for (const r of role.reservations) {
      const s = byName.get(r.serve);
      const title = s
        ? `${r.serve}: ${r.mib} MiB (${s.residency || "no residency"}, ${s.lifecycle})`
        : `${r.serve}: ${r.mib} MiB (no longer declared, kept until its container stops)`;
      bar.append(el("div", { class: segmentClass(s), "data-serve": r.serve, "data-mib": r.mib,
        "data-lifecycle": s ? s.lifecycle : "undeclared", title, style: { width: pct(r.mib) } },
        el("span", { class: "seg-label" }, `${r.serve} ${r.mib}`)));
    }
    if (role.free_mib > 0) {
      bar.append(el("div", { class: "seg free", "data-segment": "free", "data-mib": role.free_mib,
        title: `free: ${role.free_mib} MiB`, style: { width: pct(role.free_mib) } },
        el("span", { class: "seg-label" }, `free ${role.free_mib}`)));
    }
  } else {
    bar.append(el("div", { class: "seg unknown-seg", "data-segment": "unknown",
      title: "committed is unknown: docker could not be read",
      style: { width: pct(role.budget_mib) } },
      el("span", { class: "seg-label" }, "committed unknown")));
  }
  bar.append(el("div", { class: "seg reserve", "data-segment": "reserve", "data-mib": role.reserve_mib,
    title: `reserve: ${role.reserve_mib} MiB (never reserved)`, style: { width: pct(role.reserve_mib) } },
    el("span", { class: "seg-label" }, `reserve ${role.reserve_mib}`)));
  if (role.nvml_used_mib !== null && role.nvml_used_mib !== undefined) {
    bar.append(el("div", { class: "nvml-overlay", "data-segment": "nvml-used",
      "data-mib": role.nvml_used_mib, title: `NVML used: ${role.nvml_used_mib} MiB`,
      style: { width: pct(role.nvml_used_mib) } }));
  }
  const over = role.overcommitted
    ? el("span", { class: "pill bad", "data-field": "overcommitted" }, "OVERCOMMITTED") : null;
  const driftTotal = role.drift_total_mib
    ? el("span", { class: "warn" }, " (device total ", fig("drift_total_mib", role.drift_total_mib, signed),
      " vs declared)") : null;
  return el("div", { class: "role", "data-role": role.gpu_role },
    el("div", { class: "role-head" },
      el("strong", {}, role.gpu_role), over,
      el("span", { class: "muted" }, role.uuid ? ` ${role.uuid}` : " (no device linked)")),
    bar,
    el("div", { class: "figures" },
      el("span", {}, "capacity ", fig("capacity_mib", role.capacity_mib)),
      el("span", {}, "reserve ", fig("reserve_mib", role.reserve_mib)),
      el("span", {}, "budget ", fig("budget_mib", role.budget_mib)),
      el("span", {}, "committed ", fig("committed_mib", role.committed_mib)),
      el("span", {}, "free ", fig("free_mib", role.free_mib)),
      el("span", {}, "NVML used ", fig("nvml_used_mib", role.nvml_used_mib), " of ",
        fig("nvml_total_mib", role.nvml_total_mib)),
      el("span", {}, "drift ", fig("drift_used_mib", role.drift_used_mib, signed), driftTotal),
      el("span", { class: "muted" }, "MiB")));
}

// A label shows whole or not at all: a cut one ("reserve 204" of 2048, "fr") would
// print a wrong figure. The segment's title and the figures below keep every number.
function fitLabels() {
  for (const label of document.querySelectorAll("#roles .seg-label")) {
    label.hidden = false;
    const seg = label.parentElement;
    label.hidden = label.offsetLeft + label.offsetWidth > seg.clientWidth;
  }
}
window.addEventListener("resize", fitLabels);

function drawLegend() {
  const item = (cls, text) => el("span", { class: "legend-item" }, el("i", { class: cls }), text);
  $("#legend").replaceChildren(
    item("seg res-resident", "resident"), item("seg res-evictable", "evictable"),
    item("seg res-on-demand", "on-demand"), item("seg res-other", "no residency"),
    item("seg res-undeclared", "no longer declared"), item("seg life-starting", "starting"),
    item("seg life-reserved", "reserved, not started"), item("seg life-stopping", "stopping / draining"),
    item("seg free", "free"), item("seg reserve", "reserve"), item("nvml-key", "NVML used"));
}

function reservedCell(s) {
  if (!s.in_ledger) return "-";
  if (s.committed === true) return mib(s.reservation_mib);
  if (s.committed === null || s.committed === undefined) return UNKNOWN;
  return `0 of ${mib(s.reservation_mib)}`;
}

function requestCell(req) {
  if (!req) return "-";
  if (req.ttl_s === null) return "requested, no TTL";
  if (req.expired) return "expired";
  if (req.ttl_basis === "pending") return `waiting for its start (then idle TTL ${secs(req.ttl_s)})`;
  if (req.expires_in_s === null || req.expires_in_s === undefined) {
    // measured idleness while requests are in flight: no deadline yet
    return `busy: ends after ${secs(req.ttl_s)} with no request in flight`;
  }
  const basis = {
    measured: "idle",
    request: "from the request",
    unknown: "in flight unknown",
  }[req.ttl_basis];
  const how = basis ? `TTL ${secs(req.ttl_s)}, ${basis}` : `TTL ${secs(req.ttl_s)}`;
  return `expires in ${secs(req.expires_in_s)} (${how})`;
}

function backoffCell(b) {
  if (!b) return "-";
  const why = b.last_failure === null ? "reason shown with the token" : b.last_failure;
  return `${b.failures} failure(s), retry in ${secs(b.retry_in_s)}: ${why}`;
}

// as the CLI's status prints it (controller/interfaces/render.py, desired_cell)
function desiredCell(s) {
  if (s.evicted_for && s.evicted_for.length) return `${s.desired} (evicted for ${s.evicted_for.join(", ")})`;
  if (s.desired_by === "request") return `${s.desired} (request)`;
  return s.desired || "unmanaged";
}

// [serve.model]: the estimate beside the reservation and the measured footprint
// (controller/service/model_estimates.py); what is unknown is said, never 0
function modelCell(m) {
  if (!m) return "-";
  if (m.error) return `estimate unknown: ${m.error}`;
  const e = m.estimate;
  let text = `weights ${mib(e.weights_mib)} + KV ${mib(e.kv_cache_mib)} = ${mib(e.known_mib)}` +
    `, the rest unknown; reserved ${mib(m.vram_mib)}, measured ${mib(m.measured_mib)}`;
  if (m.check && m.check.verdict === "cannot_load") text += ` (cannot load: short by ${m.check.shortfall_mib})`;
  return text;
}

function drawServes(serves) {
  const rows = serves.serves.map((s) => el("tr", { "data-serve-row": s.serve,
    class: `life-row-${s.lifecycle}` },
    el("td", {}, s.serve),
    el("td", {}, s.gpu_roles.join(", ") || "-"),
    el("td", {}, s.residency || "-"),
    el("td", { "data-field": "desired" }, desiredCell(s)),
    el("td", { "data-field": "state" }, s.self_sleep === "asleep" ? `${s.state}, asleep by itself` : s.state),
    el("td", { "data-field": "health" }, s.health || "-"),
    el("td", { "data-field": "lifecycle" }, el("span", { class: `pill life-${s.lifecycle}` }, s.lifecycle)),
    el("td", { class: "num", "data-field": "reserved" }, reservedCell(s)),
    el("td", { class: "num", "data-field": "nvml_used_mib" }, s.committed ? mib(s.nvml_used_mib) : "-"),
    el("td", { "data-field": "model" }, modelCell(s.model)),
    el("td", { "data-field": "request" }, requestCell(s.request)),
    el("td", { "data-field": "backoff" }, backoffCell(s.backoff)),
    el("td", { "data-field": "blocked" }, s.blocked || "-")));
  $("#serves tbody").replaceChildren(...rows);
}

function drawPlans(plans) {
  if (!plans.plans.length) {
    $("#plans").replaceChildren(el("p", { class: "muted" }, "no plan recorded yet"));
    return;
  }
  const cards = plans.plans.map((p) => {
    const verdict = p.dry_run ? "dry run"
      : p.outcome === null ? "running"
      : p.outcome.preflight_problems ? "refused by preflight"
      : p.outcome.ok ? "done" : "incomplete";
    const steps = p.steps.map((s) => {
      const amount = s.to_mib !== null && s.to_mib !== undefined ? ` ${s.mib} MiB → ${s.to_mib}`
        : s.mib !== null && s.mib !== undefined ? ` ${s.mib} MiB` : "";
      const roles = s.gpu_roles.length ? ` [${s.gpu_roles.join(", ")}]` : "";
      const outcome = s.outcome === null ? (p.dry_run ? "planned" : "pending") : s.outcome;
      return el("li", { "data-step": s.index, class: `outcome-${outcome}` },
        el("span", { class: "pill outcome" }, outcome), " ",
        el("strong", {}, s.action), ` ${s.serve}${roles}${amount}`,
        el("span", { class: "muted" }, ` — ${s.reason}`),
        s.duration_s !== null ? el("span", { class: "muted" }, ` (${s.duration_s.toFixed(2)} s)`) : null,
        s.detail ? el("div", { class: "detail" }, s.detail) : null);
    });
    const blocked = p.blocked.map((b) => el("li", { class: "blocked" },
      el("span", { class: "pill warn" }, "blocked"), ` ${b.serve}: ${b.reason}`));
    const notes = p.notes.map((n) => el("li", { class: "note" }, el("span", { class: "pill bad" }, "note"), ` ${n}`));
    return el("div", { class: "plan", "data-cycle": p.cycle },
      el("div", { class: "plan-head" }, el("strong", {}, `cycle ${p.cycle}`),
        ` at ${when(p.at)} · `, el("span", { class: "verdict" }, verdict),
        ` · ${p.steps.length} step(s)`),
      el("ol", {}, steps, blocked, notes));
  });
  $("#plans").replaceChildren(...cards);
}

function drawNotices(m) {
  const { health, ledger } = m;
  const items = [];
  if (health.dry_run) items.push(el("div", { class: "notice" }, "dry run: the loop plans and executes nothing"));
  if (ledger.docker !== "ok") items.push(el("div", { class: "notice bad" },
    "docker could not be read: committed MiB is unknown; nothing is admitted or stopped (fail closed)"));
  if (ledger.nvml !== "ok") items.push(el("div", { class: "notice warn", "data-notice": "nvml" },
    "NVML unavailable: device figures (NVML used, drift) are unknown"));
  for (const e of ledger.manifest_errors) items.push(el("div", { class: "notice bad" }, `manifest: ${e}`));
  if (ledger.undeclared_gpu_containers.length) items.push(el("div", { class: "notice bad" },
    "undeclared GPU containers (no manifest reserves their memory): " +
    ledger.undeclared_gpu_containers.join(", ")));
  for (const s of m.serves.serves.filter((x) => x.foreign_project)) items.push(el("div",
    { class: "notice warn", "data-notice": "foreign", "data-foreign": s.serve },
    `foreign: ${s.serve}: container ${s.container} (${s.state}) belongs to compose project ` +
    `${s.foreign_project}: never started, stopped or removed; ` +
    (s.in_ledger ? `its ${s.reservation_mib} MiB counted while it runs` : "not in the ledger")));
  for (const n of ledger.no_longer_declared) items.push(el("div", { class: "notice warn" },
    `no longer declared: ${n.container} (started as ${n.serve}) keeps ${n.reservation_mib} MiB on ` +
    `${n.gpu_roles.join(", ")} until it stops`));
  $("#notices").replaceChildren(...items);
}

function draw(m) {
  const { health, ledger, serves, plans } = m;
  const byName = servesByName(serves);
  $("#roles").replaceChildren(...ledger.gpu_roles.map((r) => drawRole(r, byName, ledger)));
  fitLabels();
  drawServes(serves);
  drawPlans(plans);
  drawNotices(m);
  $("#health").replaceChildren(
    el("span", {}, "docker ", el("b", { "data-field": "docker" }, health.docker)), " · ",
    el("span", {}, "NVML ", el("b", { "data-field": "nvml" }, health.nvml)), " · ",
    el("span", {}, "cycle ", el("b", { "data-field": "cycles" }, health.cycles)),
    el("span", { class: "muted" }, ` (${secs(health.last_cycle_age_s)} ago, took ${
      health.last_cycle_duration_s === null ? UNKNOWN : health.last_cycle_duration_s.toFixed(3) + " s"})`));
  const detail = $("#detail");
  detail.textContent = `detail: ${ledger.detail}`;
  detail.dataset.detail = ledger.detail;
  detail.title = ledger.detail_note || "";
  document.body.dataset.observedAt = String(ledger.observed_at);
  document.body.dataset.cycles = String(ledger.cycles);
  $("#meta").textContent = `observed at ${when(ledger.observed_at)} · manifest ${
    ledger.manifest_digest.slice(0, 12)} · refreshed every ${POLL_MS / 1000} s`;
}

function setConn(state, text) {
  const c = $("#conn");
  c.dataset.state = state;
  c.textContent = text;
  document.body.classList.toggle("stale", state !== "live");
}

async function poll() {
  try {
    const m = await fetchMoment();
    if (m) {
      draw(m);
      setConn("live", "live");
    }
  } catch (e) {
    if (e instanceof ApiError && e.status === 403 && sessionStorage.getItem(TOKEN_KEY)) {
      setConn("error", "the token was refused (403): forget it or type the right one");
    } else {
      setConn("error", `cannot read the API: ${e.message} (figures below are from before)`);
    }
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = $("#token").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  $("#token").value = "";
});
$("#token-clear").addEventListener("click", () => sessionStorage.removeItem(TOKEN_KEY));

drawLegend();
poll();
