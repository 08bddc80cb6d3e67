"""The Helm chart, rendered offline by Helm's own engine.

helm-python-sdk wraps Helm's Go library (the same loader, values coalescing,
values.schema.json validation and template engine as `helm install`), so these
tests need no cluster and no helm binary. They assert on the rendered objects:
what the operator may do (RBAC, exactly), how it is run (image, args, env,
probes, securityContext), and that bad values are refused before anything
reaches a cluster.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_python import HelmValuesError, lint, package
from helm_python.chart import Chart

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "patchbay"
REPO_CRD = REPO / "crds" / "realtimeroute.yaml"
RELEASE = "patchbay"
NAMESPACE = "patchbay-system"
OPERATOR = "patchbay-operator"

# Read, watch and server-side apply (an apply that creates is authorised as a create).
APPLIED = {"get", "list", "watch", "create", "patch"}

# (apiGroup, resource) -> verbs: exactly what the operator's code calls, and nothing more.
OPERATOR_RULES = {
    ("patchbay.dev", "realtimeroutes"): {"list", "watch"},
    ("patchbay.dev", "realtimeroutes/status"): {"patch"},
    ("", "configmaps"): APPLIED,
    ("", "services"): APPLIED,
    ("apps", "deployments"): APPLIED,
    # Deleted when a route stops autoscaling; every other child goes with its route.
    ("autoscaling", "horizontalpodautoscalers"): APPLIED | {"delete"},
    ("policy", "poddisruptionbudgets"): APPLIED,
    # The gateway pods' account and its read access to their pool ConfigMap (by name).
    ("", "serviceaccounts"): {"get", "create", "patch"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "create", "patch"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create", "patch"},
    # spec.expose: the owned HTTPRoute, read by name (no list/watch: the CRDs may be absent),
    # applied, deleted when the route stops asking; its parent Gateways only read.
    ("gateway.networking.k8s.io", "httproutes"): {"get", "create", "patch", "delete"},
    ("gateway.networking.k8s.io", "gateways"): {"get"},
    # Find a route's gateway pods; set their deletion cost (narrowed by the admission policy).
    ("", "pods"): {"list", "patch"},
    # The gateway pods' FailedMount/Failed events, read for Degraded=PodsNotStarting.
    ("", "events"): {"list"},
    ("events.k8s.io", "events"): {"create", "patch"},
}

POLICY = f"{OPERATOR}-pod-deletion-cost"
CLUSTER_SCOPED = {
    "ClusterRole", "ClusterRoleBinding",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}

MANAGED_ENV = {
    "PATCHBAY_GATEWAY_IMAGE",
    "PATCHBAY_WATCH_NAMESPACE",
    "PATCHBAY_OPERATOR_METRICS_LISTEN",
    "PATCHBAY_LOG_FORMAT",
    "PATCHBAY_LEADER_ELECTION",
    "PATCHBAY_LEASE_NAME",
    "POD_NAME",
    "POD_NAMESPACE",
}


@pytest.fixture(scope="module")
def chart() -> Iterator[Chart]:
    with Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def app_version(chart: Chart) -> str:
    return str(chart.metadata["appVersion"])


def render(chart: Chart, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    manifests = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def notes(chart: Chart, values: dict[str, Any] | None = None) -> str:
    manifests = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects)


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """Flatten a role's rules to (apiGroup, resource) -> verbs."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = only(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["operator"]
    return pod["containers"][0]


def env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    entries = container(objects)["env"]
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


# --- what gets installed -----------------------------------------------------


def test_default_install_renders_the_operator_its_identity_rbac_and_metrics_service(chart):
    assert kinds(render(chart)) == [
        ("ClusterRole", OPERATOR),
        ("ClusterRoleBinding", OPERATOR),
        ("Deployment", OPERATOR),
        ("Role", f"{OPERATOR}-leader-election"),
        ("RoleBinding", f"{OPERATOR}-leader-election"),
        ("Service", f"{OPERATOR}-metrics"),
        ("ServiceAccount", OPERATOR),
        ("ValidatingAdmissionPolicy", POLICY),
        ("ValidatingAdmissionPolicyBinding", POLICY),
    ]


def test_namespaced_objects_land_in_the_release_namespace(chart):
    for obj in render(chart):
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]
        else:
            assert "namespace" not in obj["metadata"]


