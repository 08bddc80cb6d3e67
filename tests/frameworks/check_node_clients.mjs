// JavaScript voice-agent clients, unchanged, through the gateway against its
// simulator, each configured only through its own documented settings:
// - the official `openai` Node SDK (`OpenAIRealtimeWS`), which dials only
//   `wss:` (its `buildRealtimeURL` forces the protocol), against the
//   gateway's TLS listener (`[server] tls_cert_file`/`tls_key_file`; the
//   self-signed certificate trusted through NODE_EXTRA_CA_CERTS): a turn;
// - `@openai/agents-realtime` (`RealtimeSession` over
//   `OpenAIRealtimeWebSocket` with its `url`): a tool-call round trip with
//   the framework's own `tool()`, then a clean close.
// Every turn is a request-log row on the gateway's stdout: the check reads
// them and asserts their count, key and cost.
//
// Usage: node check_node_clients.mjs <patchbay-gateway binary>
// Starts `sim` and `serve` on free 127.0.0.1 ports; the clients run in a
// child process (NODE_EXTRA_CA_CERTS is read at start). Prints
// `node clients: N passed, N failed`; everything started is stopped.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, openSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

const CLIENT_KEY = "pb-node-clients";
const UPSTREAM_KEY = "sk-sim-node-clients";
const MODEL = "gpt-realtime";
const DEADLINE_MS = 30000;

function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function withDeadline(what, promise, ms = DEADLINE_MS) {
  return Promise.race([
    promise,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), ms)),
  ]);
}

