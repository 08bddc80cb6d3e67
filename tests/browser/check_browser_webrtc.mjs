// A real browser through the gateway: headless Chromium (Debian's
// `chromium`, driven by playwright-core) builds an RTCPeerConnection offer
// in a page served from another origin, POSTs it to the gateway (CORS
// preflight included), reads the call id from the exposed `Location`, and
// `setRemoteDescription` accepts the SDP answer.
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

async function main() {
  const [simPort, gwPort, adminPort, pagePort] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const dir = mkdtempSync(join(tmpdir(), "patchbay-browser-"));
  const config = join(dir, "gateway.toml");
  writeFileSync(
    config,
    `[server]\nlisten = "127.0.0.1:${gwPort}"\nadmin_listen = "127.0.0.1:${adminPort}"\n` +
      `[[routes]]\nmodel = "${MODEL}"\nupstream_url = "ws://127.0.0.1:${simPort}/v1/realtime"\napi_key_env = "BROWSER_UPSTREAM_KEY"\n`,
  );
  const env = { ...process.env, BROWSER_UPSTREAM_KEY: UPSTREAM_KEY, PATCHBAY_MASTER_KEY: CLIENT_KEY };
  const procs = [
    spawn(binary, ["sim", "--listen", `127.0.0.1:${simPort}`, "--keys", UPSTREAM_KEY], { stdio: "ignore" }),
    spawn(binary, ["serve", "--config", config], { env, stdio: ["ignore", "ignore", "inherit"] }),
  ];
  const page = createServer((_, res) => {
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
    const gateway = `http://127.0.0.1:${gwPort}`;
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
