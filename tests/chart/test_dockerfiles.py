"""The images' contract, read from the Dockerfiles (no docker engine needed).

What the chart and the operator rely on: the binary is the ENTRYPOINT (the
chart passes only `args`), it runs as uid 65532 (the chart sets
runAsNonRoot), and the build is the workspace's locked release build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

IMAGES = {
    # package: (default CMD, exposed ports)
    "gateway": (["serve"], {"8080", "9090"}),
    "operator": (["run"], {"8080"}),
}


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(i.split(None, 1)[0].upper(), i.split(None, 1)[1]) for i in logical]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_is_a_multi_stage_locked_release_build_of_its_package(name):
    steps = instructions(REPO / "docker" / f"{name}.Dockerfile")
    stages = [args for op, args in steps if op == "FROM"]
    assert len(stages) == 2
    assert stages[0].endswith(" AS build")
    build = " ".join(args for op, args in steps if op == "RUN")
    assert f"cargo build --release --locked -p patchbay-{name}" in build


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_runtime_stage_is_distroless_non_root_with_the_binary_as_entrypoint(name):
    cmd, ports = IMAGES[name]
    steps = instructions(REPO / "docker" / f"{name}.Dockerfile")
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    runtime = steps[last_from:]
    assert re.fullmatch(r"gcr\.io/distroless/cc-debian\d+:nonroot", runtime[0][1])
    final = {op: args for op, args in runtime}
    assert final["USER"] == "65532:65532"
    binary = f"/usr/local/bin/patchbay-{name}"
    assert final["COPY"] == f"--from=build /out/patchbay-{name} {binary}"
    assert json.loads(final["ENTRYPOINT"]) == [binary]
    assert json.loads(final["CMD"]) == cmd
    assert set(final["EXPOSE"].split()) == ports


def image_env(name: str) -> dict[str, str]:
    """The runtime stage's ENV, as `KEY=value` pairs (one or several per instruction)."""
    steps = instructions(REPO / "docker" / f"{name}.Dockerfile")
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    env = {}
    for op, args in steps[last_from:]:
        if op == "ENV":
            env.update(pair.split("=", 1) for pair in args.split())
    return env


def test_gateway_image_listens_on_every_interface_at_its_exposed_ports():
    # The gateway's defaults are 127.0.0.1:8080 and 127.0.0.1:9090 (its config tests say so);
    # in a container a published port reaches only a listener on the container's interfaces.
    env = image_env("gateway")
    _, ports = IMAGES["gateway"]
    listeners = {env["PATCHBAY_SERVER_LISTEN"], env["PATCHBAY_SERVER_ADMIN_LISTEN"]}
    assert listeners == {f"0.0.0.0:{port}" for port in ports}


def test_build_context_leaves_out_target_and_git():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", "target"} <= ignored
