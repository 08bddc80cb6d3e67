#!/usr/bin/env python3
"""A stand-in OTLP/HTTP collector for the benchmarks' `cpu-otel` stage: it
reads every POST (`/v1/traces`, `/v1/logs`, `/v1/metrics`) to its end and
answers 200 with an empty protobuf body, which is what a collector answers
to a full success. It decodes nothing (its own CPU is not in the figures);
it counts requests and bytes, printed when it stops.

Usage: otlp_sink.py PORT (listens on 127.0.0.1).
"""

from __future__ import annotations

import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts: dict[str, list[int]] = {}


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        c = counts.setdefault(self.path, [0, 0])
        c[0] += 1
        c[1] += n
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)

    def stop(*_: object) -> None:
        for path, (requests, size) in sorted(counts.items()):
            print(f"{path}: {requests} requests, {size} bytes", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
