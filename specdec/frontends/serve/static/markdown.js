// A small markdown renderer for the chat page that colours every character by the token
// that produced it.  parse(text) builds a tree whose leaves are character ranges [s, e) of
// the text, in order, covering all of it exactly once; `mk` leaves are markup (fences, '#',
// '**', list markers, block-ending newlines) that CSS hides.  render() turns the tree into
// DOM nodes, splitting each leaf at token boundaries into <span class="tok k-KIND">: the
// spans' text, in document order, is the answer's text, character for character.
// Model text only ever reaches the DOM through textContent (never innerHTML).

class Builder {
  constructor(text) {
    this.text = text;
    this.root = { tag: "div", ch: [] };
    this.stack = [this.root];
    this.pos = 0;
  }
  top() { return this.stack[this.stack.length - 1]; }
  open(tag, cls) {
    const n = { tag, cls, ch: [] };
    this.top().ch.push(n);
    this.stack.push(n);
    return n;
  }
  close() { this.stack.pop(); }
  leaf(s, e, mk) {
    if (s > this.pos) this.top().ch.push({ s: this.pos, e: s, mk: true });
    if (e > s) this.top().ch.push({ s, e, mk: !!mk });
    this.pos = Math.max(this.pos, e);
  }
}

const FENCE = /^ {0,3}(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})[ \t]+/;
const RULE = /^ {0,3}([-*_])( *\1){2,} *$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])[ \t]+/;
const QUOTE = /^ {0,3}> ?/;

function lines(text) {
  const out = [];
  let i = 0;
  while (i < text.length) {
    let le = text.indexOf("\n", i);
    if (le < 0) le = text.length;
    out.push({ s: i, e: le, next: Math.min(le + 1, text.length), t: text.slice(i, le) });
    i = le + 1;
  }
  return out;
}

function isBlockStart(t) {
  return FENCE.test(t) || HEADING.test(t) || RULE.test(t) || ITEM.test(t) || QUOTE.test(t) || !t.trim();
}

export function parse(text) {
  const b = new Builder(text);
  const ls = lines(text);
  let i = 0;
  while (i < ls.length) {
    const l = ls[i];
    let m;
    if ((m = FENCE.exec(l.t))) {
      i = fence(b, ls, i, m);
    } else if (!l.t.trim()) {
      b.leaf(l.s, l.next, true);
      i++;
    } else if ((m = HEADING.exec(l.t))) {
      b.open("h" + Math.min(m[1].length + 2, 6), "h");
      b.leaf(l.s, l.s + m[0].length, true);
      inline(b, l.s + m[0].length, l.e);
      b.close();
      b.leaf(l.e, l.next, true);
      i++;
    } else if (RULE.test(l.t)) {
      b.open("div", "rule");
      b.leaf(l.s, l.next, true);
      b.close();
      i++;
    } else if (ITEM.test(l.t)) {
      i = list(b, ls, i);
    } else if ((m = QUOTE.exec(l.t))) {
      b.open("blockquote");
      while (i < ls.length && (m = QUOTE.exec(ls[i].t))) {
        b.leaf(ls[i].s, ls[i].s + m[0].length, true);
        inline(b, ls[i].s + m[0].length, ls[i].e);
        b.leaf(ls[i].e, ls[i].next, false);
        i++;
      }
      b.close();
    } else {
      b.open("p");
      for (;;) {
        inline(b, ls[i].s, ls[i].e);
        const last = i + 1 >= ls.length || isBlockStart(ls[i + 1].t);
        b.leaf(ls[i].e, ls[i].next, last);      // a newline inside a paragraph is shown
        i++;
        if (last) break;
      }
      b.close();
    }
  }
  b.leaf(text.length, text.length, true);
  if (b.pos < text.length) b.root.ch.push({ s: b.pos, e: text.length, mk: true });
  return b.root;
}

function fence(b, ls, i, m) {
  const mark = m[1];
  const closes = (t) => t.trim().length >= mark.length && t.trim() === mark[0].repeat(t.trim().length);
  const pre = b.open("pre", "code");
  pre.lang = m[2].trim();
  b.leaf(ls[i].s, ls[i].next, true);
  b.open("code");
  for (i++; i < ls.length && !closes(ls[i].t); i++) {
    b.leaf(ls[i].s, ls[i].e, false);
    const end = i + 1 >= ls.length || closes(ls[i + 1].t);
    b.leaf(ls[i].e, ls[i].next, end);           // the newline before the fence: markup
  }
  b.close();
  if (i < ls.length) b.leaf(ls[i].s, ls[i].next, true);
  b.close();
  return i + 1;
}

