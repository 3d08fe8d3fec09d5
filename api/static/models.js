// The model registry: the key's models ("#/models") and one model ("#/models/<name>", with
// "?owner=<id>" for one an admin shared with the key): its aliases with each one's moves,
// a form that moves an alias, and its versions with their metrics and lineage. Built on
// app.js.
"use strict";

// The owner a model's API paths need: none for the key's own.
function ownerQuery(owner, extra = "") {
  const params = new URLSearchParams(extra);
  if (owner) params.set("owner", owner);
  const text = params.toString();
  return text ? `?${text}` : "";
}

function modelHash(model) {
  return `#/models/${model.name}${model.read_only ? ownerQuery(model.owner) : ""}`;
}

function aliasChips(aliases) {
  return aliases.map((a) => el("span", { class: "alias-chip", text: `${a.alias} → ${a.version}` }));
}

// ---------------------------------------------------------------------------------------
// The list.

function openModels(signal) {
  showView("models-view");
  repeat(() => refreshModels(signal), LIST_REFRESH_MS, signal);
}

async function refreshModels(signal) {
  let page;
  try {
    page = await api("/models?limit=200", { signal });
  } catch (e) {
    if (!(e instanceof Unauthorized) && !signal.aborted) show($("#models-message"), `Could not load the models: ${e.message}`);
    return;
  }
  show($("#models-message"), "");
  const rows = page.items.map((m) =>
    el(
      "tr",
      { "data-model": m.name },
      el("td", { class: "wrap" }, el("a", { href: modelHash(m), text: m.name })),
      el("td", { class: "mono", text: m.read_only ? `${m.owner} (shared, read-only)` : m.owner }),
      el("td", { class: "num", text: String(m.version_count) }),
      el("td", { class: "num", text: m.latest_version ?? "–" }),
      el("td", { class: "wrap" }, ...aliasChips(m.aliases)),
      el("td", { text: fmtShortTime(m.created_at), title: fmtTime(m.created_at) }),
    ),
  );
  $("#models tbody").replaceChildren(...rows);
  $("#models-empty").hidden = page.items.length > 0;
}

// ---------------------------------------------------------------------------------------
// One model.

let shownModel = null; // the model on the page: {name, owner}

async function openModel(name, owner, signal) {
  showView("model-view");
  show($("#model-message"), "");
  show($("#alias-message"), "");
  shownModel = { name, owner };
  $("#model-name").textContent = name;
  await refreshModel(signal);
}

async function refreshModel(signal) {
  const { name, owner } = shownModel;
  let model;
  try {
    model = await api(`/models/${name}${ownerQuery(owner, "limit=100")}`, { signal });
  } catch (e) {
    if (!(e instanceof Unauthorized) && !signal?.aborted) show($("#model-message"), `Could not load the model: ${e.message}`);
    return;
  }
  renderModelFacts(model);
  renderAliases(model);
  renderVersions(model);
  renderMoveForm(model);
}

function renderModelFacts(model) {
  const facts = [
    ["owner", model.read_only ? `${model.owner} (shared with this key, read-only)` : model.owner],
    ["versions", model.version_count],
    ["newest", model.latest_version ?? "–"],
    ["created", fmtTime(model.created_at)],
    ["created by", model.created_by],
  ];
  $("#model-facts").replaceChildren(
    ...facts.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) }))),
  );
}

function renderAliases(model) {
  const rows = model.aliases.map((a) =>
    el(
      "tr",
      { "data-alias": a.alias },
      el("td", { class: "mono", text: a.alias }),
      el("td", { class: "num", text: String(a.version) }),
      el("td", { class: "mono", text: a.moved_by }),
      el("td", { text: fmtShortTime(a.moved_at), title: fmtTime(a.moved_at) }),
      el("td", {}, el("button", { type: "button", class: "history", text: "History", onclick: () => showHistory(a.alias) })),
    ),
  );
  $("#aliases tbody").replaceChildren(...rows);
  $("#aliases-empty").hidden = model.aliases.length > 0;
}

