"""Gateway memory per session: RSS of a release `patchbay-gateway serve` with
N idle sessions, then after one turn on each, against a simulator.

    python3 benchmarks/memory.py target/release/patchbay-gateway 300

`MEM_SIM_ARGS` adds simulator options (e.g. `--audio-delta-bytes 16384`:
the turn's deltas then leave each upstream leg a spare read buffer).
Needs the `websockets` package (tests/requirements.txt). Uses 127.0.0.1
ports 19080/19090/19100; everything it starts is stopped on exit.
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import websockets

SIM, GW, ADMIN = 19100, 19080, 19090


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def main(binary: str, n: int) -> None:
    tmp = tempfile.mkdtemp(prefix="patchbay-mem-")
    config = os.path.join(tmp, "gateway.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = "127.0.0.1:{GW}"\nadmin_listen = "127.0.0.1:{ADMIN}"\n'
            f'[[routes]]\nmodel = "gpt-realtime"\nupstream_url = "ws://127.0.0.1:{SIM}/v1/realtime"\n'
            f'api_key_env = "MEM_UPSTREAM_KEY"\n[pool]\nsize = 0\n[limits]\nmax_sessions = {n + 10}\n'
        )
    env = dict(os.environ, MEM_UPSTREAM_KEY="sk-mem", PATCHBAY_MASTER_KEY="pb-mem", RUST_LOG="warn")
    sim_args = os.environ.get("MEM_SIM_ARGS", "").split()
    sim = subprocess.Popen(
        [binary, "sim", "--listen", f"127.0.0.1:{SIM}", *sim_args], stdout=subprocess.DEVNULL
    )
    gw = subprocess.Popen([binary, "serve", "--config", config], env=env, stdout=subprocess.DEVNULL)
    try:
        time.sleep(1)
        base = rss_kb(gw.pid)
        conns = []
        for _ in range(n):
            ws = await websockets.connect(
                f"ws://127.0.0.1:{GW}/v1/realtime?model=gpt-realtime",
                additional_headers={"Authorization": "Bearer pb-mem"},
                max_size=None,
            )
            await asyncio.wait_for(ws.recv(), 10)
            conns.append(ws)
        time.sleep(0.5)
        idle = rss_kb(gw.pid)

        async def turn(c):
            await c.send(json.dumps({"type": "response.create"}))
            while True:
                m = await asyncio.wait_for(c.recv(), 10)
                if m.startswith('{"type":"response.done"'):
                    return

        await asyncio.gather(*[turn(c) for c in conns])
        after = rss_kb(gw.pid)
        print(f"sessions {n}: gateway RSS {base} KB empty, {idle} KB idle "
              f"({(idle - base) / n:.1f} KB/session), {after} KB after one turn each "
              f"({(after - base) / n:.1f} KB/session)")
        await asyncio.gather(*[c.close() for c in conns])
    finally:
        for p in (gw, sim):
            p.terminate()
            p.wait(timeout=15)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300))