async function until(what, f) {
  const deadline = Date.now() + DEADLINE_MS;
  while (Date.now() < deadline) {
    const v = await f();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

// ---------------------------------------------------------------- clients

async function openaiSdkOverWss(port) {
  const { default: OpenAI } = await import("openai");
  const { OpenAIRealtimeWS } = await import("openai/realtime/ws");
  const client = new OpenAI({ apiKey: CLIENT_KEY, baseURL: `https://127.0.0.1:${port}/v1` });
  const rt = new OpenAIRealtimeWS({ model: MODEL }, client);
  if (!rt.url.toString().startsWith("wss://")) throw new Error(`dials ${rt.url}`);
  const seen = [];
  const done = new Promise((resolve, reject) => {
    rt.on("error", (e) => reject(new Error(`error event: ${JSON.stringify(e)}`)));
    rt.on("session.created", () => {
      seen.push("session.created");
      rt.send({ type: "response.create" });
    });
    rt.on("response.output_audio.delta", () => seen.push("delta"));
    rt.on("response.done", (e) => resolve(e));
  });
  const event = await withDeadline("the SDK's turn", done);
  if (event.response.status !== "completed") throw new Error(`status ${event.response.status}`);
  if (!seen.includes("delta")) throw new Error(`no audio: ${seen}`);
  const closed = new Promise((resolve) => rt.socket.on("close", (code) => resolve(code)));
  rt.close({ code: 1000, reason: "done" });
  const code = await withDeadline("the close", closed);
  if (code !== 1000) throw new Error(`closed with ${code}`);
}

async function agentsRealtimeToolCall(port) {
  const { RealtimeAgent, RealtimeSession, OpenAIRealtimeWebSocket, tool } = await import(
    "@openai/agents-realtime"
  );
  const { z } = await import("zod");
  let calledWith = null;
  const lookupOrder = tool({
    name: "lookup_order",
    description: "Looks an order up by its id.",
    parameters: z.object({ order_id: z.string() }),
    execute: async ({ order_id }) => {
      calledWith = order_id;
      return "shipped yesterday";
    },
  });
  const agent = new RealtimeAgent({
    name: "Support",
    instructions: "Help with orders.",
    tools: [lookupOrder],
  });
  const transport = new OpenAIRealtimeWebSocket({
    url: `wss://127.0.0.1:${port}/v1/realtime?model=${MODEL}`,
  });
  const session = new RealtimeSession(agent, { transport, model: MODEL });
  let turns = 0;
  const errors = [];
  session.on("error", (e) => errors.push(JSON.stringify(e.error ?? e)));
  transport.on("turn_done", () => (turns += 1));
  await withDeadline("connect", session.connect({ apiKey: CLIENT_KEY }));
  session.sendMessage("Please lookup_order 42 for me.");
  await until("the tool call and the answer after it", () => calledWith !== null && turns >= 2);
  if (errors.length) throw new Error(`errors: ${errors}`);
  if (calledWith !== "sim") throw new Error(`tool called with ${calledWith}`);
  session.close();
}

async function clients(port) {
  let passed = 0;
  let failed = 0;
  for (const [name, check] of [
    ["the openai Node SDK over wss:// completes a turn and closes", () => openaiSdkOverWss(port)],
    ["@openai/agents-realtime runs a tool-call round trip", () => agentsRealtimeToolCall(port)],
  ]) {
    try {
      await check();
      passed += 1;
      console.log(`ok      ${name}`);
    } catch (e) {
      failed += 1;
      console.log(`FAILED  ${name}\n${e.stack ?? e}`);
    }
  }
  process.exit(failed === 0 && passed > 0 ? 0 : 1);
}

// ---------------------------------------------------------------- driver

async function main() {
  const binary = process.argv[2];
  const [simPort, gwPort, adminPort] = [await freePort(), await freePort(), await freePort()];
  const dir = mkdtempSync(join(tmpdir(), "patchbay-node-"));
  const cert = join(dir, "tls.crt");
  const key = join(dir, "tls.key");
  execFileSync("openssl", [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
    "-addext", "subjectAltName=IP:127.0.0.1",
  ], { stdio: "ignore" });
  const config = join(dir, "gateway.toml");
  writeFileSync(
    config,
    `[server]\nlisten = "127.0.0.1:${gwPort}"\nadmin_listen = "127.0.0.1:${adminPort}"\n` +
      `tls_cert_file = "${cert}"\ntls_key_file = "${key}"\n` +
      `[[routes]]\nmodel = "${MODEL}"\nupstream_url = "ws://127.0.0.1:${simPort}/v1/realtime"\n` +
      `api_key_env = "NODE_UPSTREAM_KEY"\n[metering]\nflush_secs = 0\n` +
      `[[prices]]\nmodel = "${MODEL}"\ntext_input = 4.0\naudio_input = 32.0\ntext_output = 16.0\naudio_output = 64.0\n`,
  );
  const rowsFile = join(dir, "rows.jsonl");
  const env = { ...process.env, NODE_UPSTREAM_KEY: UPSTREAM_KEY, PATCHBAY_MASTER_KEY: CLIENT_KEY };
  const procs = [
    spawn(binary, ["sim", "--listen", `127.0.0.1:${simPort}`, "--keys", UPSTREAM_KEY], { stdio: "ignore" }),
    spawn(binary, ["serve", "--config", config], { env, stdio: ["ignore", openSync(rowsFile, "w"), "inherit"] }),
  ];
  let code = 1;
  try {
    await until("the gateway's /readyz", async () => {
      try {
        return (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).ok;
      } catch {
        return false;
      }
    });
    const child = spawn(process.execPath, [process.argv[1], "--clients", String(gwPort)], {
      env: { ...process.env, NODE_EXTRA_CA_CERTS: cert },
      stdio: "inherit",
    });
    const clientsCode = await new Promise((resolve) => child.on("exit", resolve));
    // Every turn billed to the key: the SDK's one, the agent's tool call and
    // its answer.
    let rowsOk = false;
    try {
      const rows = await until("three billed rows", () => {
        const rows = readFileSync(rowsFile, "utf8")
          .split("\n")
          .filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l))
          .filter((r) => r.key_id === "master" && r.cost_usd > 0);
        return rows.length >= 3 ? rows : null;
      });
      console.log(`ok      every turn is a billed row (${rows.length} rows, key master)`);
      rowsOk = true;
    } catch (e) {
      console.log(`FAILED  every turn is a billed row\n${e}`);
    }
    const failed = (clientsCode === 0 ? 0 : 1) + (rowsOk ? 0 : 1);
    console.log(`node clients: ${failed === 0 ? "all" : "not all"} passed, ${failed} failed`);
    code = failed === 0 ? 0 : 1;
  } finally {
    for (const p of procs) p.kill("SIGTERM");
  }
  process.exit(code);
}

if (process.argv[2] === "--clients") {
  await clients(Number(process.argv[3]));
} else {
  await main();
}
