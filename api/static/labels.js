// trainq dashboard: names, tags and notes. The jobs list's filter bar (GET /jobs's status,
// tag, name and sort), a job's name and tag chips wherever it is listed, a trial's mark,
// and a job's labels on its page, changed with PATCH /jobs/{id}. Uses app.js's helpers.
"use strict";

// --- the filter bar ------------------------------------------------------------------------

const jobFilters = { status: "", tags: [], name: "", sort: "-created" };
const NAME_TYPING_MS = 250;

// "a, b c" -> ["a", "b", "c"]: tags are separated by commas or spaces (none holds either).
function parseTags(text) {
  return [...new Set(text.split(/[\s,]+/).filter(Boolean))];
}

// GET /jobs's query string for the filters chosen.
function jobsQuery(limit) {
  const params = new URLSearchParams({ limit: String(limit) });
  if (jobFilters.status) params.append("status", jobFilters.status);
  for (const tag of jobFilters.tags) params.append("tag", tag);
  if (jobFilters.name) params.append("name", jobFilters.name);
  if (jobFilters.sort !== "-created") params.append("sort", jobFilters.sort);
  return params.toString();
}

function filtersActive() {
  return Boolean(jobFilters.status || jobFilters.tags.length || jobFilters.name || jobFilters.sort !== "-created");
}

// Read the bar into jobFilters and list again at once (the name after a pause in typing).
function setupFilterBar(onChange) {
  let typing = null;
  const read = () => {
    jobFilters.status = $("#filter-status").value;
    jobFilters.tags = parseTags($("#filter-tags").value);
    jobFilters.name = $("#filter-name").value.trim();
    jobFilters.sort = $("#filter-sort").value;
    onChange();
  };
  for (const id of ["#filter-status", "#filter-sort"]) $(id).addEventListener("change", read);
  $("#filter-tags").addEventListener("change", read);
  for (const id of ["#filter-name", "#filter-tags"]) {
    $(id).addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(read, NAME_TYPING_MS);
    });
  }
  $("#job-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    read();
  });
  $("#filter-clear").addEventListener("click", () => {
    $("#job-filters").reset();
    read();
  });
}

// A tag chip clicked in the list narrows the list to it, too.
function filterByTag(tag, onChange) {
  if (jobFilters.tags.includes(tag)) return;
  jobFilters.tags = [...jobFilters.tags, tag];
  $("#filter-tags").value = jobFilters.tags.join(", ");
  onChange();
}

// --- a job as it is listed -----------------------------------------------------------------

// Its name, else its short id: what a legend or a table calls it.
function jobTitle(job) {
  return job.name || job.id.slice(0, 8);
}

// The tags as chips; `onPick(tag)`, where given, makes each a button.
function tagChips(tags, onPick) {
  const chips = (tags ?? []).map((tag) =>
    onPick
      ? el("button", { type: "button", class: "tag", text: tag, title: `only jobs tagged ${tag}`, onclick: () => onPick(tag) })
      : el("span", { class: "tag", text: tag }),
  );
  return el("span", { class: "tags" }, ...chips);
}

// A sweep's trial says whose: "trial 3 of <sweep>".
function trialMark(trial) {
  if (!trial) return null;
  return el(
    "span",
    { class: "trial-mark", title: `trial ${trial.trial} of sweep ${trial.id}` },
    `trial ${trial.trial} of `,
    el("a", { href: `#/sweeps/${trial.id}`, class: "mono", text: trial.id.slice(0, 8) }),
  );
}

// The list's cell of one job: its name (or id) linking to it, its id, its trial mark.
function jobCell(job) {
  const link = el("a", { href: `#/jobs/${job.id}`, class: job.name ? "job-name" : "mono", text: jobTitle(job) });
  const id = job.name ? el("span", { class: "mono muted", text: ` ${job.id.slice(0, 8)}` }) : null;
  const mark = trialMark(job.sweep);
  return el("td", { class: "job-cell" }, link, id, mark ? el("br") : null, mark);
}

// --- a job's labels on its page ------------------------------------------------------------

function renderLabels(data) {
  $("#job-name").textContent = data.name ?? "";
  $("#job-name").hidden = !data.name;
  $("#job-tags").replaceChildren(tagChips(data.tags));
  $("#job-notes").textContent = data.notes ?? "";
  $("#job-notes").hidden = !data.notes;
  const form = $("#labels-form");
  if (!form.hidden) return; // being edited: leave what is typed
  form.elements.name.value = data.name ?? "";
  form.elements.tags.value = (data.tags ?? []).join(", ");
  form.elements.notes.value = data.notes ?? "";
}

function setupLabelEditor() {
  const form = $("#labels-form");
  $("#edit-labels").addEventListener("click", () => {
    form.hidden = !form.hidden;
    show($("#labels-message"), "");
    if (!form.hidden && job?.data) {
      form.elements.name.value = job.data.name ?? "";
      form.elements.tags.value = (job.data.tags ?? []).join(", ");
      form.elements.notes.value = job.data.notes ?? "";
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!job) return;
    const body = {
      name: form.elements.name.value.trim() || null,
      tags: parseTags(form.elements.tags.value),
      notes: form.elements.notes.value.trim() || null,
    };
    try {
      const changed = await api(`/jobs/${job.id}`, { method: "PATCH", body });
      form.hidden = true;
      show($("#labels-message"), "");
      job.data = { ...job.data, ...changed };
      renderLabels(changed);
    } catch (e) {
      if (e instanceof Unauthorized) return;
      const detail = e.status === 422 && Array.isArray(e.detail)
        ? e.detail.map((d) => `${(d.loc ?? []).filter((p) => p !== "body").join(".")}: ${d.msg}`).join("; ")
        : e.message;
      show($("#labels-message"), `Not saved: ${detail}`);
    }
  });
}

// --- the submit form's labels --------------------------------------------------------------

// The name, tags and notes inputs above the spec's fields: entries of specForm.fields, so
// that only what is typed is sent and a 422 shows next to the input it names.
function labelFieldBoxes(fields, markChanged) {
  const specs = [
    ["name", "Name", "What to call the job (not unique)", el("input", { type: "text", name: "name", id: "f-name", maxlength: "128" })],
    ["tags", "Tags", "Comma-separated, 16 at most: letters, digits, _ . : / -", el("input", { type: "text", name: "tags", id: "f-tags" })],
    ["notes", "Notes", "Why it is run", el("textarea", { name: "notes", id: "f-notes", rows: "2", maxlength: "4096" })],
  ];
  return specs.map(([name, title, hint, input]) => {
    const error = el("span", { class: "field-error", "data-error-for": name, role: "alert", hidden: true });
    const box = el("div", { class: "field label-field", "data-field": name }, el("label", { for: input.id, text: title }), input, el("small", { class: "muted", text: hint }), error);
    fields.set(name, { input, kind: name === "tags" ? "tags" : "label", initial: "", error, box });
    input.addEventListener("input", () => markChanged(fields.get(name)));
    return box;
  });
}
