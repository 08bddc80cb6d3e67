"""The dashboard and the alert rules of the chart, on a real Prometheus.

- `promtool check rules` on the rule file, and `promtool test rules` on
  patchbay-alerts.test.yaml, which must test every alert firing.
- A real `prometheus` (Debian's package) on a free 127.0.0.1 port scrapes a
  real gateway (`patchbay-gateway serve`, the binary in
  $PATCHBAY_GATEWAY_BIN, else target/debug/patchbay-gateway) in front of
  the built-in simulator, every second, while the test drives sessions
  through it. Then every expression of every dashboard panel is evaluated
  through Prometheus's HTTP API (template variables as `.*`,
  `$__rate_interval` as 1m, `$__range` as 5m): each must evaluate without
  an error and return at least one series. Every `patchbay_*` family named
  by a panel or an alert must be one the gateway exports (its `# TYPE`
  lines), so a misspelt family fails even behind `or vector(0)`.

Needs `prometheus` and `promtool` on PATH (.ci/run installs the package).
Everything started here listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from websockets.sync.client import connect as ws_connect

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "charts" / "patchbay" / "files"
DASHBOARD = FILES / "grafana" / "patchbay-dashboard.json"
ALERTS = FILES / "prometheus" / "patchbay-alerts.yaml"
ALERT_TESTS = Path(__file__).resolve().parent / "patchbay-alerts.test.yaml"

MODEL = "gpt-realtime"
CLIENT_KEY = "pb-prometheus-check"
UPSTREAM_KEY = "sk-sim-prometheus-check"
DEADLINE_S = 30
SESSIONS = 6
# Grafana's variables as the test substitutes them.
RATE_INTERVAL = "1m"
RANGE = "5m"
# Series Prometheus or kube-state-metrics provide, not the gateway.
NOT_THE_GATEWAYS = {"up", "kube_pod_status_ready"}


def binary(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not on PATH (Debian: apt-get install prometheus)"
    return path


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
        time.sleep(0.2)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")


# ---- what the files say ---------------------------------------------------


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel, rows' collapsed panels included."""
    out = []
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title / refId, expression) of every query of every panel."""
    return [
        (f"{p['title']} / {t['refId']}", t["expr"])
        for p in dashboard_panels()
        for t in p.get("targets", [])
    ]


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def substitute(expr: str) -> str:
    """Grafana's variables as a query of them would read them: the built-in
    intervals as fixed durations, every template variable as `.*` (all)."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE)
    expr = expr.replace("$__interval", RATE_INTERVAL)
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", ".*", expr)


FAMILY_NAME = re.compile(r"\b(patchbay_[a-z0-9_]+|up|kube_pod_status_ready)\b")


def names_in(expr: str) -> set[str]:
    # Label values (quoted) are not names.
    return set(FAMILY_NAME.findall(re.sub(r'"[^"]*"', '""', expr)))


def exported_names(exposition: str) -> set[str]:
    """Every sample name the gateway's families can have: a counter's
    `_total`, a histogram's `_bucket`/`_count`/`_sum`, from its `# TYPE` line
    (families without a series yet have one too)."""
    names = set()
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        if kind == "counter":
            names.add(family + "_total")
        elif kind == "histogram":
            names.update(family + s for s in ("_bucket", "_count", "_sum"))
        else:
            names.add(family)
    return names


# ---- promtool ---------------------------------------------------------------