function list(b, ls, i) {
  const ordered = /\d/.test(ITEM.exec(ls[i].t)[2]);
  b.open(ordered ? "ol" : "ul");
  let m;
  while (i < ls.length && (m = ITEM.exec(ls[i].t)) && /\d/.test(m[2]) === ordered) {
    const li = b.open("li");
    li.indent = Math.floor(m[1].length / 2);
    b.leaf(ls[i].s, ls[i].s + m[0].length, true);
    inline(b, ls[i].s + m[0].length, ls[i].e);
    i++;
    // lazy continuation lines: indented text that is not a new block
    while (i < ls.length && /^ {2,}\S/.test(ls[i].t) && !isBlockStart(ls[i].t)) {
      b.leaf(ls[i - 1].e, ls[i - 1].next, false);
      inline(b, ls[i].s, ls[i].e);
      i++;
    }
    b.close();
    b.leaf(ls[i - 1].e, ls[i - 1].next, true);
  }
  b.close();
  return i;
}

// `code`, **strong**, __strong__, *em*, _em_ within [s, e) of one line.
function inline(b, s, e) {
  const t = b.text;
  let p = s;
  while (p < e) {
    const c = t[p];
    if (c === "`") {
      let k = p;
      while (k < e && t[k] === "`") k++;
      const run = t.slice(p, k);
      const close = t.indexOf(run, k);
      if (close > k && close + run.length <= e) {
        b.open("code", "inline");
        b.leaf(p, k, true);
        b.leaf(k, close, false);
        b.leaf(close, close + run.length, true);
        b.close();
        p = close + run.length;
        continue;
      }
      b.leaf(p, k, false);
      p = k;
      continue;
    }
    if ((c === "*" || c === "_") && p + 1 < e) {
      const two = t[p + 1] === c;
      const mark = two ? c + c : c;
      const from = p + mark.length;
      const close = t.indexOf(mark, from);
      const wordy = c === "_" && p > s && /\w/.test(t[p - 1]);
      if (!wordy && close > from && close + mark.length <= e && !/\s/.test(t[from]) && !/\s/.test(t[close - 1])) {
        b.open(two ? "strong" : "em");
        b.leaf(p, from, true);
        inline(b, from, close);
        b.leaf(close, close + mark.length, true);
        b.close();
        p = close + mark.length;
        continue;
      }
    }
    let q = p + 1;
    while (q < e && t[q] !== "`" && t[q] !== "*" && t[q] !== "_") q++;
    b.leaf(p, q, false);
    p = q;
  }
}

// tokens: [{text, kind, ...}] in order; their texts concatenated are a prefix of `text`.
export function render(text, tokens, into) {
  const starts = [];
  let pos = 0;
  for (const tk of tokens) {
    starts.push(pos);
    pos += tk.text.length;
  }
  const covered = Math.min(pos, text.length);
  const tokenAt = (c) => {              // the last token starting at or before c
    let lo = 0, hi = starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (starts[mid] <= c) lo = mid; else hi = mid - 1;
    }
    return lo;
  };
  const piece = (parent, s, e, mk, i, cls) => {
    const span = document.createElement("span");
    span.className = cls + (mk ? " mk" : "");
    if (i !== null) span.dataset.i = String(i);
    span.textContent = text.slice(s, e);
    parent.appendChild(span);
  };
  const leaf = (parent, n) => {
    let c = n.s;
    while (c < n.e) {
      if (c >= covered) {
        piece(parent, c, n.e, n.mk, null, "tok pending");
        return;
      }
      const i = tokenAt(c);
      // skip tokens with no text (a character split across tokens comes with the next one)
      const end = Math.min(n.e, covered, i + 1 < starts.length ? starts[i + 1] : covered);
      piece(parent, c, end, n.mk, i, "tok k-" + tokens[i].kind + (tokens[i].source ? " s-" + tokens[i].source : "")
            + (i % 2 ? " odd" : ""));
      c = end;
    }
  };
  const build = (parent, node) => {
    for (const n of node.ch) {
      if (n.ch === undefined) {
        leaf(parent, n);
        continue;
      }
      const el = document.createElement(n.tag);
      if (n.cls) el.className = n.cls;
      if (n.lang) el.dataset.lang = n.lang;
      if (n.indent) el.style.marginLeft = n.indent * 1.2 + "em";
      parent.appendChild(el);
      build(el, n);
    }
  };
  into.replaceChildren();
  build(into, parse(text));
}
