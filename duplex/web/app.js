// duplex demo page: WebRTC in the OpenAI Realtime convention (POST /v1/realtime/calls with an
// SDP offer; events on the "oai-events" data channel). Plain JS, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const AudioCtx = window.AudioContext || window.webkitAudioContext;
const SILENT_RMS = 0.003;      // below this the agent is considered silent
const ONSET_RMS = 0.02;        // microphone level that counts as the caller starting to speak

// Exposed for automated checks (and curious people with a console open).
window.duplex = {
  events: [], sent: [], userTranscripts: [], agentPeak: 0, connected: false,
  peer: () => pc, audioContext: () => audioCtx,
};

let pc = null, channel = null, callUrl = null, mic = null, audioCtx = null, meterTimer = null;
let micAnalyser = null, agentAnalyser = null;
let state = "disconnected";
let lastMicOnset = null;         // performance.now() when the caller last started talking
let lastMicLoud = -Infinity;     // ... and when the mic was last loud
const ONSET_QUIET_MS = 300;      // a rise after this much quiet is a new onset, not a syllable
let pendingHeardStop = null;     // {responseId, onset} while waiting for the agent to fall silent
const agentItems = new Map();    // item_id -> <li>
const userItems = new Map();
const metricsRows = new Map();   // response_id -> <tr>

function setState(next) {
  state = next;
  $("state").textContent = next.replace("_", " ");
  $("state").dataset.state = next;
}

const startedAt = performance.now();
function logEvent(event) {
  window.duplex.events.push(event);
  if (event.type.endsWith(".delta")) return;  // the transcript shows those
  const li = document.createElement("li");
  const seconds = ((performance.now() - startedAt) / 1000).toFixed(2).padStart(7);
  li.textContent = seconds + "  " + event.type + (event.state ? " → " + event.state : "");
  $("events").prepend(li);
  while ($("events").children.length > 60) $("events").lastChild.remove();
}

function transcriptLine(map, id, cls, who) {
  let li = map.get(id);
  if (!li) {
    li = document.createElement("li");
    li.className = cls;
    li.dataset.item = id;
    const label = document.createElement("span");
    label.className = "who";
    label.textContent = who;
    li.appendChild(label);
    li.appendChild(document.createElement("span"));
    map.set(id, li);
    $("transcript").appendChild(li);
  }
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return li.lastChild;
}

function metricsRow(responseId) {
  let row = metricsRows.get(responseId);
  if (!row) {
    row = document.createElement("tr");
    row.innerHTML = "<td></td><td class='num'>–</td><td class='num'>–</td><td class='num'>–</td><td></td>";
    row.cells[0].textContent = responseId.replace("resp_", "");
    metricsRows.set(responseId, row);
    $("metrics").tBodies[0].prepend(row);
  }
  return row;
}

// The parts of a turn's time to first audio (duplex.metrics), in order; they add up to ttfa_ms.
const TURN_PARTS = [["end_of_turn", "end-of-turn wait"], ["asr_tail", "ASR tail"], ["first_token", "first token"],
  ["first_phrase", "first phrase"], ["tts_first_chunk", "TTS first chunk"], ["playout", "playout"]];
const WATERFALL_FULL_MS = 1500;  // a bar this long fills the cell

function waterfall(event) {
  const bar = document.createElement("div");
  bar.className = "waterfall";
  for (const [key, label] of TURN_PARTS) {
    const ms = event[key + "_ms"];
    if (ms == null || ms <= 0) continue;
    const part = document.createElement("span");
    part.className = "part " + key;
    part.style.width = Math.min(100, 100 * ms / WATERFALL_FULL_MS) + "%";
    part.title = `${label}: ${Math.round(ms)} ms`;
    part.dataset.ms = ms;
    bar.append(part);
  }
  return bar;
}

