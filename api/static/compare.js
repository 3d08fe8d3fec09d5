// Jobs side by side ("#/compare/<id>,<id>…"): their final metrics as a table, their loss
// per batch and test accuracy per epoch overlaid over steps, epochs or images seen (runs
// of different batch sizes line up by the last two), and their specs as a table whose
// differing fields come first.
"use strict";

const MAX_COMPARED = 10;
const METRICS_PAGE = 5000; // the most GET /jobs/{id}/metrics answers at once

// The x axes a comparison offers: each turns a job's step (and, for the accuracy plot, an
// epoch's number) into its x.
const COMPARE_AXES = {
  steps: { label: "step", ofStep: (job, step) => step, ofEpoch: (job, e) => e.step },
  epochs: { label: "epoch", ofStep: (job, step) => step / stepsPerEpoch(job), ofEpoch: (job, e) => e.epoch },
  images: { label: "images seen", ofStep: (job, step) => step * job.data.spec.batch_size, ofEpoch: (job, e) => e.step * job.data.spec.batch_size },
};

let compared = null; // the jobs on the compare page, redrawn when the x axis changes

async function openCompare(ids, signal) {
  showView("compare-view");
  ids = [...new Set(ids)];
  $("#compare-count").textContent = String(ids.length);
  show($("#compare-message"), "");
  compared = null;
  for (const node of ["#compare-final tbody", "#compare-spec thead tr", "#compare-spec tbody", "#compare-spec-equal tbody"]) $(node).replaceChildren();
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
  compared = jobs;
  renderFinalMetrics(jobs);
  renderSpecDiff(jobs);
  renderCompareCharts(jobs);
}

// Steps in one epoch: from the first epoch's end, else from the planned total; 1 when
// neither is known yet (the epochs axis then reads as steps).
function stepsPerEpoch(job) {
  const first = job.epochs.find((e) => e.epoch >= 1);
  if (first) return first.step / first.epoch;
  const total = job.data.progress.total_steps;
  return total && job.data.spec.epochs ? total / job.data.spec.epochs : 1;
}

function renderFinalMetrics(jobs) {
  const fixed = (x) => (Number.isFinite(x) ? x.toFixed(4) : "–");
  const rows = jobs.map((job) => {
    const r = job.data.result;
    const num = (text) => el("td", { class: "num", text });
    return el(
      "tr",
      { "data-job-id": job.id },
      jobCell(job.data),
      el("td", {}, statusBadge(job.data.status)),
      num(fmtPercent(r?.test_accuracy ?? job.epochs.at(-1)?.test_accuracy)),
      num(fixed(r?.test_loss ?? job.epochs.at(-1)?.test_loss)),
      num(fixed(r?.train_loss ?? job.epochs.at(-1)?.train_loss)),
      num(r ? `${r.epochs} · ${r.steps}` : `${job.epochs.length} · ${job.losses.at(-1)?.[0] ?? 0}`),
      num(fmtValue(job.data.spec.batch_size)),
      num(r ? Math.round(r.images_per_second).toLocaleString() : "–"),
      num(r ? fmtDuration(r.duration_s) : "–"),
    );
  });
  $("#compare-final tbody").replaceChildren(...rows);
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

// Its name (its short id if it has none), and a trial's number where the name does not
// carry it.
function jobLabel(job) {
  const trial = job.data.sweep && !job.data.name ? ` (trial ${job.data.sweep.trial})` : "";
  return `${jobTitle(job.data)}${trial}`;
}

// A job in a legend: its name (or short id) and the spec fields that set it apart from
// the others compared, "resnet baseline · batch_size=64".
function lineLabel(job, keys) {
  return [jobLabel(job), ...keys.slice(0, 3).map((k) => `${k}=${fmtValue(job.data.spec[k])}`)].join(" · ");
}

// Series over one shared x: every x any job has, each job null where it has none.
function alignedLines(jobs, pointsOf) {
  const keys = differingKeys(jobs.map((j) => ({ params: j.data.spec })));
  const xs = [...new Set(jobs.flatMap((j) => pointsOf(j).map(([x]) => x)))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const lines = jobs.map((job) => {
    const ys = new Array(xs.length).fill(null);
    for (const [x, y] of pointsOf(job)) ys[index.get(x)] = Number.isFinite(y) ? y : null;
    return { label: lineLabel(job, keys), kind: "trial", ys };
  });
  return { xs, lines };
}

function renderCompareCharts(jobs) {
  const axis = COMPARE_AXES[$("#compare-x").value] ?? COMPARE_AXES.steps;
  const ended = jobs.every((j) => TERMINAL.has(j.data.status));
  const empty = (what) => (ended ? `no data: the jobs ended before their first ${what}` : undefined);
  const loss = alignedLines(jobs, (j) => j.losses.map(([step, y]) => [axis.ofStep(j, step), y]));
  linesChart($("#compare-loss-plot"), { xLabel: axis.label, yLabel: "loss", ...loss, spanGaps: true, empty: empty("step") });
  const accuracy = alignedLines(jobs, (j) => j.epochs.map((e) => [axis.ofEpoch(j, e), e.test_accuracy]));
  linesChart($("#compare-accuracy-plot"), {
    xLabel: axis.label,
    yLabel: "test accuracy",
    ...accuracy,
    integerX: axis === COMPARE_AXES.epochs,
    spanGaps: true,
    empty: empty("epoch"),
  });
}

$("#compare-x").addEventListener("change", () => {
  if (compared) renderCompareCharts(compared);
});

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
