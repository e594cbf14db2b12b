// The walkserve playground: one page that adapts to the served model's capabilities (GET /v1/models).
import { apiKey, call, readEvents, setApiKey, traceNote } from "/playground/api.js";
import { PcmStream, base64Bytes } from "/playground/audio.js";

const $ = (id) => document.getElementById(id);
const MODEL_TASKS = ["act", "encode", "predict", "rollout", "plan"];

// An example observation for a policy: a prompt, a zero state and a small synthetic camera frame.
function exampleObservation() {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 32;
  const paint = canvas.getContext("2d");
  const gradient = paint.createLinearGradient(0, 0, 32, 32);
  gradient.addColorStop(0, "#204080");
  gradient.addColorStop(1, "#e0c040");
  paint.fillStyle = gradient;
  paint.fillRect(0, 0, 32, 32);
  paint.fillStyle = "#c02020";
  paint.fillRect(12, 12, 8, 8);
  return { prompt: "pick up the red cube", state: [0, 0, 0, 0, 0, 0, 0, 0],
           base_0_rgb: { type: "image", url: canvas.toDataURL("image/png") } };
}
let card = null;
const history = [];

function showError(error) {
  $("error").textContent = error instanceof Error ? error.message : String(error);
  $("error").hidden = false;
}

// A "timeline" link after a request's figures, when the server named the request (X-Request-Id): it fetches
// GET /v1/requests/{id}/timeline with the key and saves it (Chrome/Perfetto trace JSON: open it in ui.perfetto.dev).
function addTimeline(stats, response) {
  const id = response.headers.get("x-request-id");
  if (!id) return;
  const link = Object.assign(document.createElement("a"), { href: "#", className: "timeline", textContent: "timeline" });
  link.title = "this request's timeline, node by node (open the file in ui.perfetto.dev)";
  link.addEventListener("click", async (event) => {
    event.preventDefault();
    try {
      const reply = await call(`/v1/requests/${encodeURIComponent(id)}/timeline`);
      const url = URL.createObjectURL(await reply.blob());
      Object.assign(document.createElement("a"), { href: url, download: `timeline-${id}.json` }).click();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (error) {
      showError(error);
    }
  });
  $(stats).append(" · ", link);
}

// Runs one user action with its button disabled; any failure is shown as its message.
function action(button, work) {
  $(button).addEventListener("click", async () => {
    $("error").hidden = true;
    $(button).disabled = true;
    try {
      await work();
    } catch (error) {
      showError(error);
    } finally {
      $(button).disabled = false;
    }
  });
}

const seconds = (ms) => (ms / 1000).toFixed(3);
const has = (...caps) => caps.some((c) => card.capabilities.includes(c));

async function loadModel() {
  $("error").hidden = true;
  for (const id of ["chat", "speech", "images", "robot"]) $(id).hidden = true;
  const body = await (await call("/v1/models")).json();
  card = body.data[0];
  $("model-name").textContent = `${card.id} (${card.family})`;
  $("model-notes").textContent = card.random_weights ? "Random weights: answers are noise." : card.description || "";
  $("chat").hidden = !has("chat");
  $("chat-speak-label").hidden = !has("audio_out");
  $("speech").hidden = !has("speech");
  $("images").hidden = !has("images", "image_edit");
  $("image-edit-label").hidden = !has("image_edit");
  const tasks = MODEL_TASKS.filter((t) => has(t));
  $("robot").hidden = tasks.length === 0;
  $("robot-task").replaceChildren(...tasks.map((t) => new Option(t, t)));
  if (!$("robot-inputs").value && tasks.length) $("robot-inputs").value = JSON.stringify(exampleObservation(), null, 2);
  const voices = card.voices.length ? card.voices : [""];
  $("speech-voice").replaceChildren(...voices.map((v) => new Option(v || "(default)", v, v === card.default_voice, v === card.default_voice)));
  const formats = card.audio_formats || [];
  $("speech-format").replaceChildren(...formats.map((f) => new Option(f, f, f === "wav", f === "wav")));
}

// ---- chat ----
const AUDIO_FORMATS = { "audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/flac": "flac", "audio/ogg": "ogg" };

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`cannot read ${file.name}`));
    reader.readAsDataURL(file);
  });
}