def test_alert_rules_pass_promtool_check():
    run = subprocess.run(
        [binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in run.stdout, run.stdout


def test_alert_unit_tests_pass_promtool():
    run = subprocess.run(
        [binary("promtool"), "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not():
    fired, quiet = set(), set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for t in case.get("alert_rule_test", []):
            (fired if t.get("exp_alerts") else quiet).add(t["alertname"])
    alerts = {r["alert"] for r in alert_rules() if "alert" in r}
    assert alerts, "no alerts in the rule file"
    assert alerts - fired == set(), "alerts no unit test fires"
    assert alerts - quiet == set(), "alerts no unit test shows quiet"
    assert (fired | quiet) - alerts == set(), "unit tests of alerts the rule file does not have"


def test_the_unit_tests_read_the_charts_rule_file():
    files = yaml.safe_load(ALERT_TESTS.read_text())["rule_files"]
    assert [(ALERT_TESTS.parent / f).resolve() for f in files] == [ALERTS.resolve()]


# ---- a real Prometheus scraping a real gateway ------------------------------


def gateway_binary() -> str:
    path = Path(os.environ.get("PATCHBAY_GATEWAY_BIN", REPO / "target" / "debug" / "patchbay-gateway"))
    assert path.is_file(), f"{path} is missing: cargo build -p patchbay-gateway (or set PATCHBAY_GATEWAY_BIN)"
    return str(path)


class Stack:
    def __init__(self, work: Path):
        self.work = work
        self.procs: list[subprocess.Popen] = []
        self.sim_port, self.gw_port, self.admin_port, self.prom_port = (free_port() for _ in range(4))

    def start(self, argv: list[str], log: str, **kw) -> None:
        out = open(self.work / log, "wb")
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **kw))

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def query(self, expr: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            return json.loads(get(url, timeout=10))
        except urllib.error.HTTPError as e:  # 400/422: a bad expression
            return json.loads(e.read())

    def metrics(self) -> str:
        return get(f"http://127.0.0.1:{self.admin_port}/metrics").decode()


def gateway_config(stack: Stack) -> str:
    keys = stack.work / "keys.toml"
    keys.write_text(
        f'[[keys]]\nid = "prometheus-check"\nsha256 = "{hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}"\n'
    )
    upstream = f"ws://127.0.0.1:{stack.sim_port}/v1/realtime"
    # Two upstreams, so that the failover families have their series too.
    return (
        f'[server]\nlisten = "127.0.0.1:{stack.gw_port}"\nadmin_listen = "127.0.0.1:{stack.admin_port}"\n'
        f'[[routes]]\nmodel = "{MODEL}"\n'
        f'[[routes.upstreams]]\nname = "sim-a"\nupstream_url = "{upstream}"\napi_key_env = "PROM_UPSTREAM_KEY"\npriority = 0\n'
        f'[[routes.upstreams]]\nname = "sim-b"\nupstream_url = "{upstream}"\napi_key_env = "PROM_UPSTREAM_KEY"\npriority = 1\n'
        f'[pool]\nsize = 2\n[keys]\nfile = "{keys}"\n[metering]\nflush_secs = 0\n'
        f'[[prices]]\nmodel = "{MODEL}"\ntext_input = 4.0\ncached_text_input = 0.4\naudio_input = 32.0\n'
        "cached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n"
    )


def prometheus_config(stack: Stack) -> str:
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "patchbay", "static_configs": [{"targets": [f"127.0.0.1:{stack.admin_port}"]}]}
            ],
        }
    )


def one_session(stack: Stack, key: str = CLIENT_KEY) -> None:
    url = f"ws://127.0.0.1:{stack.gw_port}/v1/realtime?model={MODEL}"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(json.dumps({"type": "response.create"}))
        while True:
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                return


def refused_session(stack: Stack) -> None:
    try:
        one_session(stack, key="pb-not-a-key")
    except Exception as e:  # the upgrade is answered 401
        assert "401" in str(e), repr(e)
        return
    raise AssertionError("a wrong key was accepted")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="patchbay-prom-") as tmp:
        s = Stack(Path(tmp))
        gw = gateway_binary()
        (s.work / "gateway.toml").write_text(gateway_config(s))
        (s.work / "prometheus.yml").write_text(prometheus_config(s))
        try:
            s.start([gw, "sim", "--listen", f"127.0.0.1:{s.sim_port}"], "sim.log")
            s.start(
                [gw, "serve", "--config", str(s.work / "gateway.toml")],
                "gateway.log",
                env=dict(os.environ, PROM_UPSTREAM_KEY=UPSTREAM_KEY),
            )
            s.start(
                [
                    binary("prometheus"),
                    f"--config.file={s.work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={s.work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{s.prom_port}",
                ],
                "prometheus.log",
            )
            wait_for("the gateway's /readyz", lambda: get(f"http://127.0.0.1:{s.admin_port}/readyz"))
            wait_for("prometheus's /-/ready", lambda: get(f"http://127.0.0.1:{s.prom_port}/-/ready"))
            # Its first scrape comes a few seconds after ready (target
            # updates are throttled): traffic before it would be no rate.
            wait_for("a first scrape", lambda: s.query('up{job="patchbay"} == 1')["data"]["result"])
            # Traffic spread over a few scrapes: sessions with a turn each,
            # and refusals (two: a refusal's series appears at its first
            # count, which rate() cannot see).
            for i in range(SESSIONS):
                one_session(s)
                if i in (0, SESSIONS - 1):
                    refused_session(s)
                time.sleep(0.5)
            yield s
        except BaseException:
            for log in ("sim.log", "gateway.log", "prometheus.log"):
                path = s.work / log
                if path.exists():
                    print(f"--- {log}\n{path.read_text(errors='replace')[-4000:]}")
            raise
        finally:
            s.stop()


