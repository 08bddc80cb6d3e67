"""Third-party client check: the official `openai` Python SDK completes a
Realtime turn through the gateway, and mints a client secret with which a
second client (SDK by Bearer, browser-style by subprotocol) completes a turn.

Starts `patchbay-gateway sim` and `patchbay-gateway serve` (the binary given
as argv[1]) on free 127.0.0.1 ports, waits for /readyz, then drives one
session with `client.realtime.connect(model=...)`, sync and async. Prints a
pytest-style closing line (`N passed, N failed`) and exits non-zero on any
failure. Everything it starts is stopped on exit.
"""

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import json
import urllib.request

import openai
from openai import AsyncOpenAI, OpenAI
from websockets.sync.client import connect as ws_connect

CLIENT_KEY = "pb-sdk-check"
UPSTREAM_KEY = "sk-sim-sdk-check"
MODEL = "gpt-realtime"
DEADLINE_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str) -> None:
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


def check_sync(base: str) -> None:
    client = OpenAI(api_key=CLIENT_KEY, websocket_base_url=base)
    seen = []
    with client.realtime.connect(model=MODEL) as conn:
        conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}
        )
        conn.response.create()
        for event in conn:
            seen.append(event.type)
            if event.type == "error":
                raise AssertionError(f"error event: {event}")
            if event.type == "response.done":
                usage = event.response.usage
                assert usage is not None and usage.total_tokens > 0, usage
                assert usage.output_token_details.audio_tokens > 0, usage
                break
    assert seen[0] == "session.created", seen
    assert "session.updated" in seen, seen
    assert "conversation.item.added" in seen, seen
    assert "response.output_audio.delta" in seen, seen


async def check_async(base: str) -> None:
    client = AsyncOpenAI(api_key=CLIENT_KEY, websocket_base_url=base)
    async with client.realtime.connect(model=MODEL) as conn:
        await conn.response.create()
        async for event in conn:
            if event.type == "response.done":
                assert event.response.status == "completed", event.response
                return
    raise AssertionError("no response.done")


def check_wrong_key_is_refused(base: str) -> None:
    client = OpenAI(api_key="pb-wrong", websocket_base_url=base)
    try:
        with client.realtime.connect(model=MODEL) as conn:
            conn.response.create()
            next(iter(conn))
    except Exception as e:  # the SDK surfaces the 401 from the upgrade
        assert "401" in str(e), repr(e)
        return
    raise AssertionError("a wrong key was accepted")


def check_client_secret_flow(http_base: str, ws_base: str) -> None:
    server = OpenAI(api_key=CLIENT_KEY, base_url=http_base, max_retries=0)
    secret = server.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={"type": "realtime", "model": MODEL, "instructions": "Minted instructions."},
    )
    assert secret.value.startswith("pbek_"), secret
    assert time.time() < secret.expires_at <= time.time() + 61, secret
    assert secret.session.instructions == "Minted instructions.", secret.session

    # Bearer form: a client holding only the secret.
    holder = OpenAI(api_key=secret.value, websocket_base_url=ws_base, max_retries=0)
    seen = []
    with holder.realtime.connect(model=MODEL) as conn:
        conn.response.create()
        for event in conn:
            seen.append(event.type)
            if event.type == "error":
                raise AssertionError(f"error event: {event}")
            if event.type == "session.updated":
                assert event.session.instructions == "Minted instructions.", event.session
            if event.type == "response.done":
                assert event.response.status == "completed", event.response
                break
    assert seen[:2] == ["session.created", "session.updated"], seen

    # Browser form: the secret in the subprotocol, as a page would send it.
    url = f"{ws_base}/realtime?model={MODEL}"
    protocols = ["realtime", f"openai-insecure-api-key.{secret.value}"]
    with ws_connect(url, subprotocols=protocols, open_timeout=DEADLINE_S) as ws:
        assert ws.subprotocol == "realtime", ws.subprotocol
        first = json.loads(ws.recv(timeout=DEADLINE_S))
        assert first["type"] == "session.created", first
        updated = json.loads(ws.recv(timeout=DEADLINE_S))
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["instructions"] == "Minted instructions.", updated
        ws.send(json.dumps({"type": "response.create"}))
        while json.loads(ws.recv(timeout=DEADLINE_S))["type"] != "response.done":
            pass

    # A secret cannot mint secrets.
    try:
        OpenAI(api_key=secret.value, base_url=http_base, max_retries=0).realtime.client_secrets.create(
            session={"type": "realtime", "model": MODEL}
        )
    except openai.AuthenticationError:
        return
    raise AssertionError("a client secret minted a client secret")


def main() -> int:
    binary = sys.argv[1]
    sim_port, gw_port, admin_port = free_port(), free_port(), free_port()
    tmp = tempfile.mkdtemp(prefix="patchbay-sdk-")
    config = os.path.join(tmp, "gateway.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = "127.0.0.1:{gw_port}"\nadmin_listen = "127.0.0.1:{admin_port}"\n'
            f'[[routes]]\nmodel = "{MODEL}"\nupstream_url = "ws://127.0.0.1:{sim_port}/v1/realtime"\n'
            f'api_key_env = "SDK_UPSTREAM_KEY"\n'
        )
    env = dict(os.environ, SDK_UPSTREAM_KEY=UPSTREAM_KEY, PATCHBAY_MASTER_KEY=CLIENT_KEY)
    procs = [
        subprocess.Popen(
            [binary, "sim", "--listen", f"127.0.0.1:{sim_port}", "--keys", UPSTREAM_KEY],
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen([binary, "serve", "--config", config], env=env, stdout=subprocess.DEVNULL),
    ]
    passed = failed = 0
    try:
        wait_ready(f"http://127.0.0.1:{admin_port}/readyz")
        base = f"ws://127.0.0.1:{gw_port}/v1"
        checks = [
            ("sync client completes a turn", lambda: check_sync(base)),
            ("async client completes a turn", lambda: asyncio.run(asyncio.wait_for(check_async(base), DEADLINE_S))),
            ("wrong key is refused with 401", lambda: check_wrong_key_is_refused(base)),
            (
                "a minted client secret opens a session (Bearer and subprotocol)",
                lambda: check_client_secret_flow(f"http://127.0.0.1:{gw_port}/v1", base),
            ),
        ]
        for name, check in checks:
            try:
                check()
                passed += 1
                print(f"ok      {name}")
            except Exception:
                failed += 1
                print(f"FAILED  {name}")
                traceback.print_exc()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    print(f"sdk: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
