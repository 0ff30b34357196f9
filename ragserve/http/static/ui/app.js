// ragserve playground: vanilla JS, no build step, nothing fetched from outside this server.
// The page lives at <prefix>/ui/; the API is <prefix>/ (so it also works under a Serve route prefix).
"use strict";

const API = new URL("../", location.href);
const KEY_STORE = "ragserve.apiKey";
const INDEX_STORE = "ragserve.index";
const $ = (sel) => document.querySelector(sel);

const state = {
  history: [],          // the conversation sent with every chat request
  docsOffset: 0,
  docsTotal: 0,
  busy: false,
  config: null,
};

// --- HTTP ---------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// The key lives in sessionStorage (this tab, until it closes) unless the user ticks "remember",
// then in localStorage; never in both.
function storedKey() {
  return sessionStorage.getItem(KEY_STORE) || localStorage.getItem(KEY_STORE);
}

function storeKey(key, remember) {
  sessionStorage.removeItem(KEY_STORE);
  localStorage.removeItem(KEY_STORE);
  if (key) (remember ? localStorage : sessionStorage).setItem(KEY_STORE, key);
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = storedKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorMessage(res) {
  const text = await res.text();
  try {
    const body = JSON.parse(text);
    if (body.error && body.error.message) return body.error.message;
    if (body.detail) return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch (_) { /* not JSON */ }
  return text || res.statusText;
}

// fetch() against the API; a 401 asks for the key and tries once more.
async function call(path, opts = {}, retried = false) {
  const res = await fetch(new URL(path, API), { ...opts, headers: headers(opts.headers || {}) });
  if (res.status === 401 && !retried) {
    const why = await errorMessage(res);
    if (await askKey(why)) return call(path, opts, true);
  }
  if (!res.ok) throw new ApiError(res.status, await errorMessage(res));
  return res;
}

async function json(path, opts) {
  return (await call(path, opts)).json();
}

function toast(message, isError = false) {
  const t = $("#toast");
  t.textContent = message;
  t.className = isError ? "error" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, isError ? 8000 : 3000);
}

// --- API key ------------------------------------------------------------------------------------
function askKey(reason) {
  const dialog = $("#key-dialog");
  $("#key-reason").textContent = (reason ? reason + " " : "") +
    "The key is kept for this tab only (or in this browser if you tick remember) and sent as Authorization: Bearer.";
  $("#key-input").value = storedKey() || "";
  $("#key-remember").checked = localStorage.getItem(KEY_STORE) !== null;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue === "save" && $("#key-input").value.trim()) {
        storeKey($("#key-input").value.trim(), $("#key-remember").checked);
        resolve(true);
      } else {
        if (dialog.returnValue === "forget") storeKey(null, false);
        resolve(false);
      }
    }, { once: true });
    dialog.showModal();
  });
}

// --- indexes ------------------------------------------------------------------------------------
function currentIndex() { return $("#index-select").value; }

function humanBytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

async function loadIndexes(select) {
  const names = await json("indexes");
  const sel = $("#index-select");
  const want = select || sel.value || localStorage.getItem(INDEX_STORE);
  sel.innerHTML = "";
  if (!names.length) sel.append(new Option("(no index yet: upload files)", ""));
  for (const name of names) sel.append(new Option(name, name));
  if (names.includes(want)) sel.value = want;
  if (!$("#upload-index").value) $("#upload-index").value = sel.value || "playground";
  await indexChanged();
}

async function indexChanged() {
  const name = currentIndex();
  if (name) localStorage.setItem(INDEX_STORE, name);
  $("#index-stats").textContent = "";
  state.docsOffset = 0;
  if (!name) return;
  try {
    const s = await json(`indexes/${encodeURIComponent(name)}/stats`);
    $("#index-stats").textContent =
      `${s.documents} documents · ${s.chunks} chunks · ${humanBytes(s.bytes)} · ${s.index_kind} · ${s.shards.length} shard(s)`;
  } catch (e) {
    $("#index-stats").textContent = e.message;
  }
  if (!$("#tab-documents").hidden) loadDocuments();
}