function onServerEvent(event) {
  logEvent(event);
  switch (event.type) {
    case "session.created":
      $("model").textContent = event.session.model;
      showTurnDetection(event.session);
      break;
    case "session.updated":
      showTurnDetection(event.session);
      break;
    case "duplex.state":
      setState(event.state);
      break;
    case "input_audio_buffer.speech_started":
      transcriptLine(userItems, event.item_id, "user", "you").textContent = "…";
      break;
    case "conversation.item.input_audio_transcription.completed":
      transcriptLine(userItems, event.item_id, "user", "you").textContent = event.transcript;
      window.duplex.userTranscripts.push(event.transcript);
      break;
    case "response.output_audio_transcript.delta":
      transcriptLine(agentItems, event.item_id, "agent", "agent").textContent += event.delta;
      break;
    case "conversation.item.truncated": {
      const li = agentItems.get(event.item_id);
      if (li) li.classList.add("truncated");
      break;
    }
    case "output_audio_buffer.cleared":
      if (lastMicOnset !== null) pendingHeardStop = { responseId: event.response_id, onset: lastMicOnset };
      break;
    case "duplex.metrics": {
      const row = metricsRow(event.response_id);
      if (event.ttfa_ms != null) {
        row.cells[1].textContent = Math.round(event.ttfa_ms) + " ms";
        row.cells[4].replaceChildren(waterfall(event));
      }
      if (event.barge_in_ms != null) row.cells[2].textContent = Math.round(event.barge_in_ms) + " ms";
      break;
    }
    case "error":
      console.warn("duplex error:", event.error);
      break;
  }
}

// How the call's turns end, as the server describes its session (session.created / updated):
// semantic_vad (the words and the voice say the caller is done), server_vad (a silence), or
// none (the client commits). A server without the end-of-turn audio model judges by words only.
const TURN_MODES = { semantic_vad: "end of turn by meaning (semantic_vad)", server_vad: "end of turn by silence (server_vad)" };

function showTurnDetection(session) {
  const detection = session.audio && session.audio.input ? session.audio.input.turn_detection : null;
  const mode = detection ? detection.type : "none";
  const label = $("turn-mode");
  delete label.dataset.audioModel;
  if (mode === "semantic_vad") {
    const audioModel = !session.duplex_turn_end || session.duplex_turn_end.audio_model !== false;
    label.dataset.audioModel = String(audioModel);
    label.textContent = "this call: semantic_vad, judged by " + (audioModel ? "the words and the voice"
      : "the words only (this server has no end-of-turn audio model)");
  } else if (mode === "server_vad") {
    label.textContent = `this call: server_vad, turns end after ${detection.silence_duration_ms} ms of silence`;
  } else {
    label.textContent = "this call: turn_detection null, the client commits its turns";
  }
  label.dataset.mode = mode;
  if (mode in TURN_MODES) $("turn-detection").value = mode;
  $("turn-detection").disabled = !(mode in TURN_MODES);
}

function askTurnDetection() {
  if (!channel || channel.readyState !== "open") return;
  const session = { type: "realtime", audio: { input: { turn_detection: { type: $("turn-detection").value } } } };
  const event = { type: "session.update", session };
  window.duplex.sent.push(event);
  channel.send(JSON.stringify(event));
  $("turn-mode").textContent = "asking for " + TURN_MODES[$("turn-detection").value] + " ...";
}

function rms(analyser, buffer) {
  analyser.getFloatTimeDomainData(buffer);
  let sum = 0;
  for (let i = 0; i < buffer.length; i++) sum += buffer[i] * buffer[i];
  return Math.sqrt(sum / buffer.length);
}

function startMeters() {
  const micBuf = new Float32Array(1024), agentBuf = new Float32Array(1024);
  meterTimer = setInterval(() => {
    const now = performance.now();
    if (micAnalyser) {
      const level = rms(micAnalyser, micBuf);
      $("mic-level").style.width = Math.min(100, level * 400) + "%";
      if (level > ONSET_RMS) {
        if (now - lastMicLoud > ONSET_QUIET_MS) lastMicOnset = now;
        lastMicLoud = now;
      }
    }
    if (agentAnalyser) {
      const level = rms(agentAnalyser, agentBuf);
      window.duplex.agentPeak = Math.max(window.duplex.agentPeak, level);
      $("agent-level").style.width = Math.min(100, level * 400) + "%";
      if (pendingHeardStop && level < SILENT_RMS) {
        const row = metricsRow(pendingHeardStop.responseId);
        row.cells[3].textContent = Math.round(now - pendingHeardStop.onset) + " ms";
        pendingHeardStop = null;
      }
    }
  }, 20);
}

