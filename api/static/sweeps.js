// Sweeps: the list ("#/sweeps") and one sweep ("#/sweeps/<id>"), followed live from its
// event stream, each event being the whole sweep. Built on app.js (DOM, API, streams) and
// charts.js.
"use strict";

const SWEEP_LIST_REFRESH_MS = 3000;
// How a Dimension's form reads on an axis: log forms on a log scale.
const LOG_FORMS = new Set(["log_uniform", "log_int_uniform"]);

// ---------------------------------------------------------------------------------------
// The search space, as the sweep's spec holds it: a dimension is an object with exactly one
// form set (the others are null); anything else is a value fixed for every trial.

function dimensions(spec) {
  const dims = [];
  for (const [name, value] of Object.entries(spec.space ?? {})) {
    if (value === null || typeof value !== "object") continue;
    const form = Object.keys(value).find((k) => value[k] !== null && value[k] !== undefined);
    if (form) dims.push({ name, form, values: value[form] });
  }
  return dims;
}

function fmtDimension(dim) {
  if (dim.form === "choice") return `${dim.name} ∈ {${dim.values.map(fmtValue).join(", ")}}`;
  return `${dim.name} ${dim.form} [${dim.values.map(fmtValue).join(", ")}]`;
}

// Numbers spread over two decades or more read best on a log axis, choices included; other
// choices (strings, booleans) are categories.
function axisScale(dim) {
  if (LOG_FORMS.has(dim.form)) return "log";
  if (dim.form !== "choice") return "linear";
  const numeric = dim.values.every((v) => typeof v === "number");
  if (!numeric) return "category";
  const lo = Math.min(...dim.values);
  const hi = Math.max(...dim.values);
  return lo > 0 && hi / lo >= 100 ? "log" : "linear";
}

function trialKind(trial, best) {
  if (best && trial.number === best.number) return "best";
  return trial.status === "pruned" ? "pruned" : "trial";
}

// ---------------------------------------------------------------------------------------
// The list.

function openSweeps(signal) {
  showView("sweeps-view");
  repeat(() => refreshSweeps(signal), SWEEP_LIST_REFRESH_MS, signal);
}

