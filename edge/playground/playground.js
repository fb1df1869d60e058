// The tritongate playground: chat (streamed), embeddings similarity and rerank against this server's
// OpenAI-compatible API. Plain browser JavaScript: no build step, nothing loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];  // the chat so far: {role, content}
let running = null;       // the AbortController of the answer being streamed

function headers() {
  const key = $("api-key").value.trim();
  return { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) };
}

async function api(path, body) {
  const response = await fetch(path, body === undefined ? { headers: headers() }
    : { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try { message = (await response.json()).error.message || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

function status(text) { $("status").textContent = text; }

function fill(select, ids, preferred) {
  const previous = select.value;
  select.replaceChildren(...ids.map((id) => new Option(id, id)));
  const pick = ids.includes(previous) ? previous : ids.find(preferred) || ids[0];
  if (pick) select.value = pick;
}

async function loadModels() {
  try {
    const models = (await (await api("/v1/models")).json()).data;
    // Models that generate say so in `permission` (allow_sampling); the others embed or rerank.
    const generates = (m) => m.permission && m.permission[0] && m.permission[0].allow_sampling;
    const llms = models.filter(generates).map((m) => m.id);
    const others = models.filter((m) => !generates(m)).map((m) => m.id);
    fill($("chat-model"), llms, () => true);
    fill($("embed-model"), others, (id) => !id.includes("rerank"));
    fill($("rerank-model"), others, (id) => id.includes("rerank"));
    status(`${models.length} models`);
  } catch (error) {
    status(`models: ${error.message}`);
  }
}

function bubble(role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  element.textContent = text;
  $("messages").append(element);
  element.scrollIntoView({ block: "end" });
  return element;
}

function number(id) {
  const value = parseFloat($(id).value);
  return Number.isFinite(value) ? value : undefined;
}

// Server-Sent Events from a fetch body: each `data:` line's JSON, until [DONE].
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const payload = JSON.parse(data);
      if (payload.error) throw new Error(payload.error.message);
      yield payload;
    }
  }
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || running) return;
  $("prompt").value = "";
  conversation.push({ role: "user", content: text });
  bubble("user", text);
  const answer = bubble("assistant", "");
  const system = $("system").value.trim();
  const body = {
    model: $("chat-model").value, stream: true, temperature: number("temperature"), top_p: number("top-p"),
    max_tokens: number("max-tokens"),
    messages: [...(system ? [{ role: "system", content: system }] : []), ...conversation],
  };
  running = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: running.signal });
    if (!response.ok) throw new Error((await response.json()).error.message);
    for await (const chunk of events(response)) {
      for (const choice of chunk.choices) answer.textContent += choice.delta.content || "";
      answer.scrollIntoView({ block: "end" });
    }
    conversation.push({ role: "assistant", content: answer.textContent });
  } catch (error) {
    conversation.pop();  // the question goes with its failed answer
    if (error.name === "AbortError") {
      answer.textContent += " [stopped]";
    } else {
      answer.className = "message error";
      answer.textContent = error.message;
    }
  } finally {
    running = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return dot / Math.sqrt(na * nb);
}

async function compare() {
  const texts = $("embed-texts").value.split("\n").map((t) => t.trim()).filter(Boolean);
  const table = $("similarity");
  try {
    const result = await (await api("/v1/embeddings", { model: $("embed-model").value, input: texts })).json();
    const vectors = result.data.map((d) => d.embedding);
    const head = `<tr><th></th>${texts.map((_, j) => `<th>${j + 1}</th>`).join("")}</tr>`;
    const rows = vectors.map((a, i) => `<tr><th title="${escape(texts[i])}">${i + 1}</th>${
      vectors.map((b) => `<td>${cosine(a, b).toFixed(3)}</td>`).join("")}</tr>`);
    table.innerHTML = head + rows.join("");
    table.dataset.ready = "true";
  } catch (error) {
    table.innerHTML = `<tr><td class="error">${escape(error.message)}</td></tr>`;
  }
}

async function rerank() {
  const documents = $("rerank-docs").value.split("\n").map((t) => t.trim()).filter(Boolean);
  const list = $("ranking");
  try {
    const result = await (await api("/v1/rerank", {
      model: $("rerank-model").value, query: $("rerank-query").value, documents })).json();
    list.replaceChildren(...result.results.map((r) => {
      const item = document.createElement("li");
      item.textContent = `${r.relevance_score.toFixed(3)}  ${documents[r.index]}`;
      return item;
    }));
    list.dataset.ready = "true";
  } catch (error) {
    list.replaceChildren(Object.assign(document.createElement("li"), { textContent: error.message }));
  }
}

function escape(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

$("api-key").value = localStorage.getItem("tritongate-api-key") || "";
$("api-key").addEventListener("change", () => {
  localStorage.setItem("tritongate-api-key", $("api-key").value.trim());
  loadModels();
});
$("chat-form").addEventListener("submit", send);
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) send(event);
});
$("stop").addEventListener("click", () => running && running.abort());
$("reset").addEventListener("click", () => { conversation.length = 0; $("messages").replaceChildren(); });
$("embed-run").addEventListener("click", compare);
$("rerank-run").addEventListener("click", rerank);
loadModels();
