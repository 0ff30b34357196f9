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
  sel.replaceChildren();
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
  showExamples();
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

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function addMessage(role, text) {
  const div = el("div", `msg ${role}`);
  div.append(el("div", "body", text));
  $("#messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// An answer on the screen: what the stream has said so far, and the parts that show it.
function newAnswer(question) {
  const div = el("div", "msg assistant");
  const a = {
    div, question, text: "", nodes: [], evidence: [], answerable: null, error: null, inHistory: false,
    note: el("div", "note"), body: el("div", "body md"), evidenceBox: el("div", "evidence"), meta: el("div", "meta"),
    sources: el("ol", "sources"), actions: el("div", "actions"), painting: false,
  };
  a.note.hidden = a.evidenceBox.hidden = true;
  div.append(a.note, a.body, a.evidenceBox, a.meta, a.sources, a.actions);
  div.answer = a;
  $("#messages").append(div);
  div.scrollIntoView({ block: "end" });
  return a;
}

// Re-renders the answer's text (Markdown) at most once a frame while it streams.
function repaint(a) {
  if (a.painting) return;
  a.painting = true;
  requestAnimationFrame(() => { a.painting = false; paintBody(a); });
}

function paintBody(a) {
  Markdown.render(a.text, a.body, { sources: a.nodes.length });
  if (a.error) a.body.append(el("p", "error-line", `Error: ${a.error}`));
  a.div.scrollIntoView({ block: "end" });
}

function renderMeta(a, mode, reason) {
  a.meta.replaceChildren();
  if (mode) a.meta.append(el("span", `badge ${mode}`, mode));
  if (reason) a.meta.append(document.createTextNode(`reason: ${reason}`));
}

function sourceLabel(node) {
  const m = node.metadata || {};
  const where = m.path || node.doc_id;
  const page = m.page ? ` p.${m.page}` : "";
  return m.title && !String(where).endsWith(m.title) ? `${m.title} — ${where}${page}` : `${where}${page}`;
}

function renderSources(a, nodes) {
  a.nodes = nodes;
  a.sources.replaceChildren();
  nodes.forEach((node) => {
    const li = el("li");
    const details = el("details");
    const summary = el("summary");
    summary.append(document.createTextNode(sourceLabel(node)),
      el("span", "score", ` (score ${Number(node.score).toFixed(3)})`));
    details.append(summary, el("div", "snippet", node.text));
    li.append(details);
    a.sources.append(li);
  });
  paintEvidence(a);
}

// --- evidence: rag.evidence = [{text, source (1-based), node_id, start, end, score}] --------------
// start and end count characters as the server does (Unicode code points); a JS string counts
// UTF-16 units, so they are converted. [startUnit, endUnit] or null when they do not fit the text.
function unitRange(text, start, end) {
  if (!Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end <= start) return null;
  let cp = 0, from = null;
  for (let u = 0; u <= text.length;) {
    if (cp === start) from = u;
    if (cp === end) return [from, u];
    if (u === text.length) break;
    const c = text.charCodeAt(u);
    u += c >= 0xd800 && c <= 0xdbff && (text.charCodeAt(u + 1) & 0xfc00) === 0xdc00 ? 2 : 1;
    cp++;
  }
  return null;
}

// Where evidence sits in its source's text: its offsets when they hold its text, else its text found.
function evidenceRange(nodeText, ev) {
  const r = unitRange(nodeText, ev.start, ev.end);
  if (r && nodeText.slice(r[0], r[1]) === ev.text) return r;
  const at = ev.text ? nodeText.indexOf(ev.text) : -1;
  return at >= 0 ? [at, at + ev.text.length] : null;
}

function setRag(a, rag) {
  if (!rag || typeof rag !== "object") return;
  if (Array.isArray(rag.evidence)) {
    a.evidence = rag.evidence.filter((ev) => ev && typeof ev.text === "string" && ev.text &&
      Number.isInteger(ev.source) && ev.source >= 1);
  }
  if (typeof rag.answerable === "boolean") a.answerable = rag.answerable;
  paintEvidence(a);
}

function paintEvidence(a) {
  const notCovered = a.answerable === false;
  a.div.classList.toggle("not-covered", notCovered);
  a.note.hidden = !notCovered;
  a.note.textContent = notCovered
    ? "Not covered: the indexed documents do not answer this question. The closest sources are listed below."
    : "";
  // under the answer: each passage, its source and score
  const usable = a.evidence.filter((ev) => ev.source <= a.nodes.length || !a.nodes.length);
  a.evidenceBox.replaceChildren();
  a.evidenceBox.hidden = !usable.length;
  if (usable.length) {
    a.evidenceBox.append(el("div", "evidence-title", "Evidence in the sources"));
    const list = el("ul");
    a.evidence.forEach((ev, k) => {
      if (!usable.includes(ev)) return;
      const li = el("li");
      const cite = el("a", "cite", `[${ev.source}]`);
      cite.href = "#";
      cite.dataset.source = String(ev.source);
      cite.dataset.evidence = String(k);
      cite.title = `show it in source ${ev.source}`;
      li.append(cite, " ", el("q", "", ev.text));
      if (Number.isFinite(ev.score)) li.append(el("span", "score", ` (score ${ev.score.toFixed(2)})`));
      list.append(li);
    });
    a.evidenceBox.append(list);
  }
  // in the sources: the passages highlighted in their text
  [...a.sources.children].forEach((li, i) => {
    const node = a.nodes[i];
    const snippet = li.querySelector(".snippet");
    const ranges = [];
    a.evidence.forEach((ev, k) => {
      if (ev.source !== i + 1) return;
      const r = evidenceRange(node.text, ev);
      if (r) ranges.push({ from: r[0], to: r[1], k, ev });
    });
    ranges.sort((x, y) => x.from - y.from);
    snippet.replaceChildren();
    let at = 0;
    for (const r of ranges) {
      if (r.to <= at) continue;  // inside one already marked
      const from = Math.max(r.from, at);
      snippet.append(node.text.slice(at, from));
      const mark = el("mark", "", node.text.slice(from, r.to));
      mark.dataset.evidence = String(r.k);
      if (Number.isFinite(r.ev.score)) mark.title = `evidence, score ${r.ev.score.toFixed(2)}`;
      snippet.append(mark);
      at = r.to;
    }
    snippet.append(node.text.slice(at));
    const summary = li.querySelector("summary");
    let tag = summary.querySelector(".has-evidence");
    if (ranges.length && !tag) summary.append(tag = el("span", "has-evidence", "evidence"));
    if (!ranges.length && tag) tag.remove();
  });
}

// A citation [n] (in an answer or its evidence) opens source n and shows it (its passage, from evidence).
function showSource(link) {
  const msg = link.closest(".msg");
  const a = msg && msg.answer;
  const li = a && a.sources.children[Number(link.dataset.source) - 1];
  if (!li) return;
  li.querySelector("details").open = true;
  const mark = link.dataset.evidence !== undefined
    ? li.querySelector(`mark[data-evidence="${CSS.escape(link.dataset.evidence)}"]`) : null;
  const target = mark || li;
  target.scrollIntoView({ block: "nearest" });
  target.classList.remove("flash");
  void target.offsetWidth;  // restart the animation
  target.classList.add("flash");
}

// --- copy and regenerate ------------------------------------------------------------------------
async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch (_) {  // no clipboard API (a page not served over https or localhost): the old way
    const area = el("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok;
  }
}

function addActions(a) {
  a.actions.replaceChildren();
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.title = "Copy the answer's text";
  copy.disabled = !a.text;
  copy.addEventListener("click", async () => {
    const ok = await copyText(a.text);
    copy.textContent = ok ? "Copied ✓" : "Copy failed";
    setTimeout(() => { copy.textContent = "Copy"; }, 2000);
  });
  const again = el("button", "regenerate", "Regenerate");
  again.type = "button";
  again.title = "Ask the last question again";
  again.addEventListener("click", () => ask(a.question, a));
  a.actions.append(copy, again);
}

// --- example questions --------------------------------------------------------------------------
// Their words around the title are only stopwords and words of how a question is asked ("tell"),
// which the server's answerability rule does not weigh (ragserve.rag.answerable): an example is
// answered whenever the document holds its title's words. A word of their own ("Summarize", "key
// points") would be a term no document holds, and a click would get "not covered".
const EXAMPLES = [(t) => `What is “${t}” about?`, (t) => `Tell me about “${t}”.`, (t) => `What is in “${t}”?`];

function docTitle(d) {
  const m = d.metadata || {};
  let t = typeof m.title === "string" ? m.title : "";
  if (!t.trim()) {  // the file's name: "uploads/pump-guide.md" -> "pump-guide"
    const path = String(m.path || d.doc_id || "").split("#")[0];
    t = path.slice(path.lastIndexOf("/") + 1).replace(/\.[A-Za-z0-9]{1,8}$/, "");
  }
  t = t.replace(/\s+/g, " ").trim();
  return t.length > 80 ? t.slice(0, 79) + "…" : t;
}

// On an empty chat: a few questions built from the selected index's document titles, to click.
async function showExamples() {
  const box = $("#messages");
  if (box.querySelector(".msg")) return;
  const token = showExamples.token = (showExamples.token || 0) + 1;
  box.replaceChildren();
  const name = currentIndex();
  if (!name) return;
  const limit = Math.min(50, (state.config && state.config.limits && state.config.limits.max_list_limit) || 50);
  let page;
  try {
    page = await json(`indexes/${encodeURIComponent(name)}/documents?limit=${limit}&max_text_length=1`);
  } catch (_) {
    return;  // the chat works without examples
  }
  if (token !== showExamples.token || box.querySelector(".msg")) return;
  const titles = [], seen = new Set();
  for (const d of page.documents) {
    const t = docTitle(d);
    if (t && !seen.has(t.toLowerCase()) && titles.length < 4) { seen.add(t.toLowerCase()); titles.push(t); }
  }
  const wrap = el("div", "examples");
  wrap.id = "examples";
  if (!titles.length) {
    wrap.append(el("p", "muted", `“${name}” has no documents yet: add files in the Upload tab.`));
  } else {
    wrap.append(el("p", "muted", `Ask about “${name}”, for example:`));
    titles.forEach((t, i) => {
      const b = el("button", "example", EXAMPLES[i % EXAMPLES.length](t));
      b.type = "button";
      b.addEventListener("click", () => ask(b.textContent));
      wrap.append(b);
    });
  }
  box.append(wrap);
}

// --- asking -------------------------------------------------------------------------------------
function send(event) {
  event.preventDefault();
  const text = $("#chat-input").value.trim();
  if (ask(text)) $("#chat-input").value = "";
}

// Asks `text`; with `replacing` (the newest answer), asks its question again in its place.
// Returns whether it started (not while another answer streams, nor with a filter that does not parse).
function ask(text, replacing = null) {
  if (!text || state.busy) return false;
  let filter;
  try { filter = parseFilter($("#opt-filter").value); } catch (e) { toast(e.message, true); return false; }
  state.busy = true;
  stream(text, replacing, filter);
  return true;
}

async function stream(text, replacing, filter) {
  $("#chat-send").disabled = true;
  const examples = $("#examples");
  if (examples) examples.remove();
  for (const b of document.querySelectorAll("#messages .regenerate")) b.remove();  // only the newest answer's
  if (replacing) {
    if (replacing.inHistory) state.history = state.history.slice(0, -2);
    replacing.div.remove();
  } else {
    addMessage("user", text);
  }
  const messages = [...state.history, { role: "user", content: text }];
  const body = { messages, stream: true, max_tokens: Number($("#opt-max-tokens").value) || undefined };
  if (replacing) body.cache = false;  // regenerate: a fresh answer, not the answer cache's copy
  if ($("#opt-rag").checked && currentIndex()) {
    body.index_name = currentIndex();
    body.top_k = Number($("#opt-top-k").value) || undefined;
    if (filter) body.metadata_filter = filter;
  }
  const a = newAnswer(text);
  a.div.classList.add("streaming");
  try {
    const res = await call("v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    renderMeta(a, res.headers.get("X-RAG-Mode"), res.headers.get("X-RAG-Reason"));
    for await (const chunk of sseEvents(res)) {
      if (chunk.error) throw new ApiError(chunk.error.code || 502, chunk.error.message);
      if (chunk.source_nodes && chunk.source_nodes.length) renderSources(a, chunk.source_nodes);
      if (chunk.rag) setRag(a, chunk.rag);
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        a.text += delta.content;
        repaint(a);
      }
    }
    state.history = [...messages, { role: "assistant", content: a.text }];
    a.inHistory = true;
  } catch (e) {
    a.div.classList.add("error");
    a.error = e.message;
  } finally {
    paintBody(a);
    a.div.classList.remove("streaming");
    a.div.classList.add("done");
    addActions(a);
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
  tbody.replaceChildren();
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
  tbody.replaceChildren();
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
  $("#chat-clear").addEventListener("click", () => {
    if (state.busy) return;
    state.history = [];
    $("#messages").replaceChildren();
    showExamples();
  });
  $("#messages").addEventListener("click", (e) => {
    const link = e.target.closest("a.cite");
    if (link) { e.preventDefault(); showSource(link); }
  });
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
