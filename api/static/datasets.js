// Data sets: the key's sets and a drop zone to upload one ("#/datasets"), and one set's
// classes with their counts and thumbnails ("#/datasets/<id>"). The upload goes by
// XMLHttpRequest, whose upload progress fetch() cannot report. Built on app.js.
"use strict";

const UPLOAD_SUFFIX = /\.(zip|tar\.gz|tgz|tar|npz)$/i;
const SPLIT_NAMES = ["train", "val", "holdout"];

// ---------------------------------------------------------------------------------------
// The list and the upload.

function openDatasets(signal) {
  showView("datasets-view");
  refreshDatasets(signal);
}

async function refreshDatasets(signal) {
  let sets;
  try {
    sets = await api("/datasets", { signal });
  } catch (e) {
    if (!(e instanceof Unauthorized) && !signal.aborted) show($("#datasets-message"), `Could not load the data sets: ${e.message}`);
    return;
  }
  show($("#datasets-message"), "");
  renderDatasets(sets);
}

function imageCount(ds) {
  return ds.train_count + ds.test_count + (ds.holdout_count ?? 0);
}

function classSummary(ds) {
  if (!ds.classes) return `${ds.num_classes} numbered`;
  const shown = ds.classes.slice(0, 4).join(", ");
  return ds.classes.length > 4 ? `${shown}, … (${ds.classes.length})` : shown;
}

function renderDatasets(sets) {
  const rows = sets.map((ds) =>
    el(
      "tr",
      { "data-dataset-id": ds.id },
      el("td", { class: "wrap" }, el("a", { href: `#/datasets/${ds.id}`, text: ds.name })),
      el("td", { class: "mono", text: `ds:${ds.id.slice(0, 8)}`, title: ds.dataset }),
      el("td", { class: "wrap", text: classSummary(ds) }),
      el("td", { class: "num", text: imageCount(ds).toLocaleString() }),
      el("td", { text: ds.image_shape.join("×") }),
      el("td", { text: fmtShortTime(ds.created_at), title: fmtTime(ds.created_at) }),
    ),
  );
  $("#datasets tbody").replaceChildren(...rows);
  $("#datasets-empty").hidden = sets.length > 0;
}

// A refusal's detail as one line: a 422 lists its problems, anything else is a string.
function problemText(detail) {
  if (Array.isArray(detail)) return detail.map((p) => p?.msg ?? JSON.stringify(p)).join("; ");
  return typeof detail === "string" ? detail : JSON.stringify(detail);
}

function uploadForm(file) {
  const form = new FormData();
  form.append("file", file);
  form.append("name", $("#upload-name").value.trim() || file.name.replace(UPLOAD_SUFFIX, "") || "data set");
  if ($("#upload-size").value) form.append("image_size", $("#upload-size").value);
  form.append("fit", $("#upload-fit").value);
  if ($("#upload-skip-bad").checked) form.append("skip_bad", "true");
  return form;
}

function showUploadProgress(loaded, total, text) {
  const bar = $("#upload-progress");
  bar.hidden = false;
  bar.max = total || 1;
  bar.value = loaded;
  $("#upload-progress-text").textContent = text;
}

function uploadDataset(file) {
  if (!file) return;
  show($("#upload-message"), "");
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/datasets");
  xhr.setRequestHeader("Authorization", `Bearer ${apiKey()}`);
  xhr.responseType = "json";
  xhr.upload.addEventListener("progress", (e) => {
    const total = e.lengthComputable ? e.total : file.size;
    showUploadProgress(e.loaded, total, `${fmtBytes(e.loaded)} of ${fmtBytes(total)} sent`);
  });
  xhr.upload.addEventListener("load", () => {
    $("#upload-progress-text").textContent = "sent; the API is checking every image…";
  });
  xhr.addEventListener("load", () => uploaded(xhr));
  xhr.addEventListener("error", () => uploadFailed("the API could not be reached"));
  showUploadProgress(0, file.size, `sending ${file.name}`);
  xhr.send(uploadForm(file));
}

function uploaded(xhr) {
  if (xhr.status === 401) {
    askForKey("The API refused this key (401). Enter a valid API key.");
    return;
  }
  const body = xhr.response;
  if (xhr.status !== 201) {
    uploadFailed(`HTTP ${xhr.status}: ${problemText(body?.detail ?? xhr.statusText)}`);
    return;
  }
  $("#upload-progress-text").textContent = `uploaded as ${body.dataset}`;
  location.hash = `#/datasets/${body.id}`;
}

