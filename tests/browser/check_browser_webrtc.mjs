// A real browser through the gateway: headless Chromium (Debian's
// `chromium`, driven by playwright-core) builds an RTCPeerConnection offer
// in a page served from another origin, POSTs it to the gateway (CORS
// preflight included), reads the call id from the exposed `Location`, and
// `setRemoteDescription` accepts the SDP answer. Then a GPT-Live WebRTC
// session by the documented server-side flow (OpenAI's Live takes no
// client secret): the page sends its offer to its own server, which
// creates the session at the gateway's `POST /v1/live/sessions` with its
// key; the browser accepts the answer, and the server hangs the session up.
//
// Usage: node check_browser_webrtc.mjs <patchbay-gateway binary>
// Starts `sim` and `serve` on free 127.0.0.1 ports and a page server on a
// third; everything is stopped on exit. Prints `browser: N passed, N failed`.

import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const CLIENT_KEY = "pb-browser-check";
const UPSTREAM_KEY = "sk-sim-browser-check";
const MODEL = "gpt-realtime";
const LIVE_MODEL = "gpt-live-1";
const DEADLINE_MS = 20000;

const binary = process.argv[2];
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";

function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitReady(url) {
  const deadline = Date.now() + DEADLINE_MS;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(url)).status === 200) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} never became ready`);
}

// The page's script, run in the browser on the page's origin.
async function createCall({ gateway, key, model }) {
  const pc = new RTCPeerConnection();
  pc.addTransceiver("audio", { direction: "sendrecv" });
  pc.createDataChannel("oai-events");
  await pc.setLocalDescription(await pc.createOffer());
  const r = await fetch(`${gateway}/v1/realtime/calls?model=${model}`, {
    method: "POST",
    body: pc.localDescription.sdp,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/sdp" },
  });
  const answer = await r.text();
  const out = { status: r.status, location: r.headers.get("Location"), origin: location.origin };
  if (r.status === 201) {
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
    out.signalingState = pc.signalingState;
    out.remoteMids = pc.getTransceivers().map((t) => t.mid);
  } else {
    out.body = answer;
  }
  pc.close();
  return out;
}

// The page's script for a Live session: its offer goes to its own server.
async function createLiveSession() {
  const pc = new RTCPeerConnection();
  pc.addTransceiver("audio", { direction: "sendrecv" });
  pc.createDataChannel("oai-events");
  await pc.setLocalDescription(await pc.createOffer());
  const r = await fetch("/live-session", {
    method: "POST",
    body: JSON.stringify({ sdp: pc.localDescription.sdp }),
    headers: { "Content-Type": "application/json" },
  });
  const body = await r.json();
  const out = { status: r.status, body };
  if (r.status === 200) {
    await pc.setRemoteDescription({ type: "answer", sdp: body.transport.sdp });
    out.signalingState = pc.signalingState;
  }
  pc.close();
  return out;
}

// The app server's side of the Live flow: `client.live.create(...)` with its key.
async function liveSession(gateway, offer, res) {
  const r = await fetch(`${gateway}/v1/live/sessions`, {
    method: "POST",
    headers: { Authorization: `Bearer ${CLIENT_KEY}`, "Content-Type": "application/json" },
    body: JSON.stringify({ session: { model: LIVE_MODEL }, transport: { type: "webrtc", sdp: offer.sdp } }),
  });
  res.writeHead(r.status, { "Content-Type": "application/json" });
  res.end(await r.text());
}

async function main() {
  const [simPort, gwPort, adminPort, pagePort] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const dir = mkdtempSync(join(tmpdir(), "patchbay-browser-"));
  const config = join(dir, "gateway.toml");
  writeFileSync(
    config,
    `[server]\nlisten = "127.0.0.1:${gwPort}"\nadmin_listen = "127.0.0.1:${adminPort}"\n` +
      `[[routes]]\nmodel = "${MODEL}"\nupstream_url = "ws://127.0.0.1:${simPort}/v1/realtime"\napi_key_env = "BROWSER_UPSTREAM_KEY"\n` +
      `[[routes]]\nmodel = "${LIVE_MODEL}"\nendpoint = "live"\nupstream_url = "ws://127.0.0.1:${simPort}/v1/live/sessions"\napi_key_env = "BROWSER_UPSTREAM_KEY"\n` +
      `[[prices]]\nmodel = "${LIVE_MODEL}"\nusd_per_minute = 0.05\n`,
  );
  const env = { ...process.env, BROWSER_UPSTREAM_KEY: UPSTREAM_KEY, PATCHBAY_MASTER_KEY: CLIENT_KEY };
  const procs = [
    spawn(binary, ["sim", "--listen", `127.0.0.1:${simPort}`, "--keys", UPSTREAM_KEY], { stdio: "ignore" }),
    spawn(binary, ["serve", "--config", config], { env, stdio: ["ignore", "ignore", "inherit"] }),
  ];
  const gateway = `http://127.0.0.1:${gwPort}`;
  const page = createServer((req, res) => {
    if (req.method === "POST" && req.url === "/live-session") {
      let data = "";
      req.on("data", (c) => (data += c));
      req.on("end", () =>
        liveSession(gateway, JSON.parse(data), res).catch((e) => {
          res.writeHead(502);
          res.end(JSON.stringify({ error: String(e) }));
        }),
      );
      return;
    }
    res.writeHead(200, { "Content-Type": "text/html" });
    res.end("<!doctype html><title>patchbay browser check</title>");
  });
  await new Promise((r) => page.listen(pagePort, "127.0.0.1", r));
  let passed = 0;
  let failed = 0;
  let browser;
  try {
    await waitReady(`http://127.0.0.1:${adminPort}/readyz`);
    browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
    const tab = await browser.newPage();
    // localhost, not 127.0.0.1: another origin than the gateway's.
    await tab.goto(`http://localhost:${pagePort}/`);
    const checks = [
      [
        "a page on another origin creates a call and accepts the answer",
        async () => {
          const out = await tab.evaluate(createCall, { gateway, key: CLIENT_KEY, model: MODEL });
          if (out.status !== 201) throw new Error(`status ${out.status}: ${out.body}`);
          if (!out.location || !/^\/v1\/realtime\/calls\/rtc_\w+$/.test(out.location))
            throw new Error(`Location not readable or wrong: ${out.location}`);
          if (out.signalingState !== "stable") throw new Error(`signalingState ${out.signalingState}`);
          if (out.origin === gateway) throw new Error("the page must be on another origin");
        },
      ],
      [
        "a Live session created by the page's server through the gateway: the browser accepts the answer",
        async () => {
          const out = await tab.evaluate(createLiveSession);
          if (out.status !== 200) throw new Error(`status ${out.status}: ${JSON.stringify(out.body)}`);
          if (out.body.transport?.type !== "webrtc") throw new Error(JSON.stringify(out.body));
          if (out.signalingState !== "stable") throw new Error(`signalingState ${out.signalingState}`);
          const id = out.body.session?.id;
          if (!id) throw new Error(`no session id: ${JSON.stringify(out.body)}`);
          // The server ends it.
          const hangup = await fetch(`${gateway}/v1/live/sessions/${id}/hangup`, {
            method: "POST",
            headers: { Authorization: `Bearer ${CLIENT_KEY}`, "Content-Type": "application/json" },
            body: "{}",
          });
          if (hangup.status !== 200) throw new Error(`hangup: ${hangup.status} ${await hangup.text()}`);
        },
      ],
      [
        "a wrong key gets the gateway's 401, readable by the page",
        async () => {
          const out = await tab.evaluate(createCall, { gateway, key: "pb-wrong", model: MODEL });
          if (out.status !== 401) throw new Error(`status ${out.status}`);
          if (JSON.parse(out.body).error.code !== "invalid_api_key") throw new Error(out.body);
        },
      ],
    ];
    for (const [name, check] of checks) {
      try {
        await check();
        passed += 1;
        console.log(`ok      ${name}`);
      } catch (e) {
        failed += 1;
        console.log(`FAILED  ${name}\n${e.stack || e}`);
      }
    }
  } finally {
    if (browser) await browser.close();
    page.close();
    for (const p of procs) p.kill("SIGTERM");
  }
  console.log(`browser: ${passed} passed, ${failed} failed`);
  process.exit(failed === 0 && passed > 0 ? 0 : 1);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
