// trainq dashboard: plain browser JavaScript, no build step, nothing loaded from elsewhere.
// Views are chosen by the URL hash: "#/" lists jobs and the submit form, "#/jobs/<id>"
// follows one job; sweeps.js adds "#/sweeps" and "#/sweeps/<id>", compare.js
// "#/compare/<id>,<id>…", datasets.js "#/datasets" and "#/datasets/<id>", models.js
// "#/models" and "#/models/<name>", charts.js the
// uPlot charts they share. Every API call carries
// "Authorization: Bearer <key>"; the key lives in sessionStorage, so it is forgotten with
// the tab.
"use strict";

const KEY_STORAGE = "trainq.apiKey";
const LIST_REFRESH_MS = 3000;
const JOB_REFRESH_MS = 2000;
const TERMINAL = new Set(["succeeded", "failed", "canceled", "pruned"]);
// Shown first in the submit form; every other JobSpec field goes under "More options".
const COMMON_FIELDS = ["recipe", "dataset", "epochs", "batch_size", "lr", "optimizer", "scheduler", "amp", "seed"];

const $ = (selector) => document.querySelector(selector);

// ---------------------------------------------------------------------------------------
// Small DOM and formatting helpers. Text always goes in through textContent, never
// innerHTML, so nothing the API returns can inject markup.

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function show(node, message) {
  node.textContent = message ?? "";
  node.hidden = !message;
}

// The API's timestamps may lack a zone (SQLite drops it); they are always UTC.
function parseTime(value) {
  if (!value) return null;
  const hasZone = /(Z|[+-]\d\d:?\d\d)$/.test(value);
  return new Date(hasZone ? value : `${value}Z`);
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const s = Math.round(seconds);
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

// How long a job ran (or has been running, or waiting, when it has not started).
function jobDuration(job) {
  const created = parseTime(job.created_at);
  const started = parseTime(job.started_at);
  const finished = parseTime(job.finished_at);
  if (started) return fmtDuration(((finished ?? new Date()) - started) / 1000);
  if (finished) return "never ran";
  return `waiting ${fmtDuration((new Date() - created) / 1000)}`;
}

function fmtTime(value) {
  const t = parseTime(value);
  return t ? t.toLocaleString() : "–";
}

// For table cells: the date and the minute, short ("12/6/26, 1:25 AM" in en-US).
function fmtShortTime(value) {
  const t = parseTime(value);
  return t ? t.toLocaleString(undefined, { dateStyle: "short", timeStyle: "short" }) : "–";
}

function fmtPercent(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(2)} %`;
}

function fmtBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Math.abs(bytes);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  const digits = i === 0 || v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return `${(Math.sign(bytes) * v).toFixed(digits)} ${units[i]}`;
}

// Short, readable numbers for axis ticks: 0.001 → "1e-3" would be unreadable next to
// "0.0005", so use fixed notation unless the value is really tiny or huge.
function fmtNumber(x, step) {
  if (x === 0) return "0";
  const ax = Math.abs(x);
  if (ax >= 1e5 || ax < 1e-4) return x.toExponential(1);
  const decimals = step ? Math.max(0, Math.min(8, -Math.floor(Math.log10(step)) + 1)) : 3;
  return Number(x.toFixed(decimals)).toString();
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

// ---------------------------------------------------------------------------------------
// The API key and API calls.

class Unauthorized extends Error {}

class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

const apiKey = () => sessionStorage.getItem(KEY_STORAGE);

function authHeaders(extra = {}) {
  return { ...extra, Authorization: `Bearer ${apiKey()}` };
}

// Any 401 means the stored key is wrong or was revoked: forget it and ask again, whatever
// view made the call.
function checkAuth(resp) {
  if (resp.status === 401) {
    askForKey("The API refused this key (401). Enter a valid API key.");
    throw new Unauthorized();
  }
}

async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal, cache: "no-store", headers: authHeaders() };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(path, init);
  checkAuth(resp);
  const text = await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!resp.ok) throw new ApiError(resp.status, data?.detail ?? data ?? resp.statusText);
  return data;
}

// ---------------------------------------------------------------------------------------
// Views. Each view's timers and requests hang off one AbortController, so leaving the view
// stops them all (no polling or streaming left behind for a job no longer shown).

let view = new AbortController();

function leaveView() {
  view.abort();
  view = new AbortController();
  return view.signal;
}

// Run `fn` now and then `ms` after each run ends (never two at once), until `signal` aborts.
async function repeat(fn, ms, signal) {
  while (!signal.aborted) {
    try {
      if ((await fn()) === false) return;
    } catch (e) {
      if (e instanceof Unauthorized || signal.aborted) return;
      console.warn(e);
    }
    await sleep(ms, signal);
  }
}

const VIEWS = ["login-view", "home-view", "job-view", "sweeps-view", "sweep-view", "compare-view", "datasets-view", "dataset-view", "models-view", "model-view"];

function showView(id) {
  for (const section of VIEWS) $(`#${section}`).hidden = section !== id;
  $("#logout").hidden = id === "login-view";
  $("#nav").hidden = id === "login-view";
}

function askForKey(message) {
  leaveView();
  sessionStorage.removeItem(KEY_STORAGE);
  showView("login-view");
  show($("#login-message"), message);
  $("#api-key").value = "";
  $("#api-key").focus();
}

async function login(event) {
  event.preventDefault();
  const key = $("#api-key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  try {
    await api("/jobs?limit=1"); // a 401 here asks again, with the message
  } catch (e) {
    if (!(e instanceof Unauthorized)) show($("#login-message"), `Could not reach the API: ${e.message}`);
    return;
  }
  show($("#login-message"), "");
  route();
}

