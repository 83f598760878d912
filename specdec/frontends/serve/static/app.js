// The chat page of `specdec serve`: streams /v1/chat/completions with the `specdec`
// extension (docs/serve.md, "The chat page"), colours each token by how speculation produced
// it and shows per-answer numbers.  Model text reaches the DOM through textContent only.
import { render } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const KIND = {
  accepted: "accepted draft token", predicted: "accepted token of the prediction",
  correction: "the target's correction after a rejected draft",
  bonus: "bonus token (every drafted token accepted)", sampled: "plain decoding",
};
const history = [];                 // the conversation: {role, content}
const answers = new WeakMap();      // answer element -> its state
let busy = null;                    // the AbortController of the running request

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("apikey").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function connect() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (r.status === 401) {
      $("model").textContent = "this server needs an API key: enter it on the left";
      $("apikey").classList.add("wanted");
      return;
    }
    const j = await r.json();
    const m = j.data[0];
    $("apikey").classList.remove("wanted");
    $("model").textContent = m.id + " · " + m.meta.arch + " · " + m.meta.n_ctx_slot + " tokens per slot";
    const h = await (await fetch("/health")).json();
    $("status").textContent = h.slots_idle + "/" + h.slots_total + " slots idle";
  } catch (e) {
    $("model").textContent = "cannot reach the server: " + e;
  }
}

function options() {
  const o = {};
  const num = (id, f) => { const v = $(id).value.trim(); if (v !== "") o[f] = Number(v); };
  num("temperature", "temperature");
  num("max-tokens", "max_tokens");
  num("draft-n", "draft_n");
  num("seed", "seed");
  if ($("draft").value) o.draft = $("draft").value;
  return o;
}

function addMessage(role, text) {
  const m = el("div", "msg " + role);
  m.appendChild(el("div", "who", role === "user" ? "you" : "model"));
  const body = el("div", "body", role === "user" ? text : undefined);
  m.appendChild(body);
  $("messages").appendChild(m);
  m.scrollIntoView({ block: "end" });
  return m;
}

function newAnswer() {
  const m = addMessage("assistant");
  m.dataset.state = "streaming";
  const panel = el("div", "panel");
  m.appendChild(panel);
  const calls = el("div", "calls");
  m.insertBefore(calls, panel);
  const a = { el: m, body: m.querySelector(".body"), panel, text: "", tokens: [], steps: [],
              calls: [], callsEl: calls,
              summary: null, timings: null, plain: null, queued: false };
  answers.set(m, a);
  return a;
}

async function readStream(response, onChunk) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new Error(obj.error.message);
        onChunk(obj);
      }
    }
  }
}

function onChunk(a, obj) {
  const choice = (obj.choices || [])[0];
  if (choice && choice.delta && choice.delta.content) a.text += choice.delta.content;
  for (const tc of (choice && choice.delta && choice.delta.tool_calls) || []) {
    const c = a.calls[tc.index] || (a.calls[tc.index] = { id: "", name: "", arguments: "" });
    if (tc.id) c.id = tc.id;
    if (tc.function && tc.function.name) c.name += tc.function.name;
    if (tc.function && tc.function.arguments) c.arguments += tc.function.arguments;
  }
  const ext = obj.specdec;
  if (ext) {
    if (ext.tokens) a.tokens.push(...ext.tokens);
    if (ext.steps) a.steps.push(...ext.steps);
    if (ext.summary) a.summary = ext.summary;
  }
  if (obj.timings) a.timings = obj.timings;
  schedule(a);
}

function schedule(a) {
  if (a.queued) return;
  a.queued = true;
  requestAnimationFrame(() => { a.queued = false; draw(a); });
}

function draw(a) {
  const near = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  for (const t of a.tokens)           // an accepted draft token's drafter (its step's source): s-mtp
    if (t.kind === "accepted" && t.step !== null && a.steps[t.step]) t.source = a.steps[t.step].source;
  // with tool calls the tokens spell the whole answer (<tool_call> blocks and all): shown so
  render((a.tools || a.calls.length) && a.tokens.length ? a.tokens.map((t) => t.text).join("") : a.text, a.tokens, a.body);
  drawCalls(a);
  drawPanel(a);
  if (near) a.el.scrollIntoView({ block: "end" });
}

// The tool calls of an answer, each as name(arguments), through textContent only.
function drawCalls(a) {
  a.callsEl.replaceChildren();
  for (const c of a.calls) {
    const box = el("div", "call");
    box.appendChild(el("span", "call-name", "tool call · " + c.name));
    let args = c.arguments;
    try { args = JSON.stringify(JSON.parse(c.arguments), null, 2); } catch (e) { /* as sent */ }
    box.appendChild(el("pre", "call-args", args));
    a.callsEl.appendChild(box);
  }
}

function toolOptions() {
  const o = {};
  const t = $("tools").value.trim();
  if (t) o.tools = JSON.parse(t);       // a bad list: the send fails with the message shown
  if (t && $("tool-choice").value) o.tool_choice = $("tool-choice").value;
  if ($("format").value) o.response_format = { type: $("format").value };
  return o;
}