// --- chat ---------------------------------------------------------------------------------------
function parseFilter(text) {
  text = text.trim();
  if (!text) return null;
  if (text.startsWith("{")) return JSON.parse(text);
  const out = {};  // key=value, key2=value2
  for (const pair of text.split(",")) {
    const [k, ...v] = pair.split("=");
    if (!k.trim() || !v.length) throw new Error(`filter: expected key=value, got ${pair.trim()}`);
    const raw = v.join("=").trim();
    out[k.trim()] = /^-?\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw;
  }
  return out;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  div.append(body);
  $("#messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function renderMeta(div, mode, reason) {
  let meta = div.querySelector(".meta");
  if (!meta) { meta = document.createElement("div"); meta.className = "meta"; div.append(meta); }
  meta.innerHTML = "";
  if (mode) {
    const badge = document.createElement("span");
    badge.className = `badge ${mode}`;
    badge.textContent = mode;
    meta.append(badge);
  }
  if (reason) meta.append(document.createTextNode(`reason: ${reason}`));
}

function sourceLabel(node) {
  const m = node.metadata || {};
  const where = m.path || node.doc_id;
  const page = m.page ? ` p.${m.page}` : "";
  return m.title && !String(where).endsWith(m.title) ? `${m.title} — ${where}${page}` : `${where}${page}`;
}

function renderSources(div, nodes) {
  const list = document.createElement("ol");
  list.className = "sources";
  for (const node of nodes) {
    const li = document.createElement("li");
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = ` (score ${Number(node.score).toFixed(3)})`;
    summary.append(document.createTextNode(sourceLabel(node)), score);
    const snippet = document.createElement("div");
    snippet.className = "snippet";
    snippet.textContent = node.text;
    details.append(summary, snippet);
    li.append(details);
    list.append(li);
  }
  div.append(list);
}

async function send(event) {
  event.preventDefault();
  const text = $("#chat-input").value.trim();
  if (!text || state.busy) return;
  let filter;
  try { filter = parseFilter($("#opt-filter").value); } catch (e) { toast(e.message, true); return; }
  state.busy = true;
  $("#chat-send").disabled = true;
  $("#chat-input").value = "";
  addMessage("user", text);
  const messages = [...state.history, { role: "user", content: text }];
  const body = { messages, stream: true, max_tokens: Number($("#opt-max-tokens").value) || undefined };
  if ($("#opt-rag").checked && currentIndex()) {
    body.index_name = currentIndex();
    body.top_k = Number($("#opt-top-k").value) || undefined;
    if (filter) body.metadata_filter = filter;
  }
  const div = addMessage("assistant", "");
  div.classList.add("streaming");
  const out = div.querySelector(".body");
  let answer = "";
  try {
    const res = await call("v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    renderMeta(div, res.headers.get("X-RAG-Mode"), res.headers.get("X-RAG-Reason"));
    for await (const chunk of sseEvents(res)) {
      if (chunk.error) throw new ApiError(chunk.error.code || 502, chunk.error.message);
      if (chunk.source_nodes && chunk.source_nodes.length) renderSources(div, chunk.source_nodes);
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        answer += delta.content;
        out.textContent = answer;
        div.scrollIntoView({ block: "end" });
      }
    }
    state.history = [...messages, { role: "assistant", content: answer }];
  } catch (e) {
    div.classList.add("error");
    out.textContent = answer + (answer ? "\n" : "") + `Error: ${e.message}`;
  } finally {
    div.classList.remove("streaming");
    div.classList.add("done");
    state.busy = false;
    $("#chat-send").disabled = false;
    $("#chat-input").focus();
  }
}

// Server-sent events from a fetch() body: "data: {...}" blocks separated by blank lines.
async function* sseEvents(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
    if (done) return;
  }
}

// --- documents ----------------------------------------------------------------------------------
async function loadDocuments(event) {
  if (event) { event.preventDefault(); state.docsOffset = 0; }
  const name = currentIndex();
  const tbody = $("#docs-table tbody");
  tbody.innerHTML = "";
  if (!name) { $("#docs-page").textContent = "no index"; return; }
  const limit = Number($("#docs-limit").value);
  const params = new URLSearchParams({ limit, offset: state.docsOffset, max_text_length: 300 });
  try {
    const filter = parseFilter($("#docs-filter").value);
    if (filter) params.set("metadata_filter", JSON.stringify(filter));
    const page = await json(`indexes/${encodeURIComponent(name)}/documents?${params}`);
    state.docsTotal = page.total_items;
    for (const d of page.documents) {
      const tr = document.createElement("tr");
      const m = d.metadata || {};
      const cells = [d.doc_id, m.title || "", m.file_type || m.language || "", d.text + (d.is_truncated ? "…" : "")];
      cells.forEach((value, i) => {
        const td = document.createElement("td");
        if (i === 0) { const c = document.createElement("code"); c.textContent = value; td.append(c); }
        else td.textContent = value;
        if (i === 3) { td.className = "text"; td.title = JSON.stringify(m, null, 1); }
        tr.append(td);
      });
      tbody.append(tr);
    }
    const last = Math.min(state.docsOffset + page.count, page.total_items);
    $("#docs-page").textContent = page.total_items
      ? `${state.docsOffset + 1}–${last} of ${page.total_items}` : "no documents match";
    $("#docs-prev").disabled = state.docsOffset === 0;
    $("#docs-next").disabled = last >= page.total_items;
  } catch (e) {
    $("#docs-page").textContent = "";
    toast(e.message, true);
  }
}