function waitForIceGathering(peer, timeoutMs) {
  // The server takes the offer's candidates at once (no trickle), so let gathering finish.
  if (peer.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { peer.removeEventListener("icegatheringstatechange", check); resolve(); };
    const check = () => { if (peer.iceGatheringState === "complete") done(); };
    peer.addEventListener("icegatheringstatechange", check);
    setTimeout(done, timeoutMs);
  });
}

async function connect() {
  $("connect").disabled = true;
  setState("connecting");
  try {
    const aec = $("aec").checked;
    mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: aec, noiseSuppression: aec, autoGainControl: aec },
    });
    audioCtx = new AudioCtx();
    micAnalyser = audioCtx.createAnalyser();
    audioCtx.createMediaStreamSource(mic).connect(micAnalyser);

    pc = new RTCPeerConnection({ iceServers: [] });
    pc.addTrack(mic.getAudioTracks()[0], mic);
    pc.ontrack = (e) => {
      const stream = e.streams[0] || new MediaStream([e.track]);
      // Chromium feeds a remote stream to WebAudio only once a media element plays it.
      $("agent-audio").srcObject = stream;
      $("agent-audio").play().catch(() => {});
      agentAnalyser = audioCtx.createAnalyser();
      audioCtx.createMediaStreamSource(stream).connect(agentAnalyser);
    };
    pc.onconnectionstatechange = () => {
      if (pc && (pc.connectionState === "failed" || pc.connectionState === "closed")) hangUp();
    };
    channel = pc.createDataChannel("oai-events");
    channel.onmessage = (m) => onServerEvent(JSON.parse(m.data));
    channel.onopen = () => { window.duplex.connected = true; };

    await pc.setLocalDescription(await pc.createOffer());
    await waitForIceGathering(pc, 2000);
    callAuth = await demoSecret();
    const response = await fetch("/v1/realtime/calls", {
      method: "POST", body: pc.localDescription.sdp,
      headers: { "Content-Type": "application/sdp", ...callAuth },
    });
    if (response.status !== 201) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || "HTTP " + response.status);
    }
    callUrl = response.headers.get("Location");
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    if (audioCtx.state === "suspended") await audioCtx.resume();
    startMeters();
    $("hangup").disabled = false;
  } catch (err) {
    logEvent({ type: "error: " + err.message });
    await hangUp();
  }
}

// A server with an API key lets this page in only with a client secret of its own (--demo-open):
// one short-lived secret per call, so the page never holds the key. No key: 404, no header needed.
let callAuth = {};
async function demoSecret() {
  const reply = await fetch("/duplex/demo/client_secret", { method: "POST" });
  if (reply.status === 404) return {};
  const body = await reply.json().catch(() => ({}));
  if (reply.status !== 200) throw new Error((body.error && body.error.message) || "HTTP " + reply.status);
  return { Authorization: "Bearer " + body.value };
}

async function hangUp() {
  const url = callUrl;
  callUrl = null;
  if (meterTimer) clearInterval(meterTimer);
  meterTimer = null;
  if (channel) channel.close();
  if (pc) pc.close();
  if (mic) mic.getTracks().forEach((t) => t.stop());
  if (audioCtx) audioCtx.close();
  pc = channel = mic = audioCtx = micAnalyser = agentAnalyser = null;
  window.duplex.connected = false;
  $("turn-detection").disabled = true;
  if (url) await fetch(url, { method: "DELETE", headers: callAuth }).catch(() => {});
  setState("disconnected");
  $("connect").disabled = false;
  $("hangup").disabled = true;
}

$("connect").addEventListener("click", connect);
$("hangup").addEventListener("click", hangUp);
$("turn-detection").addEventListener("change", askTurnDetection);
window.addEventListener("pagehide", () => {
  if (callUrl) fetch(callUrl, { method: "DELETE", keepalive: true, headers: callAuth }).catch(() => {});
});
