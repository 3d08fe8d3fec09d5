// Jobs side by side ("#/compare/<id>,<id>…"): their loss per batch and test accuracy per
// epoch overlaid, and their specs as a table whose differing fields come first.
"use strict";

const MAX_COMPARED = 10;
const METRICS_PAGE = 5000; // the most GET /jobs/{id}/metrics answers at once

async function openCompare(ids, signal) {
  showView("compare-view");
  ids = [...new Set(ids)];
  $("#compare-count").textContent = String(ids.length);
  show($("#compare-message"), "");
  for (const node of ["#compare-spec thead tr", "#compare-spec tbody", "#compare-spec-equal tbody"]) $(node).replaceChildren();
  chartNote($("#compare-loss-plot"), "loading…");
  chartNote($("#compare-accuracy-plot"), "loading…");
  if (ids.length < 2 || ids.length > MAX_COMPARED || !ids.every((id) => /^[0-9a-fA-F-]{36}$/.test(id))) {
    show($("#compare-message"), `Compare takes 2 to ${MAX_COMPARED} job ids, separated by commas.`);
    return;
  }
  $("#compare-loading").hidden = false;
  let jobs;
  try {
    jobs = await Promise.all(ids.map((id) => loadCompared(id, signal)));
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) show($("#compare-message"), `No job ${e.jobId} (or it belongs to another key).`);
    else if (!(e instanceof Unauthorized) && !signal.aborted) show($("#compare-message"), `Could not load the jobs: ${e.message}`);
    return;
  } finally {
    $("#compare-loading").hidden = true;
  }
  if (signal.aborted) return;
  renderSpecDiff(jobs);
  renderCompareCharts(jobs);
}

// One job with all its per-step losses and its epochs.
async function loadCompared(id, signal) {
  try {
    const [data, epochs, losses] = await Promise.all([
      api(`/jobs/${id}`, { signal }),
      api(`/jobs/${id}/epochs`, { signal }),
      stepLosses(id, signal),
    ]);
    return { id, data, epochs, losses };
  } catch (e) {
    e.jobId = id;
    throw e;
  }
}

// [step, loss] for every step so far, page by page (`next` is the cursor to pass as `after`).
async function stepLosses(id, signal) {
  const points = [];
  let after = 0;
  for (;;) {
    const page = await api(`/jobs/${id}/metrics?after=${after}&limit=${METRICS_PAGE}`, { signal });
    for (const p of page.items) points.push([p.step, p.loss]);
    if (page.items.length < METRICS_PAGE || page.next === after) return points;
    after = page.next;
  }
}

function jobLabel(job) {
  const trial = job.data.sweep ? ` (trial ${job.data.sweep.trial})` : "";
  return `${job.id.slice(0, 8)}${trial}`;
}

// Series over one shared x: every x any job has, each job null where it has none.
function alignedLines(jobs, pointsOf) {
  const xs = [...new Set(jobs.flatMap((j) => pointsOf(j).map(([x]) => x)))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const lines = jobs.map((job) => {
    const ys = new Array(xs.length).fill(null);
    for (const [x, y] of pointsOf(job)) ys[index.get(x)] = Number.isFinite(y) ? y : null;
    return { label: jobLabel(job), kind: "trial", ys };
  });
  return { xs, lines };
}

function renderCompareCharts(jobs) {
  const loss = alignedLines(jobs, (j) => j.losses);
  linesChart($("#compare-loss-plot"), { xLabel: "step", yLabel: "loss", ...loss });
  const accuracy = alignedLines(jobs, (j) => j.epochs.map((e) => [e.epoch, e.test_accuracy]));
  linesChart($("#compare-accuracy-plot"), { xLabel: "epoch", yLabel: "test accuracy", ...accuracy, integerX: true });
}

function renderSpecDiff(jobs) {
  $("#compare-spec thead tr").replaceChildren(
    el("th", { text: "field" }),
    ...jobs.map((job) =>
      el(
        "th",
        { "data-job-id": job.id },
        el("a", { href: `#/jobs/${job.id}`, class: "mono", text: jobLabel(job) }),
        " ",
        statusBadge(job.data.status),
      ),
    ),
  );
  const fields = [...new Set(jobs.flatMap((j) => Object.keys(j.data.spec)))].sort();
  const differs = (field) => new Set(jobs.map((j) => JSON.stringify(j.data.spec[field] ?? null))).size > 1;
  const row = (field, differing) =>
    el(
      "tr",
      { "data-field": field, class: differing ? "differs" : "same" },
      el("th", { scope: "row", text: field }),
      ...jobs.map((j) => el("td", { text: fmtValue(j.data.spec[field]) })),
    );
  const differing = fields.filter(differs);
  const same = fields.filter((f) => !differs(f));
  $("#compare-spec tbody").replaceChildren(...differing.map((f) => row(f, true)));
  $("#compare-same-none").hidden = same.length > 0;
  $("#compare-equal").hidden = same.length === 0;
  $("#compare-equal summary").textContent = `${same.length} equal field${same.length === 1 ? "" : "s"}`;
  $("#compare-spec-equal tbody").replaceChildren(...same.map((f) => row(f, false)));
}