function route() {
  if (!apiKey()) {
    askForKey("");
    return;
  }
  const signal = leaveView();
  const hash = location.hash;
  let match;
  if ((match = hash.match(/^#\/jobs\/([0-9a-fA-F-]{36})$/))) openJob(match[1], signal);
  else if ((match = hash.match(/^#\/sweeps\/([0-9a-fA-F-]{36})$/))) openSweep(match[1], signal);
  else if (hash === "#/sweeps") openSweeps(signal);
  else if ((match = hash.match(/^#\/compare\/([0-9a-fA-F,-]+)$/))) openCompare(match[1].split(","), signal);
  else if ((match = hash.match(/^#\/datasets\/([0-9a-fA-F-]{36})$/))) openDataset(match[1], signal);
  else if (hash === "#/datasets") openDatasets(signal);
  else if ((match = hash.match(/^#\/models\/([a-z0-9][a-z0-9_.-]{0,63})(?:\?owner=([^&]+))?$/))) openModel(match[1], match[2] && decodeURIComponent(match[2]), signal);
  else if (hash === "#/models") openModels(signal);
  else openHome(signal);
}

// ---------------------------------------------------------------------------------------
// Home: the job list and the submit form.

function openHome(signal) {
  showView("home-view");
  loadSpecForm();
  repeat(() => refreshJobs(signal), LIST_REFRESH_MS, signal);
}

async function refreshJobs(signal) {
  let page;
  try {
    page = await api(`/jobs?${jobsQuery(50)}`, { signal });
  } catch (e) {
    // A 503 (Redis or the database away) or a network error: say so, keep the last list. A
    // filter the API refuses (422) names itself.
    const why = e instanceof ApiError && e.status === 422 && Array.isArray(e.detail)
      ? e.detail.map((d) => `${(d.loc ?? []).filter((p) => p !== "query").join(".")}: ${d.msg}`).join("; ")
      : e.message;
    if (!(e instanceof Unauthorized) && !signal.aborted) show($("#jobs-message"), `Could not refresh the jobs: ${why}`);
    throw e;
  }
  renderJobs(page.items);
  show($("#jobs-message"), "");
  $("#jobs-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

function statusBadge(status, attrs = {}) {
  return el("span", { class: `status status-${status}`, text: status, ...attrs });
}

function specSummary(spec) {
  return `${spec.dataset ?? "?"}, ${spec.epochs ?? "?"} ep, batch ${spec.batch_size ?? "?"}`;
}

function progressText(job) {
  const p = job.progress;
  if (!p.total_steps) return p.step ? `step ${p.step}` : "–";
  return `${Math.floor((100 * p.step) / p.total_steps)} % (epoch ${p.epoch})`;
}

// Jobs ticked for comparison; kept here because the list is redrawn at every refresh.
const selectedJobs = new Set();

// A checkbox that adds its id to `selected` or takes it out, then calls `onChange`.
function selectBox(id, selected, onChange, label) {
  const box = el("input", { type: "checkbox", "aria-label": label });
  box.checked = selected.has(id);
  box.addEventListener("change", () => {
    if (box.checked) selected.add(id);
    else selected.delete(id);
    onChange();
  });
  return box;
}

function compareHash(ids) {
  return `#/compare/${[...ids].join(",")}`;
}

function updateCompareJobs() {
  $("#compare-jobs").disabled = selectedJobs.size < 2;
}

function renderJobs(jobs) {
  const rows = jobs.map((job) =>
    el(
      "tr",
      { "data-job-id": job.id, "data-status": job.status },
      el("td", {}, selectBox(job.id, selectedJobs, updateCompareJobs, `select job ${job.id.slice(0, 8)}`)),
      jobCell(job),
      el("td", {}, statusBadge(job.status)),
      el("td", { class: "wrap" }, tagChips(job.tags, (tag) => filterByTag(tag, relist))),
      el("td", { class: "wrap", text: specSummary(job.spec) }),
      el("td", { text: progressText(job) }),
      el("td", { class: "num", text: fmtPercent(job.result?.test_accuracy) }),
      el("td", { class: "num", text: jobDuration(job) }),
      el("td", { text: fmtShortTime(job.created_at), title: fmtTime(job.created_at) }),
    ),
  );
  $("#jobs tbody").replaceChildren(...rows);
  $("#jobs-empty").textContent = filtersActive() ? "No job matches these filters." : "No jobs yet: submit one.";
  $("#jobs-empty").hidden = jobs.length > 0;
  updateCompareJobs();
}

// The list again now, with the filters as they are (the view's refresh loop goes on).
function relist() {
  refreshJobs(view.signal).catch(() => {});
}

// --- the submit form, built from the JobSpec schema in /openapi.json --------------------

let specForm = null; // { fields: Map(name -> {input, kind, initial, error}) } once built

async function loadSpecForm() {
  if (specForm) return;
  try {
    const resp = await fetch("/openapi.json", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    buildSpecForm((await resp.json()).components.schemas);
  } catch (e) {
    $("#spec-fields").replaceChildren(
      el("p", { class: "error", text: `Could not load the job spec: ${e.message}` }),
    );
  }
}

// A field's schema with any $ref resolved, and `nullable` when it is `anyOf [X, null]`.
function resolveField(prop, schemas) {
  const deref = (s) => (s && s.$ref ? schemas[s.$ref.split("/").pop()] : s);
  let nullable = false;
  let base = deref(prop);
  if (prop.anyOf) {
    const options = prop.anyOf.map(deref);
    nullable = options.some((o) => o.type === "null");
    base = options.find((o) => o.type !== "null") ?? {};
  } else if (prop.allOf && prop.allOf.length === 1) {
    base = deref(prop.allOf[0]);
  }
  return { ...base, ...prop, base, nullable };
}

function inputFor(name, field) {
  const base = field.base;
  if (base.enum) {
    const select = el("select", { name, id: `f-${name}` });
    if (field.nullable) select.append(el("option", { value: "", text: "(none)" }));
    for (const value of base.enum) select.append(el("option", { value, text: value }));
    select.value = field.default ?? "";
    return { input: select, kind: "enum" };
  }
  if (base.type === "boolean") {
    const box = el("input", { type: "checkbox", name, id: `f-${name}` });
    box.checked = Boolean(field.default);
    return { input: box, kind: "boolean" };
  }
  if (base.type === "integer" || base.type === "number") {
    const lo = base.minimum ?? base.exclusiveMinimum;
    const hi = base.maximum ?? base.exclusiveMaximum;
    const input = el("input", {
      type: "number",
      name,
      id: `f-${name}`,
      step: base.type === "integer" ? "1" : "any",
      min: lo,
      max: hi,
      placeholder: field.nullable ? "none" : undefined,
    });
    input.value = field.default === undefined || field.default === null ? "" : String(field.default);
    return { input, kind: base.type };
  }
  if (base.type === "array") {
    // A list of choices (the model formats): typed comma-separated, sent as a list.
    const input = el("input", { type: "text", name, id: `f-${name}` });
    input.value = (field.default ?? []).join(",");
    return { input, kind: "list" };
  }
  const input = el("input", { type: "text", name, id: `f-${name}` });
  input.value = field.default ?? "";
  return { input, kind: "string" };
}

function boundsText(base) {
  const parts = [];
  if (base.minimum !== undefined) parts.push(`≥ ${base.minimum}`);
  if (base.exclusiveMinimum !== undefined) parts.push(`> ${base.exclusiveMinimum}`);
  if (base.maximum !== undefined) parts.push(`≤ ${base.maximum}`);
  if (base.exclusiveMaximum !== undefined) parts.push(`< ${base.exclusiveMaximum}`);
  return parts.join(", ");
}

function buildSpecForm(schemas) {
  const spec = schemas.JobSpec;
  const fields = new Map();
  const common = el("div", { class: "fields" });
  const more = el("div", { class: "fields" });
  common.append(...labelFieldBoxes(fields, markChanged));
  const names = Object.keys(spec.properties).filter((n) => !spec.properties[n].readOnly);
  const ordered = [...COMMON_FIELDS.filter((n) => names.includes(n)), ...names.filter((n) => !COMMON_FIELDS.includes(n))];
  for (const name of ordered) {
    const field = resolveField(spec.properties[name], schemas);
    const { input, kind } = inputFor(name, field);
    const initial = kind === "boolean" ? input.checked : input.value;
    const error = el("span", { class: "field-error", "data-error-for": name, role: "alert", hidden: true });
    const title = field.title ?? field.base.title ?? name;
    const dflt = field.default === undefined || field.default === null ? "none" : String(field.default);
    const meta = [`default ${dflt}`, boundsText(field.base)].filter(Boolean).join(" · ");
    const label =
      kind === "boolean"
        ? el("label", { for: input.id, class: "check" }, input, ` ${title}`)
        : el("label", { for: input.id, text: title });
    const box = el(
      "div",
      { class: "field", "data-field": name },
      label,
      kind === "boolean" ? null : input,
      el("small", { class: "muted", text: [field.description, meta].filter(Boolean).join(" — ") }),
      error,
    );
    input.addEventListener("input", () => markChanged(fields.get(name)));
    input.addEventListener("change", () => markChanged(fields.get(name)));
    fields.set(name, { input, kind, initial, error, box });
    (COMMON_FIELDS.includes(name) ? common : more).append(box);
  }
  followRecipe(fields, spec.properties.recipe?.["x-recipes"]);
  const details = el("details", { id: "more-fields" }, el("summary", { text: `More options (${more.children.length})` }), more);
  $("#spec-fields").replaceChildren(common, details);
  specForm = { fields };
  $("#submit").disabled = false;
}

// Choosing a recipe shows its values in the knobs it fills (a knob the user changed keeps
// the user's value): a knob is sent only where it differs from the chosen recipe's.
function followRecipe(fields, recipes) {
  const recipe = fields.get("recipe");
  if (!recipes || !recipe) return;
  recipe.input.addEventListener("change", () => {
    for (const [name, value] of recipes[recipe.input.value] ?? []) {
      const f = fields.get(name);
      if (!f || isChanged(f)) continue;
      if (f.kind === "boolean") f.input.checked = Boolean(value);
      else f.input.value = value === null || value === undefined ? "" : String(value);
      f.initial = f.kind === "boolean" ? f.input.checked : f.input.value;
      markChanged(f);
    }
  });
}

function isChanged(f) {
  return f.kind === "boolean" ? f.input.checked !== f.initial : f.input.value !== f.initial;
}

function markChanged(f) {
  f.box.classList.toggle("changed", isChanged(f));
  show(f.error, "");
}

// Only what the user changed: the server's defaults stay the single source of truth.
function changedSpec() {
  const body = {};
  const problems = [];
  for (const [name, f] of specForm.fields) {
    if (!isChanged(f)) continue;
    if (f.kind === "boolean") body[name] = f.input.checked;
    else if (f.kind === "integer" || f.kind === "number") {
      if (f.input.validity.badInput) problems.push([name, "not a number"]);
      else body[name] = f.input.value === "" ? null : Number(f.input.value);
    } else if (f.kind === "list") {
      body[name] = f.input.value.split(",").map((v) => v.trim()).filter(Boolean);
    } else if (f.kind === "tags") {
      body[name] = parseTags(f.input.value);
    } else if (f.kind === "label") {
      if (f.input.value.trim()) body[name] = f.input.value.trim();
    } else body[name] = f.input.value === "" ? null : f.input.value;
  }
  return { body, problems };
}

function showFieldError(name, message) {
  const f = specForm.fields.get(name);
  if (!f) return false;
  if (f.box.closest("details")) f.box.closest("details").open = true;
  show(f.error, message);
  return true;
}

async function submitJob(event) {
  event.preventDefault();
  if (!specForm) return;
  for (const f of specForm.fields.values()) show(f.error, "");
  const message = $("#submit-message");
  show(message, "");
  message.className = "";
  const { body, problems } = changedSpec();
  if (problems.length) {
    for (const [name, text] of problems) showFieldError(name, text);
    return;
  }
  $("#submit").disabled = true;
  try {
    const job = await api("/jobs", { method: "POST", body });
    message.className = "ok";
    message.replaceChildren("Submitted ", el("a", { href: `#/jobs/${job.id}`, class: "mono", text: job.id.slice(0, 8) }), ".");
    message.hidden = false;
    refreshJobs(view.signal).catch(() => {});
  } catch (e) {
    if (!(e instanceof Unauthorized)) showSubmitError(e);
  } finally {
    $("#submit").disabled = false;
  }
}

// 422: `detail` is a list of {loc: ["body", field, ...], msg}; show each next to its field,
// and what names no field (e.g. min_lr vs lr, checked across fields) above the button.
function showSubmitError(e) {
  const general = [];
  if (e.status === 422 && Array.isArray(e.detail)) {
    for (const item of e.detail) {
      const [where, name] = item.loc ?? [];
      if (!(where === "body" && typeof name === "string" && showFieldError(name, item.msg))) {
        general.push(item.msg);
      }
    }
  } else {
    general.push(e.message);
  }
  const message = $("#submit-message");
  message.className = "error";
  show(message, general.length ? `Not submitted: ${general.join("; ")}` : "Not submitted: see the fields marked above.");
}

// ---------------------------------------------------------------------------------------
// One job: status, progress, result, live plots from Server-Sent Events, cancel, download,
// run record.

let job = null; // { id, data (GET /jobs/{id}), steps: [], epochs: [], recordLoaded, streamDone }

function openJob(id, signal) {
  showView("job-view");
  job = { id, data: null, steps: [], epochs: [], recordLoaded: false, streamDone: false };
  $("#job-id").textContent = id;
  setStatus("…", { reset: true });
  show($("#job-error"), "");
  show($("#job-message"), "");
  $("#record").textContent = "Available once the job has ended.";
  $("#cancel").hidden = true;
  $("#downloads").replaceChildren();
  $("#job-facts").replaceChildren();
  $("#job-trial").hidden = true;
  $("#labels-form").hidden = true;
  renderLabels({ name: null, tags: [], notes: null });
  resetClassViews();
  drawAll();
  repeat(() => refreshJob(id, signal), JOB_REFRESH_MS, signal);
  const opened = job;
  followEvents(id, signal, (kind, data, eventId) => onJobEvent(id, kind, data, eventId)).then(() => {
    opened.streamDone = true; // every step the job will ever have has arrived
    if (job === opened) scheduleDraw();
  });
}

// An ended job never runs again, so a terminal status is final: a poll answered just
// before the job ended must not turn "canceled" back into "running" (reset opens a job).
function setStatus(status, { reset = false } = {}) {
  const node = $("#job-status");
  if (!reset && TERMINAL.has(node.dataset.status) && !TERMINAL.has(status)) return;
  node.textContent = status;
  node.className = `status status-${status}`;
  node.dataset.status = status;
  $("#cancel").hidden = !(status === "queued" || status === "running");
}

// Returns false once the job has ended and everything about it is shown: polling stops.
async function refreshJob(id, signal) {
  let data;
  try {
    data = await api(`/jobs/${id}`, { signal });
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) {
      show($("#job-message"), `No job ${id} (or it belongs to another key).`);
      return false;
    }
    throw e;
  }
  if (signal.aborted || job?.id !== id) return false;
  job.data = data;
  setStatus(data.status);
  renderFacts(data);
  renderLabels(data);
  renderTrial(data.sweep);
  renderProgress();
  show($("#job-error"), data.error ? `${data.error.code}: ${data.error.message}` : "");
  renderDownloads(data);
  showPredict(data.status);
  scheduleDraw(); // an ended job's empty plots say that no data will come
  if (!TERMINAL.has(data.status)) return true;
  if (!job.recordLoaded) await Promise.all([loadRecord(id, signal), loadConfusion(id, signal)]);
  return false;
}

function renderFacts(data) {
  const r = data.result;
  const facts = [
    ["device", data.device ?? "–"],
    ["worker", data.worker ?? "–"],
    ["attempt", data.attempt],
    ["spec", specSummary(data.spec)],
    ["created", fmtTime(data.created_at)],
    ["started", fmtTime(data.started_at)],
    ["finished", fmtTime(data.finished_at)],
    ["duration", jobDuration(data)],
  ];
  if (r) {
    facts.push(
      ["test accuracy", fmtPercent(r.test_accuracy)],
      ["test loss", r.test_loss.toFixed(4)],
      ["train loss", r.train_loss.toFixed(4)],
      ["images/s", Math.round(r.images_per_second).toLocaleString()],
      ["training time", fmtDuration(r.duration_s)],
      ["epochs · steps", `${r.epochs} · ${r.steps}`],
    );
    if (r.stopped_early) facts.push(["stopped early", r.stopped_early]);
  }
  $("#job-facts").replaceChildren(
    ...facts.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) }))),
  );
}

// A trial of a sweep says so: `trial` is the job's `sweep` field, null for other jobs.
function renderTrial(trial) {
  const line = $("#job-trial");
  line.hidden = !trial;
  if (!trial) return;
  line.replaceChildren(
    `trial ${trial.trial} of sweep `,
    el("a", { href: `#/sweeps/${trial.id}`, class: "mono", text: trial.id.slice(0, 8) }),
    ` (${fmtParams(trial.params)})`,
  );
}

// A trial's values, as "lr=0.003, batch_size=128".
function fmtParams(params) {
  return Object.entries(params ?? {})
    .map(([k, v]) => `${k}=${fmtValue(v)}`)
    .join(", ");
}

// Any JSON value, short: numbers to 4 significant digits, lists and objects as JSON.
function fmtValue(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

// Progress from whichever is newer: the last polled job or the last streamed step.
function renderProgress() {
  const data = job.data;
  const lastStep = job.steps.length ? job.steps[job.steps.length - 1] : null;
  const step = Math.max(data?.progress.step ?? 0, lastStep?.step ?? 0);
  const total = data?.progress.total_steps;
  const epochs = data?.spec.epochs;
  const epoch = Math.max(data?.progress.epoch ?? 0, job.epochs.length ? job.epochs[job.epochs.length - 1].epoch : 0);
  const bar = $("#job-progress");
  bar.max = total || 1;
  bar.value = total ? Math.min(step, total) : 0;
  $("#job-progress-text").textContent =
    `step ${step}${total ? ` / ${total}` : ""} · epoch ${epoch}${epochs ? ` / ${epochs}` : ""} done` +
    (lastStep ? ` · last step ${Math.round(lastStep.images_per_second).toLocaleString()} images/s` : "");
}

async function loadRecord(id, signal) {
  try {
    const record = await api(`/jobs/${id}/record`, { signal });
    $("#record").textContent = JSON.stringify(record, null, 2);
    job.recordLoaded = true;
  } catch (e) {
    if (e instanceof ApiError && e.status === 409) $("#record").textContent = "No run record for this job.";
    else throw e;
  }
}

function onJobEvent(id, kind, data) {
  if (job?.id !== id) return;
  if (kind === "step") {
    // Ids resume exactly, so a step arrives once; the check guards the plots all the same.
    const last = job.steps.length ? job.steps[job.steps.length - 1].step : 0;
    if (data.step > last) job.steps.push(data);
  } else if (kind === "epoch") {
    job.epochs = job.epochs.filter((e) => e.epoch !== data.epoch);
    job.epochs.push(data);
    loadConfusion(id, view.signal).catch(() => {});
  } else if (kind === "status") {
    if (data.status === "running" && Number.isInteger(data.resumed_from_step)) {
      // A new attempt restarts after its checkpoint: later points of the lost attempt go.
      const from = data.resumed_from_step;
      job.steps = job.steps.filter((p) => p.step <= from);
      job.epochs = job.epochs.filter((e) => e.step <= from);
    }
    setStatus(data.status);
    if (TERMINAL.has(data.status)) refreshJob(id, view.signal).catch(() => {});
  }
  renderProgress();
  scheduleDraw();
}

// --- Server-Sent Events over fetch() -----------------------------------------------------
// EventSource cannot send an Authorization header, so the stream is read by hand.

// Yields {id, event, data, retry} per frame of a text/event-stream body, as the SSE spec
// parses it: lines end in \n, \r\n or \r; a blank line ends a frame; ":" starts a comment.
async function* sseFrames(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let frame = { data: [] };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      // A trailing \r may be half of a \r\n split across chunks: keep it for the next one.
      const lines = buffer.split(/\r\n|\r(?!$)|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (frame.data.length || frame.id !== undefined) {
            yield { ...frame, data: frame.data.length ? frame.data.join("\n") : undefined };
          }
          frame = { data: [] };
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") frame.data.push(value);
        else if (field === "event") frame.event = value;
        else if (field === "id" && !value.includes("\0")) frame.id = value;
        else if (field === "retry" && /^\d+$/.test(value)) frame.retry = Number(value);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// Follows a job's events until it ends.
function followEvents(id, signal, onEvent) {
  return followStream(`/jobs/${id}/events`, signal, {
    state: $("#stream-state"),
    onEvent,
    isEnd: (kind, data) => kind === "status" && TERMINAL.has(data.status),
  });
}

// Follows an event stream until `isEnd(kind, data)`, reconnecting after a drop with
// Last-Event-ID so the server resumes right after the last event seen (nothing lost,
// nothing twice). `state` shows whether the stream is live.
async function followStream(path, signal, { state, onEvent, isEnd }) {
  let lastId = null;
  let retryMs = 1000;
  while (!signal.aborted) {
    let ended = false;
    try {
      const headers = authHeaders({ Accept: "text/event-stream" });
      if (lastId) headers["Last-Event-ID"] = lastId;
      const resp = await fetch(path, { headers, signal, cache: "no-store" });
      checkAuth(resp);
      if (resp.status === 404) return; // refreshJob says so
      if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
      state.textContent = "● live";
      for await (const frame of sseFrames(resp.body)) {
        if (frame.id) lastId = frame.id;
        if (frame.retry) retryMs = frame.retry;
        if (frame.data === undefined) continue;
        const kind = frame.event || "message";
        const data = JSON.parse(frame.data);
        onEvent(kind, data, frame.id);
        if (isEnd(kind, data)) {
          ended = true;
          break; // the server ends the stream here too
        }
      }
    } catch (e) {
      if (e instanceof Unauthorized || signal.aborted) return;
      console.warn("event stream dropped:", e);
    }
    if (ended) {
      state.textContent = "stream complete";
      return;
    }
    state.textContent = "reconnecting…";
    await sleep(retryMs, signal);
  }
}

// --- download ------------------------------------------------------------------------------

// Each model format a job may offer: its button's text and its file's suffix.
const FORMATS = {
  torchscript: { name: "TorchScript", suffix: ".pt" },
  onnx: { name: "ONNX", suffix: ".onnx" },
  pt2: { name: "torch.export", suffix: ".pt2" },
};

// One button per format the job offers (GET /jobs/{id}'s `formats`), its `default_format`
// first; the default's button gets `defaultId`. None while it offers none.
function downloadButtons(data, message, defaultId) {
  const formats = data.formats ?? [];
  const ordered = [...formats.filter((f) => f === data.default_format), ...formats.filter((f) => f !== data.default_format)];
  return ordered.map((format, i) => {
    const known = FORMATS[format] ?? { name: format, suffix: "" };
    const button = el("button", {
      type: "button",
      id: i === 0 ? defaultId : undefined,
      class: i === 0 ? "default-format" : "other-format",
      "data-format": format,
      title: i === 0 ? `${known.name}: this job's default format` : known.name,
      text: i === 0 ? `Download ${known.name}` : known.name,
    });
    button.addEventListener("click", () => downloadModel(data.id, button, message, format));
    return button;
  });
}

function renderDownloads(data) {
  const box = $("#downloads");
  const shown = [...box.children].map((b) => b.dataset.format).join();
  const offered = downloadButtons(data, $("#job-message"), "download");
  if (shown !== offered.map((b) => b.dataset.format).join()) box.replaceChildren(...offered);
}

// The model route needs the Authorization header, which a plain link cannot send: fetch
// it, check its sha256 against the ETag where the browser can hash, and save it via a
// temporary object URL. `button` is disabled meanwhile; a failure is shown in `message`.
async function downloadModel(id, button, message, format) {
  button.disabled = true;
  show(message, "");
  try {
    const query = format ? `?format=${encodeURIComponent(format)}` : "";
    const resp = await fetch(`/jobs/${id}/model${query}`, { headers: authHeaders(), cache: "no-store" });
    checkAuth(resp);
    if (!resp.ok) throw new Error(`HTTP ${resp.status}: ${(await resp.text()).slice(0, 200)}`);
    const blob = await resp.blob();
    await checkSha256(blob, resp.headers.get("ETag"));
    const suffix = FORMATS[format]?.suffix ?? ".pt";
    const name = /filename="([^"]+)"/.exec(resp.headers.get("Content-Disposition") ?? "")?.[1] ?? `trainq-${id}${suffix}`;
    const url = URL.createObjectURL(blob);
    const a = el("a", { href: url, download: name, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000); // after the browser has read it
  } catch (e) {
    if (!(e instanceof Unauthorized)) show(message, `Download failed: ${e.message}`);
  } finally {
    button.disabled = false;
  }
}

async function checkSha256(blob, etag) {
  if (!etag || !crypto.subtle) return; // crypto.subtle exists on https and localhost only
  const digest = await crypto.subtle.digest("SHA-256", await blob.arrayBuffer());
  const hex = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  if (`"${hex}"` !== etag) throw new Error("the file's sha256 does not match its ETag");
}

async function cancelJob() {
  const id = job.id;
  $("#cancel").disabled = true;
  try {
    await api(`/jobs/${id}/cancel`, { method: "POST" });
  } catch (e) {
    if (e instanceof ApiError && e.status === 409) show($("#job-message"), "The job had already ended.");
    else if (!(e instanceof Unauthorized)) show($("#job-message"), `Cancel failed: ${e.message}`);
  } finally {
    $("#cancel").disabled = false;
  }
  refreshJob(id, view.signal).catch(() => {});
}

// ---------------------------------------------------------------------------------------
// Plots, drawn on <canvas>. Redraws are coalesced: a replay of thousands of steps draws a
// few times, not once per event.

const COLORS = { blue: "#2563eb", orange: "#d97706", green: "#059669", red: "#dc2626", violet: "#7c3aed" };
const WAITING = "waiting for data…";
let drawPending = false;

function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  setTimeout(() => {
    drawPending = false;
    drawAll();
  }, 100);
}

// What an empty plot says: data may still come while the job can run, or while the event
// stream replays the steps of an ended job; once neither can bring any, why there is none.
function emptyNotes() {
  const data = job.data;
  if (!data || !TERMINAL.has(data.status)) return { steps: WAITING, epochs: WAITING };
  const stepped = data.progress.step > 0;
  if (stepped && !job.streamDone) return { steps: "loading…", epochs: "loading…" };
  const noStep = "no data: the job ended before its first step";
  return {
    steps: stepped ? "no data: this job's steps are no longer kept" : noStep,
    epochs: stepped ? "no data: the job ended before its first epoch" : noStep,
  };
}

// GPU memory is charted only where a step reported some; a job on the CPU reports zeros,
// and says so in one line instead of a chart of zeros.
function showMemory(steps) {
  const reported = steps.some((p) => p.memory_allocated || p.memory_reserved || p.memory_peak);
  const onCpu = !reported && (steps.length > 0 || /^cpu\b/.test(job.data?.device ?? ""));
  $("#memory-figure").hidden = !reported;
  const ended = TERMINAL.has(job.data?.status);
  show($("#memory-note"), onCpu ? `${ended ? "Trained" : "Training"} on the CPU: no GPU memory to chart.` : "");
  return reported;
}

function drawAll() {
  if (!job) return;
  const steps = job.steps;
  const epochEnds = job.epochs.map((e) => e.step);
  const empty = emptyNotes();
  const series = (key) => steps.map((p) => [p.step, p[key]]).filter(([, y]) => Number.isFinite(y));
  drawPlot($("#loss-plot"), {
    series: [{ label: "loss", color: COLORS.blue, points: series("loss") }],
    xLabel: "step",
    yLabel: "loss",
    markers: epochEnds,
    empty: empty.steps,
  });
  drawPlot($("#lr-plot"), {
    series: [{ label: "learning rate", color: COLORS.orange, points: series("lr") }],
    xLabel: "step",
    yLabel: "learning rate",
    markers: epochEnds,
    empty: empty.steps,
  });
  if (showMemory(steps)) drawMemory(series, epochEnds);
  drawPlot($("#accuracy-plot"), {
    series: [{ label: "test accuracy", color: COLORS.green, points: job.epochs.map((e) => [e.epoch, e.test_accuracy]), dots: true }],
    xLabel: "epoch",
    yLabel: "test accuracy",
    yFormat: (v) => `${(100 * v).toFixed(1)} %`,
    valueFormat: (v) => `${(100 * v).toFixed(2)} %`,
    integerX: true,
    yFit: true,
    empty: empty.epochs,
  });
}

function drawMemory(series, epochEnds) {
  drawPlot($("#memory-plot"), {
    series: [
      { label: "allocated", color: COLORS.blue, points: series("memory_allocated") },
      { label: "reserved", color: COLORS.violet, points: series("memory_reserved") },
      { label: "peak", color: COLORS.red, points: series("memory_peak") },
    ],
    xLabel: "step",
    yLabel: "bytes",
    yFormat: (v) => fmtBytes(v),
    yBytes: true,
    markers: epochEnds,
    empty: WAITING,
  });
}

// "Nice" tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
  return { ticks, step };
}

// Byte ticks fall on round numbers of one unit (0, 256 MiB, 512 MiB…), not of bytes.
function byteTicks(lo, hi) {
  const unit = 1024 ** Math.max(0, Math.floor(Math.log(Math.max(Math.abs(lo), Math.abs(hi))) / Math.log(1024)));
  const { ticks, step } = niceTicks(lo / unit, hi / unit);
  return { ticks: ticks.map((t) => t * unit), step: step * unit };
}

function sizeCanvas(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 640;
  const height = canvas.clientHeight || 280;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return { ctx, width, height };
}

// min and max without spreading: a long run has more points than a call takes arguments.
function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

function yRange(values, opts) {
  let [lo, hi] = extent(values);
  if (opts.yFit) {
    // Accuracy: zoom in on the data, which sits near 1, but stay within [0, 1].
    const pad = Math.max((hi - lo) * 0.15, 0.01);
    return [Math.max(0, lo - pad), Math.min(1, hi + pad)];
  }
  lo = Math.min(0, lo); // losses, rates and bytes read best from zero
  if (hi === lo) hi = lo + (lo === 0 ? (opts.yBytes ? 1024 ** 2 : 1) : Math.abs(lo));
  return [lo, hi + (hi - lo) * 0.05];
}

// Draws line series with labelled axes and tick values; sets data-points to the number of
// points of the first series (what the tests read to see a plot grow). Without points it
// writes `opts.empty` instead, also as the canvas's data-note and label.
function drawPlot(canvas, opts) {
  const { ctx, width, height } = sizeCanvas(canvas);
  const pad = { left: 86, right: 16, top: 24, bottom: 44 };
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const css = getComputedStyle(document.body);
  const fg = css.getPropertyValue("--fg").trim() || "#111";
  const muted = css.getPropertyValue("--muted").trim() || "#666";
  const grid = css.getPropertyValue("--grid").trim() || "#e5e7eb";
  ctx.clearRect(0, 0, width, height);
  ctx.font = "12px system-ui, sans-serif";
  canvas.dataset.points = String(opts.series[0].points.length);

  const all = opts.series.flatMap((s) => s.points);
  canvas.dataset.note = all.length ? "" : opts.empty;
  canvas.setAttribute("aria-label", all.length ? opts.yLabel : opts.empty);
  if (!all.length) {
    ctx.fillStyle = muted;
    ctx.textAlign = "center";
    ctx.fillText(opts.empty, width / 2, height / 2);
    return;
  }
  const xs = all.map((p) => p[0]);
  let [x0, x1] = extent(xs);
  if (x1 === x0) [x0, x1] = [x0 - 1, x1 + 1];
  if (opts.integerX) [x0, x1] = [x0 - 0.25, x1 + 0.25]; // dots at the ends stay whole
  const [y0, y1] = yRange(all.map((p) => p[1]), opts);
  const X = (x) => pad.left + ((x - x0) / (x1 - x0)) * plotW;
  const Y = (y) => pad.top + plotH - ((y - y0) / (y1 - y0)) * plotH;

  // Grid lines and tick values.
  const yt = opts.yBytes ? byteTicks(y0, y1) : niceTicks(y0, y1);
  const fmtY = opts.yFormat ?? ((v) => fmtNumber(v, yt.step));
  const fmtValue = opts.valueFormat ?? opts.yFormat ?? ((v) => Number(v.toPrecision(4)).toString());
  ctx.strokeStyle = grid;
  ctx.fillStyle = muted;
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of yt.ticks.filter((t) => t >= y0 && t <= y1)) {
    line(ctx, pad.left, Y(v), pad.left + plotW, Y(v));
    ctx.fillText(fmtY(v), pad.left - 6, Y(v));
  }
  let xt = niceTicks(x0, x1, Math.max(2, Math.floor(plotW / 80)));
  if (opts.integerX && xt.step < 1) xt = { ticks: xt.ticks.filter(Number.isInteger), step: 1 };
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const v of xt.ticks.filter((t) => t >= x0 && t <= x1)) {
    line(ctx, X(v), pad.top + plotH, X(v), pad.top + plotH + 4);
    ctx.fillText(fmtNumber(v, xt.step), X(v), pad.top + plotH + 6);
  }

  // Epoch ends, faintly, on the per-step plots.
  ctx.setLineDash([3, 4]);
  ctx.strokeStyle = muted;
  for (const m of opts.markers ?? []) if (m > x0 && m < x1) line(ctx, X(m), pad.top, X(m), pad.top + plotH);
  ctx.setLineDash([]);

  // Axes and their labels.
  ctx.strokeStyle = fg;
  line(ctx, pad.left, pad.top, pad.left, pad.top + plotH);
  line(ctx, pad.left, pad.top + plotH, pad.left + plotW, pad.top + plotH);
  ctx.fillStyle = fg;
  ctx.fillText(opts.xLabel, pad.left + plotW / 2, height - 16);
  ctx.save();
  ctx.translate(12, pad.top + plotH / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = "middle";
  ctx.fillText(opts.yLabel, 0, 0);
  ctx.restore();

  ctx.save();
  ctx.beginPath();
  ctx.rect(pad.left, pad.top - 2, plotW + 2, plotH + 4);
  ctx.clip();
  for (const s of opts.series) drawSeries(ctx, s, X, Y, plotW);
  ctx.restore();
  drawLegend(ctx, opts, fmtValue, pad, width, fg);
}

function line(ctx, xa, ya, xb, yb) {
  ctx.beginPath();
  ctx.moveTo(Math.round(xa) + 0.5, Math.round(ya) + 0.5);
  ctx.lineTo(Math.round(xb) + 0.5, Math.round(yb) + 0.5);
  ctx.stroke();
}

// With more points than pixels, each pixel column draws its min and max only: the same
// picture, at a cost bounded by the canvas width rather than the run length.
function drawSeries(ctx, s, X, Y, plotW) {
  ctx.strokeStyle = s.color;
  ctx.fillStyle = s.color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  if (s.points.length > 2 * plotW) {
    let column = null;
    let lo = 0;
    let hi = 0;
    const flush = () => {
      ctx.lineTo(column, Y(lo));
      ctx.lineTo(column, Y(hi));
    };
    for (const [x, y] of s.points) {
      const c = Math.round(X(x));
      if (c !== column) {
        if (column !== null) flush();
        else ctx.moveTo(c, Y(y));
        column = c;
        lo = hi = y;
      } else {
        lo = Math.min(lo, y);
        hi = Math.max(hi, y);
      }
    }
    flush();
  } else {
    s.points.forEach(([x, y], i) => (i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
  }
  ctx.stroke();
  if (s.dots || s.points.length === 1) {
    for (const [x, y] of s.points) {
      ctx.beginPath();
      ctx.arc(X(x), Y(y), 3.5, 0, 2 * Math.PI);
      ctx.fill();
    }
  }
}

// Top right: each series' name and its latest value.
function drawLegend(ctx, opts, fmtValue, pad, width, fg) {
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  let x = width - pad.right;
  for (const s of [...opts.series].reverse()) {
    if (!s.points.length) continue;
    const text = `${s.label}: ${fmtValue(s.points[s.points.length - 1][1])}`;
    ctx.fillStyle = fg;
    ctx.fillText(text, x, pad.top / 2 + 2);
    x -= ctx.measureText(text).width + 6;
    ctx.fillStyle = s.color;
    ctx.fillRect(x - 10, pad.top / 2 - 2, 10, 8);
    x -= 22;
  }
}

// ---------------------------------------------------------------------------------------

function start() {
  $("#login-form").addEventListener("submit", login);
  $("#logout").addEventListener("click", () => askForKey("Key forgotten."));
  $("#submit-form").addEventListener("submit", submitJob);
  $("#cancel").addEventListener("click", cancelJob);
  $("#compare-jobs").addEventListener("click", () => (location.hash = compareHash(selectedJobs)));
  setupFilterBar(relist);
  setupLabelEditor();
  window.addEventListener("hashchange", route);
  window.addEventListener("resize", scheduleDraw);
  route();
}

// After every deferred script has run: the views of sweeps.js and compare.js exist by then.
document.addEventListener("DOMContentLoaded", start);
