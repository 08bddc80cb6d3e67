"""The gateway's OpenTelemetry export, received by a collector built on the
official OTLP protobuf definitions (the `opentelemetry-proto` package).

A real gateway (`patchbay-gateway serve`, the binary in
$PATCHBAY_GATEWAY_BIN, else target/debug/patchbay-gateway) in front of the
built-in simulator exports to an OTLP/HTTP receiver started here, which
decodes every request with `opentelemetry.proto`'s generated classes:

- every response turn is a `realtime_inference gpt-realtime` CLIENT span;
  a session opened with a client `traceparent` has its spans in the
  client's trace, children of the client's span; one without starts its
  own trace;
- every usage attribute of a span equals the request-log row of the same
  turn (`patchbay.request_id`), and so do its cost and time to first token;
- each session has its `gen_ai.client.realtime_session.started` and
  `.ended` events, with the key id (never the key), outcome and close code;
- every span's `gen_ai.conversation.id` is the conversation the client saw
  in its response's `response.done` (openai-python's
  `types/realtime/realtime_response.py`: `conversation_id`), one per
  session;
- the `gen_ai.client.token.usage` and
  `gen_ai.client.inference.usage.{input,output}_tokens` histograms count
  the rows' tokens, and the `gen_ai.client.inference.usage.detailed.*`
  counters add up, modality by modality, to the rows' (and the spans')
  tokens;
- a WebRTC call created with a `traceparent` has its sideband's turns in
  the client's trace, and its events;
- a translation session has its events but no `realtime_inference` span
  (the conventions leave translation and transcription sessions out);
- with the collector down (refusing connections, or accepting and never
  answering), sessions complete as before and
  `patchbay_telemetry_dropped_total` rises, over either protocol.

The same export over OTLP/gRPC is in test_otlp_grpc_export.py.

Everything started here listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from websockets.sync.client import connect as ws_connect

REPO = Path(__file__).resolve().parents[2]
MODEL = "gpt-realtime"
TRANSLATE = "gpt-realtime-translate"
CLIENT_KEY = "pb-otel-check-key"
KEY_ID = "otel-check"
UPSTREAM_KEY = "sk-sim-otel-check"
DEADLINE_S = 30
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"

# The span's usage attributes and the row fields they must equal.
USAGE_ATTRIBUTES = {
    "gen_ai.usage.input_tokens": "input_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.text.input_tokens": "input_text_tokens",
    "gen_ai.usage.audio.input_tokens": "input_audio_tokens",
    "gen_ai.usage.image.input_tokens": "input_image_tokens",
    "gen_ai.usage.text.output_tokens": "output_text_tokens",
    "gen_ai.usage.audio.output_tokens": "output_audio_tokens",
    "gen_ai.usage.cache_read.input_tokens": "input_cached_tokens",
}
# Cached tokens by modality add up to the row's cached tokens.
CACHED_BY_MODALITY = [
    "gen_ai.usage.text.cache_read.input_tokens",
    "gen_ai.usage.audio.cache_read.input_tokens",
    "gen_ai.usage.image.cache_read.input_tokens",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 2) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def wait_for(what: str, f, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            v = f()
        except OSError:
            v = None
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")


def gateway_binary() -> str:
    path = Path(os.environ.get("PATCHBAY_GATEWAY_BIN", REPO / "target" / "debug" / "patchbay-gateway"))
    assert path.is_file(), f"{path} is missing: cargo build -p patchbay-gateway (or set PATCHBAY_GATEWAY_BIN)"
    return str(path)


# ---- the receiver ------------------------------------------------------------


class Received:
    """What the receiver decoded, by signal."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.content_types: set[str] = set()

    def spans(self) -> list[tuple[Any, Any]]:
        """(resource, span) of every span received."""
        with self.lock:
            return [
                (rs.resource, span)
                for req in self.traces
                for rs in req.resource_spans
                for ss in rs.scope_spans
                for span in ss.spans
            ]

    def log_records(self) -> list[Any]:
        with self.lock:
            return [
                rec
                for req in self.logs
                for rl in req.resource_logs
                for sl in rl.scope_logs
                for rec in sl.log_records
            ]

    def last_metrics(self) -> dict[str, Any]:
        with self.lock:
            out = {}
            for req in self.metrics:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            out[m.name] = m
            return out


