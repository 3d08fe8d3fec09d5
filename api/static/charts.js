// uPlot charts for the sweep and compare views: a scatter of one value against a parameter,
// and lines over a shared x axis. Each chart lives in a container <div class="chart">, is
// rebuilt whole when its data changes (a sweep has tens of trials, not thousands), and
// sets data-series and data-points on the container (what the tests read).
"use strict";

const CHART_HEIGHT = 260;
const PALETTE = ["#2563eb", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#9333ea", "#ea580c", "#0d9488"];
// How each kind of trial is drawn: the best stands out, pruned ones fade behind the rest.
const BEST_COLOR = "#dc2626";
const PRUNED_COLOR = "rgba(107, 114, 128, 0.45)";

const charts = new Map(); // container -> uPlot

function destroyChart(container) {
  charts.get(container)?.destroy();
  charts.delete(container);
}

function placeChart(container, opts, data) {
  destroyChart(container);
  container.replaceChildren();
  const width = Math.max(200, container.clientWidth || 480);
  const chart = new uPlot({ width, height: CHART_HEIGHT, ...opts }, data, container);
  charts.set(container, chart);
  container.dataset.note = "";
  return chart;
}

function chartNote(container, text) {
  destroyChart(container);
  container.replaceChildren(el("p", { class: "muted chart-note", text }));
  container.dataset.series = "0";
  container.dataset.points = "0";
  container.dataset.note = text;
}

// Ticks with as many decimals as their spacing needs (fmtNumber is app.js's).
function tickValues(u, splits, axisIdx, space, incr) {
  return splits.map((v) => (v === null || v === undefined ? "" : fmtNumber(v, incr)));
}

// A log axis spans decades, so one spacing fits no tick: each is written on its own.
function logTickValues(u, splits) {
  return splits.map((v) => {
    if (v === null || v === undefined) return ""; // a tick uPlot leaves out for room
    return v >= 1e-3 && v < 1e5 ? String(Number(v.toPrecision(3))) : v.toExponential(0);
  });
}

function axis(label, extra = {}) {
  return { label, values: tickValues, stroke: "#6b7280", grid: { stroke: "#e5e7eb", width: 1 }, ...extra };
}

// points: [{x, y, kind: "trial" | "pruned" | "best", label}]. A dimension is "log" (a log x
// axis), "category" (x is an index into `categories`) or "linear".
function scatterChart(container, { xLabel, yLabel, points, scale, categories }) {
  const usable = points.filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y) && (scale !== "log" || p.x > 0));
  if (!usable.length) {
    chartNote(container, "no trial has a value yet");
    return;
  }
  usable.sort((a, b) => a.x - b.x);
  const xs = usable.map((p) => p.x);
  const only = (kind) => usable.map((p) => (p.kind === kind ? p.y : null));
  const dots = (color, size) => ({
    paths: () => null,
    points: { show: true, size, width: 1.5, stroke: color, fill: color },
    stroke: color,
  });
  const x = { time: false };
  let xAxis = axis(xLabel);
  if (scale === "log") {
    x.distr = 3;
    xAxis = axis(xLabel, { values: logTickValues });
  }
  if (scale === "category") {
    x.range = () => [-0.5, categories.length - 0.5];
    xAxis = axis(xLabel, {
      splits: () => categories.map((_, i) => i),
      values: (u, splits) => splits.map((i) => fmtValue(categories[i])),
    });
  }
  placeChart(
    container,
    {
      scales: { x, y: { auto: true } },
      axes: [xAxis, axis(yLabel, { size: 60 })],
      cursor: { drag: { x: false, y: false } },
      series: [
        { label: xLabel, value: (u, v) => (!Number.isFinite(v) ? "" : scale === "category" ? fmtValue(categories[v]) : fmtValue(v)) },
        { label: "trials", ...dots(PALETTE[0], 8), value: blankOrValue },
        { label: "pruned", ...dots(PRUNED_COLOR, 7), value: blankOrValue },
        { label: "best", ...dots(BEST_COLOR, 13), value: blankOrValue },
      ],
    },
    [xs, only("trial"), only("pruned"), only("best")],
  );
  container.dataset.series = "3";
  container.dataset.points = String(usable.length);
}

// A legend value, blank (not "–") where the series has no point at the cursor.
function blankOrValue(u, v) {
  return Number.isFinite(v) ? fmtValue(v) : "";
}

// A line's value in the legend: at the cursor, or its last value while no point is
// pointed at; blank where the line has none (a pruned trial past its end).
function legendValue(ys) {
  let last = null;
  for (const y of ys) if (Number.isFinite(y)) last = y;
  return (u, v, seriesIdx, idx) => {
    return blankOrValue(u, idx === null || idx === undefined ? last : v);
  };
}

// lines: [{label, ys (one per x, null where none), kind: "trial" | "pruned" | "best"}], over
// the shared `xs`. `many` lines drop the legend, which would outgrow the chart. Without a
// point, the chart says `empty`. `spanGaps` joins a line across the xs it has no value at
// (runs compared over xs that only some of them have).
function linesChart(container, { xLabel, yLabel, xs, lines, integerX = false, empty = "waiting for data…", spanGaps = false }) {
  const drawn = lines.filter((l) => l.ys.some((y) => Number.isFinite(y)));
  if (!drawn.length) {
    chartNote(container, empty);
    return;
  }
  const style = (line, i) => {
    if (line.kind === "best") return { stroke: BEST_COLOR, width: 3.5 };
    if (line.kind === "pruned") return { stroke: PRUNED_COLOR, width: 1, dash: [4, 3] };
    return { stroke: PALETTE[i % PALETTE.length], width: 1.5 };
  };
  const single = xs.length === 1; // one epoch: a line needs a dot to be seen
  placeChart(
    container,
    {
      scales: { x: { time: false }, y: { auto: true } },
      axes: [
        axis(xLabel, integerX ? { incrs: [1, 2, 5, 10, 20, 50, 100], values: (u, s) => s.map((v) => (Number.isInteger(v) ? String(v) : "")) } : {}),
        axis(yLabel, { size: 60 }),
      ],
      legend: { show: drawn.length <= 12 },
      series: [
        { label: xLabel, value: (u, v) => (Number.isFinite(v) ? fmtValue(v) : "") },
        ...drawn.map((line, i) => ({
          label: line.label,
          spanGaps,
          value: legendValue(line.ys),
          ...style(line, i),
          points: { show: single || line.ys.filter((y) => y !== null).length === 1, size: 7, fill: style(line, i).stroke },
        })),
      ],
    },
    [xs, ...drawn.map((l) => l.ys)],
  );
  container.dataset.series = String(drawn.length);
  container.dataset.points = String(drawn.reduce((n, l) => n + l.ys.filter((y) => y !== null).length, 0));
}

// A chart that was drawn into a container since hidden or resized keeps its width: fit
// every chart on the page to its container again.
window.addEventListener("resize", () => {
  for (const [container, chart] of charts) {
    if (!container.isConnected || !container.clientWidth) continue;
    chart.setSize({ width: container.clientWidth, height: CHART_HEIGHT });
  }
});
