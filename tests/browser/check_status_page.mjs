// The gateway's live status page (`GET /status` on the admin listener) in
// a real browser: headless Chromium (Debian's `chromium`, driven by
// playwright-core) runs sessions through the gateway from a page, loads
// the status page, and checks that its numbers are those of `/metrics`,
// that it fetched nothing but itself (no script, nothing from elsewhere),
// and that it refreshes itself: after one more session the open page shows
// it without being reloaded by the test. A screenshot of the page is
// written to $STATUS_SCREENSHOT (default target/status-page.png).
//
// Usage: node check_status_page.mjs <patchbay-gateway binary>
// Starts `sim` and `serve` on free 127.0.0.1 ports; everything is stopped
// on exit. Prints `status page: N passed, N failed`.

import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { chromium } from "playwright-core";

const CLIENT_KEY = "pb-status-check";
const UPSTREAM_KEY = "sk-sim-status-check";
const MODEL = "gpt-realtime";
const DEADLINE_MS = 20000;
const SESSIONS = 3;

const binary = process.argv[2];
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const screenshot = process.env.STATUS_SCREENSHOT || "target/status-page.png";

function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function until(what, f, deadlineMs = DEADLINE_MS) {
  const deadline = Date.now() + deadlineMs;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await f();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what} (last: ${last})`);
}

// Sums of a family's samples in the text exposition whose labels include `matching`.
function sum(text, name, matching = {}) {
  let total = 0;
  for (const line of text.split("\n")) {
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)/);
    if (!m || m[1] !== name) continue;
    const labels = Object.fromEntries([...(m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]));
    if (Object.entries(matching).every(([k, v]) => labels[k] === v)) total += Number(m[3]);
  }
  return total;
}

// Run in the browser: one session with a turn, the key in the subprotocol.
// The page sending it is the admin listener's /healthz: an origin the
// gateway does not check for a WebSocket.
async function oneSession({ url, key }) {
  return await new Promise((resolve, reject) => {
    const ws = new WebSocket(url, ["realtime", `openai-insecure-api-key.${key}`]);
    const timer = setTimeout(() => reject(new Error("no response.done")), 10000);
    ws.onmessage = (m) => {
      const event = JSON.parse(m.data);
      if (event.type === "session.created") ws.send(JSON.stringify({ type: "response.create" }));
      if (event.type === "error") reject(new Error(m.data));
      if (event.type === "response.done") {
        clearTimeout(timer);
        ws.close(1000);
        resolve(event.response.status);
      }
    };
    ws.onerror = () => reject(new Error("websocket error"));
  });
}

async function main() {
  const [simPort, gwPort, adminPort] = [await freePort(), await freePort(), await freePort()];
  const dir = mkdtempSync(join(tmpdir(), "patchbay-status-"));
  const config = join(dir, "gateway.toml");
  writeFileSync(
    config,
    `[server]\nlisten = "127.0.0.1:${gwPort}"\nadmin_listen = "127.0.0.1:${adminPort}"\n` +
      `[[routes]]\nmodel = "${MODEL}"\n` +
      `[[routes.upstreams]]\nname = "sim-a"\nupstream_url = "ws://127.0.0.1:${simPort}/v1/realtime"\napi_key_env = "STATUS_UPSTREAM_KEY"\n` +
      `[[routes.upstreams]]\nname = "sim-b"\nupstream_url = "ws://127.0.0.1:${simPort}/v1/realtime"\napi_key_env = "STATUS_UPSTREAM_KEY"\npriority = 1\n` +
      `[pool]\nsize = 2\n[metering]\nflush_secs = 0\n` +
      `[[prices]]\nmodel = "${MODEL}"\ntext_input = 4.0\ncached_text_input = 0.4\naudio_input = 32.0\n` +
      `cached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n`,
  );
  const env = { ...process.env, STATUS_UPSTREAM_KEY: UPSTREAM_KEY, PATCHBAY_MASTER_KEY: CLIENT_KEY };
  const procs = [
    spawn(binary, ["sim", "--listen", `127.0.0.1:${simPort}`, "--keys", UPSTREAM_KEY], { stdio: "ignore" }),
    spawn(binary, ["serve", "--config", config], { env, stdio: ["ignore", "ignore", "inherit"] }),
  ];
  const admin = `http://127.0.0.1:${adminPort}`;
  const wsUrl = `ws://127.0.0.1:${gwPort}/v1/realtime?model=${MODEL}`;
  const metrics = async () => (await fetch(`${admin}/metrics`)).text();
  let passed = 0;
  let failed = 0;
  let browser;
  try {
    await until("/readyz", async () => (await fetch(`${admin}/readyz`)).status === 200);
    browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
    const tab = await browser.newPage({ viewport: { width: 1200, height: 700 } });
    // Sessions run from a tab of their own: the status tab reloads itself.
    const client = await browser.newPage();
    await client.goto(`${admin}/healthz`);
    const requests = [];
    tab.on("request", (r) => requests.push(r.url()));
    const cell = (id) => tab.textContent(`[data-model="${MODEL}"] [data-id="${id}"]`);
    const field = (id) => tab.textContent(`[data-id="${id}"]`);

    const checks = [
      [
        "sessions from a page complete their turns",
        async () => {
          for (let i = 0; i < SESSIONS; i++) {
            const status = await client.evaluate(oneSession, { url: wsUrl, key: CLIENT_KEY });
            if (status !== "completed") throw new Error(`response status ${status}`);
          }
          await until("the turns in /metrics", async () => sum(await metrics(), "patchbay_turns_total") === SESSIONS);
        },
      ],
      [
        "the page's numbers are those of /metrics",
        async () => {
          // Nothing moves between the two reads: no session is open, the
          // pool is full and every row is written.
          await until("a quiet gateway", async () => {
            const t = await metrics();
            return (
              sum(t, "patchbay_pool_warm_sockets") === 2 &&
              sum(t, "patchbay_realtime_sessions_active") === 0 &&
              sum(t, "patchbay_outbox_rows") === 0
            );
          });
          await tab.goto(`${admin}/status`);
          const text = await metrics();
          const m = { model: MODEL };
          const expect = [
            ["sessions", await cell("sessions"), sum(text, "patchbay_realtime_sessions_active", m)],
            ["warm", await cell("warm"), sum(text, "patchbay_pool_warm_sockets", m)],
            ["turns", await cell("turns"), sum(text, "patchbay_turns_total", m)],
            ["spend", await cell("spend"), sum(text, "patchbay_cost_usd_total", m)],
            ["store errors", await field("store-errors"), sum(text, "patchbay_store_errors_total")],
            ["rows waiting for stdout", await field("outbox-stdout"), sum(text, "patchbay_outbox_rows", { sink: "stdout" })],
            ["rows dropped", await field("outbox-dropped"), sum(text, "patchbay_outbox_dropped_total")],
          ];
          for (const [what, shown, scraped] of expect) {
            if (Math.abs(Number(shown) - scraped) > 1e-6) throw new Error(`${what}: page ${shown}, /metrics ${scraped}`);
          }
          if (Number(await cell("turns")) !== SESSIONS) throw new Error(`turns ${await cell("turns")}`);
          if (!(Number(await cell("spend")) > 0)) throw new Error(`spend ${await cell("spend")}`);
          if ((await cell("target")) !== "2") throw new Error(`pool target ${await cell("target")}`);
          if ((await field("state")) !== "ready") throw new Error(`state ${await field("state")}`);
          const breakers = await tab.$$eval(`[data-model="${MODEL}"] [data-upstream]`, (es) => es.map((e) => e.textContent));
          if (JSON.stringify(breakers) !== JSON.stringify(["sim-a: breaker closed", "sim-b: breaker closed"]))
            throw new Error(`upstreams ${breakers}`);
        },
      ],
      [
        "the page loads nothing but itself and runs no script",
        async () => {
          const others = requests.filter((u) => !u.startsWith(`${admin}/status`));
          if (others.length) throw new Error(`other requests: ${others}`);
          if ((await tab.$$("script")).length) throw new Error("the page has a script");
        },
      ],
      [
        "the open page refreshes itself and shows the next session",
        async () => {
          const before = requests.length;
          await client.evaluate(oneSession, { url: wsUrl, key: CLIENT_KEY });
          await until("the page's own refresh", async () => requests.length > before && Number(await cell("turns")) === SESSIONS + 1, 15000);
          mkdirSync(dirname(screenshot), { recursive: true });
          await tab.screenshot({ path: screenshot, fullPage: true });
          console.log(`screenshot: ${screenshot}`);
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
    for (const p of procs) p.kill("SIGTERM");
  }
  console.log(`status page: ${passed} passed, ${failed} failed`);
  process.exit(failed === 0 && passed > 0 ? 0 : 1);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