async function refreshSweeps(signal) {
  let page;
  try {
    page = await api("/sweeps?limit=50", { signal });
  } catch (e) {
    if (!(e instanceof Unauthorized) && !signal.aborted) show($("#sweeps-message"), `Could not refresh the sweeps: ${e.message}`);
    throw e;
  }
  const rows = page.items.map((sw) =>
    el(
      "tr",
      { "data-sweep-id": sw.id, "data-status": sw.status },
      el(
        "td",
        { class: "job-cell" },
        el("a", { href: `#/sweeps/${sw.id}`, class: sw.name ? "job-name" : "mono", text: sw.name || sw.id.slice(0, 8) }),
        sw.name ? el("span", { class: "mono muted", text: ` ${sw.id.slice(0, 8)}` }) : null,
      ),
      el("td", {}, statusBadge(sw.status)),
      el("td", { class: "wrap" }, tagChips(sw.tags)),
      el("td", { class: "wrap", text: dimensions(sw.spec).map((d) => d.name).join(", ") }),
      el("td", { text: `${sw.objective.direction} ${sw.objective.metric}` }),
      el("td", { class: "num", text: `${sw.budget.ended} / ${sw.budget.trials}` }),
      el("td", { class: "num", text: sw.best ? fmtValue(sw.best.value) : "–" }),
      el("td", { text: fmtTime(sw.created_at) }),
    ),
  );
  $("#sweeps tbody").replaceChildren(...rows);
  $("#sweeps-empty").hidden = rows.length > 0;
  show($("#sweeps-message"), "");
  $("#sweeps-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

// ---------------------------------------------------------------------------------------
// One sweep.

// { id, data (the sweep object), sort: {key, descending}, selected: Set of job ids }
let sweep = null;

function openSweep(id, signal) {
  showView("sweep-view");
  sweep = { id, data: null, sort: { key: "number", descending: false }, selected: new Set() };
  $("#sweep-id").textContent = id;
  setSweepStatus("…");
  for (const node of ["#sweep-facts", "#sweep-best", "#sweep-scatter", "#trials thead tr", "#trials tbody"]) {
    $(node).replaceChildren();
  }
  show($("#sweep-message"), "");
  show($("#sweep-waiting"), "");
  $("#sweep-stream-state").textContent = "";
  $("#sweep-compare").disabled = true;
  loadSweep(id, signal);
}

async function loadSweep(id, signal) {
  try {
    renderSweep(await api(`/sweeps/${id}`, { signal }));
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) show($("#sweep-message"), `No sweep ${id} (or it belongs to another key).`);
    else if (!(e instanceof Unauthorized) && !signal.aborted) show($("#sweep-message"), `Could not load the sweep: ${e.message}`);
    return;
  }
  if (sweep.data.status !== "running") return; // ended: nothing more will change
  await followStream(`/sweeps/${id}/events`, signal, {
    state: $("#sweep-stream-state"),
    onEvent: (kind, data) => {
      if (kind === "sweep" && sweep?.id === id && !signal.aborted) renderSweep(data);
    },
    isEnd: (kind, data) => kind === "sweep" && data.status !== "running",
  });
}

function setSweepStatus(status) {
  const node = $("#sweep-status");
  node.textContent = status;
  node.className = `status status-${status}`;
  node.dataset.status = status;
  $("#sweep-cancel").hidden = status !== "running";
}

function renderSweep(data) {
  sweep.data = data;
  setSweepStatus(data.status);
  renderBudget(data);
  renderSweepFacts(data);
  renderBest(data);
  show($("#sweep-waiting"), data.waiting && data.status === "running" ? `Waiting: ${data.waiting}` : "");
  renderScatter(data);
  renderCurves(data);
  renderTrials();
}

function renderBudget(data) {
  const b = data.budget;
  const bar = $("#sweep-progress");
  bar.max = b.trials;
  bar.value = b.ended;
  $("#sweep-progress-text").textContent =
    `${b.ended} of ${b.trials} trials ended · ${b.created} started · ${b.in_flight} queued or running · ` +
    `${b.pruned} pruned · ${b.epochs} epochs trained`;
}

function renderSweepFacts(data) {
  const spec = data.spec;
  const facts = [
    ...(data.name ? [["name", data.name]] : []),
    ...(data.tags?.length ? [["tags", data.tags.join(", ")]] : []),
    ...(data.notes ? [["notes", data.notes]] : []),
    ["objective", `${data.objective.direction} ${data.objective.metric}`],
    ["space", dimensions(spec).map(fmtDimension).join("; ")],
    ["sampler", `${spec.sampler.name}, seed ${spec.sampler.seed}`],
    ["pruner", spec.pruner.name === "none" ? "none" : `${spec.pruner.name}, after ${spec.pruner.min_epochs} epoch(s)`],
    ["parallel", spec.parallel],
    ["created", fmtTime(data.created_at)],
    ["finished", fmtTime(data.finished_at)],
  ];
  $("#sweep-facts").replaceChildren(
    ...facts.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) }))),
  );
}

function renderBest(data) {
  const best = data.best;
  const box = $("#sweep-best");
  if (!best) {
    box.replaceChildren(el("span", { class: "muted", text: "No trial has succeeded yet." }));
    return;
  }
  const message = el("span", { class: "error", role: "alert", hidden: true });
  const downloads = el("span", { class: "downloads", id: "sweep-downloads" });
  box.replaceChildren(
    el("strong", { text: "Best: " }),
    `trial ${best.number}, ${data.objective.metric} ${fmtValue(best.value)} (${fmtParams(best.params)}), job `,
    el("a", { href: `#/jobs/${best.job_id}`, class: "mono", id: "sweep-best-job", text: best.job_id.slice(0, 8) }),
    " ",
    downloads,
    message,
  );
  bestJobFormats(best.job_id).then((job) => {
    if (job && downloads.isConnected) downloads.replaceChildren(...downloadButtons(job, message, "sweep-download"));
  });
}