def test_chart_passes_helm_lint_in_strict_mode_with_and_without_options():
    everything = {"watchNamespace": "voice", "serviceMonitor": {"enabled": True, "gateways": True}}
    for values in (None, everything):
        report = lint(CHART_DIR, values, strict=True)
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


# The oldest Kubernetes the chart supports (its kubeVersion: the gateway pods'
# `preStop: sleep` needs 1.30), and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
EVERY_OPTION = {
    "watchNamespace": "voice",
    "serviceMonitor": {"enabled": True, "gateways": True},
    "extraEnv": [{"name": "HTTPS_PROXY", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "url"}}}],
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "imagePullSecrets": [{"name": "regcred"}],
    "podAnnotations": {"example.com/team": "voice"},
    "podLabels": {"example.com/team": "voice"},
}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", [None, EVERY_OPTION], ids=["defaults", "every-option"])
def test_rendered_objects_are_valid_kubernetes_objects_with_no_unknown_fields(chart, values, kube_version):
    objects = [o for o in render(chart, values) if o["apiVersion"] != "monitoring.coreos.com/v1"]
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, kube_version, strict=True)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_crd_is_a_valid_custom_resource_definition(chart, kube_version):
    kubernetes_validate.validate(yaml.safe_load(chart.crds[0]["data"]), kube_version, strict=True)


# Helm's longest release name (53) that does not contain the chart name, so the
# full name is `<release>-patchbay`: 62 characters before any suffix.
LONG_RELEASE = "voice-" + "r" * 47
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(
    ("release", "values"),
    [
        (LONG_RELEASE, EVERY_OPTION),
        (RELEASE, {**EVERY_OPTION, "fullnameOverride": "f" * 63}),
        # Cut at 46 for "-operator-metrics", this one ends in a dash, which goes.
        (RELEASE, {**EVERY_OPTION, "fullnameOverride": "a" * 45 + "-" + "b" * 17}),
    ],
    ids=["longest-release-name", "longest-fullname-override", "cut-at-a-dash"],
)
def test_every_name_fits_a_dns_label_whatever_the_release_name(chart, release, values):
    """A Service's name must be a DNS-1035 label (63 characters); the chart
    keeps every name it makes to that, each suffix whole."""
    manifests = chart.render(values=values, name=release, namespace=NAMESPACE)
    objects = [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Service", "") not in names
    for kind, name in names:
        assert len(name) <= 63 and DNS_LABEL.match(name), f"{kind} {name!r} ({len(name)})"
    service = only(objects, "Service")["metadata"]["name"]
    assert service.endswith("-operator-metrics")
    operator = only(objects, "Deployment")["metadata"]["name"]
    assert operator.endswith("-operator")
    assert only(objects, "ValidatingAdmissionPolicy")["metadata"]["name"].endswith(
        "-operator-pod-deletion-cost"
    )
    # The full name is cut only as far as each suffix needs.
    prefix = operator.removesuffix("-operator")
    assert service.removesuffix("-operator-metrics") == prefix[: len(service) - 17].rstrip("-")
    assert only(objects, "ServiceAccount")["metadata"]["name"] == operator
    assert f"service/{service} port" in "".join(
        text for path, text in manifests.items() if path.endswith("NOTES.txt")
    )


# --- RBAC ----------------------------------------------------------------------


def test_cluster_role_grants_exactly_the_operator_verbs_per_resource(chart):
    role = only(render(chart), "ClusterRole", OPERATOR)
    assert grants(role) == OPERATOR_RULES


def test_no_rule_anywhere_uses_a_wildcard(chart):
    for values in (None, {"watchNamespace": "voice"}):
        for obj in render(chart, values):
            for rule in obj.get("rules", []):
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert "*" not in rule.get(field, []), (obj["kind"], rule)


def test_no_role_grants_anything_on_secrets(chart):
    for values in (None, {"watchNamespace": "voice"}):
        for obj in render(chart, values):
            if "rules" in obj and obj["kind"] in ("ClusterRole", "Role"):
                assert not [r for r in obj["rules"] if "secrets" in r["resources"]], obj["metadata"]


def test_delete_is_granted_only_on_the_hpa_and_the_http_route(chart):
    """The two children a route can stop wanting while it lives; the garbage collector
    deletes the rest with their route."""
    deletable = {res for res, verbs in grants(only(render(chart), "ClusterRole", OPERATOR)).items()
                 if "delete" in verbs}
    assert deletable == {
        ("autoscaling", "horizontalpodautoscalers"),
        ("gateway.networking.k8s.io", "httproutes"),
    }


# --- the pod admission policy ---------------------------------------------------------


def test_pod_policy_matches_only_pod_updates_by_the_operator_service_account(chart):
    policy = only(render(chart), "ValidatingAdmissionPolicy", POLICY)["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"] == {"resourceRules": [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"],
    }]}
    assert policy["matchConditions"] == [{
        "name": "operator-service-account",
        "expression": f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{OPERATOR}"',
    }]
    expressions = " ".join(v["expression"] for v in policy["validations"])
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert variables["cost"] == "'controller.kubernetes.io/pod-deletion-cost'"
    for needle in (
        "variables.oldLabels['app.kubernetes.io/name'] == 'patchbay-gateway'",
        "variables.oldLabels['app.kubernetes.io/managed-by'] == 'patchbay-operator'",
        "variables.newLabels == variables.oldLabels",
        "object.spec == oldObject.spec",
        "k == variables.cost",
    ):
        assert needle in expressions, needle


