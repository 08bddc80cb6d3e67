"""Third-party client check: the official `openai` Python SDK completes a
Realtime turn through the gateway, and mints a client secret with which a
second client (SDK by Bearer, browser-style by subprotocol) completes a turn.
Calls: `client.realtime.calls.create(sdp=…)` with a client key and with a
client secret returns the SDP answer and a call id, the simulated caller's
turns become request-log rows (read from the gateway's stdout) attributed to
the right key; a spent budget makes the gateway hang up (the simulator saw
it) and refuse the next call with 402; another key's `calls.hangup` is 404;
a SIP call accepted with `calls.accept` is metered the same way.
Transcription: `client.realtime.connect(extra_query={"intent":
"transcription"})` (no model) reaches the route configured for the intent,
the model is chosen in `session.update` and its duration usage becomes a
row priced per minute; a model outside the key's list is refused with an
`error` event; a transcription client secret mints and connects. The beta
client (`client.beta.realtime`) is refused with 400 on the GA route.
Translation: `client.realtime.translations.connect(model=…)` translates
appended audio through the gateway, and its rows bill the input seconds
per minute; `client.realtime.translations.client_secrets.create` mints a
secret that connects.

GPT-Live: `client.live.connect()` then `session.start` opens a Live session
through the gateway, its cumulative `session.usage.updated` seconds and the
final `session.closed` figure become rows that charge exactly that figure
per minute; a key whose `models` leave the Live model out gets an `error`
event and the close. `client.live.create()` (a WebRTC offer) returns the
answer and a session id; another key's `live.sessions.hangup`,
`download_recording` and `fork` are 404; the owner forks it (a new
session) and downloads its recording, and its hangup ends both, whose
rows (metered over the gateway's `/attach` sideband) charge exactly the
simulator's seconds. `client.live.sideband.connect(session_id=…)` attaches
the owner to that session through the gateway (another key's attach and
WebSocket fork are 404), `client.live.forks.connect(session_id=…)` forks
it over WebSocket (the parent's model, its own rows), and the attach's
`session.close` ends the session, charged once over the gateway's own
sideband.

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
import hashlib
import json
import urllib.request

import openai
from openai import AsyncOpenAI, OpenAI
from websockets.sync.client import connect as ws_connect

CLIENT_KEY = "pb-sdk-check"
UPSTREAM_KEY = "sk-sim-sdk-check"
MODEL = "gpt-realtime"
DEADLINE_S = 20
CALLER_TURNS = 3
# What a browser's RTCPeerConnection offers: audio and a data channel.
OFFER = (
    "v=0\r\no=- 4611731400430051336 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=ice-ufrag:abcd\r\n"
    "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\na=setup:actpass\r\na=mid:0\r\na=sendrecv\r\n"
    "a=rtpmap:111 opus/48000/2\r\n"
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\n"
)
CALLS_KEY, OTHER_KEY, BUDGET_KEY = "pb-calls-a", "pb-calls-b", "pb-calls-budget"
TRANSCRIBE_KEY = "pb-transcribe-only"
WHISPER = "gpt-realtime-whisper"
TRANSLATE = "gpt-realtime-translate"
LIVE = "gpt-live-1"
LIVE_USD_PER_MINUTE = 0.05
# The simulator reports each transcription as 30 s of audio.
TRANSCRIBED_SECONDS = 30
# One simulator turn costs $0.006692 at these prices; the budget key can
# afford less than one.
KEYS_TOML = "".join(
    f'[[keys]]\nid = "{kid}"\nsha256 = "{hashlib.sha256(k.encode()).hexdigest()}"\n{extra}\n'
    for kid, k, extra in [
        ("calls-a", CALLS_KEY, ""),
        ("calls-b", OTHER_KEY, ""),
        ("calls-budget", BUDGET_KEY, "budget_usd = 0.005"),
        ("transcribe-only", TRANSCRIBE_KEY, f'models = ["transcribe", "{WHISPER}"]'),
    ]
)
PRICES_TOML = (
    '[[prices]]\nmodel = "gpt-realtime"\ntext_input = 4.0\ncached_text_input = 0.4\n'
    "audio_input = 32.0\ncached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n"
    f'[[prices]]\nmodel = "{WHISPER}"\nusd_per_minute = 0.017\n'
    f'[[prices]]\nmodel = "{TRANSLATE}"\nusd_per_minute = 0.034\n'
    f'[[prices]]\nmodel = "{LIVE}"\nusd_per_minute = {LIVE_USD_PER_MINUTE}\n'
)


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


TRANSCRIPTION_CONFIG = {"type": "transcription", "audio": {"input": {"transcription": {"model": WHISPER}}}}
# 100 ms of 24 kHz PCM16 silence.
SILENCE_B64 = __import__("base64").b64encode(bytes(4800)).decode()


def transcribe_once(conn) -> dict:
    """Appends audio, commits it and returns the completed event's usage."""
    conn.input_audio_buffer.append(audio=SILENCE_B64)
    conn.input_audio_buffer.commit()
    for event in conn:
        if event.type == "error":
            raise AssertionError(f"error event: {event}")
        if event.type == "conversation.item.input_audio_transcription.completed":
            return event.usage
    raise AssertionError("no transcription")