// The best trial's job, for the formats it offers; asked once per job, and again while it
// offers none (its model is still being stored).
async function bestJobFormats(jobId) {
  const known = sweep.bestJob;
  if (known?.id === jobId && known.formats?.length) return known;
  try {
    sweep.bestJob = await api(`/jobs/${jobId}`);
  } catch (e) {
    if (!(e instanceof Unauthorized)) console.warn(e);
    return null;
  }
  return sweep.bestJob;
}

// --- plots ------------------------------------------------------------------------------

function renderScatter(data) {
  const grid = $("#sweep-scatter");
  const dims = dimensions(data.spec);
  // Rebuild the figures only when the dimensions change; their charts are redrawn each time.
  if (grid.children.length !== dims.length) {
    grid.replaceChildren(
      ...dims.map((d) =>
        el("figure", { class: "scatter" }, el("figcaption", { text: fmtDimension(d) }), el("div", { class: "chart", "data-dimension": d.name })),
      ),
    );
  }
  dims.forEach((dim, i) => {
    const scale = axisScale(dim);
    const categories = scale === "category" ? dim.values : null;
    const points = data.trials
      .filter((t) => t.value !== null && dim.name in t.params)
      .map((t) => {
        const v = t.params[dim.name];
        return { x: categories ? categories.findIndex((c) => c === v) : Number(v), y: t.value, kind: trialKind(t, data.best) };
      });
    scatterChart(grid.children[i].lastChild, { xLabel: dim.name, yLabel: data.objective.metric, points, scale, categories });
  });
}

// The parameters whose values differ between `items` (each {params}); with one item,
// all of its own.
function differingKeys(items) {
  const keys = [...new Set(items.flatMap((i) => Object.keys(i.params ?? {})))];
  if (items.length < 2) return keys;
  return keys.filter((k) => new Set(items.map((i) => JSON.stringify(i.params?.[k] ?? null))).size > 1);
}

// A trial in a legend: its number and what sets it apart, "trial 0 · lr=0.003".
function trialLabel(trial, keys) {
  const shown = keys.filter((k) => k in trial.params).map((k) => `${k}=${fmtValue(trial.params[k])}`);
  return [`trial ${trial.number}`, ...shown].join(" · ");
}

function renderCurves(data) {
  const epochs = Math.max(0, ...data.trials.map((t) => t.values.length));
  const xs = Array.from({ length: epochs }, (_, i) => i + 1);
  const keys = differingKeys(data.trials);
  const lines = (key) =>
    data.trials.map((t) => ({
      label: trialLabel(t, keys),
      kind: trialKind(t, data.best),
      ys: xs.map((_, i) => t[key][i] ?? null),
    }));
  const empty = data.status === "running" ? undefined : "no data: the sweep ended before any trial's first epoch";
  $("#sweep-values-caption").textContent = `${data.objective.metric} per epoch`;
  linesChart($("#sweep-values-plot"), { xLabel: "epoch", yLabel: data.objective.metric, xs, lines: lines("values"), integerX: true, empty });
  linesChart($("#sweep-loss-plot"), { xLabel: "epoch", yLabel: "train loss", xs, lines: lines("train_loss"), integerX: true, empty });
}

// --- the trial table --------------------------------------------------------------------