def test_pod_policy_binding_denies_and_follows_the_service_account_name(chart):
    objects = render(chart, {"serviceAccount": {"name": "pb-sa"}})
    binding = only(objects, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]
    assert binding == {"policyName": POLICY, "validationActions": ["Deny"]}
    policy = only(objects, "ValidatingAdmissionPolicy", POLICY)["spec"]
    assert policy["matchConditions"][0]["expression"].endswith(f':{NAMESPACE}:pb-sa"')


def test_leases_are_granted_only_in_the_release_namespace_and_only_for_the_operators_lease(chart):
    objects = render(chart)
    role = only(objects, "Role", f"{OPERATOR}-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role) == {("coordination.k8s.io", "leases"): {"get", "create", "update", "patch"}}
    # create cannot be limited by name; every other verb is limited to one Lease.
    for rule in role["rules"]:
        if rule["verbs"] == ["create"]:
            assert "resourceNames" not in rule
        else:
            assert rule["resourceNames"] == [OPERATOR]
    assert all(("coordination.k8s.io", "leases") not in grants(o)
               for o in objects if o["kind"] == "ClusterRole")


def test_bindings_bind_the_operator_service_account_to_its_own_role(chart):
    objects = render(chart)
    for kind, role_kind, name in (
        ("ClusterRoleBinding", "ClusterRole", OPERATOR),
        ("RoleBinding", "Role", f"{OPERATOR}-leader-election"),
    ):
        binding = only(objects, kind, name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
        ]
    pod = only(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR


def test_watch_namespace_replaces_cluster_wide_rbac_with_a_role_in_that_namespace(chart):
    objects = render(chart, {"watchNamespace": "voice"})
    assert not [o for o in objects if o["kind"].startswith("Cluster")]
    role = only(objects, "Role", OPERATOR)
    assert role["metadata"]["namespace"] == "voice"
    assert grants(role) == OPERATOR_RULES
    binding = only(objects, "RoleBinding", OPERATOR)
    assert binding["metadata"]["namespace"] == "voice"
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
    # The Lease stays in the operator's own namespace.
    assert only(objects, "Role", f"{OPERATOR}-leader-election")["metadata"]["namespace"] == NAMESPACE
    assert env(objects)["PATCHBAY_WATCH_NAMESPACE"] == "voice"


def test_without_watch_namespace_the_operator_is_not_told_one(chart):
    assert "PATCHBAY_WATCH_NAMESPACE" not in env(render(chart))


def test_rbac_create_false_renders_no_roles_or_bindings(chart):
    objects = render(chart, {"rbac": {"create": False}})
    assert not [o for o in objects if "Role" in o["kind"] or "Admission" in o["kind"]]


# --- the operator Deployment ----------------------------------------------------


def test_operator_runs_the_run_subcommand_from_the_default_image(chart, app_version):
    c = container(render(chart))
    assert c["image"] == f"patchbay/operator:{app_version}" == "patchbay/operator:0.1.0"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["args"] == ["run"]
    assert "command" not in c  # the image's ENTRYPOINT is the binary


def test_operator_environment_carries_the_contracted_settings(chart, app_version):
    assert env(render(chart)) == {
        "PATCHBAY_GATEWAY_IMAGE": f"patchbay/gateway:{app_version}",
        "PATCHBAY_OPERATOR_METRICS_LISTEN": "0.0.0.0:8080",
        "PATCHBAY_LOG_FORMAT": "json",
        "PATCHBAY_LEADER_ELECTION": "true",
        "PATCHBAY_LEASE_NAME": OPERATOR,
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }


def test_image_values_set_both_images_by_tag_or_by_digest(chart):
    digest = "sha256:" + "ab" * 32
    objects = render(chart, {
        "image": {"repository": "registry.example.com:5000/acme/patchbay-operator", "tag": "1.2.3"},
        "gateway": {"image": {"repository": "ghcr.io/acme/patchbay-gateway", "digest": digest}},
    })
    assert container(objects)["image"] == "registry.example.com:5000/acme/patchbay-operator:1.2.3"
    assert env(objects)["PATCHBAY_GATEWAY_IMAGE"] == f"ghcr.io/acme/patchbay-gateway@{digest}"


def test_metrics_port_moves_the_listener_the_container_port_and_the_service_together(chart):
    objects = render(chart, {"metrics": {"port": 9100}})
    assert env(objects)["PATCHBAY_OPERATOR_METRICS_LISTEN"] == "0.0.0.0:9100"
    assert container(objects)["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    service = only(objects, "Service", f"{OPERATOR}-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_liveness_and_readiness_probe_healthz_on_the_metrics_port(chart):
    c = container(render(chart))
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert c[probe]["periodSeconds"] >= 1
        assert c[probe]["timeoutSeconds"] >= 1


def test_operator_runs_as_uid_65532_on_a_read_only_root_with_no_capabilities(chart):
    objects = render(chart)
    pod = only(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container(objects)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_container_has_memory_limit_and_requests(chart):
    resources = container(render(chart))["resources"]
    assert resources["limits"]["memory"]
    assert set(resources["requests"]) == {"cpu", "memory"}


def test_leader_election_is_on_and_replicas_follow_the_value(chart):
    objects = render(chart, {"replicas": 3})
    assert only(objects, "Deployment", OPERATOR)["spec"]["replicas"] == 3
    assert env(objects)["PATCHBAY_LEADER_ELECTION"] == "true"


def test_leader_election_off_drops_the_lease_role_and_tells_the_operator(chart):
    objects = render(chart, {"leaderElection": {"enabled": False}})
    assert env(objects)["PATCHBAY_LEADER_ELECTION"] == "false"
    assert not [o for o in objects if o["metadata"]["name"].endswith("-leader-election")]


def test_lease_name_value_is_passed_and_scopes_the_lease_role(chart):
    objects = render(chart, {"leaderElection": {"leaseName": "pb-leader"}})
    assert env(objects)["PATCHBAY_LEASE_NAME"] == "pb-leader"
    role = only(objects, "Role", f"{OPERATOR}-leader-election")
    assert [r.get("resourceNames") for r in role["rules"]] == [None, ["pb-leader"]]


def test_extra_env_is_appended_after_the_chart_managed_variables(chart):
    objects = render(chart, {"extraEnv": [{"name": "RUST_LOG", "value": "debug"}]})
    names = [e["name"] for e in container(objects)["env"]]
    assert names[-1] == "RUST_LOG"
    assert set(names[:-1]) == MANAGED_ENV - {"PATCHBAY_WATCH_NAMESPACE"}


def test_pod_scheduling_values_reach_the_pod_spec(chart):
    toleration = {"key": "dedicated", "operator": "Equal", "value": "patchbay", "effect": "NoSchedule"}
    objects = render(chart, {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [toleration],
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "regcred"}],
    })
    pod = only(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [toleration]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


# --- metrics ---------------------------------------------------------------------


def test_metrics_service_selects_exactly_the_operator_pods(chart):
    objects = render(chart)
    deployment = only(objects, "Deployment", OPERATOR)
    service = only(objects, "Service", f"{OPERATOR}-metrics")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def monitors(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceMonitor")


def test_service_monitors_are_rendered_only_when_enabled(chart):
    assert monitors(render(chart)) == []
    assert monitors(render(chart, {"serviceMonitor": {"enabled": True}})) == [OPERATOR]
    assert monitors(render(chart, {"serviceMonitor": {"gateways": True}})) == ["patchbay-gateways"]


def test_operator_service_monitor_scrapes_the_operator_metrics_service(chart):
    objects = render(chart, {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
    monitor = only(objects, "ServiceMonitor", OPERATOR)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = only(objects, "Service", f"{OPERATOR}-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]


def test_gateway_service_monitor_selects_operator_made_gateway_services_where_routes_live(chart):
    monitor = only(render(chart, {"serviceMonitor": {"gateways": True}}), "ServiceMonitor")
    # The labels and port name the operator puts on every route's Service.
    assert monitor["spec"]["selector"] == {"matchLabels": {
        "app.kubernetes.io/name": "patchbay-gateway",
        "app.kubernetes.io/managed-by": "patchbay-operator",
    }}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    scoped = only(render(chart, {"serviceMonitor": {"gateways": True}, "watchNamespace": "voice"}),
                  "ServiceMonitor")
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["voice"]}


def test_each_service_monitor_is_labelled_with_the_component_it_scrapes(chart):
    objects = render(chart, {"serviceMonitor": {"enabled": True, "gateways": True,
                                                "labels": {"release": "prom"}}})
    operator = only(objects, "ServiceMonitor", OPERATOR)["metadata"]["labels"]
    gateways = only(objects, "ServiceMonitor", "patchbay-gateways")["metadata"]["labels"]
    assert operator["app.kubernetes.io/component"] == "operator"
    assert gateways["app.kubernetes.io/component"] == "gateway"
    for labels in (operator, gateways):
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/part-of"] == "patchbay"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["release"] == "prom"
    # Nothing else the chart renders changed component: the operator's objects are the operator's.
    for o in objects:
        if o["kind"] != "ServiceMonitor" and o["kind"] != "CustomResourceDefinition":
            assert o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator", o["kind"]


# --- values.schema.json, enforced by Helm itself -----------------------------------

BAD_VALUES = [
    ({"replicas": 0}, "/replicas"),
    ({"replicas": 6}, "/replicas"),
    ({"replicas": "2"}, "/replicas"),
    ({"replicas": 2, "leaderElection": {"enabled": False}}, "/leaderElection/enabled"),
    ({"image": {"repository": "patchbay/operator:0.1.0"}}, "/image/repository"),
    ({"image": {"tag": "not a tag"}}, "/image/tag"),
    ({"image": {"digest": "sha256:short"}}, "/image/digest"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"gateway": {"image": {"repository": ""}}}, "/gateway/image/repository"),
    ({"watchNamespace": "Not_A_Namespace"}, "/watchNamespace"),
    ({"leaderElection": {"enabled": "yes"}}, "/leaderElection/enabled"),
    ({"logFormat": "yaml"}, "/logFormat"),
    ({"metrics": {"port": 80}}, "/metrics/port"),
    ({"metrics": {"port": 65536}}, "/metrics/port"),
    ({"serviceMonitor": {"interval": "30"}}, "/serviceMonitor/interval"),
    ({"resources": {"requests": {"cpu": "lots"}}}, "/resources/requests/cpu"),
    ({"resources": {"limits": {"gpu": 1}}}, "/resources/limits"),
    ({"podSecurityContext": {"runAsUser": -1}}, "/podSecurityContext/runAsUser"),
    ({"probes": {"liveness": {"periodSeconds": 0}}}, "/probes/liveness/periodSeconds"),
    ({"tolerations": [{"operator": "Maybe"}]}, "/tolerations/0/operator"),
    ({"nodeSelector": {"disk": 1}}, "/nodeSelector/disk"),
    ({"podLabels": {"app.kubernetes.io/instance": "other"}}, "/podLabels"),
    ({"podLabels": {"app.kubernetes.io/version": "x"}}, "/podLabels"),
    ({"extraEnv": [{"name": "POD_NAME", "value": "x"}]}, "/extraEnv/0/name"),
    ({"replica": 2}, "additional properties 'replica' not allowed"),
    ({"fullnameOverride": "f" * 64}, "/fullnameOverride"),
]


@pytest.mark.parametrize(("values", "where"), BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_helm_refuses_values_the_schema_forbids(chart, values, where):
    with pytest.raises(HelmValuesError) as refused:
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    message = str(refused.value)
    assert "values don't meet the specifications of the schema" in message
    assert where in message


FREE_FORM = {
    # Kubernetes types passed through verbatim, not re-specified here.
    ("properties", "global"),
    ("properties", "affinity", "properties", "nodeAffinity"),
    ("properties", "affinity", "properties", "podAffinity"),
    ("properties", "affinity", "properties", "podAntiAffinity"),
    ("properties", "extraEnv", "items", "properties", "valueFrom"),
}


def test_every_object_in_the_schema_is_closed_to_unknown_keys(chart):
    """A typo in a value name is an error, never silently ignored."""
    schema = chart.schema
    assert schema is not None

    def walk(node: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        if isinstance(node, dict):
            if node.get("type") == "object" and path not in FREE_FORM:
                if "additionalProperties" not in node:
                    yield path
            for key, child in node.items():
                yield from walk(child, (*path, key))

    assert list(walk(schema, ())) == []


# --- the CRD ------------------------------------------------------------------------


def test_chart_ships_the_repository_crd_byte_for_byte(chart):
    crds = chart.crds
    assert [c["name"] for c in crds] == ["crds/realtimeroute.yaml"]
    assert crds[0]["data"] == REPO_CRD.read_text(), (
        "charts/patchbay/crds/realtimeroute.yaml differs from crds/realtimeroute.yaml; "
        "it must be the same file (a symlink)"
    )


def test_chart_crd_is_a_relative_symlink_to_the_repository_crd():
    """One source: the operator regenerates crds/, the chart follows."""
    link = CHART_DIR / "crds" / "realtimeroute.yaml"
    assert link.is_symlink()
    assert link.resolve() == REPO_CRD.resolve()
    assert not Path(os.readlink(link)).is_absolute()


def test_packaged_chart_carries_the_crd_contents_not_the_link(tmp_path):
    archive = package(CHART_DIR, destination=tmp_path)
    with Chart.load(archive) as packaged:
        assert [c["data"] for c in packaged.crds] == [REPO_CRD.read_text()]


def test_shipped_crd_defines_realtime_route_with_its_short_name_and_status(chart):
    crd = yaml.safe_load(chart.crds[0]["data"])
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "realtimeroutes.patchbay.dev"
    spec = crd["spec"]
    assert spec["group"] == "patchbay.dev"
    assert spec["scope"] == "Namespaced"
    names = spec["names"]
    assert (names["kind"], names["plural"]) == ("RealtimeRoute", "realtimeroutes")
    assert "rtr" in names["shortNames"]
    v1alpha1 = next(v for v in spec["versions"] if v["name"] == "v1alpha1")
    assert v1alpha1["served"] and v1alpha1["storage"]
    assert "status" in v1alpha1["subresources"]


def test_a_route_can_name_a_certificate_secret_for_the_gateways_client_listener(chart):
    """The chart deploys the operator, not the gateways: a route's `spec.tls.secretName`
    names a `kubernetes.io/tls` Secret (what cert-manager's Certificate writes), which the
    operator mounts into the route's gateway pods for the client listener's TLS."""
    import jsonschema

    crd = yaml.safe_load(chart.crds[0]["data"])
    v1alpha1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    spec_schema = v1alpha1["schema"]["openAPIV3Schema"]["properties"]["spec"]
    tls = spec_schema["properties"]["tls"]
    assert tls["required"] == ["secretName"]
    assert tls["properties"]["secretName"]["type"] == "string"
    full = next(
        d for d in yaml.safe_load_all((REPO / "examples" / "realtimeroute-full.yaml").read_text())
        if d and d["kind"] == "RealtimeRoute"
    )
    assert full["spec"]["tls"] == {"secretName": "voice-tls"}
    jsonschema.validate(full["spec"], spec_schema)
    for bad in ({"secretName": ""}, {}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**full["spec"], "tls": bad}, spec_schema)


def test_crd_is_not_rendered_as_a_template(chart):
    """Helm installs crds/ before templates and never upgrades or deletes it."""
    kinds_rendered = {o["kind"] for o in render(chart)}
    assert "CustomResourceDefinition" not in kinds_rendered


# --- NOTES.txt ----------------------------------------------------------------------


def test_notes_tell_the_user_what_to_do_next(chart):
    text = notes(chart)
    for step in (
        f"kubectl -n {NAMESPACE} rollout status deployment/{OPERATOR}",
        "kubectl create secret generic openai --from-literal=api-key=",
        "kubectl create secret generic voice-keys --from-file=keys.toml",
        "kubectl apply -f examples/realtimeroute.yaml",
        "kubectl get rtr",
        "kubectl port-forward svc/voice 8080:http",
        "kubectl apply --server-side --force-conflicts -f charts/patchbay/crds/realtimeroute.yaml",
    ):
        assert step in text
    assert "every namespace" in text


def test_notes_name_the_watched_namespace_when_one_is_set(chart):
    assert "in namespace voice only" in notes(chart, {"watchNamespace": "voice"})
