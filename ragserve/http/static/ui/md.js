// Markdown for the playground's answers, built with DOM nodes only: text always goes in through
// text nodes and textContent, never innerHTML, so HTML or script in a model's answer (or in the
// documents it quotes) shows as text and cannot run. Links are made only for http(s) URLs.
//
// Rendered: paragraphs (a newline inside one is a line break: the CSS keeps it), headings, fenced
// code blocks (closed or not, so a streaming answer renders as it grows), bulleted and numbered
// lists (nested by indentation), block quotes, rules, and inline `code`, **bold**, *italics* (and
// the _ forms), [text](http-url), bare http(s) URLs and citations [n] / [1, 2]. Anything else stays
// text. As in CommonMark, a line right after a list item (no blank line between) continues it.
//
// Every step is linear in the text's length: the blocks are one pass over the lines; inline, one
// pass finds code spans (the next backtick run of each length is precomputed), links and citations
// (the next "[", "]", ")" and URL stop after each position are precomputed, and only the innermost
// "[" before a "]" is tried) and bare URLs (what failed to be one is skipped whole); emphasis pairs
// the * and _ runs with a stack per character, each run pushed and popped at most once. The tree
// is bounded: nesting by MAX_INLINE_DEPTH and MAX_LIST_DEPTH, and its size by MAX_ELEMENTS, after
// which the rest of the answer is one plain text (no real answer comes near it; a hostile one
// cannot make the page build a million elements).
"use strict";