async function send(text) {
  const system = $("system").value.trim();
  const user = { role: "user", content: text };
  addMessage("user", text);
  const body = { messages: [...(system ? [{ role: "system", content: system }] : []), ...history, user],
                 stream: true, specdec: { tokens: true }, ...options() };
  const a = newAnswer();
  try { Object.assign(body, toolOptions()); } catch (e) { a.el.appendChild(el("div", "error", "tools: " + e.message)); }
  a.tools = Boolean(body.tools) && body.tool_choice !== "none";
  a.sampled = body.temperature === undefined || body.temperature > 0;
  busy = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
                                                    body: JSON.stringify(body), signal: busy.signal });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || "HTTP " + r.status);
    }
    await readStream(r, (obj) => onChunk(a, obj));
    a.el.dataset.state = "done";
  } catch (e) {
    a.el.dataset.state = e.name === "AbortError" ? "stopped" : "error";
    if (a.el.dataset.state === "error") a.el.appendChild(el("div", "error", String(e.message || e)));
  } finally {
    busy = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    const calls = a.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
    if ((a.text || calls.length) && a.el.isConnected)
      history.push(user, calls.length ? { role: "assistant", content: a.text || null, tool_calls: calls }
                                      : { role: "assistant", content: a.text });
    draw(a);
    connect();
  }
  if ($("compare").checked && a.el.dataset.state === "done") await comparePlain(body, a);
}

// The same request without drafting, not streamed: its tokens/s beside this answer's.
async function comparePlain(body, a) {
  const plain = { ...body, stream: false, draft: "none" };
  delete plain.specdec;
  delete plain.draft_n;
  a.plain = { pending: true };
  drawPanel(a);
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(plain) });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : "HTTP " + r.status);
    a.plain = { tps: j.timings.predicted_per_second, same: j.choices[0].message.content === a.text };
  } catch (e) {
    a.plain = { error: String(e.message || e) };
  }
  drawPanel(a);
  a.el.dataset.compared = "1";
}

// trace-report's numbers (specdec/frontends/report.py summarize) over the steps so far.
function summarize(steps) {
  const reached = [], accepted = [], alpha = [], by = {};
  let drafted = 0, emitted = 0;
  for (const r of steps) {
    r.accepted.every((ok, i) => {
      if (ok === null) return false;
      reached[i] = (reached[i] || 0) + 1;
      accepted[i] = (accepted[i] || 0) + (ok ? 1 : 0);
      alpha[i] = (alpha[i] || 0) + r.alpha[i];
      return true;
    });
    const d = by[r.source] || (by[r.source] = { steps: 0, drafted: 0, accepted: 0 });
    d.steps += 1;
    d.drafted += r.n_nodes || r.drafted.length;
    d.accepted += r.n_accepted;
    drafted += r.n_nodes || r.drafted.length;
    emitted += r.emitted.length;
  }
  const sum = (xs) => xs.reduce((x, y) => x + (y || 0), 0);
  const nReached = sum(reached), nAcc = sum(accepted);
  return {
    n_steps: steps.length, n_drafted: drafted, n_accepted: nAcc, n_emitted: emitted,
    acceptance_rate: drafted ? nAcc / drafted : 0, tokens_per_step: steps.length ? emitted / steps.length : 0,
    measured_acceptance: nReached ? nAcc / nReached : 0, predicted_acceptance: nReached ? sum(alpha) / nReached : 0,
    by_position: reached.map((n, i) => ({ position: i + 1, reached: n, accepted: accepted[i] || 0,
                                          measured: n ? (accepted[i] || 0) / n : null, predicted: n ? alpha[i] / n : null })),
    by_source: by, drafting: "",
  };
}

const pct = (x) => (100 * x).toFixed(1) + "%";

function stat(panel, key, label, text, value) {
  const row = el("div", "stat");
  row.dataset.k = key;
  if (value !== undefined) row.dataset.value = String(value);
  row.appendChild(el("span", "label", label));
  row.appendChild(el("span", "value", text));
  panel.appendChild(row);
}

