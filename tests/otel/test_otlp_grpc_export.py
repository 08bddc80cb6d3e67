"""The gateway's OpenTelemetry export over OTLP/gRPC, received by a real
gRPC server built from the official service stubs
(`opentelemetry.proto.collector.*.v1.*_service_pb2_grpc`, on grpcio).

The gateway and the simulator are those of test_otlp_export.py, with
`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`:

- the same spans, session events and metrics arrive through the three
  `Export` methods as over HTTP, checked by the same assertions, and
  `OTEL_EXPORTER_OTLP_HEADERS` arrive as call metadata;
- a signal can be sent over gRPC while the others go over HTTP
  (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`);
- a receiver that answers every call with an error status (UNAVAILABLE)
  gets each batch counted as dropped (`reason="export_failed"`), and the
  sessions run unchanged.

Everything started here listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import re
import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

# The HTTP test's gateway, sessions and checks (and its fixtures, by name).
from test_otlp_export import (  # noqa: F401 (sim and work are fixtures)
    MODEL,
    Gateway,
    Received,
    check_turns_events_and_metrics,
    receiver,
    sim,
    wait_for,
    work,
)

COLLECTOR_TOKEN = "Bearer collector-token"


class GrpcReceiver:
    """A gRPC OTLP receiver on a free loopback port: the three services,
    decoding into `received`, or failing every call with `fail` (a status
    code) when it is set."""

    def __init__(self, received: Received, fail: grpc.StatusCode | None = None):
        self.received = received
        self.fail = fail
        self.calls: list[str] = []
        self.metadata: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        outer = self

        def export(method: str, into: list, request: Any, context: grpc.ServicerContext, answer: Any) -> Any:
            with outer.lock:
                outer.calls.append(method)
                outer.metadata.append(dict(context.invocation_metadata()))
            if outer.fail is not None:
                context.abort(outer.fail, "collector overloaded: try later")
            with received.lock:
                into.append(request)
            return answer

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 (the service's name)
                return export("traces", received.traces, request, context,
                              trace_service_pb2.ExportTraceServiceResponse())

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                return export("logs", received.logs, request, context,
                              logs_service_pb2.ExportLogsServiceResponse())

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                return export("metrics", received.metrics, request, context,
                              metrics_service_pb2.ExportMetricsServiceResponse())

        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None)


def grpc_env(**extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20collector-token", **extra}


def dropped_failed(metrics: str) -> dict[str, float]:
    """`patchbay_telemetry_dropped_total{reason="export_failed"}` by signal."""
    out = {}
    for m in re.finditer(r'^patchbay_telemetry_dropped_total\{([^}]*)\} (\S+)$', metrics, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels["reason"] == "export_failed":
            out[labels["signal"]] = float(m.group(2))
    return out


def test_turn_spans_events_and_metrics_reach_a_grpc_collector_and_match_the_rows(sim, work):
    received = Received()
    collector = GrpcReceiver(received)
    gw = Gateway(work, sim, collector.endpoint, grpc_env())
    try:
        check_turns_events_and_metrics(gw, received)
        assert sum(dropped_failed(gw.metrics()).values()) == 0
    except BaseException:
        gw.dump()
        raise
    finally:
        gw.stop()
        collector.stop()
    assert set(collector.calls) == {"traces", "logs", "metrics"}
    assert all(md.get("authorization") == COLLECTOR_TOKEN for md in collector.metadata)


def test_traces_can_go_over_grpc_while_the_other_signals_go_over_http(sim, work):
    over_grpc, over_http = Received(), Received()
    collector = GrpcReceiver(over_grpc)
    server = receiver(over_http)
    gw = Gateway(work, sim, f"http://127.0.0.1:{server.server_port}", {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
    })
    try:
        gw.session(turns=1)
        spans = wait_for("the turn's span over gRPC", over_grpc.spans)
        wait_for("the session's events over HTTP", lambda: len(over_http.log_records()) >= 2)
    except BaseException:
        gw.dump()
        raise
    finally:
        gw.stop()
        collector.stop()
        server.shutdown()
    assert spans[0][1].name == f"realtime_inference {MODEL}"
    assert over_http.spans() == [] and over_grpc.log_records() == []
    assert set(collector.calls) == {"traces"}


def test_a_grpc_error_status_drops_the_batch_and_counts_it(sim, work):
    received = Received()
    collector = GrpcReceiver(received, fail=grpc.StatusCode.UNAVAILABLE)
    gw = Gateway(work, sim, collector.endpoint, grpc_env())
    try:
        assert sum(dropped_failed(gw.metrics()).values()) == 0
        for _ in range(2):
            assert gw.session(turns=2).count("response.done") == 2
        rows = wait_for("four rows", lambda: len(gw.rows()) >= 4 and gw.rows())
        assert all(r["status"] == 200 and not r["usage_unknown"] for r in rows)
        # Four spans and four session events were refused: all counted.
        counted = wait_for(
            "the refused spans and events counted as dropped",
            lambda: (d := dropped_failed(gw.metrics())).get("traces", 0) >= 4
            and d.get("logs", 0) >= 4 and d,
        )
    except BaseException:
        gw.dump()
        raise
    finally:
        gw.stop()
        collector.stop()
    # The calls reached the receiver: the status, not the connection, failed them.
    assert {"traces", "logs"} <= set(collector.calls)
    assert received.spans() == [] and received.log_records() == []
    assert counted["traces"] == 4 and counted["logs"] == 4, counted
    assert "grpc-status 14 (UNAVAILABLE): collector overloaded: try later" in gw.log_path.read_text()