// Each column: its header, how a trial sorts under it, and its cell.
function trialColumns(data) {
  const params = dimensions(data.spec).map((d) => ({
    key: `param:${d.name}`,
    title: d.name,
    num: true,
    sortValue: (t) => t.params[d.name],
    cell: (t) => el("td", { class: "num", text: fmtValue(t.params[d.name]) }),
  }));
  return [
    { key: "number", title: "trial", num: true, sortValue: (t) => t.number, cell: (t) => el("td", { class: "num", text: String(t.number) }) },
    { key: "status", title: "status", sortValue: (t) => t.status, cell: (t) => el("td", {}, statusBadge(t.status)) },
    ...params,
    { key: "value", title: data.objective.metric, num: true, sortValue: (t) => t.value, cell: (t) => el("td", { class: "num", text: fmtValue(t.value) }) },
    { key: "epochs", title: "epochs", num: true, sortValue: (t) => t.values.length, cell: (t) => el("td", { class: "num", text: String(t.values.length) }) },
    {
      key: "job",
      title: "job",
      cell: (t) => el("td", {}, el("a", { href: `#/jobs/${t.job_id}`, class: "mono", text: t.job_id.slice(0, 8) })),
    },
  ];
}

function compareValues(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b));
}

// A trial without a value yet sorts last whichever the direction; ties go by trial number.
function sortedTrials(trials, column, descending) {
  const sign = descending ? -1 : 1;
  const missing = (v) => v === null || v === undefined;
  return [...trials].sort((x, y) => {
    const a = column.sortValue(x);
    const b = column.sortValue(y);
    const order = missing(a) || missing(b) ? missing(a) - missing(b) : sign * compareValues(a, b);
    return order || x.number - y.number;
  });
}

function sortBy(key) {
  const s = sweep.sort;
  sweep.sort = { key, descending: s.key === key ? !s.descending : false };
  renderTrials();
}

function renderTrials() {
  const data = sweep.data;
  const columns = trialColumns(data);
  const column = columns.find((c) => c.key === sweep.sort.key) ?? columns[0];
  const arrow = sweep.sort.descending ? " ▼" : " ▲";
  $("#trials thead tr").replaceChildren(
    el("th", {}, el("span", { class: "visually-hidden", text: "select" })),
    ...columns.map((c) =>
      c.sortValue
        ? el(
            "th",
            {
              class: c.num ? "sortable num" : "sortable",
              "data-sort": c.key,
              "aria-sort": c === column ? (sweep.sort.descending ? "descending" : "ascending") : "none",
            },
            el("button", { type: "button", class: "link", text: c.title + (c === column ? arrow : ""), onclick: () => sortBy(c.key) }),
          )
        : el("th", { text: c.title }),
    ),
  );
  const rows = sortedTrials(data.trials, column, sweep.sort.descending).map((t) =>
    el(
      "tr",
      { "data-trial": t.number, "data-job-id": t.job_id, "data-status": t.status, class: `trial-${trialKind(t, data.best)}` },
      el("td", {}, selectBox(t.job_id, sweep.selected, updateSweepCompare, `select trial ${t.number}`)),
      ...columns.map((c) => c.cell(t)),
    ),
  );
  $("#trials tbody").replaceChildren(...rows);
  $("#trials-empty").hidden = rows.length > 0;
  updateSweepCompare();
}

function updateSweepCompare() {
  $("#sweep-compare").disabled = sweep.selected.size < 2;
}

async function cancelSweep() {
  const id = sweep.id;
  $("#sweep-cancel").disabled = true;
  try {
    const data = await api(`/sweeps/${id}/cancel`, { method: "POST" });
    if (sweep?.id === id) renderSweep(data);
  } catch (e) {
    if (e instanceof ApiError && e.status === 409) show($("#sweep-message"), "The sweep had already ended.");
    else if (!(e instanceof Unauthorized)) show($("#sweep-message"), `Cancel failed: ${e.message}`);
  } finally {
    $("#sweep-cancel").disabled = false;
  }
}

$("#sweep-cancel").addEventListener("click", cancelSweep);
$("#sweep-compare").addEventListener("click", () => (location.hash = compareHash(sweep.selected)));
