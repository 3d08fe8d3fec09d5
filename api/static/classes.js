// Class names in the job view: the last epoch's confusion matrix as a heat map (rows the
// true classes, columns the predicted ones, each cell shaded by its share of its row), and
// the predict panel (drop or choose images, see each one's top labels and their bars).
// GET /jobs/{id}/confusion and POST /jobs/{id}/predict; app.js calls these as a job opens,
// as each epoch ends and as the job ends.
"use strict";

const HEAT_RGB = "37, 99, 235"; // PALETTE[0] of charts.js, at the cell's share as its alpha

function resetClassViews() {
  $("#confusion").replaceChildren(el("p", { class: "muted", text: "Shown once an epoch has ended." }));
  $("#confusion").dataset.classes = "0";
  $("#predict-card").hidden = true;
  $("#predictions").replaceChildren();
}

async function loadConfusion(id, signal) {
  let figures;
  try {
    figures = await api(`/jobs/${id}/confusion`, { signal });
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return; // no epoch yet
    throw e;
  }
  if (signal.aborted || job?.id !== id) return;
  renderConfusion(figures);
}

function renderConfusion(f) {
  const head = el("tr", {}, el("th", { text: "true \\ predicted" }), ...f.classes.map((name) => el("th", { text: name })),
    el("th", { class: "num", text: "accuracy" }));
  const rows = f.confusion.map((row, i) => {
    const total = f.class_counts[i] || 1;
    const cells = row.map((n, j) => {
      const td = el("td", { class: "num heat", text: String(n), title: `${f.classes[i]} predicted as ${f.classes[j]}: ${n} of ${f.class_counts[i]}` });
      // Through the CSSOM: the page's CSP (style-src 'self') refuses style attributes.
      td.style.backgroundColor = `rgba(${HEAT_RGB}, ${(n / total).toFixed(3)})`;
      if (n / total > 0.5) td.style.color = "#fff";
      return td;
    });
    const acc = f.per_class_accuracy[i];
    return el("tr", {}, el("th", { text: f.classes[i] }), ...cells, el("td", { class: "num", text: acc === null ? "–" : fmtPercent(acc) }));
  });
  const top5 = f.top5_accuracy === null ? "" : ` · top-5 ${fmtPercent(f.top5_accuracy)}`;
  const caption = el("p", { class: "muted", text: `epoch ${f.epoch} · test accuracy ${fmtPercent(f.test_accuracy)}${top5}` });
  const table = el("table", { class: "heatmap" }, el("thead", {}, head), el("tbody", {}, ...rows));
  const node = $("#confusion");
  node.replaceChildren(caption, el("div", { class: "table-scroll" }, table));
  node.dataset.classes = String(f.classes.length);
  node.dataset.epoch = String(f.epoch);
}

function showPredict(status) {
  $("#predict-card").hidden = status !== "succeeded";
}

async function predictFiles(files) {
  const id = job?.id;
  if (!id || !files.length) return;
  const form = new FormData();
  for (const f of files) form.append("files", f, f.name);
  show($("#predict-error"), "");
  const resp = await fetch(`/jobs/${id}/predict`, { method: "POST", body: form, headers: authHeaders() });
  checkAuth(resp);
  const data = await resp.json().catch(() => null);
  if (!resp.ok) {
    const detail = Array.isArray(data?.detail) ? data.detail.map((d) => d.msg).join("; ") : data?.detail;
    show($("#predict-error"), `HTTP ${resp.status}: ${detail ?? resp.statusText}`);
    return;
  }
  if (job?.id !== id) return;
  $("#predictions").replaceChildren(...data.predictions.map((p, i) => predictionCard(files[i], p)));
}

function predictionCard(file, p) {
  const img = el("img", { alt: file.name, class: "predict-thumb" });
  img.src = URL.createObjectURL(file);
  img.onload = () => URL.revokeObjectURL(img.src);
  const bars = p.top.map((t) => {
    const bar = el("span", { class: "predict-bar" });
    bar.style.width = `${(100 * t.probability).toFixed(1)}%`;
    return el("div", { class: "predict-row", "data-label": t.label },
      el("span", { class: "predict-label", text: t.label }), el("span", { class: "predict-track" }, bar),
      el("span", { class: "num", text: fmtPercent(t.probability) }));
  });
  return el("div", { class: "prediction", "data-label": p.label }, img,
    el("div", {}, el("strong", { text: `${file.name}: ${p.label}` }), ...bars));
}

function setUpPredictPanel() {
  const drop = $("#predict-drop");
  const input = $("#predict-files");
  input.addEventListener("change", () => predictFiles([...input.files]).catch((e) => show($("#predict-error"), String(e))));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    predictFiles([...e.dataTransfer.files]).catch((err) => show($("#predict-error"), String(err)));
  });
}

document.addEventListener("DOMContentLoaded", setUpPredictPanel);