function uploadFailed(message) {
  $("#upload-progress").hidden = true;
  $("#upload-progress-text").textContent = "";
  show($("#upload-message"), `Not uploaded: ${message}`);
}

function setUpDropzone() {
  const zone = $("#dropzone");
  const input = $("#upload-file");
  for (const kind of ["dragenter", "dragover"]) {
    zone.addEventListener(kind, (e) => {
      e.preventDefault();
      zone.classList.add("over");
    });
  }
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    uploadDataset(e.dataTransfer?.files?.[0]);
  });
  input.addEventListener("change", () => {
    uploadDataset(input.files[0]);
    input.value = "";
  });
}

// ---------------------------------------------------------------------------------------
// One set.

async function openDataset(id, signal) {
  showView("dataset-view");
  show($("#dataset-message"), "");
  let ds;
  try {
    ds = await api(`/datasets/${id}`, { signal });
  } catch (e) {
    if (!(e instanceof Unauthorized) && !signal.aborted) show($("#dataset-message"), `Could not load the data set: ${e.message}`);
    return;
  }
  renderDataset(ds, signal);
}

function fmtChannels(values) {
  return values ? values.map((v) => v.toFixed(3)).join(" ") : "–";
}

function renderDataset(ds, signal) {
  $("#dataset-name").textContent = ds.name;
  const prep = ds.preprocessing;
  const facts = [
    ["train on it as", ds.dataset],
    ["images", `${imageCount(ds).toLocaleString()} of ${ds.image_shape.join("×")}`],
    ["classes", ds.num_classes],
    ["mean", fmtChannels(ds.mean)],
    ["std", fmtChannels(ds.std)],
    ["fit", prep ? prep.fit : "–"],
    ["created", fmtTime(ds.created_at)],
  ];
  $("#dataset-facts").replaceChildren(
    ...facts.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) }))),
  );
  $("#dataset-notes").replaceChildren(...(prep?.notes ?? []).map((n) => el("li", { text: n })));
  const skipped = ds.skipped ?? [];
  $("#dataset-skipped-card").hidden = skipped.length === 0;
  $("#dataset-skipped").replaceChildren(...skipped.map((s) => el("li", { text: `${s.file}: ${s.reason}` })));
  renderClasses(ds, signal);
}

// One row per class: its name, a bar of its images, the count per split, its thumbnails.
function renderClasses(ds, signal) {
  const counts = ds.class_counts ?? { train: [ds.train_count], val: [ds.test_count] };
  const splits = SPLIT_NAMES.filter((s) => counts[s]);
  const names = ds.class_counts ? (ds.classes ?? counts.train.map((_, k) => String(k))) : ["all classes"];
  const totals = names.map((_, k) => splits.reduce((sum, s) => sum + counts[s][k], 0));
  const most = Math.max(1, ...totals);
  $("#dataset-classes thead tr").replaceChildren(
    ...["class", "images", ...splits, "samples"].map((h) => el("th", { text: h, class: h === "class" || h === "samples" ? null : "num" })),
  );
  const rows = names.map((name, k) =>
    el(
      "tr",
      { "data-class": name },
      el("td", { class: "wrap", text: name }),
      el("td", { class: "num" }, el("meter", { class: "class-bar", min: 0, max: most, value: totals[k], title: `${totals[k]} images` }), ` ${totals[k]}`),
      ...splits.map((s) => el("td", { class: "num", text: String(counts[s][k]) })),
      el("td", { class: "thumbs" }, ...thumbnails(ds.thumbnails?.[k] ?? [], name, signal)),
    ),
  );
  $("#dataset-classes tbody").replaceChildren(...rows);
}

// The thumbnail route wants the Authorization header, which an <img src> cannot send:
// each is fetched, then shown from a blob: URL (the page's CSP allows img-src blob:).
function thumbnails(paths, name, signal) {
  return paths.map((path, i) => {
    const img = el("img", { class: "thumb", alt: `${name} ${i + 1}`, width: 48, height: 48 });
    fetch(path, { headers: authHeaders(), signal })
      .then((resp) => (resp.ok ? resp.blob() : Promise.reject(new Error(`HTTP ${resp.status}`))))
      .then((blob) => {
        const url = URL.createObjectURL(blob);
        img.addEventListener("load", () => URL.revokeObjectURL(url), { once: true });
        img.src = url;
      })
      .catch((e) => {
        if (!signal.aborted) img.alt = `${name} ${i + 1}: ${e.message}`;
      });
    return img;
  });
}

document.addEventListener("DOMContentLoaded", setUpDropzone);