async function showHistory(alias) {
  const { name, owner } = shownModel;
  const box = $("#alias-history");
  try {
    const detail = await api(`/models/${name}/aliases/${alias}${ownerQuery(owner)}`);
    const items = detail.history.map((m) =>
      el("li", {
        text: `${m.from_version ?? "new"} → ${m.to_version ?? "removed"} by ${m.moved_by}, ${fmtTime(m.moved_at)}`,
      }),
    );
    $("#alias-history-title").textContent = `Moves of ${alias}, newest first`;
    $("#alias-history-list").replaceChildren(...items);
    box.hidden = false;
  } catch (e) {
    if (!(e instanceof Unauthorized)) show($("#model-message"), `Could not load the history: ${e.message}`);
  }
}

function lineageText(v) {
  const l = v.lineage;
  return JSON.stringify({ job_id: l.job_id, dataset: l.dataset, dataset_sha256: l.dataset_sha256,
    classes: l.classes, formats: l.formats, metrics: l.metrics, spec: l.spec }, null, 2);
}

function renderVersions(model) {
  const rows = model.versions.map((v) => {
    const m = v.lineage.metrics ?? {};
    const sha = v.lineage.dataset_sha256;
    return el(
      "tr",
      { "data-version": v.version },
      el("td", { class: "num", text: String(v.version) }),
      el("td", {}, el("a", { href: `#/jobs/${v.job_id}`, class: "mono", text: v.job_id.slice(0, 8) })),
      el("td", { class: "num", text: m.test_accuracy == null ? "–" : fmtPercent(m.test_accuracy) }),
      el("td", { class: "num", text: m.test_loss == null ? "–" : m.test_loss.toFixed(4) }),
      el("td", { class: "wrap", text: v.lineage.dataset, title: sha ? `sha256 ${sha}` : "" }),
      el("td", { text: v.lineage.formats.map((f) => f.format).join(", ") }),
      el("td", { class: "wrap" }, ...v.aliases.map((a) => el("span", { class: "alias-chip", text: a }))),
      el("td", { text: fmtShortTime(v.registered_at), title: `${fmtTime(v.registered_at)} by ${v.registered_by}` }),
      el("td", {}, el("details", {}, el("summary", { text: "lineage" }), el("pre", { class: "record", text: lineageText(v) }))),
    );
  });
  $("#versions tbody").replaceChildren(...rows);
  $("#versions-empty").hidden = model.versions.length > 0;
}

// The form moves an alias from where the page showed it (expected_version): if another
// move came first, the API refuses (409) and the page says so, and shows where it is now.
function renderMoveForm(model) {
  $("#move-alias-card").hidden = model.read_only;
  const versions = model.versions.map((v) => el("option", { value: v.version, text: `version ${v.version}` }));
  $("#move-version").replaceChildren(...versions);
  $("#move-alias-names").replaceChildren(...model.aliases.map((a) => el("option", { value: a.alias })));
  $("#move-alias-form").dataset.aliases = JSON.stringify(Object.fromEntries(model.aliases.map((a) => [a.alias, a.version])));
}

async function moveAlias(event) {
  event.preventDefault();
  const form = $("#move-alias-form");
  const alias = $("#move-alias").value.trim();
  const version = Number($("#move-version").value);
  if (!alias || !version) return;
  const known = JSON.parse(form.dataset.aliases || "{}");
  const { name, owner } = shownModel;
  $("#move-submit").disabled = true;
  show($("#alias-message"), "");
  try {
    const moved = await api(`/models/${name}/aliases/${alias}${ownerQuery(owner)}`, {
      method: "PUT",
      body: { version, expected_version: known[alias] ?? 0 },
    });
    const was = moved.previous_version == null ? "new" : `was ${moved.previous_version}`;
    show($("#alias-message"), `${alias} → version ${moved.version} (${was})`);
    $("#alias-message").className = "ok";
  } catch (e) {
    $("#alias-message").className = "error";
    if (e instanceof ApiError && e.status === 409) show($("#alias-message"), `Not moved: ${e.message}`);
    else if (!(e instanceof Unauthorized)) show($("#alias-message"), `Not moved: ${problemText(e.detail ?? e.message)}`);
  } finally {
    $("#move-submit").disabled = false;
  }
  await refreshModel(view.signal);
}

$("#move-alias-form").addEventListener("submit", moveAlias);
