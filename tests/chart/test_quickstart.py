"""The quickstart agrees with itself: the example route, the Secrets the docs
and the chart's NOTES tell you to create, the placeholder Secrets in
examples/secrets.yaml, and the namespace the operator is installed in.

A route with more than one gateway pod must share a store and a signing key
(a limit would otherwise count per pod, a client secret minted on one pod be
refused by another), and the quickstart's must autoscale on what a bare
cluster serves (CPU through metrics-server): these are checked on the files
as written, since every command below copies them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from helm_python.chart import Chart

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
QUICKSTART = EXAMPLES / "realtimeroute.yaml"
# Where a reader is told which Secrets to create for the quickstart route.
GUIDES = {
    "README.md": (REPO / "README.md").read_text(),
    "docs/kubernetes.md": (REPO / "docs" / "kubernetes.md").read_text(),
}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def route(path: Path) -> dict[str, Any]:
    (found,) = [d for d in documents(path) if d["kind"] == "RealtimeRoute"]
    return found


def secret_keys(node: Any) -> Iterator[tuple[str, str]]:
    """(Secret, key) for every `*SecretRef` under `node` (`key` or `keys`)."""
    if isinstance(node, dict):
        for field, value in node.items():
            if field.endswith("SecretRef"):
                for key in [value.get("key")] + value.get("keys", []):
                    if key:
                        yield value["name"], key
            else:
                yield from secret_keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from secret_keys(item)


def quickstart_secrets() -> set[tuple[str, str]]:
    return set(secret_keys(route(QUICKSTART)["spec"]))


def created(text: str, name: str, key: str) -> bool:
    """Does `text` tell the reader to `kubectl create` Secret `name` with `key`?"""
    pattern = (
        rf"kubectl create secret generic {re.escape(name)} "
        rf"--from-(literal={re.escape(key)}=|file={re.escape(key)}\b)"
    )
    return re.search(pattern, text) is not None


@pytest.fixture(scope="module")
def notes() -> str:
    with Chart.load(REPO / "charts" / "patchbay") as chart:
        manifests = chart.render(values=None, name="patchbay", namespace="patchbay-system")
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def test_the_quickstart_route_reads_four_secrets():
    assert quickstart_secrets() == {
        ("openai", "api-key"),
        ("voice-keys", "keys.toml"),
        ("redis", "url"),
        ("voice-signing", "current"),
    }


@pytest.mark.parametrize("guide", sorted(GUIDES))
def test_each_guide_creates_every_secret_the_quickstart_route_reads(guide):
    missing = [s for s in sorted(quickstart_secrets()) if not created(GUIDES[guide], *s)]
    assert not missing, f"{guide} never creates {missing}"


def test_the_charts_notes_create_every_secret_the_quickstart_route_reads(notes):
    missing = [s for s in sorted(quickstart_secrets()) if not created(notes, *s)]
    assert not missing, f"NOTES.txt never creates {missing}"
    assert "kubectl apply -f examples/realtimeroute.yaml" in notes


def test_the_placeholder_secrets_hold_every_key_an_example_reads():
    held = {
        (d["metadata"]["name"], key)
        for d in documents(EXAMPLES / "secrets.yaml")
        if d["kind"] == "Secret"
        for key in d.get("stringData", {})
    }
    for example in ("realtimeroute.yaml", "realtimeroute-minimal.yaml"):
        missing = set(secret_keys(route(EXAMPLES / example)["spec"])) - held
        assert not missing, f"examples/secrets.yaml lacks {missing} for {example}"
    signing = next(d for d in documents(EXAMPLES / "secrets.yaml")
                   if d["metadata"]["name"] == "voice-signing")
    assert len(signing["stringData"]["current"].encode()) >= 32, "the gateway wants >= 32 bytes"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("realtimeroute*.yaml")))
def test_an_example_with_more_than_one_pod_shares_a_store_and_a_signing_key(example):
    spec = route(EXAMPLES / example)["spec"]
    replicas = spec.get("replicas", {})
    most = max(replicas.get("min", 1), replicas.get("max", replicas.get("min", 1)))
    if most > 1:
        assert spec.get("metering", {}).get("redisUrlSecretRef"), example
        assert spec.get("clientSecrets", {}).get("signingKeysSecretRef"), example


def test_the_quickstart_autoscales_on_what_a_bare_cluster_serves():
    # The sessions target needs a custom-metrics adapter; without one the HPA never scales down.
    autoscaling = route(QUICKSTART)["spec"].get("autoscaling", {})
    assert "targetActiveSessionsPerPod" not in autoscaling
    assert autoscaling.get("targetCPUUtilizationPercentage")


def test_every_guide_installs_the_operator_in_one_namespace():
    installs = {
        guide: re.findall(r"helm install patchbay charts/patchbay(.*)", text)
        for guide, text in GUIDES.items()
    }
    namespaces = set()
    for guide, lines in installs.items():
        assert lines, f"{guide} has no helm install"
        for line in lines:
            found = re.search(r"(?:--namespace|-n)[ =](\S+)", line)
            assert found, f"{guide}: helm install without a namespace: {line!r}"
            namespaces.add(found.group(1))
    assert namespaces == {"patchbay-system"}


def test_nothing_says_the_operator_checks_that_secrets_exist():
    # It has no access to Secrets; the gateway pods mount them.
    texts = dict(GUIDES)
    texts["docs/operator.md"] = (REPO / "docs" / "operator.md").read_text()
    for path in EXAMPLES.glob("*.yaml"):
        texts[f"examples/{path.name}"] = path.read_text()
    for name, text in texts.items():
        assert not re.search(r"operator (only )?checks that the Secrets exist", text), name