def empty_or_failing(stack: Stack, exprs: list[tuple[str, str]]) -> dict[str, str]:
    """The expressions that do not (yet) return a series, with why."""
    bad = {}
    for name, expr in exprs:
        answer = stack.query(substitute(expr))
        if answer.get("status") != "success":
            bad[name] = f"error: {answer.get('error')} in {expr}"
        elif not answer["data"]["result"]:
            bad[name] = f"no series: {expr}"
    return bad


def test_prometheus_scrapes_the_gateway_and_the_traffic_is_there(stack):
    answer = wait_for(
        "turns in Prometheus",
        lambda: stack.query(f'sum(patchbay_turns_total{{model="{MODEL}",status="200"}}) >= {SESSIONS}')["data"]["result"],
    )
    assert float(answer[0]["value"][1]) == SESSIONS
    up = stack.query('up{job="patchbay"}')["data"]["result"]
    assert [r["value"][1] for r in up] == ["1"]


def test_every_dashboard_panel_expression_returns_series_on_a_real_prometheus(stack):
    exprs = dashboard_exprs()
    assert len(exprs) > 30, "the dashboard lost its queries"
    # Bounded wait: counters need two scrapes inside a rate()'s window.
    deadline = time.monotonic() + DEADLINE_S
    while (bad := empty_or_failing(stack, exprs)) and time.monotonic() < deadline:
        time.sleep(1)
    assert bad == {}


# Panels that must show the traffic the fixture drove (a number > 0 in at
# least one series), not only a series: a query that is right but reads
# the wrong thing (a rate of a gauge, a ratio upside down) would show 0 or NaN.
SHOW_TRAFFIC = [
    "Turns / s",
    "Spend in the time range",
    "Pool hit ratio",
    "Sessions started / s",
    "Sessions ended / s, by outcome",
    "Session set-up latency",
    "Turns / s, by status",
    "Tokens / s",
    "Spend per route (USD / hour)",
    "Spend per route in the time range",
    "Pool hit ratio by route",
    "Upstream dial latency",
    "Dials / s, by upstream and result",
    "Warm sockets",
    "Admission refusals / s, by reason",
]


def shows_traffic(stack: Stack, panel: dict[str, Any]) -> bool:
    for target in panel["targets"]:
        for series in stack.query(substitute(target["expr"]))["data"]["result"]:
            value = float(series["value"][1])
            if value > 0 and value != float("inf"):
                return True
    return False


def test_the_panels_of_what_the_traffic_did_show_it(stack):
    panels = {p["title"]: p for p in dashboard_panels()}
    assert set(SHOW_TRAFFIC) <= set(panels)
    deadline = time.monotonic() + DEADLINE_S
    while (idle := [t for t in SHOW_TRAFFIC if not shows_traffic(stack, panels[t])]) and time.monotonic() < deadline:
        time.sleep(1)
    assert idle == []


def test_the_check_rejects_an_expression_of_a_family_the_gateway_lacks(stack):
    """The check above is not vacuous: an unknown family has no series, and
    a broken expression is an error."""
    bad = empty_or_failing(
        stack,
        [
            ("unknown", 'sum by (model) (rate(patchbay_time_to_first_token_seconds_count{model=~"$model"}[$__rate_interval]))'),
            ("broken", "sum by (model) (rate(patchbay_turns_total[$__rate_interval])"),
        ],
    )
    assert bad["unknown"].startswith("no series"), bad
    assert bad["broken"].startswith("error"), bad


def test_every_family_the_dashboard_and_alerts_name_is_one_the_gateway_exports(stack):
    exported = exported_names(stack.metrics())
    assert "patchbay_turns_total" in exported and "patchbay_upstream_dial_seconds_bucket" in exported
    named = {n for _, e in dashboard_exprs() for n in names_in(e)}
    named |= {n for r in alert_rules() for n in names_in(r["expr"])}
    assert "patchbay_outbox_dropped_total" in named
    assert named - exported - NOT_THE_GATEWAYS == set()


def test_every_alert_expression_evaluates_on_the_real_prometheus(stack):
    for rule in alert_rules():
        answer = stack.query(rule["expr"])
        assert answer.get("status") == "success", (rule["alert"], answer)
        # A healthy gateway under light traffic fires nothing, except the
        # pool's hit rate while its pool of 2 serves 6 sessions in 3 s.
        if rule["alert"] not in {"PatchbayPoolHitRateLow"}:
            assert answer["data"]["result"] == [], (rule["alert"], answer["data"]["result"])