async function part(file) {
  const url = await dataUrl(file);
  if (file.type.startsWith("image/")) return { type: "image_url", image_url: { url } };
  if (file.type.startsWith("video/")) return { type: "video_url", video_url: { url } };
  if (file.type.startsWith("audio/")) {
    return { type: "input_audio", input_audio: { data: url.split(",", 2)[1], format: AUDIO_FORMATS[file.type] || "wav" } };
  }
  throw new Error(`${file.name}: attach images, audio or video`);
}

function logLine(role, text) {
  const line = document.createElement("div");
  line.className = role;
  line.textContent = text;
  $("chat-log").append(line);
  return line;
}

async function sendChat() {
  const text = $("chat-input").value.trim();
  if (!text) throw new Error("type a message first");
  const files = [...$("chat-files").files];
  const content = files.length ? [{ type: "text", text }, ...(await Promise.all(files.map(part)))] : text;
  const speak = has("audio_out") && $("chat-speak").checked;
  const request = {
    model: card.id, messages: [...history, { role: "user", content }], stream: true,
    stream_options: { include_usage: true }, max_completion_tokens: Number($("chat-max-tokens").value) || 32,
  };
  if ($("chat-temperature").value !== "") request.temperature = Number($("chat-temperature").value);
  if (speak) Object.assign(request, { modalities: ["text", "audio"], audio: { voice: card.default_voice, format: "pcm16" } });
  logLine("user", text);
  const answer = logLine("assistant", "");
  const audio = speak ? new PcmStream(card.sample_rate, true) : null;
  const start = performance.now();
  let first = null;
  let usage = null;
  const response = await call("/v1/chat/completions", { json: request });
  await readEvents(response, (chunk) => {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices && chunk.choices[0] ? chunk.choices[0].delta || {} : {};
    const piece = delta.content || (delta.audio && delta.audio.transcript) || "";
    if (piece) answer.textContent += piece;
    if (delta.audio && delta.audio.data) audio.push(base64Bytes(delta.audio.data));
    if ((piece || (delta.audio && delta.audio.data)) && first === null) first = performance.now();
  });
  const total = performance.now() - start;
  history.push({ role: "user", content }, { role: "assistant", content: answer.textContent });
  $("chat-input").value = "";
  if (audio && audio.bytes) {
    $("chat-audio").src = URL.createObjectURL(audio.wav());
    $("chat-audio").hidden = false;
  }
  const tokens = usage ? usage.completion_tokens : 0;
  $("chat-stats").textContent = `first token ${first === null ? "-" : seconds(first - start)} s · ${tokens} tokens · ` +
    `${(tokens / (total / 1000)).toFixed(1)} tokens/s${traceNote(response)}`;
  addTimeline("chat-stats", response);
}

// ---- speech ----
async function speak() {
  const live = $("speech-live").checked;
  const request = { model: card.id, input: $("speech-input").value, voice: $("speech-voice").value || undefined };
  if ($("speech-seed").value) request.seed = Number($("speech-seed").value);
  const start = performance.now();
  let first = null;
  let audioSeconds;
  let response;
  if (live) { // pcm over SSE: played as it arrives, kept as a WAV file for the player
    const stream = new PcmStream(card.sample_rate, true);
    response = await call("/v1/audio/speech", { json: { ...request, response_format: "pcm", stream_format: "sse" } });
    await readEvents(response, (event) => {
      if (event.type !== "speech.audio.delta") return;
      if (first === null) first = performance.now();
      stream.push(base64Bytes(event.audio));
    });
    audioSeconds = stream.seconds;
    $("speech-audio").src = URL.createObjectURL(stream.wav());
  } else { // the chosen format, whole
    response = await call("/v1/audio/speech", { json: { ...request, response_format: $("speech-format").value } });
    const blob = await response.blob();
    first = performance.now();
    $("speech-audio").src = URL.createObjectURL(blob);
    await new Promise((resolve) => $("speech-audio").addEventListener("loadedmetadata", resolve, { once: true }));
    audioSeconds = $("speech-audio").duration;
  }
  const total = (performance.now() - start) / 1000;
  $("speech-stats").textContent = `first audio ${first === null ? "-" : seconds(first - start)} s · ` +
    `${audioSeconds.toFixed(2)} s of audio · ${(audioSeconds / total).toFixed(2)} audio s/s${traceNote(response)}`;
  addTimeline("speech-stats", response);
}