def receiver(received: Received) -> ThreadingHTTPServer:
    decoders = {
        "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, received.traces,
                       trace_service_pb2.ExportTraceServiceResponse),
        "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, received.logs,
                     logs_service_pb2.ExportLogsServiceResponse),
        "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, received.metrics,
                        metrics_service_pb2.ExportMetricsServiceResponse),
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request_type, into, response_type = decoders[self.path]
            decoded = request_type.FromString(body)
            with received.lock:
                into.append(decoded)
                received.content_types.add(self.headers["Content-Type"])
            answer = response_type().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---- the gateway and its sessions -------------------------------------------


class Gateway:
    def __init__(self, work: Path, sim_port: int, endpoint: str, extra_env: dict[str, str]):
        self.work = work
        self.port, self.admin_port = free_port(), free_port()
        keys = work / f"keys-{self.port}.toml"
        keys.write_text(f'[[keys]]\nid = "{KEY_ID}"\nsha256 = "{hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}"\n')
        config = work / f"gateway-{self.port}.toml"
        config.write_text(
            f'[server]\nlisten = "127.0.0.1:{self.port}"\nadmin_listen = "127.0.0.1:{self.admin_port}"\n'
            f'[[routes]]\nmodel = "{MODEL}"\nupstream_url = "ws://127.0.0.1:{sim_port}/v1/realtime"\n'
            'api_key_env = "OTEL_CHECK_UPSTREAM_KEY"\n'
            f'[[routes]]\nmodel = "{TRANSLATE}"\nendpoint = "translations"\n'
            f'upstream_url = "ws://127.0.0.1:{sim_port}/v1/realtime/translations"\n'
            'api_key_env = "OTEL_CHECK_UPSTREAM_KEY"\n'
            f'[pool]\nsize = 1\n[keys]\nfile = "{keys}"\n[metering]\nflush_secs = 0\n'
            f'[[prices]]\nmodel = "{MODEL}"\ntext_input = 4.0\ncached_text_input = 0.4\naudio_input = 32.0\n'
            "cached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n"
            f'[[prices]]\nmodel = "{TRANSLATE}"\nusd_per_minute = 0.034\n'
            f'[telemetry]\nendpoint = "{endpoint}"\nbatch_delay_ms = 100\nmetrics_interval_ms = 300\n'
        )
        # Response id -> the `conversation_id` its `response.done` named.
        self.conversation_of: dict[str, str | None] = {}
        self.rows_path = work / f"rows-{self.port}.jsonl"
        self.log_path = work / f"gateway-{self.port}.log"
        env = dict(os.environ, OTEL_CHECK_UPSTREAM_KEY=UPSTREAM_KEY, OTEL_SERVICE_NAME="patchbay-otel-check",
                   OTEL_RESOURCE_ATTRIBUTES="deployment.environment=ci")
        for k in [k for k in env if k.startswith("OTEL_EXPORTER_")]:
            del env[k]
        env.update(extra_env)
        self.proc = subprocess.Popen(
            [gateway_binary(), "serve", "--config", str(config)],
            stdout=open(self.rows_path, "wb"),
            stderr=open(self.log_path, "wb"),
            env=env,
        )
        wait_for("the gateway's /readyz", lambda: get(f"http://127.0.0.1:{self.admin_port}/readyz"))

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.rows_path.read_text().splitlines() if line.startswith("{")]

    def metrics(self) -> str:
        return get(f"http://127.0.0.1:{self.admin_port}/metrics").decode()

    def session(self, turns: int, traceparent: str | None = None) -> list[str]:
        """A session of `turns` response turns, closed by the client; the
        type of every event it received."""
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        if traceparent:
            headers["traceparent"] = traceparent
        seen = []
        url = f"ws://127.0.0.1:{self.port}/v1/realtime?model={MODEL}"
        with ws_connect(url, additional_headers=headers, open_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
            for _ in range(turns):
                ws.send(json.dumps({"type": "response.create"}))
                while True:
                    event = json.loads(ws.recv(timeout=10))
                    seen.append(event["type"])
                    assert event["type"] != "error", event
                    if event["type"] == "response.done":
                        response = event["response"]
                        self.conversation_of[response["id"]] = response.get("conversation_id")
                        break
        return seen

    def translation_session(self) -> None:
        """A translation session: two seconds of audio in, some out."""
        chunk = base64.b64encode(bytes(9600)).decode()  # 200 ms
        url = f"ws://127.0.0.1:{self.port}/v1/realtime/translations?model={TRANSLATE}"
        headers = {"Authorization": f"Bearer {CLIENT_KEY}", "traceparent": TRACEPARENT}
        with ws_connect(url, additional_headers=headers, open_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
            for _ in range(10):
                ws.send(json.dumps({"type": "session.input_audio_buffer.append", "audio": chunk}))
            while json.loads(ws.recv(timeout=10))["type"] != "session.output_audio.delta":
                pass

    def call(self, path: str, body: bytes, content_type: str) -> tuple[int, Any]:
        """POSTs to the calls API with the client key and TRACEPARENT."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": content_type,
                     "traceparent": TRACEPARENT},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def dump(self) -> None:
        print(f"--- gateway log\n{self.log_path.read_text(errors='replace')[-4000:]}")


@pytest.fixture(scope="module")
def sim() -> Iterator[int]:
    port = free_port()
    with tempfile.TemporaryFile() as log:
        # Calls: the simulated caller speaks two turns on each sideband.
        argv = [gateway_binary(), "sim", "--listen", f"127.0.0.1:{port}", "--caller-turns", "2",
                "--caller-turn-interval-ms", "100"]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for("the simulator", lambda: socket.create_connection(("127.0.0.1", port), timeout=1))
            yield port
        finally:
            proc.terminate()
            proc.wait(timeout=15)


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="patchbay-otel-") as tmp:
        yield Path(tmp)


def attrs(kvs) -> dict[str, Any]:
    """OTLP attributes as a plain dict (arrays as lists)."""
    out = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        if which == "array_value":
            out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in kv.value.array_value.values]
        else:
            out[kv.key] = getattr(kv.value, which)
    return out


# ---- the tests ---------------------------------------------------------------


def test_turn_spans_events_and_metrics_reach_the_collector_and_match_the_rows(sim, work):
    received = Received()
    server = receiver(received)
    gw = Gateway(work, sim, f"http://127.0.0.1:{server.server_port}", {})
    try:
        check_turns_events_and_metrics(gw, received)
    except BaseException:
        gw.dump()
        raise
    finally:
        gw.stop()
        server.shutdown()
    assert received.content_types == {"application/x-protobuf"}


def check_turns_events_and_metrics(gw: Gateway, received: Received) -> None:
    """Runs three turns through `gw` (two sessions, one with a client
    `traceparent`) and checks what `received` decoded against the rows:
    the spans, their usage, the session events and the metrics. Shared by
    the OTLP/gRPC test."""
    gw.session(turns=2, traceparent=TRACEPARENT)
    gw.session(turns=1)
    rows = wait_for("three rows", lambda: len(gw.rows()) >= 3 and gw.rows())
    spans = wait_for("three spans", lambda: len(received.spans()) >= 3 and received.spans())
    records = wait_for("four session events", lambda: len(received.log_records()) >= 4 and received.log_records())
    metrics = wait_for(
        "the token usage of three turns",
        lambda: (m := received.last_metrics()).get("gen_ai.client.token.usage")
        and sum(p.count for p in m["gen_ai.client.token.usage"].histogram.data_points) == 6
        and m,
    )

    assert len(rows) == 3 and len(spans) == 3, (rows, spans)
    by_request = {r["request_id"]: r for r in rows}

    # The resource: the standard variables' service name and attributes.
    resource = attrs(spans[0][0].attributes)
    assert resource["service.name"] == "patchbay-otel-check"
    assert resource["deployment.environment"] == "ci"

    traced, untraced = [], []
    for _, span in spans:
        a = attrs(span.attributes)
        assert span.name == f"realtime_inference {MODEL}"
        assert span.kind == trace_pb2.Span.SPAN_KIND_CLIENT
        assert a["gen_ai.operation.name"] == "realtime_inference"
        assert a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == MODEL
        assert a["gen_ai.response.finish_reasons"] == ["completed"]
        row = by_request[a["patchbay.request_id"]]
        assert a["gen_ai.realtime_session.id"] == row["session_id"]
        assert a["gen_ai.response.id"].startswith("resp_")
        # The conversation the client was told of, in the same turn's done.
        assert a["gen_ai.conversation.id"] == gw.conversation_of[a["gen_ai.response.id"]]
        assert a["gen_ai.conversation.id"].startswith("conv_")
        for attribute, field in USAGE_ATTRIBUTES.items():
            assert a[attribute] == row[field], (attribute, a[attribute], row[field])
        assert sum(a[k] for k in CACHED_BY_MODALITY) == row["input_cached_tokens"]
        assert a["patchbay.cost_usd"] == pytest.approx(row["cost_usd"], rel=1e-12)
        assert row["cost_usd"] > 0
        assert a["patchbay.ttft_ms"] == row["ttft_ms"]
        assert a["patchbay.status"] == row["status"] == 200
        assert a["patchbay.key_id"] == KEY_ID
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
        assert [e.name for e in span.events] == ["gen_ai.first_token"]
        (traced if span.trace_id.hex() == TRACE_ID else untraced).append((span, row))

    assert len({attrs(s.attributes)["gen_ai.response.id"] for _, s in spans}) == 3
    # The session with a traceparent: both turns children of the client's span.
    assert len(traced) == 2 and len(untraced) == 1
    for span, _ in traced:
        assert span.parent_span_id.hex() == CLIENT_SPAN_ID
    assert traced[0][1]["session_id"] == traced[1][1]["session_id"]
    # One conversation per session: the same for both turns of the first,
    # another for the second session.
    conversation = {attrs(s.attributes)["gen_ai.conversation.id"] for s, _ in traced}
    assert len(conversation) == 1
    assert attrs(untraced[0][0].attributes)["gen_ai.conversation.id"] not in conversation
    assert {s.span_id for s, _ in traced} != {traced[0][0].span_id}
    # The other session: a trace of its own, no parent.
    assert untraced[0][0].parent_span_id == b""
    assert untraced[0][0].trace_id.hex() != TRACE_ID
    # The second turn of a session reads cached audio (the simulator's), so
    # a cache attribute that is not zero was compared.
    assert any(r["input_cached_tokens"] > 0 for r in rows)

    # The session events: started and ended for each, in the session's trace.
    events = [(r.event_name, attrs(r.attributes), r) for r in records]
    started = [e for e in events if e[0] == "gen_ai.client.realtime_session.started"]
    ended = [e for e in events if e[0] == "gen_ai.client.realtime_session.ended"]
    assert len(started) == 2 and len(ended) == 2, [e[0] for e in events]
    sessions = {r["session_id"] for r in rows}
    for name, a, rec in started + ended:
        assert a["gen_ai.realtime_session.id"] in sessions
        assert a["gen_ai.request.model"] == MODEL
        assert a["patchbay.route"] == MODEL
        assert a["patchbay.transport"] == "websocket"
        assert a["patchbay.key_id"] == KEY_ID
        assert CLIENT_KEY not in repr(rec)
        assert rec.time_unix_nano > 0
    for _, a, rec in ended:
        assert a["patchbay.outcome"] == "client_closed"
        assert a["patchbay.client_close_code"] == 1000
    traced_session = traced[0][1]["session_id"]
    for _, a, rec in started + ended:
        if a["gen_ai.realtime_session.id"] == traced_session:
            assert rec.trace_id.hex() == TRACE_ID
            assert rec.span_id.hex() == CLIENT_SPAN_ID

    # The metrics: every turn's input and output tokens, by token type.
    usage = metrics["gen_ai.client.token.usage"]
    assert usage.unit == "{token}"
    sums = {attrs(p.attributes)["gen_ai.token.type"]: p.sum for p in usage.histogram.data_points}
    assert sums == {
        "input": sum(r["input_tokens"] for r in rows),
        "output": sum(r["output_tokens"] for r in rows),
    }
    duration = metrics["gen_ai.client.operation.duration"]
    assert sum(p.count for p in duration.histogram.data_points) == 3
    check_inference_usage_metrics(metrics, rows, [attrs(s.attributes) for _, s in spans])


def total(rows: list[dict[str, Any]], field: str) -> int:
    return sum(r[field] for r in rows)


def check_inference_usage_metrics(metrics: dict[str, Any], rows: list[dict[str, Any]],
                                  spans: list[dict[str, Any]]) -> None:
    """The inference usage metrics of the conventions
    (`gen-ai-inference-usage-metrics.md`) against the rows (and the spans,
    for cached tokens by modality, which the rows only sum)."""
    for direction in ("input", "output"):
        # Per-turn histograms, deliberately not by modality.
        h = metrics[f"gen_ai.client.inference.usage.{direction}_tokens"]
        assert h.unit == "{token}"
        points = h.histogram.data_points
        assert sum(p.count for p in points) == len(rows)
        assert sum(p.sum for p in points) == total(rows, f"{direction}_tokens")
        for p in points:
            a = attrs(p.attributes)
            assert a["gen_ai.operation.name"] == "realtime_inference"
            assert a["gen_ai.request.model"] == MODEL
            assert "gen_ai.token.modality" not in a and "gen_ai.token.type" not in a

    def by_modality(name: str) -> dict[str, int]:
        m = metrics[name]
        assert m.unit == "{token}"
        assert m.WhichOneof("data") == "sum"
        assert m.sum.is_monotonic
        assert m.sum.aggregation_temporality == 2  # CUMULATIVE
        out: dict[str, int] = {}
        for p in m.sum.data_points:
            a = attrs(p.attributes)
            assert a["gen_ai.request.model"] == MODEL and a["gen_ai.provider.name"] == "openai"
            out[a["gen_ai.token.modality"]] = p.as_int
        return out

    detailed = "gen_ai.client.inference.usage.detailed"
    # The rows break every token down by modality: nothing is unknown.
    assert by_modality(f"{detailed}.input_tokens") == {
        "text": total(rows, "input_text_tokens"),
        "audio": total(rows, "input_audio_tokens"),
        "image": total(rows, "input_image_tokens"),
    }
    assert sum(by_modality(f"{detailed}.input_tokens").values()) == total(rows, "input_tokens")
    assert by_modality(f"{detailed}.output_tokens") == {
        "text": total(rows, "output_text_tokens"),
        "audio": total(rows, "output_audio_tokens"),
    }
    assert sum(by_modality(f"{detailed}.output_tokens").values()) == total(rows, "output_tokens")
    cached = by_modality(f"{detailed}.cache_read.input_tokens")
    assert cached == {m: sum(s[f"gen_ai.usage.{m}.cache_read.input_tokens"] for s in spans)
                      for m in ("text", "audio", "image")}
    assert sum(cached.values()) == total(rows, "input_cached_tokens") > 0


def dropped(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("patchbay_telemetry_dropped_total{")
    )


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.parametrize("down", ["refusing", "silent"])
def test_with_the_collector_down_sessions_run_unchanged_and_drops_are_counted(sim, work, down, protocol):
    # "refusing": nothing listens on the port; "silent": a socket that
    # accepts connections and never answers (a hung collector).
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    port = silent.getsockname()[1] if down == "silent" else free_port()
    gw = Gateway(work, sim, f"http://127.0.0.1:{port}",
                 {"PATCHBAY_TELEMETRY_QUEUE_SIZE": "4", "PATCHBAY_TELEMETRY_EXPORT_TIMEOUT_MS": "3000",
                  "OTEL_EXPORTER_OTLP_PROTOCOL": protocol})
    try:
        assert "patchbay_telemetry_dropped_total" in gw.metrics()
        assert dropped(gw.metrics()) == 0
        for _ in range(3):
            seen = gw.session(turns=3)
            assert seen.count("response.done") == 3
        rows = wait_for("nine rows", lambda: len(gw.rows()) >= 9 and gw.rows())
        assert all(r["status"] == 200 and not r["usage_unknown"] for r in rows)
        wait_for("dropped telemetry counted", lambda: dropped(gw.metrics()) > 0)
    except BaseException:
        gw.dump()
        raise
    finally:
        gw.stop()
        silent.close()


def test_a_translation_session_has_its_events_and_no_inference_span(sim, work):
    received = Received()
    server = receiver(received)
    gw = Gateway(work, sim, f"http://127.0.0.1:{server.server_port}", {})
    try:
        gw.translation_session()
        rows = wait_for("a translation row", lambda: [r for r in gw.rows() if r["model"] == TRANSLATE])
        ended = wait_for(
            "the translation session's ended event",
            lambda: [r for r in received.log_records() if r.event_name == "gen_ai.client.realtime_session.ended"],
        )
        # A Realtime session afterwards: its span arriving shows the
        # exporter had sent everything before it.
        gw.session(turns=1)
        spans = wait_for("the Realtime session's span", received.spans)
    except BaseException:
        gw.dump()
        raise
    finally:
        gw.stop()
        server.shutdown()
    session = rows[0]["session_id"]
    a = attrs(ended[0].attributes)
    assert a["gen_ai.realtime_session.id"] == session
    assert a["gen_ai.request.model"] == TRANSLATE
    assert ended[0].trace_id.hex() == TRACE_ID
    assert all(attrs(s.attributes)["gen_ai.realtime_session.id"] != session for _, s in spans)
    assert all(attrs(s.attributes)["gen_ai.request.model"] == MODEL for _, s in spans)


OFFER = (
    "v=0\r\no=- 4611731400430051336 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=ice-ufrag:abcd\r\n"
    "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\na=setup:actpass\r\na=mid:0\r\na=sendrecv\r\n"
    "a=rtpmap:111 opus/48000/2\r\n"
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\n"
)


def test_a_call_created_with_a_traceparent_has_its_turns_in_the_clients_trace(sim, work):
    received = Received()
    server = receiver(received)
    gw = Gateway(work, sim, f"http://127.0.0.1:{server.server_port}", {})
    try:
        status, headers = gw.call(f"/v1/realtime/calls?model={MODEL}", OFFER.encode(), "application/sdp")
        assert status == 201
        call_id = headers["Location"].rsplit("/", 1)[1]
        spans = wait_for("the caller's two turns", lambda: len(received.spans()) >= 2 and received.spans())
        gw.call(f"/v1/realtime/calls/{call_id}/hangup", b"", "application/json")
        ended = wait_for(
            "the call's ended event",
            lambda: [r for r in received.log_records() if r.event_name == "gen_ai.client.realtime_session.ended"],
        )
        rows = wait_for("the call's rows", lambda: len(gw.rows()) >= 2 and gw.rows())
    except BaseException:
        gw.dump()
        raise
    finally:
        gw.stop()
        server.shutdown()
    by_request = {r["request_id"]: r for r in rows}
    for _, span in spans:
        a = attrs(span.attributes)
        assert span.trace_id.hex() == TRACE_ID
        assert span.parent_span_id.hex() == CLIENT_SPAN_ID
        assert a["patchbay.transport"] == "webrtc"
        assert a["gen_ai.conversation.id"].startswith("conv_")
        row = by_request[a["patchbay.request_id"]]
        assert row["call_id"] == call_id
        for attribute, field in USAGE_ATTRIBUTES.items():
            assert a[attribute] == row[field], (attribute, a[attribute], row[field])
    a = attrs(ended[0].attributes)
    assert a["patchbay.transport"] == "webrtc"
    # The hangup, or the upstream closing the call's sideband first.
    assert a["patchbay.outcome"] in ("client_hangup", "call_ended")
    assert ended[0].trace_id.hex() == TRACE_ID