function pageDocs(step) {
  const limit = Number($("#docs-limit").value);
  state.docsOffset = Math.max(0, Math.min(state.docsOffset + step * limit, Math.max(0, state.docsTotal - 1)));
  loadDocuments();
}

// --- upload -------------------------------------------------------------------------------------
async function upload(files) {
  const index = $("#upload-index").value.trim() || currentIndex();
  if (!index) { toast("Name the index to upload into.", true); return; }
  const log = $("#upload-log");
  let ok = 0;
  for (const file of files) {
    const li = document.createElement("li");
    li.textContent = `${file.name}: uploading…`;
    log.prepend(li);
    const params = new URLSearchParams({ filename: file.name, mtime: Math.floor(file.lastModified / 1000) });
    try {
      const r = await json(`indexes/${encodeURIComponent(index)}/files?${params}`, {
        method: "POST", headers: { "Content-Type": file.type || "application/octet-stream" }, body: file,
      });
      li.className = "ok";
      li.textContent = `${file.name}: ${r.doc_ids.length} document(s) indexed as ${r.file_type}` +
        (r.warnings.length ? ` (${r.warnings.join("; ")})` : "");
      ok++;
    } catch (e) {
      li.className = "fail";
      li.textContent = `${file.name}: ${e.message}`;
    }
  }
  if (ok) await loadIndexes(index);
}

// --- settings -----------------------------------------------------------------------------------
async function loadConfig() {
  try {
    state.config = await json("ui/config");
  } catch (e) {
    toast(e.message, true);
    return;
  }
  const c = state.config;
  $("#model-name").textContent = `${c.model} · ${c.context_window} tokens`;
  const rows = [["model", c.model], ["context window", c.context_window], ["embedding model", c.embedding_model],
    ["API keys required", c.auth_required ? "yes" : "no"]];
  for (const [k, v] of Object.entries(c.settings)) rows.push([k, v]);
  for (const [k, v] of Object.entries(c.limits)) rows.push([`limit: ${k}`, v]);
  const tbody = $("#settings-table tbody");
  tbody.innerHTML = "";
  for (const [k, v] of rows) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = k;
    const td = document.createElement("td");
    td.textContent = v === null || v === undefined ? "—" : typeof v === "object" ? JSON.stringify(v) : String(v);
    tr.append(th, td);
    tbody.append(tr);
  }
}

// --- wiring -------------------------------------------------------------------------------------
function showTab(name) {
  for (const b of document.querySelectorAll("#tabs button")) b.setAttribute("aria-selected", b.dataset.tab === name);
  for (const s of document.querySelectorAll(".tab")) s.hidden = s.id !== `tab-${name}`;
  if (name === "documents") loadDocuments();
  if (name === "settings") loadConfig();
}

function init() {
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));
  $("#index-select").addEventListener("change", indexChanged);
  $("#index-refresh").addEventListener("click", () => loadIndexes().catch((e) => toast(e.message, true)));
  $("#chat-form").addEventListener("submit", send);
  $("#chat-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("#chat-form").requestSubmit(); }
  });
  $("#chat-clear").addEventListener("click", () => { state.history = []; $("#messages").innerHTML = ""; });
  $("#docs-form").addEventListener("submit", loadDocuments);
  $("#docs-prev").addEventListener("click", () => pageDocs(-1));
  $("#docs-next").addEventListener("click", () => pageDocs(1));
  $("#key-button").addEventListener("click", async () => { if (await askKey("")) boot(); });
  $("#upload-files").addEventListener("change", (e) => { upload([...e.target.files]); e.target.value = ""; });
  const zone = $("#drop-zone");
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("over"); upload([...e.dataTransfer.files]); });
  boot();
}

async function boot() {
  try {
    await loadConfig();
    await loadIndexes();
    document.body.dataset.ready = "true";
  } catch (e) {
    toast(e.message, true);
  }
}

init();