def check_transcription_session(ws_base: str, rows_file: str) -> None:
    client = OpenAI(api_key=TRANSCRIBE_KEY, websocket_base_url=ws_base)
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        created = next(iter(conn))
        assert created.type == "session.created" and created.session.type == "transcription", created
        conn.session.update(session=TRANSCRIPTION_CONFIG)
        usage = transcribe_once(conn)
        assert usage.type == "duration" and usage.seconds == TRANSCRIBED_SECONDS, usage

    def row():
        rows = [r for r in read_rows(rows_file) if r.get("key_id") == "transcribe-only" and r["model"] == WHISPER]
        return rows[0] if rows else None

    r = wait_for("the transcription row", row)
    assert r["audio_seconds"] == TRANSCRIBED_SECONDS, r
    assert abs(r["cost_usd"] - TRANSCRIBED_SECONDS / 60 * 0.017) < 1e-9, r


def check_transcription_model_refused(ws_base: str) -> None:
    client = OpenAI(api_key=TRANSCRIBE_KEY, websocket_base_url=ws_base)
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.session.update(
            session={"type": "transcription", "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}},
            event_id="evt_sdk_1",
        )
        for event in conn:
            if event.type == "session.updated":
                raise AssertionError("a disallowed model reached the upstream")
            if event.type == "error":
                assert event.error.code == "model_not_allowed", event
                assert event.error.param == "session.audio.input.transcription.model", event
                assert event.error.event_id == "evt_sdk_1", event
                return
    raise AssertionError("no error event")


def check_transcription_client_secret(http_base: str, ws_base: str) -> None:
    server = OpenAI(api_key=TRANSCRIBE_KEY, base_url=http_base, max_retries=0)
    secret = server.realtime.client_secrets.create(session=TRANSCRIPTION_CONFIG)
    assert secret.value.startswith("pbek_"), secret
    assert secret.session.type == "transcription", secret.session
    holder = OpenAI(api_key=secret.value, websocket_base_url=ws_base, max_retries=0)
    with holder.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        seen = []
        for event in conn:
            seen.append(event.type)
            if event.type == "session.updated":
                assert event.session.audio.input.transcription.model == WHISPER, event.session
                break
        assert seen == ["session.created", "session.updated"], seen
        usage = transcribe_once(conn)
        assert usage.seconds == TRANSCRIBED_SECONDS, usage


def check_beta_client_is_refused(ws_base: str) -> None:
    client = OpenAI(api_key=CLIENT_KEY, websocket_base_url=ws_base)
    try:
        with client.beta.realtime.connect(model=MODEL) as conn:
            next(iter(conn))
    except Exception as e:  # the SDK surfaces the upgrade's 400
        assert "400" in str(e), repr(e)
        return
    raise AssertionError("a beta client was served by a GA route")


def check_translation_session(ws_base: str, rows_file: str) -> None:
    client = OpenAI(api_key=CALLS_KEY, websocket_base_url=ws_base)
    chunk = __import__("base64").b64encode(bytes(9600)).decode()  # 200 ms
    with client.realtime.translations.connect(model=TRANSLATE) as conn:
        created = next(iter(conn))
        assert created.type == "session.created" and created.session.model == TRANSLATE, created
        conn.session.update(session={"audio": {"output": {"language": "fr"}}})
        for _ in range(10):
            conn.session.input_audio_buffer.append(audio=chunk)
        deltas = 0
        for event in conn:
            if event.type == "error":
                raise AssertionError(f"error event: {event}")
            if event.type == "session.updated":
                assert event.session.audio.output.language == "fr", event.session
            if event.type == "session.output_audio.delta":
                deltas += 1
                if deltas == 10:
                    break
        conn.session.close()
        for event in conn:
            if event.type == "session.closed":
                break

    def rows():
        got = [r for r in read_rows(rows_file) if r["model"] == TRANSLATE and r.get("key_id") == "calls-a"]
        return got if abs(sum(r["audio_seconds"] for r in got) - 2.0) < 1e-6 else None

    got = wait_for("the translation rows (2 s of audio)", rows)
    cost = sum(r["cost_usd"] for r in got)
    assert abs(cost - 2.0 / 60 * 0.034) < 1e-6, got


def check_translation_client_secret(http_base: str, ws_base: str) -> None:
    server = OpenAI(api_key=CALLS_KEY, base_url=http_base, max_retries=0)
    secret = server.realtime.translations.client_secrets.create(
        session={"model": TRANSLATE, "audio": {"output": {"language": "de"}}}
    )
    assert secret.value.startswith("pbek_"), secret
    assert secret.session.model == TRANSLATE, secret.session
    holder = OpenAI(api_key=secret.value, websocket_base_url=ws_base, max_retries=0)
    with holder.realtime.translations.connect(model=TRANSLATE) as conn:
        seen = []
        for event in conn:
            seen.append(event.type)
            if event.type == "session.updated":
                assert event.session.audio.output.language == "de", event.session
                break
        assert seen == ["session.created", "session.updated"], seen
        conn.session.input_audio_buffer.append(audio=SILENCE_B64)
        for event in conn:
            if event.type == "session.output_audio.delta":
                break


def check_live_session(ws_base: str, rows_file: str) -> None:
    client = OpenAI(api_key=CALLS_KEY, websocket_base_url=ws_base, max_retries=0)
    with client.live.connect() as conn:
        conn.session.start(session={"model": LIVE, "instructions": "Answer briefly."})
        started = None
        seen = 0.0
        for event in conn:
            if event.type == "error":
                raise AssertionError(f"error event: {event}")
            if event.type == "session.started":
                started = event
                assert event.session.model == LIVE and event.session.status == "active", event
            if event.type == "session.usage.updated":
                assert event.usage.seconds >= seen, (event.usage, seen)
                seen = event.usage.seconds
                if seen >= 60:
                    break
        assert started is not None
        conn.session.close()
        final = None
        for event in conn:
            if event.type == "session.closed":
                final = event.usage.seconds
                assert event.reason == "close_requested", event
                break
        assert final is not None and final >= seen, (final, seen)

    def rows():
        got = [r for r in read_rows(rows_file) if r.get("live_session_id") == started.session.id]
        return got if abs(sum(r["audio_seconds"] for r in got) - final) < 1e-6 else None

    got = wait_for(f"the Live session's rows ({final} s)", rows)
    assert all(r["key_id"] == "calls-a" and not r["usage_estimated"] for r in got), got
    cost = sum(r["cost_usd"] for r in got)
    assert abs(cost - final / 60 * LIVE_USD_PER_MINUTE) < 1e-6, got


def check_live_model_refused(ws_base: str) -> None:
    client = OpenAI(api_key=TRANSCRIBE_KEY, websocket_base_url=ws_base, max_retries=0)
    with client.live.connect() as conn:
        conn.session.start(session={"model": LIVE}, event_id="start-1")
        event = conn.recv()
        assert event.type == "error", event
        assert event.error.code == "model_not_allowed", event.error
        assert event.error.client_event_id == "start-1", event.error
        try:
            conn.recv()
        except openai.OpenAIError:
            pass
        except Exception as e:  # the close, as the websockets library raises it
            assert "1008" in str(e), repr(e)
        else:
            raise AssertionError("the session went on")


def check_live_webrtc(http_base: str, sim_base: str, rows_file: str) -> None:
    owner = OpenAI(api_key=CALLS_KEY, base_url=http_base, max_retries=0)
    other = OpenAI(api_key=OTHER_KEY, base_url=http_base, max_retries=0)
    created = owner.live.create(
        session={"model": LIVE, "instructions": "Answer briefly."},
        transport={"type": "webrtc", "sdp": OFFER},
    )
    assert created.transport.type == "webrtc" and "a=mid:0" in created.transport.sdp, created
    sid = created.session.id
    for name, act in [
        ("hangup", lambda: other.live.sessions.hangup(sid)),
        ("download_recording", lambda: other.live.sessions.download_recording(sid)),
        ("fork", lambda: other.live.sessions.fork(sid, transport={"type": "webrtc", "sdp": OFFER})),
    ]:
        try:
            act()
        except openai.NotFoundError:
            continue
        raise AssertionError(f"another key's {name} was not refused with 404")
    forked = owner.live.sessions.fork(sid, transport={"type": "webrtc", "sdp": OFFER})
    assert forked.session.id != sid, forked
    time.sleep(1.5)
    recording = owner.live.sessions.download_recording(sid)
    assert len(recording.content) > 0
    for s in (sid, forked.session.id):
        owner.live.sessions.hangup(s)

    def rows():
        got = {s: [r for r in read_rows(rows_file) if r.get("live_session_id") == s] for s in (sid, forked.session.id)}
        closed = all(g and g[-1]["end_reason"] == "session_closed" for g in got.values())
        return got if closed else None

    got = wait_for("the WebRTC Live sessions' last rows", rows)
    charged = sum(r["audio_seconds"] for g in got.values() for r in g)
    assert all(r["transport"] == "webrtc" and r["key_id"] == "calls-a" for g in got.values() for r in g), got
    assert charged >= 60, got


def refused_404(connect) -> None:
    """`connect` (an SDK WebSocket manager) is refused with 404."""
    try:
        with connect():
            pass
    except Exception as e:  # the websockets library's InvalidStatus
        response = getattr(e, "response", None)
        assert getattr(response, "status_code", None) == 404, repr(e)
        return
    raise AssertionError("the upgrade was accepted")


def check_live_attach_and_ws_fork(http_base: str, ws_base: str, rows_file: str) -> None:
    owner = OpenAI(api_key=CALLS_KEY, base_url=http_base, websocket_base_url=ws_base, max_retries=0)
    other = OpenAI(api_key=OTHER_KEY, base_url=http_base, websocket_base_url=ws_base, max_retries=0)
    sid = owner.live.create(
        session={"model": LIVE, "instructions": "Answer briefly."},
        transport={"type": "webrtc", "sdp": OFFER},
    ).session.id
    refused_404(lambda: other.live.sideband.connect(session_id=sid))
    refused_404(lambda: other.live.forks.connect(session_id=sid))
    with owner.live.sideband.connect(session_id=sid, graceful_close=True) as side:
        event = side.recv()
        assert event.type == "session.usage.updated", event
        # A WebSocket fork of it: the parent's model, metered on its own.
        with owner.live.forks.connect(session_id=sid) as fork:
            fork.session.start(session={}, event_id="fork-1")
            started = fork.recv()
            assert started.type == "session.started", started
            assert started.session.model == LIVE, started.session
            fork_id = started.session.id
            time.sleep(1.0)
            fork.session.close()
            fork_final = None
            for event in fork:
                if event.type == "session.closed":
                    fork_final = event.usage.seconds
                    break
        assert fork_final is not None and fork_final >= 60, fork_final
        # The attach's session.close ends the parent.
        side.session.close()
        final = None
        for event in side:
            if event.type == "session.closed":
                final = event.usage.seconds
                break
        assert final is not None and final > 0, final

    def rows():
        got = {s: [r for r in read_rows(rows_file) if r.get("live_session_id") == s] for s in (sid, fork_id)}
        done = got[sid] and got[sid][-1]["end_reason"] == "session_closed"
        fork_charged = sum(r["audio_seconds"] for r in got[fork_id])
        return got if done and abs(fork_charged - fork_final) < 1e-6 else None

    got = wait_for("the attached session's and the fork's rows", rows)
    # Charged once, over the gateway's own sideband, with a client attached.
    assert abs(sum(r["audio_seconds"] for r in got[sid]) - final) < 1e-6, (final, got[sid])
    assert all(r["transport"] == "webrtc" for r in got[sid]), got[sid]
    assert all(r["transport"] == "websocket" and r["key_id"] == "calls-a" for r in got[fork_id]), got[fork_id]


def read_rows(rows_file: str) -> list:
    out = []
    with open(rows_file) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def rows_of(rows_file: str, call_id: str) -> list:
    out = []
    with open(rows_file) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("call_id") == call_id:
                out.append(row)
    return out


def wait_for(what: str, f):
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def sim_post(sim_base: str, path: str):
    req = urllib.request.Request(
        sim_base + path, data=b"", method="POST", headers={"Authorization": f"Bearer {UPSTREAM_KEY}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def create_call(client: OpenAI, **kw) -> tuple:
    raw = client.realtime.calls.with_raw_response.create(sdp=OFFER, **kw)
    assert raw.status_code == 201, raw.status_code
    location = raw.headers["location"]
    assert location.startswith("/v1/realtime/calls/rtc_"), location
    answer = raw.parse().text
    assert answer.startswith("v=0") and "a=mid:0" in answer and "a=mid:1" in answer, answer
    assert "a=setup:active" in answer, answer
    return location.rsplit("/", 1)[1], answer


def check_calls_with_key(http_base: str, rows_file: str) -> None:
    client = OpenAI(api_key=CALLS_KEY, base_url=http_base, max_retries=0)
    call_id, _ = create_call(client, session={"type": "realtime", "model": MODEL, "instructions": "Be brief."})
    rows = wait_for("three rows", lambda: (r := rows_of(rows_file, call_id)) and len(r) >= CALLER_TURNS and r)
    for row in rows:
        assert row["key_id"] == "calls-a", row
        assert row["transport"] == "webrtc", row
        assert row["status"] == 200 and not row["usage_unknown"], row
        assert row["total_tokens"] > 0 and row["cost_usd"] > 0, row
    try:
        OpenAI(api_key=OTHER_KEY, base_url=http_base, max_retries=0).realtime.calls.hangup(call_id)
        raise AssertionError("another key hung up the call")
    except openai.NotFoundError:
        pass
    client.realtime.calls.hangup(call_id)


def check_calls_with_client_secret(http_base: str, rows_file: str) -> None:
    parent = OpenAI(api_key=CALLS_KEY, base_url=http_base, max_retries=0)
    secret = parent.realtime.client_secrets.create(session={"type": "realtime", "model": MODEL})
    browser = OpenAI(api_key=secret.value, base_url=http_base, max_retries=0)
    call_id, _ = create_call(browser)
    rows = wait_for("three rows", lambda: (r := rows_of(rows_file, call_id)) and len(r) >= CALLER_TURNS and r)
    assert all(r["key_id"] == "calls-a" and r["client_secret_id"] for r in rows), rows
    parent.realtime.calls.hangup(call_id)


def check_budget_hangs_up(http_base: str, sim_base: str) -> None:
    client = OpenAI(api_key=BUDGET_KEY, base_url=http_base, max_retries=0)
    call_id, _ = create_call(client, session={"type": "realtime", "model": MODEL})
    wait_for(
        "the gateway's hangup",
        lambda: any(a["call_id"] == call_id and a["action"] == "hangup" for a in sim_post(sim_base, "/v1/sim/call_actions")),
    )
    try:
        create_call(client, session={"type": "realtime", "model": MODEL})
        raise AssertionError("a call was created over a spent budget")
    except openai.APIStatusError as e:
        assert e.status_code == 402, e.status_code


def check_sip_accept(http_base: str, sim_base: str, rows_file: str) -> None:
    call_id = sim_post(sim_base, "/v1/sim/sip_calls")["call_id"]
    client = OpenAI(api_key=CALLS_KEY, base_url=http_base, max_retries=0)
    client.realtime.calls.accept(call_id, type="realtime", model=MODEL, instructions="Answer the phone.")
    rows = wait_for("two rows", lambda: (r := rows_of(rows_file, call_id)) and len(r) >= 2 and r)
    assert all(r["transport"] == "sip" and r["key_id"] == "calls-a" for r in rows), rows
    client.realtime.calls.hangup(call_id)


def main() -> int:
    binary = sys.argv[1]
    sim_port, gw_port, admin_port = free_port(), free_port(), free_port()
    tmp = tempfile.mkdtemp(prefix="patchbay-sdk-")
    config = os.path.join(tmp, "gateway.toml")
    keys = os.path.join(tmp, "keys.toml")
    rows_file = os.path.join(tmp, "rows.jsonl")
    with open(keys, "w") as f:
        f.write(KEYS_TOML)
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = "127.0.0.1:{gw_port}"\nadmin_listen = "127.0.0.1:{admin_port}"\n'
            f'[[routes]]\nmodel = "{MODEL}"\nupstream_url = "ws://127.0.0.1:{sim_port}/v1/realtime"\n'
            f'api_key_env = "SDK_UPSTREAM_KEY"\n'
            f'[[routes]]\nmodel = "{TRANSLATE}"\nendpoint = "translations"\n'
            f'upstream_url = "ws://127.0.0.1:{sim_port}/v1/realtime/translations"\napi_key_env = "SDK_UPSTREAM_KEY"\n'
            f'[[routes]]\nmodel = "{LIVE}"\nendpoint = "live"\n'
            f'upstream_url = "ws://127.0.0.1:{sim_port}/v1/live/sessions"\napi_key_env = "SDK_UPSTREAM_KEY"\n'
            f'[[routes]]\nmodel = "transcribe"\nintent = "transcription"\n'
            f'upstream_url = "ws://127.0.0.1:{sim_port}/v1/realtime"\napi_key_env = "SDK_UPSTREAM_KEY"\n'
            f'[keys]\nfile = "{keys}"\n[metering]\nflush_secs = 0\n{PRICES_TOML}'
        )
    rows_out = open(rows_file, "w")
    env = dict(os.environ, SDK_UPSTREAM_KEY=UPSTREAM_KEY, PATCHBAY_MASTER_KEY=CLIENT_KEY)
    procs = [
        subprocess.Popen(
            [
                binary, "sim", "--listen", f"127.0.0.1:{sim_port}", "--keys", UPSTREAM_KEY,
                "--caller-turns", str(CALLER_TURNS), "--caller-turn-interval-ms", "100",
                "--transcription-usage", f"duration:{TRANSCRIBED_SECONDS}",
                # A Live session bills a minute a second, reported every 50 ms.
                "--live-usage-interval-ms", "50", "--live-time-scale", "60",
            ],
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen([binary, "serve", "--config", config], env=env, stdout=rows_out),
    ]
    passed = failed = 0
    try:
        wait_ready(f"http://127.0.0.1:{admin_port}/readyz")
        base = f"ws://127.0.0.1:{gw_port}/v1"
        http_base = f"http://127.0.0.1:{gw_port}/v1"
        sim_base = f"http://127.0.0.1:{sim_port}"
        checks = [
            ("sync client completes a turn", lambda: check_sync(base)),
            ("async client completes a turn", lambda: asyncio.run(asyncio.wait_for(check_async(base), DEADLINE_S))),
            ("wrong key is refused with 401", lambda: check_wrong_key_is_refused(base)),
            (
                "a minted client secret opens a session (Bearer and subprotocol)",
                lambda: check_client_secret_flow(f"http://127.0.0.1:{gw_port}/v1", base),
            ),
            ("calls.create with a key: answer, metered turns, owner-only hangup", lambda: check_calls_with_key(http_base, rows_file)),
            ("calls.create with a client secret is metered to its key", lambda: check_calls_with_client_secret(http_base, rows_file)),
            ("a spent budget hangs the call up and refuses the next with 402", lambda: check_budget_hangs_up(http_base, sim_base)),
            ("calls.accept (SIP) then metered turns", lambda: check_sip_accept(http_base, sim_base, rows_file)),
            ("a transcription session (intent, model in session.update) is billed per minute", lambda: check_transcription_session(base, rows_file)),
            ("a session.update naming a model outside the key's list is refused", lambda: check_transcription_model_refused(base)),
            ("a transcription client secret mints and connects", lambda: check_transcription_client_secret(http_base, base)),
            ("the retired beta client is refused with 400", lambda: check_beta_client_is_refused(base)),
            ("a translation session is billed by its input audio", lambda: check_translation_session(base, rows_file)),
            ("a translation client secret mints and connects", lambda: check_translation_client_secret(http_base, base)),
            ("client.live.connect(): a Live session is billed its cumulative seconds", lambda: check_live_session(base, rows_file)),
            ("a Live session.start naming a model outside the key's list is refused", lambda: check_live_model_refused(base)),
            (
                "client.live.create(): owner-only hangup, recording and fork, metered over the sideband",
                lambda: check_live_webrtc(http_base, sim_base, rows_file),
            ),
            (
                "client.live.sideband.connect() and client.live.forks.connect(): owner only, charged once",
                lambda: check_live_attach_and_ws_fork(http_base, base, rows_file),
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