// ---- images ----
async function makeImage() {
  const start = performance.now();
  const source = $("image-source").files[0];
  const prompt = $("image-prompt").value;
  const seed = $("image-seed").value;
  const steps = $("image-steps").value;
  let response;
  if (source && has("image_edit")) {
    const form = new FormData();
    form.append("image", source);
    form.append("prompt", prompt);
    form.append("size", $("image-size").value);
    if (seed) form.append("seed", seed);
    response = await call("/v1/images/edits", { form });
  } else {
    const request = { model: card.id, prompt, n: 1, size: $("image-size").value, response_format: "b64_json" };
    if (seed) request.seed = Number(seed);
    if (steps) request.steps = Number(steps);
    response = await call("/v1/images/generations", { json: request });
  }
  const body = await response.json();
  const format = body.output_format || "png";
  $("image-out").replaceChildren(...body.data.map((d) => {
    const img = document.createElement("img");
    img.alt = prompt;
    img.src = `data:image/${format};base64,${d.b64_json}`;
    return img;
  }));
  $("image-stats").textContent = `${seconds(performance.now() - start)} s for ${body.data.length} image(s)${traceNote(response)}`;
  addTimeline("image-stats", response);
}

// ---- robot policies and world models ----
function table(rows) {
  const out = document.createElement("table");
  for (const row of rows.slice(0, 16)) {
    const tr = out.insertRow();
    for (const value of row.slice(0, 16)) tr.insertCell().textContent = Number(value).toFixed(4);
  }
  return out;
}

function decodeFloats(output) {
  if (!output.data || !["float32", "float64"].includes(output.dtype)) return null;
  const bytes = base64Bytes(output.data);
  const values = output.dtype === "float32" ? new Float32Array(bytes.buffer) : new Float64Array(bytes.buffer);
  const width = output.shape.length ? output.shape[output.shape.length - 1] : 1;
  const rows = [];
  for (let i = 0; i < Math.min(values.length, width * 16); i += width) rows.push([...values.subarray(i, i + width)]);
  return rows;
}

async function runRobot() {
  let inputs;
  try {
    inputs = JSON.parse($("robot-inputs").value);
  } catch (error) {
    throw new Error(`inputs are not JSON: ${error.message}`);
  }
  const start = performance.now();
  const response = await call("/v1/generate", { json: { model: card.id, task: $("robot-task").value, inputs, stream: false } });
  const body = await response.json();
  const parts = [];
  if (body.actions) parts.push(Object.assign(document.createElement("h3"), { textContent: "actions" }), table(body.actions));
  for (const event of body.outputs || []) {
    const data = event.data || {};
    const rows = body.actions ? null : decodeFloats(data);
    parts.push(Object.assign(document.createElement("h3"), { textContent: `${event.node}.${event.output} ${JSON.stringify(data.shape || [])}` }));
    if (rows) parts.push(table(rows));
  }
  $("robot-out").replaceChildren(...parts);
  $("robot-stats").textContent = `${seconds(performance.now() - start)} s${traceNote(response)}`;
  addTimeline("robot-stats", response);
}

$("api-key").value = apiKey();
$("api-key").addEventListener("change", () => setApiKey($("api-key").value.trim()));
action("reload", loadModel);
action("chat-send", sendChat);
action("speech-send", speak);
action("image-send", makeImage);
action("robot-send", runRobot);
loadModel().catch(showError);