function drawPanel(a) {
  const p = a.panel;
  p.replaceChildren();
  const s = a.summary || summarize(a.steps);
  const kinds = {};
  for (const t of a.tokens) kinds[t.kind] = (kinds[t.kind] || 0) + 1;
  if (s.drafting) stat(p, "drafting", "drafting", s.drafting);
  if (s.n_steps) {
    const src = Object.entries(s.by_source).map(([k, v]) => (k === "none" || !k) ? "nothing drafted: " + v.steps + " steps" :
      k + ": " + v.steps + " steps, " + v.accepted + "/" + v.drafted + " accepted").join(" · ");
    stat(p, "drafters", "drafter used", src);
    stat(p, "tokens_per_step", "tokens per target pass", s.tokens_per_step.toFixed(2) + " (" + s.n_emitted +
         " tokens in " + s.n_steps + " passes)", s.tokens_per_step);
    stat(p, "acceptance", "acceptance", pct(s.acceptance_rate) + " of drafted (" + s.n_accepted + "/" + s.n_drafted +
         "); at verified positions predicted 1 − TV(p, q) " + pct(s.predicted_acceptance) + " vs measured " +
         pct(s.measured_acceptance), s.acceptance_rate);
    if (s.by_position.length) p.appendChild(bars(s.by_position));
  } else if (a.tokens.length) {
    stat(p, "drafting", "drafting", "none: one token per target pass");
  }
  const k = Object.entries(kinds).map(([kind, n]) => kind + " " + n).join(" · ");
  if (k) stat(p, "kinds", "tokens", k);
  if (a.timings) {
    const t = a.timings;
    stat(p, "speed", "speed", t.predicted_per_second.toFixed(1) + " tokens/s (" + t.predicted_n + " tokens; prompt " +
         t.prompt_n + " tokens in " + (t.prompt_ms / 1000).toFixed(2) + " s)", t.predicted_per_second);
  }
  if (a.plain) {
    const q = a.plain;
    const text = q.pending ? "running the request without drafting…" : q.error ? q.error :
      q.tps.toFixed(1) + " tokens/s without drafting" + (a.timings ? ": speedup " +
        (a.timings.predicted_per_second / q.tps).toFixed(2) + "×" : "") + (q.same ? "; the same text" :
        a.sampled ? "; another sample of the same distribution" : "; a different text");
    stat(p, "compare", "against plain", text, q.tps);
  }
}

function bars(rows) {
  const box = el("div", "bars");
  box.appendChild(el("div", "label", "acceptance by draft position (bar: measured, line: predicted)"));
  const plot = el("div", "plot");
  for (const r of rows) {
    const col = el("div", "col");
    col.dataset.position = String(r.position);
    const bar = el("div", "bar");
    bar.style.height = (100 * (r.measured || 0)).toFixed(1) + "%";
    const pred = el("div", "pred");
    pred.style.bottom = (100 * (r.predicted || 0)).toFixed(1) + "%";
    col.append(bar, pred, el("div", "pos", String(r.position)));
    col.dataset.tip = "position " + r.position + ": " + r.accepted + "/" + r.reached + " accepted (" +
      pct(r.measured || 0) + "), predicted " + pct(r.predicted || 0);
    plot.appendChild(col);
  }
  box.appendChild(plot);
  return box;
}

function tipText(a, t) {
  const lines = [KIND[t.kind] || t.kind, "token " + t.id + " " + JSON.stringify(t.text)];
  const r = t.step === null ? null : a.steps[t.step];
  if (t.step !== null) lines.push("step " + t.step + ", position " + t.pos + (r && r.source ? ", drafted by " + r.source : ""));
  if (t.p !== null) lines.push("p(x) " + t.p.toPrecision(4) + " · q(x) " + t.q.toPrecision(4) +
                               (r ? " · 1 − TV(p, q) " + r.alpha[t.pos - 1].toPrecision(4) : ""));
  if (r && t.kind === "correction") {
    const i = t.pos - 1;
    lines.push("rejected draft token " + r.drafted[i] + ": p(x) " + r.p_x[i].toPrecision(4) + " · q(x) " +
               r.q_x[i].toPrecision(4) + " (accepted with probability " + r.accept_prob[i].toPrecision(4) + ")");
  }
  if (r && t.kind === "bonus") lines.push(r.drafted.length + " drafted, all accepted: sampled from p(n+1)");
  if (r) lines.push("this step: " + r.emitted.length + " tokens from one target pass over " + (r.n_nodes + 1) + " rows");
  return lines.join("\n");
}

function showTip(ev) {
  const tip = $("tip");
  const tok = ev.target.closest(".tok[data-i]");
  const col = ev.target.closest(".col[data-tip]");
  const msg = ev.target.closest(".msg.assistant");
  const a = msg && answers.get(msg);
  if ((!tok || !a) && !col) { tip.hidden = true; return; }
  tip.textContent = col ? col.dataset.tip : tipText(a, a.tokens[Number(tok.dataset.i)]);
  tip.hidden = false;
  tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - tip.offsetWidth - 8) + "px";
  tip.style.top = Math.min(ev.clientY + 16, window.innerHeight - tip.offsetHeight - 8) + "px";
}

function init() {
  $("apikey").value = sessionStorage.getItem("specdec.apikey") || "";
  $("apikey").addEventListener("change", () => {
    sessionStorage.setItem("specdec.apikey", $("apikey").value.trim());
    connect();
  });
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || busy) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (busy) busy.abort(); });
  $("clear").addEventListener("click", () => {
    if (busy) busy.abort();
    history.length = 0;
    $("messages").replaceChildren();
  });
  $("messages").addEventListener("mousemove", showTip);
  $("messages").addEventListener("mouseleave", () => { $("tip").hidden = true; });
  connect();
}

init();