const Markdown = (() => {
  const MAX_ELEMENTS = 5000;
  const MAX_INLINE_DEPTH = 12;
  const MAX_LIST_DEPTH = 8;
  const MAX_URL = 2048;
  const MAX_DELIM_RUN = 3;  // longer runs of * or _ are text (a row of stars is not emphasis)

  // character classes of a UTF-16 code (NaN: the start or end of the text, which counts as a
  // space): ASCII from the code, the rest from Unicode properties
  const isSpace = (code) => {
    if (code < 128) return code === 32 || (code >= 9 && code <= 13);
    return code !== code || /\s/.test(String.fromCharCode(code));  // NaN !== NaN
  };
  const isPunct = (code) => {
    if (code < 128) {
      return (code >= 33 && code <= 47) || (code >= 58 && code <= 64) || (code >= 91 && code <= 96) ||
        (code >= 123 && code <= 126);
    }
    return code === code && /[\p{P}\p{S}]/u.test(String.fromCharCode(code));
  };
  const isWord = (code) => {
    if (code < 128) return (code >= 48 && code <= 57) || (code >= 65 && code <= 90) || (code >= 97 && code <= 122);
    return code === code && /[\p{L}\p{N}]/u.test(String.fromCharCode(code));
  };
  // An absolute http(s) URL, or null (javascript:, data:, relative and malformed URLs are no links).
  function safeUrl(raw) {
    if (!raw || raw.length > MAX_URL || !/^https?:\/\//i.test(raw)) return null;
    try {
      const url = new URL(raw);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch (_) {
      return null;
    }
  }

  // The element budget of one render: make() returns null once it is spent.
  function budget() {
    let left = MAX_ELEMENTS;
    return {
      make(tag) { if (left <= 0) return null; left--; return document.createElement(tag); },
      // a block's element: the render loop stops making blocks once fewer than 3 are left, so
      // these overrun the budget by a few at most
      force(tag) { left--; return document.createElement(tag); },
      get left() { return left; },
    };
  }

  // --- inline: atoms -------------------------------------------------------------------------------
  const CITATION = /\d{1,4}(?:[ \t]*,[ \t]*\d{1,4})*\]/y;  // after "[": "1]", "1, 2]"; one way to match
  const URL_START = /https?:\/\//iy;

  // The next position at or after p of what `find(p)` finds (-1: none), for positions p that only
  // grow: what was found is reused until p passes it, so a whole pass costs one scan of the text.
  function forward(find) {
    let at = -2;  // not searched yet
    let from = 0;
    return (p) => {
      if (at === -1 && p >= from) return -1;
      if (at < p || p < from) { at = find(p); from = p; }
      return at;
    };
  }

  const INTERESTING = /[`[hH]/;  // where an atom may start
  const URL_STOP_RE = /[\x00-\x20\u00a0"(<>[\]`]/g;  // where a link's (url) ends
  const BARE_URL_STOP_RE = /[\x00-\x20\u00a0"<>[\]`]/g;  // where a bare URL ends (it may hold parentheses)

  function regexFrom(re, s) {
    return (p) => {
      re.lastIndex = p;
      const m = re.exec(s);
      return m ? m.index : -1;
    };
  }

  // The atoms of s (code spans, links, citations, bare URLs) in order, not overlapping; at most
  // `limit` of them. Returns {list, end}: where the search stopped. Each scan only moves forward.
  function atoms(s, limit) {
    const n = s.length;
    const runStart = [], runLen = [];  // backtick runs
    for (let i = s.indexOf("`"); i >= 0; i = s.indexOf("`", i)) {
      let j = i + 1;
      while (j < n && s.charCodeAt(j) === 96) j++;
      runStart.push(i);
      runLen.push(j - i);
      i = j;
    }
    const nextSame = new Int32Array(runStart.length).fill(-1);  // the next run of the same length
    const lastOfLen = new Map();
    for (let r = runStart.length - 1; r >= 0; r--) {
      const last = lastOfLen.get(runLen[r]);
      if (last !== undefined) nextSame[r] = last;
      lastOfLen.set(runLen[r], r);
    }
    const next = {  // for "[" at i: the next "]" and "[" after it; for "](" at j: the ")" and the URL stop after it
      close: forward((p) => s.indexOf("]", p)), open: forward((p) => s.indexOf("[", p)),
      paren: forward((p) => s.indexOf(")", p)), linkStop: forward(regexFrom(URL_STOP_RE, s)),
    };
    const urlStop = forward(regexFrom(BARE_URL_STOP_RE, s));  // for bare URLs
    let interesting = new RegExp(INTERESTING.source, "g");
    const list = [];
    let run = 0;  // the first backtick run at or after i
    let i = 0;
    while (i < n && list.length < limit) {
      interesting.lastIndex = i;
      const m = interesting.exec(s);
      if (!m) { i = n; break; }
      i = m.index;
      const c = s.charCodeAt(i);
      if (c === 96) {  // `
        while (run < runStart.length && runStart[run] < i) run++;
        const mate = nextSame[run], len = runLen[run];
        if (mate >= 0) {
          let code = s.slice(i + len, runStart[mate]);
          // CommonMark: one space each side is dropped when both are there and it is not all spaces
          if (code.length > 2 && code[0] === " " && code[code.length - 1] === " " && code.trim()) {
            code = code.slice(1, -1);
          }
          list.push({ start: i, end: runStart[mate] + len, kind: "code", text: code });
          i = runStart[mate] + len;
        } else {
          i += len;  // a run with no mate is text
        }
      } else if (c === 91) {  // [: only the innermost "[" before a "]" is tried, so each "]" once
        const close = next.close(i + 1), inner = next.open(i + 1);
        if (close < 0) interesting = /[`hH]/g;  // no "]" after here: no "[" can start an atom
        const atom = close >= 0 && (inner < 0 || inner > close) ? bracket(s, i, close, next) : null;
        if (atom) list.push(atom);
        i = atom ? atom.end : i + 1;
      } else if (!isWord(s.charCodeAt(i - 1))) {  // h: a bare http(s) URL?
        URL_START.lastIndex = i;
        if (URL_START.test(s)) {
          const stop = urlStop(i);
          const end = stop < 0 ? n : stop;
          let j = end;
          // what ends the sentence is not the URL's: a full stop, a closing parenthesis it did not open
          const candidate = s.slice(i, j);
          let unmatched = candidate.split(")").length - candidate.split("(").length;
          while (j > URL_START.lastIndex) {
            const last = s[j - 1];
            if (last === ")" && unmatched > 0) unmatched--;
            else if (!".,;:!?}'*_".includes(last)) break;
            j--;
          }
          const href = j > URL_START.lastIndex ? safeUrl(s.slice(i, j)) : null;
          if (href) list.push({ start: i, end: j, kind: "link", href, text: s.slice(i, j) });
          i = href ? j : end;  // what was not a URL is text, whole
        } else i++;
      } else i++;
    }
    return { list, end: Math.min(i, n) };
  }

  // "[" at open, "]" at close: a citation [1] / [1, 2] (not followed by "("), or a link [text](url).
  function bracket(s, open, close, next) {
    if (s.charCodeAt(close + 1) !== 40) {
      CITATION.lastIndex = open + 1;
      if (CITATION.test(s) && CITATION.lastIndex === close + 1) {
        const numbers = s.slice(open + 1, close).split(",").map((x) => Number(x.trim()));
        return { start: open, end: close + 1, kind: "cite", numbers };
      }
      return null;
    }
    const from = close + 2, paren = next.paren(from), stop = next.linkStop(from);
    if (paren < 0 || (stop >= 0 && stop < paren) || close === open + 1 || paren - from > MAX_URL) return null;
    const href = safeUrl(s.slice(from, paren));
    return href ? { start: open, end: paren + 1, kind: "link", href, text: s.slice(open + 1, close) } : null;
  }

  // --- inline: emphasis ----------------------------------------------------------------------------
  // The pairs of * / _ delimiter runs in s[0:end) outside the atoms (CommonMark's flanking rules; a
  // stack per character; a pair of one character drops the other's openers inside it, so pairs
  // nest); at most `limit` runs are considered. Returns {pairs, end}.
  function emphasis(s, atomList, end, limit) {
    const runs = [];
    let stopped = end;
    const delims = /\*+|_+/g;
    const NONE = { index: Infinity };
    let m = { index: -1 };  // the next run found (kept when it lies past the gap: the next gap may hold it)
    const scan = (from, to) => {
      for (;;) {
        if (m.index < from) { delims.lastIndex = from; m = delims.exec(s) || NONE; }
        if (m.index >= to) return true;
        const i = m.index, code = s.charCodeAt(i);
        if (runs.length >= limit) { stopped = i; return false; }
        const j = i + m[0].length;  // a run never reaches into an atom (those start with ` [ h)
        from = j;
        const before = s.charCodeAt(i - 1), after = s.charCodeAt(j);
        const left = !isSpace(after) && (!isPunct(after) || isSpace(before) || isPunct(before));
        const right = !isSpace(before) && (!isPunct(before) || isSpace(after) || isPunct(after));
        let canOpen = left, canClose = right;
        if (code === 95) {  // _ inside a word (snake_case) is not emphasis
          canOpen = left && (!right || isPunct(before));
          canClose = right && (!left || isPunct(after));
        }
        if (j - i <= MAX_DELIM_RUN && (canOpen || canClose)) {
          runs.push({ ch: s[i], pos: i, count: j - i, canOpen, canClose });
        }
      }
    };
    let from = 0;
    let going = true;
    for (const a of atomList) {
      if (!(going = scan(from, a.start))) break;
      from = a.end;
    }
    if (going) scan(from, end);

    const stacks = { "*": [], "_": [] };
    const pairs = [];
    for (const r of runs) {
      if (r.canClose) {
        const mine = stacks[r.ch], other = stacks[r.ch === "*" ? "_" : "*"];
        while (r.count > 0 && mine.length) {
          const op = mine[mine.length - 1];
          const use = op.count >= 2 && r.count >= 2 ? 2 : 1;
          while (other.length && other[other.length - 1].pos > op.pos) other.pop();
          pairs.push({ open: op.pos + op.count - use, close: r.pos, len: use, tag: use === 2 ? "strong" : "em" });
          op.count -= use;
          r.pos += use;
          r.count -= use;
          if (op.count === 0) mine.pop();
        }
      }
      if (r.count > 0 && r.canOpen) stacks[r.ch].push(r);
    }
    return { pairs, end: stopped };
  }

  // --- inline: the tree ----------------------------------------------------------------------------
  function citation(n, ctx) {
    const ok = ctx.sources > 0 && n >= 1 && n <= ctx.sources;
    const el = ctx.budget.make(ok ? "a" : "span");
    if (!el) return null;
    el.className = ok ? "cite" : "cite invalid";
    el.dataset.source = String(n);
    if (ok) {
      el.href = "#";
      el.title = `source ${n}`;
    } else if (ctx.sources > 0) {
      el.title = `there is no source ${n}`;
    }
    return el;
  }

  // The atom's node, or null when the budget is spent.
  function atomNode(a, ctx) {
    const make = (tag, text) => {
      const el = ctx.budget.make(tag);
      if (el) el.textContent = text;
      return el;
    };
    if (a.kind === "code") return make("code", a.text);
    if (a.kind === "link") {
      const el = make("a", a.text);
      if (el) { el.href = a.href; el.target = "_blank"; el.rel = "noopener noreferrer"; }
      return el;
    }
    // a citation keeps its text ("[1]", "[1, 2]"), each number a link to its source
    if (a.numbers.length === 1) {
      const el = citation(a.numbers[0], ctx);
      if (el) el.textContent = `[${a.numbers[0]}]`;
      return el;
    }
    const span = ctx.budget.make("span");
    if (!span || ctx.budget.left < a.numbers.length) return null;
    span.append("[");
    a.numbers.forEach((n, k) => {
      if (k) span.append(", ");
      const el = citation(n, ctx);
      el.textContent = String(n);
      span.append(el);
    });
    span.append("]");
    return span;
  }

  function inline(s, parent, ctx) {
    const limit = ctx.budget.left;
    const found = atoms(s, limit);
    const emph = emphasis(s, found.list, found.end, 4 * limit);
    const end = emph.end;  // past it, plain text
    const events = [];
    for (const a of found.list) if (a.start < end) events.push({ pos: a.start, end: a.end, atom: a });
    for (const p of emph.pairs) {
      events.push({ pos: p.open, end: p.open + p.len, open: p.tag });
      events.push({ pos: p.close, end: p.close + p.len, close: true });
    }
    events.sort((x, y) => x.pos - y.pos);
    const elems = [parent];  // the open elements
    const real = [];  // per open pair: whether it made an element (pairs nested too deep stay text)
    let text = "";  // text waiting for its node: adjacent pieces make one
    let at = 0;
    const top = () => elems[elems.length - 1];
    const flush = () => { if (text) { top().append(text); text = ""; } };
    for (const e of events) {
      text += s.slice(at, e.pos);
      at = e.end;
      if (e.atom) {
        const node = atomNode(e.atom, ctx);
        if (node) { flush(); top().append(node); } else text += s.slice(e.pos, e.end);
      } else if (e.open) {
        const el = elems.length > MAX_INLINE_DEPTH ? null : ctx.budget.make(e.open);
        real.push(Boolean(el));
        if (el) { flush(); top().append(el); elems.push(el); } else text += s.slice(e.pos, e.end);
      } else if (real.pop()) {
        flush();
        elems.pop();
      } else {
        text += s.slice(e.pos, e.end);
      }
    }
    text += s.slice(at);
    flush();
  }

  // --- blocks --------------------------------------------------------------------------------------
  const FENCE = /^ {0,3}(`{3,}|~{3,})/;

  function leadingSpaces(line) {
    let i = 0, width = 0;
    for (; i < line.length; i++) {
      const c = line.charCodeAt(i);
      if (c === 32) width++;
      else if (c === 9) width += 4 - (width % 4);
      else break;
    }
    return { i, width };
  }

  // "- x", "* x", "+ x", "1. x", "1) x" -> {indent, ordered, start, text}, or null.
  function listItem(line) {
    const { i, width } = leadingSpaces(line);
    const c = line[i];
    let j = i, ordered = false, start = 1;
    if (c === "-" || c === "*" || c === "+") {
      j = i + 1;
    } else {
      while (j < line.length && j - i < 9 && line.charCodeAt(j) >= 48 && line.charCodeAt(j) <= 57) j++;
      if (j === i || (line[j] !== "." && line[j] !== ")")) return null;
      ordered = true;
      start = Number(line.slice(i, j));
      j++;
    }
    if (j < line.length && line[j] !== " " && line[j] !== "\t") return null;
    const text = line.slice(j).trim();
    return text ? { indent: width, ordered, start, text } : null;  // a bare marker is text
  }

  function heading(line) {
    const { i, width } = leadingSpaces(line);
    if (width > 3 || line[i] !== "#") return null;
    let j = i;
    while (j < line.length && j - i <= 6 && line[j] === "#") j++;
    const level = j - i;
    if (level > 6 || (j < line.length && line[j] !== " " && line[j] !== "\t")) return null;
    let text = line.slice(j).trim();
    let k = text.length;  // a closing run of # after a space is not part of the heading
    while (k > 0 && text[k - 1] === "#") k--;
    if (k === 0) text = "";
    else if (k < text.length && (text[k - 1] === " " || text[k - 1] === "\t")) text = text.slice(0, k).trim();
    return { level, text };
  }

  function isRule(line) {
    const { i, width } = leadingSpaces(line);
    const c = line.charCodeAt(i);
    if (width > 3 || (c !== 45 && c !== 42 && c !== 95)) return false;  // - * _
    let count = 0;
    for (let j = i; j < line.length; j++) {
      const d = line.charCodeAt(j);
      if (d === c) count++;
      else if (d !== 32 && d !== 9) return false;
    }
    return count >= 3;
  }

  // Renders Markdown text into container (emptied first). ctx.sources: how many sources [n] may cite.
  function render(text, container, ctx = {}) {
    ctx = { sources: 0, ...ctx, budget: budget() };
    const root = document.createDocumentFragment();
    let para = null;   // lines of the open paragraph
    let quote = null;  // lines of the open block quote
    let fence = null;  // the open code block: {marker, code: lines, el}
    const lists = [];  // open lists, outermost first: {el, indent, ordered, li, lines}
    let blank = false; // the previous line was blank

    const flushItem = (l) => {
      if (l && l.lines.length) { inline(l.lines.join("\n"), l.li, ctx); l.lines = []; l.said = true; }
    };
    const closeLists = () => { while (lists.length) flushItem(lists.pop()); };
    const flushPara = () => {
      if (para) {
        const p = ctx.budget.force("p");
        inline(para.join("\n"), p, ctx);
        root.append(p);
        para = null;
      }
    };
    const flushQuote = () => {
      if (quote) {
        const q = ctx.budget.force("blockquote");
        inline(quote.join("\n"), q, ctx);
        root.append(q);
        quote = null;
      }
    };
    const closeFence = () => {
      if (fence) { fence.el.firstChild.textContent = fence.code.join("\n"); fence = null; }
    };
    const flushAll = () => { flushPara(); flushQuote(); closeLists(); };

    // text: it continues a list item (after a blank line only when indented), a quote, or a paragraph
    const textLine = (line, width) => {
      if (lists.length && (!blank || width >= 2)) {
        const top = lists[lists.length - 1];
        if (blank && top.said) top.lines.push("");  // a new paragraph of the item: a line break
        top.lines.push(line.trim());
      } else if (quote) {
        quote.push(line.trim());
      } else {
        closeLists();
        (para = para || []).push(line.trim());
      }
      blank = false;
    };

    const src = String(text), len = src.length;
    let pos = 0, rest = -1;
    while (pos <= len) {
      const start = pos;
      let eol = src.indexOf("\n", pos);
      if (eol < 0) eol = len;
      pos = eol + 1;
      const end = eol > start && src.charCodeAt(eol - 1) === 13 ? eol - 1 : eol;  // without a \r
      if (end === start) {  // an empty line
        if (fence) fence.code.push("");
        else { flushPara(); flushQuote(); if (lists.length) flushItem(lists[lists.length - 1]); blank = true; }
        continue;
      }
      const line = src.slice(start, end);
      if (fence) {
        const m = FENCE.exec(line);
        if (m && m[1][0] === fence.marker[0] && m[1].length >= fence.marker.length && !line.slice(m[0].length).trim()) {
          closeFence();
        } else {
          fence.code.push(line);
        }
        continue;
      }
      if (!line.trim()) {
        flushPara();
        flushQuote();
        if (lists.length) flushItem(lists[lists.length - 1]);
        blank = true;
        continue;
      }
      if (ctx.budget.left < 3) { rest = start; break; }  // the rest is plain text, below
      const lead = leadingSpaces(line);
      const first = line.charCodeAt(lead.i);
      // # > - * + _ ` ~ or a digit may start a block; any other character starts text
      if (!(first === 35 || first === 62 || first === 45 || first === 42 || first === 43 || first === 95 ||
            first === 96 || first === 126 || (first >= 48 && first <= 57))) {
        textLine(line, lead.width);
        continue;
      }
      const m = FENCE.exec(line);
      if (m && !(m[1][0] === "`" && line.slice(m[0].length).includes("`"))) {
        flushAll();
        const pre = ctx.budget.force("pre");
        pre.append(ctx.budget.force("code"));
        const lang = line.slice(m[0].length).trim().split(/\s/, 1)[0];
        if (lang) pre.dataset.lang = lang.slice(0, 40);
        root.append(pre);
        fence = { marker: m[1], code: [], el: pre };
        blank = false;
        continue;
      }
      const rule = isRule(line), h = rule ? null : heading(line);
      if (rule || h) {
        flushAll();
        const el = ctx.budget.force(h ? `h${Math.min(6, h.level + 2)}` : "hr");
        if (h) inline(h.text, el, ctx);
        root.append(el);
        blank = false;
        continue;
      }
      const item = listItem(line);
      if (item) {
        flushPara();
        flushQuote();
        while (lists.length && item.indent < lists[lists.length - 1].indent) flushItem(lists.pop());
        let top = lists[lists.length - 1];
        if (top && item.indent >= top.indent + 2 && lists.length < MAX_LIST_DEPTH) {
          flushItem(top);
          top = null;  // a list nested in top's item
        } else if (top && top.ordered !== item.ordered) {
          flushItem(lists.pop());
          top = null;  // another kind of list at the same level
        } else if (top) {
          flushItem(top);
        }
        if (!top) {
          const el = ctx.budget.force(item.ordered ? "ol" : "ul");
          if (item.ordered && item.start !== 1) el.start = item.start;
          const parent = lists[lists.length - 1];
          (parent ? parent.li : root).append(el);
          top = { el, indent: item.indent, ordered: item.ordered, li: null, lines: [], said: false };
          lists.push(top);
        }
        top.li = ctx.budget.force("li");
        top.el.append(top.li);
        top.lines = [item.text];
        top.said = false;
        blank = false;
        continue;
      }
      const q = /^ {0,3}>/.exec(line);
      if (q) {
        flushPara();
        closeLists();
        const rest = line.slice(q[0].length);
        (quote = quote || []).push(rest.startsWith(" ") ? rest.slice(1) : rest);
        blank = false;
        continue;
      }
      textLine(line, lead.width);
    }
    closeFence();  // an unclosed block runs to the end (a streaming answer's is still open)
    flushAll();
    if (rest >= 0) {  // the element budget is spent: the rest as it is
      const p = document.createElement("p");
      p.className = "md-rest";
      p.textContent = src.slice(rest);
      root.append(p);
    }
    container.replaceChildren(root);
  }

  return { render, safeUrl, MAX_ELEMENTS };
})();
