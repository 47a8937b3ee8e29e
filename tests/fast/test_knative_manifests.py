"""Static checks of the Knative deployment in knative/, without a cluster.

- Core kinds are validated strictly against the official Kubernetes schemas
  (kubernetes-validate), for the oldest supported and the newest shipped version.
- Knative kinds are validated against the openAPIV3Schema of their CRD, made strict the
  way the API server treats a structural schema (unknown fields are an error unless the
  schema preserves them). The CRDs come from $KNATIVE_SCHEMAS_DIR (default:
  <repo>/../shared/schemas/knative); if they are missing the tests fail, never skip.
- A Knative Service's pod template is also validated as a core Pod, so a misspelled
  container field is caught even where a CRD would let it through.
- The project's own rules (event routing, least privilege, secrets kept out of the
  ConfigMap, kustomizations complete) are asserted as data.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version, major_minor

from tests.support.job_plans import make_plan
from tests.support.strict_schema import strict_schema

REPO = Path(__file__).resolve().parents[2]
KNATIVE = REPO / "knative"
SCHEMAS_DIR = Path(
    os.environ.get("KNATIVE_SCHEMAS_DIR") or REPO.parent / "shared" / "schemas" / "knative"
)

# Oldest Kubernetes the manifests support, and the newest schema the package ships.
K8S_VERSIONS = ("1.30", major_minor(latest_version()))
KNATIVE_GROUPS = frozenset(
    {
        "serving.knative.dev",
        "eventing.knative.dev",
        "sources.knative.dev",
        "sinks.knative.dev",
        "messaging.knative.dev",
        "flows.knative.dev",
        # Not Knative, but validated the same way: the Tekton Custom Task's StepActions
        # (knative/tekton/steps/), against the CRD of the Tekton release the cluster tests run.
        "tekton.dev",
        "triggers.tekton.dev",  # knative/tekton/examples/ (its CRDs keep any field)
    }
)
NAMESPACE = "resource-functions"
TASKS_NAMESPACE = "resource-functions-tasks"  # task Jobs, their Secrets, their fence
# Knative Eventing's receivers are fenced from pipeline namespaces where they run.
IN_EVENTING_NAMESPACE = {("NetworkPolicy", "eventing-not-from-pipelines")}
IN_KAFKA_NAMESPACE = {("NetworkPolicy", "kafka-from-knative-only")}  # the kafka component's
IN_TASKS_NAMESPACE = {  # (kind, name) of what lives beside the task Jobs
    ("Role", "resource-functions-tasks"),
    ("RoleBinding", "resource-functions-tasks"),
    ("ServiceAccount", "resource-task"),
    ("NetworkPolicy", "task-pods"),
    ("NetworkPolicy", "warm-pods-from-check"),
    ("Secret", "resource-functions-store"),  # one copy: the tasks' store credentials
    ("ResourceQuota", "task-pods"),
    ("ResourceQuota", "warm-check-pods"),
    ("LimitRange", "task-containers"),
    # The Tekton Custom Task's controller stops the Job of a cancelled CustomRun.
    ("Role", "resource-functions-tekton-controller"),
    ("RoleBinding", "resource-functions-tekton-controller"),
}
TEKTON = KNATIVE / "tekton"  # the Tekton Custom Task, a component (docs/tekton.md)
TEKTON_STEPS = TEKTON / "steps"  # its StepActions, applied per Tekton user namespace
TEKTON_STEPS_NAMESPACE = "tekton-main"
TEKTON_EXAMPLES = TEKTON / "examples"  # new versions -> PipelineRuns: Broker and user sides
TEKTON_CONTROLLER = "resource-functions-tekton-controller"  # its (Cluster)Role(Binding)s
TEAMS = KNATIVE / "teams"  # a team's credential namespace (applied per team)
TEAM_NAMESPACE = "concourse-main"
CREDENTIALS_ROLE = "resource-functions-credentials"
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "PriorityClass",
    "CustomResourceDefinition",
}
# Prometheus Operator kinds (knative/monitoring/): checked by tests/fast/test_alert_rules.py.
OPERATOR_GROUPS = {"monitoring.coreos.com"}
# Knative kinds whose CRD schema is not in KNATIVE_SCHEMAS_DIR: read from the release source
# the cluster tests build (../shared/third_party), member by member.
RELEASE_CRDS = {
    "EventPolicy": (
        REPO.parent / "shared" / "third_party" / "knative-eventing-1.22.2.tar.xz",
        "knative-eventing-1.22.2/config/core/resources/eventpolicy.yaml",
    ),
    **{
        kind: (
            REPO.parent / "shared" / "third_party" / "tekton-pipeline-1.15.0.tar.xz",
            f"tekton-pipeline-1.15.0/config/300-crds/300-{kind.lower()}.yaml",
        )
        for kind in ("StepAction", "Pipeline", "Task")
    },
    "InMemoryChannel": (
        REPO.parent / "shared" / "third_party" / "knative-eventing-1.22.2.tar.xz",
        "knative-eventing-1.22.2/config/channels/in-memory-channel/resources/in-memory-channel.yaml",
    ),
    "Subscription": (
        REPO.parent / "shared" / "third_party" / "knative-eventing-1.22.2.tar.xz",
        "knative-eventing-1.22.2/config/core/resources/subscription.yaml",
    ),
    **{
        kind: (
            REPO.parent / "shared" / "third_party" / "tekton-triggers-0.37.0.tar.xz",
            f"tekton-triggers-0.37.0/config/300-{kind.lower()}.yaml",
        )
        for kind in ("EventListener", "TriggerBinding", "TriggerTemplate")
    },
}
NO_CRD_KINDS: set[str] = set()
ACTIONS = ("check", "get", "put")
REQUEST_TYPES = {action: f"dev.resourcefunctions.{action}.requested" for action in ACTIONS}
REPLY_TYPES = [
    f"dev.resourcefunctions.{action}.{outcome}"
    for action in ACTIONS
    for outcome in ("succeeded", "failed")
]
PROJECT_IMAGE = "resource-functions"
PING_TYPE = "dev.knative.sources.ping"
FUNCTION_SA = "resource-functions"
TASK_SA = "resource-task"
CONFIG_MAP = "resource-functions-config"
STORE_SECRET = "resource-functions-store"
CACHE_SECRET = "resource-functions-cache"
# Knative-only fields of a Revision's pod spec, dropped before validating it as a Pod.
KNATIVE_POD_FIELDS = (
    "containerConcurrency",
    "timeoutSeconds",
    "responseStartTimeoutSeconds",
    "idleTimeoutSeconds",
)
EXPECTED_SERVICE_SETTINGS = {  # name: (containerConcurrency, timeoutSeconds)
    "check": (10, 300),
    "get": (4, 3600),
    "put": (4, 3600),
}
EXPECTED_ROLE_RULES = {  # (apiGroup, resource): verbs
    ("batch", "jobs"): {"create", "get", "list", "watch", "delete"},
    ("", "secrets"): {"create", "get", "delete"},
    ("", "pods"): {"get", "list", "watch", "create", "delete"},  # warm check pods
}
# Names the ecosystem uses for credentials: never ConfigMap keys.
SECRET_ENV_NAMES = {
    "password",  # the Kafka Broker's
    "CACHE_SECRET",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
KUSTOMIZATION = "kustomization.yaml"
# Settings a function Service may set inline, overriding the ConfigMap.
BUDGET_ENV = {"TASK_TIMEOUT_SECONDS", "TASK_MARGIN_SECONDS"}


# --- loading ------------------------------------------------------------------------


def _rel(path: Path) -> str:
    return path.relative_to(KNATIVE).as_posix()


# Not Kubernetes documents: a plain Prometheus rule file (tests/fast/test_alert_rules.py checks it).
# and kustomize's own configuration files (a kustomization's `configurations`).
NOT_MANIFESTS = {KNATIVE / "monitoring" / "rules.yaml"} | {
    k.parent / entry
    for k in KNATIVE.rglob(KUSTOMIZATION)
    for entry in (yaml.safe_load(k.read_text()) or {}).get("configurations", [])
}
# Manifests applied by hand beside a kustomization, never by it (documented where they are).
APPLIED_BY_HAND = {TEKTON_EXAMPLES / "scheduled-check-policy.yaml"}
YAML_FILES = sorted(
    p
    for p in KNATIVE.rglob("*")
    if p.is_file() and p.suffix in {".yaml", ".yml"} and p not in NOT_MANIFESTS
)


def _load(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _patch_files() -> set[Path]:
    """Files that kustomizations name as patches: partial documents, checked once applied
    (test_sender_auth_component_renders_a_consistent_deployment)."""
    found = set()
    for path in YAML_FILES:
        if path.name == KUSTOMIZATION:
            kustomization = yaml.safe_load(path.read_text()) or {}
            found |= {path.parent / p["path"] for p in kustomization.get("patches", [])}
    return found


PATCH_FILES = _patch_files()


def _collect() -> list[tuple[Path, Any]]:
    docs = []
    for path in YAML_FILES:
        if path.name == KUSTOMIZATION or path in PATCH_FILES:
            continue
        try:
            docs.extend((path, doc) for doc in _load(path))
        except yaml.YAMLError:
            continue  # reported by test_yaml_file_parses
    return docs


DOCS = _collect()


def _name(doc: Any) -> str:
    return str((doc.get("metadata") or {}).get("name")) if isinstance(doc, dict) else "?"


def _kind(doc: Any) -> str:
    return str(doc.get("kind")) if isinstance(doc, dict) else "?"


def _group(doc: dict) -> str:
    api_version = str(doc.get("apiVersion", ""))
    return api_version.rpartition("/")[0]


def _doc_id(path: Path, doc: Any) -> str:
    return f"{_rel(path)}:{_kind(doc)}/{_name(doc)}"


def _params(*, kinds: set[str] | None = None, knative: bool | None = None) -> list[Any]:
    """pytest params (id file:kind/name) of the documents that match."""
    out = []
    for path, doc in DOCS:
        if not isinstance(doc, dict):
            continue
        if kinds is not None and doc.get("kind") not in kinds:
            continue
        if knative is not None and (_group(doc) in KNATIVE_GROUPS) != knative:
            continue
        out.append(pytest.param(path, doc, id=_doc_id(path, doc)))
    return out


def _all(kind: str, group: str | None = None) -> list[dict]:
    return [
        doc
        for _, doc in DOCS
        if isinstance(doc, dict)
        and doc.get("kind") == kind
        and (group is None or _group(doc) == group)
    ]


def _one(kind: str, name: str, group: str | None = None) -> dict:
    found = [doc for doc in _all(kind, group) if _name(doc) == name]
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


def _knative_services() -> list[dict]:
    return _all("Service", "serving.knative.dev")


def _container(service: dict) -> dict:
    containers = service["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"Service/{_name(service)}: one container expected"
    return containers[0]


def _runs_project_image(service: dict) -> bool:
    # Used while collecting tests: tolerate a malformed Service (its own tests report it).
    containers = ((service.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "containers"
    ) or [{}]
    return any(c.get("image") == PROJECT_IMAGE for c in containers)


def _function_services() -> list[Any]:
    return [
        pytest.param(svc, id=f"Service/{_name(svc)}")
        for svc in _knative_services()
        if _name(svc) in ACTIONS
    ]


def _config_data() -> dict[str, str]:
    return _one("ConfigMap", CONFIG_MAP)["data"]


def _secret_values(doc: dict) -> dict[str, str]:
    values = dict(doc.get("stringData") or {})
    values.update(doc.get("data") or {})  # base64 text: compared as written
    return values


def _kustomize_resources(directory: Path) -> Iterator[Path]:
    """Files a kustomization includes, recursively through listed sub-kustomizations."""
    kustomization = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    for entry in kustomization.get("resources", []):
        target = directory / entry
        if target.is_dir():
            yield from _kustomize_resources(target)
        else:
            yield target


def test_there_is_something_to_check() -> None:
    assert (KNATIVE / KUSTOMIZATION).is_file(), f"{KNATIVE}/{KUSTOMIZATION} is missing"
    assert DOCS, f"no Kubernetes documents found under {KNATIVE}"


# --- every file parses, every document is well-formed ----------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_yaml_file_parses(path: Path) -> None:
    docs = _load(path)
    assert docs, f"{_rel(path)} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{_rel(path)}: a document is not a mapping: {doc!r}"


@pytest.mark.parametrize(("path", "doc"), _params())
def test_document_has_valid_names(path: Path, doc: dict) -> None:
    assert doc.get("apiVersion"), "apiVersion is required"
    assert doc.get("kind"), "kind is required"
    metadata = doc.get("metadata") or {}
    for field in ("name", "namespace"):
        value = metadata.get(field)
        if field == "namespace" and value is None:
            assert doc["kind"] in CLUSTER_SCOPED, "namespaced objects name their namespace"
            continue
        assert isinstance(value, str), f"metadata.{field} must be a string: {value!r}"
        if doc["kind"] == "CustomResourceDefinition" and field == "name":
            spec = doc["spec"]  # named <plural>.<group>, a DNS subdomain
            assert value == f"{spec['names']['plural']}.{spec['group']}"
            continue
        assert len(value) <= 63, f"metadata.{field} {value!r} is longer than 63 characters"
        assert DNS_LABEL.fullmatch(value), (
            f"metadata.{field} {value!r} is not a DNS label ([a-z0-9]([-a-z0-9]*[a-z0-9])?)"
        )
    if doc["kind"] not in CLUSTER_SCOPED:
        if path.parent == TEAMS:
            assert metadata["namespace"] == TEAM_NAMESPACE
        elif path.parent == TEKTON_STEPS:
            assert metadata["namespace"] == TEKTON_STEPS_NAMESPACE
        elif path.parent == TEKTON_EXAMPLES:
            assert metadata["namespace"] in (NAMESPACE, TEKTON_STEPS_NAMESPACE)
        elif (doc["kind"], metadata["name"]) in IN_TASKS_NAMESPACE:
            assert metadata["namespace"] in (TASKS_NAMESPACE, NAMESPACE)
        elif (doc["kind"], metadata["name"]) in IN_EVENTING_NAMESPACE:
            assert metadata["namespace"] == "knative-eventing"
        elif (doc["kind"], metadata["name"]) in IN_KAFKA_NAMESPACE:
            assert metadata["namespace"] == "kafka"
        else:
            assert metadata["namespace"] == NAMESPACE
    if doc["kind"] == "Service" and _group(doc) == "serving.knative.dev":
        # Knative derives a Kubernetes Service (DNS-1035: starts with a letter) from it.
        assert DNS_1035_LABEL.fullmatch(metadata["name"]), (
            "Knative Service names start with a letter"
        )


# --- core kinds: strict Kubernetes schemas ---------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    ("path", "doc"),
    [p for p in _params(knative=False) if _group(p.values[1]) not in OPERATOR_GROUPS],
)
def test_core_kind_validates_strictly(path: Path, doc: dict, version: str) -> None:
    _validate_core(doc, version)


def _validate_core(doc: dict, version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        location = "/".join(str(p) for p in err.absolute_path) or "(root)"
        pytest.fail(f"Kubernetes {version}: {location}: {err.message}")
    except kubernetes_validate.SchemaNotFoundError as err:
        pytest.fail(err.message)


def test_latest_kubernetes_version_is_recent() -> None:
    assert tuple(int(p) for p in K8S_VERSIONS[1].split(".")) >= (1, 37), K8S_VERSIONS


# --- Knative kinds: CRD schemas ----------------------------------------------------------


@functools.cache
def load_knative_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> strict JSON schema of every served CRD version.

    Called from the tests themselves (not a fixture) so a missing folder is a FAILED test
    with a message, not a setup error and never a skip."""
    if not SCHEMAS_DIR.is_dir():
        pytest.fail(
            f"Knative CRD schemas not found at {SCHEMAS_DIR}: set KNATIVE_SCHEMAS_DIR to the "
            "folder holding the CRD YAML files (serving.knative.dev_v1_service.yaml, …)"
        )
    schemas: dict[tuple[str, str], dict] = {}
    crds = [crd for path in sorted(SCHEMAS_DIR.glob("*.yaml")) for crd in _load(path)]
    for tarball, member in RELEASE_CRDS.values():
        with tarfile.open(tarball) as release:
            extracted = release.extractfile(member)
            assert extracted is not None, member
            crds += [d for d in yaml.safe_load_all(extracted.read()) if d]
    for crd in crds:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version.get("served"):
                continue
            api_version = f"{group}/{version['name']}"
            schema = strict_schema(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
            # The API server itself handles these three on every object.
            schema.setdefault("properties", {}).update(
                apiVersion={"const": api_version},
                kind={"const": kind},
                metadata={"type": "object"},
            )
            schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind"})
            schemas[(api_version, kind)] = schema
    if not schemas:
        pytest.fail(f"no CustomResourceDefinition found in {SCHEMAS_DIR}")
    return schemas


def _crd_errors(doc: dict) -> list[str]:
    schemas = load_knative_schemas()
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in schemas:
        pytest.fail(f"no CRD for {key[1]} {key[0]} in {SCHEMAS_DIR} (have: {sorted(schemas)})")
    validator = jsonschema.Draft7Validator(schemas[key])
    return [
        f"{'/'.join(str(p) for p in err.absolute_path) or '(root)'}: {err.message}"
        for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))
    ]


def test_knative_schemas_dir_is_present() -> None:
    kinds = {kind for _, kind in load_knative_schemas()}
    assert {"Service", "Broker", "Trigger", "SinkBinding"} <= kinds, kinds


@pytest.mark.parametrize(
    ("path", "doc"), [p for p in _params(knative=True) if _kind(p.values[1]) not in NO_CRD_KINDS]
)
def test_knative_kind_validates_against_crd(path: Path, doc: dict) -> None:
    errors = _crd_errors(doc)
    assert not errors, "\n".join(errors)
    # CRD schemas leave metadata to the API server: check it as a core ObjectMeta.
    _validate_core(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}, K8S_VERSIONS[1]
    )


def test_strict_crd_validation_catches_misspelled_fields() -> None:
    """The validator must have teeth: a typo anywhere is reported, not ignored."""
    trigger = copy.deepcopy(_one("Trigger", "check-requested"))
    trigger["spec"]["subscriber"]["reff"] = trigger["spec"]["subscriber"].pop("ref")
    assert _crd_errors(trigger)

    trigger = copy.deepcopy(_one("Trigger", "check-requested"))
    trigger["spec"]["filtr"] = trigger["spec"].pop("filter")  # spec preserves unknown fields
    assert _crd_errors(trigger)

    service = copy.deepcopy(_one("Service", "check", "serving.knative.dev"))
    container = _container(service)
    container["readinesProbe"] = container.pop("readinessProbe")
    assert _crd_errors(service)

    broker = copy.deepcopy(_one("Broker", "default"))
    broker["spec"]["delivery"]["deadLetterSink"]["reff"] = {"name": "dead-letter"}
    assert _crd_errors(broker)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("path", "doc"), _params(kinds={"Service"}, knative=True))
def test_knative_service_pod_template_validates_as_core_pod(
    path: Path, doc: dict, version: str
) -> None:
    template = doc["spec"]["template"]
    spec = {k: v for k, v in template["spec"].items() if k not in KNATIVE_POD_FIELDS}
    metadata = {**copy.deepcopy(template.get("metadata") or {}), "name": _name(doc)}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    _validate_core(pod, version)


# --- routing: triggers, broker, sink binding --------------------------------------------


def _filter_matches(expression: dict, attributes: dict[str, str]) -> bool:
    """One expression of a Trigger's `filters` (CloudEvents Subscriptions API dialects)."""
    assert len(expression) == 1, f"one dialect per filter expression: {expression}"
    ((dialect, argument),) = expression.items()
    if dialect == "exact":
        return all(attributes.get(k) == v for k, v in argument.items())
    if dialect == "prefix":
        return all(k in attributes and attributes[k].startswith(v) for k, v in argument.items())
    if dialect == "suffix":
        return all(k in attributes and attributes[k].endswith(v) for k, v in argument.items())
    if dialect == "all":
        return all(_filter_matches(e, attributes) for e in argument)
    if dialect == "any":
        return any(_filter_matches(e, attributes) for e in argument)
    if dialect == "not":
        return not _filter_matches(argument, attributes)
    raise AssertionError(f"filter dialect {dialect!r} cannot be evaluated by this test")


def _trigger_matches(trigger: dict, event_type: str) -> bool:
    """Knative's matching: `filters`, when present and non-empty, overrides `filter`; in
    `filter.attributes` an empty value matches anything."""
    action = event_type.split(".")[2]
    attributes = {
        "specversion": "1.0",
        "type": event_type,
        "source": f"/resource-functions/{action}",
        "id": "1",
    }
    spec = trigger["spec"]
    if spec.get("filters"):
        return all(_filter_matches(e, attributes) for e in spec["filters"])
    exact = (spec.get("filter") or {}).get("attributes") or {}
    return all(v == "" or attributes.get(k) == v for k, v in exact.items())


def _subscriber(trigger: dict) -> str:
    ref = trigger["spec"]["subscriber"]["ref"]
    assert (ref["apiVersion"], ref["kind"]) == ("serving.knative.dev/v1", "Service"), ref
    return ref["name"]


def _trigger_params(functions: bool) -> list[Any]:
    def subscriber_name(trigger: dict) -> Any:  # tolerant: used while collecting tests
        return ((trigger.get("spec") or {}).get("subscriber") or {}).get("ref", {}).get("name")

    return [
        pytest.param(t, id=f"Trigger/{_name(t)}")
        for t in _all("Trigger")
        if (subscriber_name(t) in ACTIONS) == functions
    ]


@pytest.mark.parametrize("trigger", _trigger_params(functions=True))
def test_function_trigger_filters_exactly_one_request_type(trigger: dict) -> None:
    action = _subscriber(trigger)
    spec = trigger["spec"]
    assert not spec.get("filters"), "function triggers use the exact-match `filter` only"
    assert spec["broker"] == "default"
    if spec["filter"]["attributes"]["type"] == PING_TYPE:
        _check_ping_trigger(trigger, action)
        return
    assert spec["filter"] == {"attributes": {"type": REQUEST_TYPES[action]}}
    matched = [t for t in REQUEST_TYPES.values() if _trigger_matches(trigger, t)]
    assert matched == [REQUEST_TYPES[action]]


def _check_ping_trigger(trigger: dict, action: str) -> None:
    """PingSource ticks (type fixed by Knative) may reach check only, and only from one named
    PingSource of these manifests."""
    assert action == "check"
    attributes = trigger["spec"]["filter"]["attributes"]
    namespace = trigger["metadata"]["namespace"]
    prefix = f"/apis/v1/namespaces/{namespace}/pingsources/"
    assert set(attributes) == {"type", "source"} and attributes["source"].startswith(prefix)
    _one("PingSource", attributes["source"][len(prefix) :])
    assert not [t for t in REQUEST_TYPES.values() if _trigger_matches(trigger, t)]


@pytest.mark.parametrize("trigger", _trigger_params(functions=True))
@pytest.mark.parametrize("reply_type", REPLY_TYPES)
def test_reply_never_reaches_a_function(trigger: dict, reply_type: str) -> None:
    # Replies go back into the same Broker; matching one would loop forever.
    assert not _trigger_matches(trigger, reply_type)


@pytest.mark.parametrize("trigger", _trigger_params(functions=False))
def test_other_triggers_never_receive_requests(trigger: dict) -> None:
    # Requests carry credentials (source/params): only the functions may see them.
    leaked = [t for t in REQUEST_TYPES.values() if _trigger_matches(trigger, t)]
    assert not leaked, f"{_name(trigger)} would receive {leaked}"


@pytest.mark.parametrize("action", ACTIONS)
def test_each_request_type_has_exactly_one_trigger(action: str) -> None:
    triggers = [t for t in _all("Trigger") if _trigger_matches(t, REQUEST_TYPES[action])]
    assert [_subscriber(t) for t in triggers] == [action]


@pytest.mark.parametrize(
    "trigger", [pytest.param(t, id=f"Trigger/{_name(t)}") for t in _all("Trigger")]
)
def test_trigger_references_exist(trigger: dict) -> None:
    _one("Broker", trigger["spec"]["broker"])
    ref = trigger["spec"]["subscriber"]["ref"]
    if (ref["apiVersion"], ref["kind"]) == ("v1", "Service"):  # the Tekton controller's
        _one("Service", ref["name"], "")
        _one("Deployment", ref["name"], "apps")
    elif ref["kind"] == "InMemoryChannel":  # new versions to Tekton (a channel hop)
        _one("InMemoryChannel", ref["name"])
    else:
        _one("Service", _subscriber(trigger), "serving.knative.dev")
    # A Trigger's delivery would replace the Broker's (retries, dead letters) whole.
    assert "delivery" not in trigger["spec"]


def test_a_teams_trigger_routes_that_teams_replies_and_discoveries_alone() -> None:
    """Replies and discovered versions carry their request's team (functions/replies.py): a
    team's Trigger takes its team's, and neither another team's nor a request."""
    from functions.replies import DISCOVERED_TYPE, TEAM_ATTRIBUTE, reply_type

    trigger = _one("Trigger", "team-main-replies")
    answers = [reply_type(a, ok) for a in ACTIONS for ok in (True, False)] + [DISCOVERED_TYPE]

    def takes(event_type: str, team: str | None) -> bool:
        attributes = {"specversion": "1.0", "type": event_type, "source": "/", "id": "1"}
        if team is not None:
            attributes[TEAM_ATTRIBUTE] = team
        return all(_filter_matches(e, attributes) for e in trigger["spec"]["filters"])

    assert all(takes(t, "main") for t in answers)
    assert not any(takes(t, team) for t in answers for team in ("other", "", None))
    assert not any(takes(t, "main") for t in REQUEST_TYPES.values())


def quantity_value(text: str) -> float:
    """A Kubernetes quantity of the forms used here (100m, 2, 128Mi, 2Gi) as a number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


def test_the_task_namespace_has_a_quota_and_every_task_container_fits_it() -> None:
    """All task pods together are bounded (pods, CPU, memory); the LimitRange gives a
    container that states nothing the default task resources, and those fit its max."""
    from functions.settings import DEFAULT_TASK_RESOURCES

    quota = _one("ResourceQuota", "task-pods")
    limits = _one("LimitRange", "task-containers")
    config = _one("ConfigMap", "resource-functions-config")["data"]
    assert quota["metadata"]["namespace"] == limits["metadata"]["namespace"]
    assert quota["metadata"]["namespace"] == config["TASK_NAMESPACE"]
    assert set(quota["spec"]["hard"]) == {
        "pods",
        "requests.cpu",
        "requests.memory",
        "limits.cpu",
        "limits.memory",
    }
    (container,) = limits["spec"]["limits"]
    defaults = json.loads(config.get("TASK_RESOURCES", DEFAULT_TASK_RESOURCES))
    assert container["type"] == "Container"
    assert container["defaultRequest"] == defaults["requests"]
    assert container["default"] == defaults["limits"]
    for name, value in defaults["limits"].items():
        assert quantity_value(value) <= quantity_value(container["max"][name])
        # the quota takes at least as many default pods as its pod count
        pods = int(quota["spec"]["hard"]["pods"])
        total = quantity_value(quota["spec"]["hard"][f"limits.{name}"])
        assert total >= pods * quantity_value(value), name
    for name, value in defaults["requests"].items():
        total = quantity_value(quota["spec"]["hard"][f"requests.{name}"])
        assert total >= int(quota["spec"]["hard"]["pods"]) * quantity_value(value), name


def test_broker_retries_then_dead_letters() -> None:
    delivery = _one("Broker", "default")["spec"]["delivery"]
    assert delivery["retry"] >= 1
    assert delivery["backoffPolicy"] == "exponential"
    # Async replies answer within seconds; a hung attempt is cut and retried.
    assert delivery["timeout"] == "PT60S"
    ref = delivery["deadLetterSink"]["ref"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (
        "serving.knative.dev/v1",
        "Service",
        "dead-letter",
    )
    _one("Service", "dead-letter", "serving.knative.dev")


# The retries after a 429 must span this many of the functions' Retry-After periods: a team's
# burst over MAX_RUNS_PER_TEAM drains wave by wave before anything of it is dead-lettered.
RETRY_AFTER_PERIODS = 12


def retry_times(delivery: dict) -> list[float]:
    """When each retry comes, in seconds after the first attempt's answer, as Knative 1.22
    computes the waits (``pkg/kncloudevents/retries.go``: ``backoffDelay * 2^n`` exponential,
    ``backoffDelay * n`` linear, n from 0; the attempts' own time left out). Retry-After is
    not among them: Knative honours it only with ``retryAfterMax``, an alpha field."""
    delay = iso_seconds(delivery["backoffDelay"])
    waits = [
        delay * (2**n if delivery["backoffPolicy"] == "exponential" else n)
        for n in range(delivery["retry"])
    ]
    return [sum(waits[: n + 1]) for n in range(len(waits))]


def iso_seconds(text: str) -> float:
    """An ISO 8601 duration of the forms Knative's delivery takes (PT2S, PT0.5S, PT1M30S)."""
    found = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?", text)
    assert found and text != "PT", text
    hours, minutes, seconds = (float(part or 0) for part in found.groups())
    return hours * 3600 + minutes * 60 + seconds


def test_iso_seconds_reads_knatives_durations() -> None:
    assert [iso_seconds(t) for t in ("PT2S", "PT0.5S", "PT1M30S", "PT1H")] == [2, 0.5, 90, 3600]


def test_the_brokers_retries_outlast_a_teams_retry_after() -> None:
    """A request over its team's ``MAX_RUNS_PER_TEAM`` is answered 429 with ``Retry-After``
    (``functions/service/teams.py``), which the shipped Broker does not wait for (no
    ``retryAfterMax``: Knative's webhook refuses it unless config-features enables the alpha
    ``delivery-retryafter``, which a user's cluster may not). So the retries alone give the
    team's runs time to end: they span ``RETRY_AFTER_PERIODS`` Retry-After periods, and at
    least three come after the first period has passed. (Before: five retries from PT1S, 31 s,
    and a burst over the limit was dead-lettered.)"""
    from functions.service.teams import RETRY_AFTER_SECONDS

    delivery = _one("Broker", "default")["spec"]["delivery"]
    assert "retryAfterMax" not in delivery
    times = retry_times(delivery)
    assert times[-1] >= RETRY_AFTER_PERIODS * RETRY_AFTER_SECONDS, times
    assert sum(t >= RETRY_AFTER_SECONDS for t in times) >= 3, times


def test_retry_times_follow_knatives_formula() -> None:
    """Knative's own figures for its formula (the DeliverySpec's doc: exponential
    ``backoffDelay*2^<numberOfRetries>``); the 31 s of the budget shipped before."""
    old = {"retry": 5, "backoffPolicy": "exponential", "backoffDelay": "PT1S"}
    assert retry_times(old) == [1, 3, 7, 15, 31]
    linear = {"retry": 3, "backoffPolicy": "linear", "backoffDelay": "PT5S"}
    assert retry_times(linear) == [0, 5, 15]


def _broker_sink(binding: dict) -> None:
    sink = binding["spec"]["sink"]["ref"]
    assert (sink["apiVersion"], sink["kind"]) == ("eventing.knative.dev/v1", "Broker")
    _one("Broker", sink["name"])


def _selects(binding: dict, labels: dict[str, str]) -> bool:
    subject = binding["spec"]["subject"]
    assert set(subject["selector"]) == {"matchLabels"}, "match labels only"
    return all(labels.get(k) == v for k, v in subject["selector"]["matchLabels"].items())


def test_no_sinkbinding_reaches_task_pods() -> None:
    """A SinkBinding on Jobs would give K_SINK to every container of a task pod, the
    resource's included: the pod spec gives it to collect alone (test_pod_spec)."""
    from functions.runtimes.kube.podspec import labels

    task_labels = labels(make_plan())
    for binding in _all("SinkBinding"):
        if binding["spec"]["subject"]["kind"] in {"Job", "Pod"}:
            assert not _selects(binding, task_labels), f"{_name(binding)} selects task Jobs"
    main = [d for p in _kustomize_resources(KNATIVE) for d in _load(p)]
    bound = {_name(d) for d in main if _kind(d) == "SinkBinding"}
    assert bound == {"function-replies", "relay-replies"}


def test_the_reply_relay_alone_gets_the_broker_as_sink_and_no_store() -> None:
    """Task pods post their replies to the relay (TASK_REPLY_SINK), which forwards them:
    it needs K_SINK and CACHE_SECRET (its tokens), nothing of the store and no API token."""
    binding = _one("SinkBinding", "relay-replies")
    subject = binding["spec"]["subject"]
    assert subject == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reply-relay"}
    _broker_sink(binding)
    relay = _one("Deployment", "reply-relay")
    pod = relay["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["args"] == ["serve", "reply-relay"]
    refs = [e["secretRef"]["name"] for e in container.get("envFrom", [])]
    assert refs == ["resource-functions-cache"]
    service = _one("Service", "reply-relay")
    host = f"{_name(service)}.{service['metadata']['namespace']}.svc.cluster.local"
    assert _config_data()["TASK_REPLY_SINK"] == f"http://{host}"


def test_only_the_broker_may_deliver_to_the_functions() -> None:
    """The EventPolicy on the functions (its schema is checked against the release's CRD
    with every other Knative kind): only the Broker's Triggers may deliver, under the
    identities Knative gives them (a Broker has none of its own to name)."""
    policy = _one("EventPolicy", "functions-from-broker")
    assert policy["apiVersion"] == "eventing.knative.dev/v1alpha1"
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert set(policy["spec"]) == {"to", "from"}
    (to,) = policy["spec"]["to"]
    assert set(to) == {"selector"} and set(to["selector"]) == {"apiVersion", "kind", "matchLabels"}
    assert (to["selector"]["apiVersion"], to["selector"]["kind"]) == (
        "serving.knative.dev/v1",
        "Service",
    )
    selected = {
        _name(svc)
        for svc in _knative_services()
        if all(
            (svc["metadata"].get("labels") or {}).get(k) == v
            for k, v in to["selector"]["matchLabels"].items()
        )
    }
    assert selected == set(ACTIONS)
    assert policy["spec"]["from"] == [{"sub": identity} for identity in _trigger_identities()]


def _trigger_identities() -> list[str]:
    """The identities Knative gives the shipped Triggers (``<trigger>-oidc-<group>-trigger``)."""
    triggers = [_name(t) for t in _load(KNATIVE / "triggers.yaml") if _kind(t) == "Trigger"]
    assert len(triggers) == len(ACTIONS)
    return [
        f"system:serviceaccount:{NAMESPACE}:{t}-oidc-eventing.knative.dev-trigger" for t in triggers
    ]


def test_function_services_get_the_broker_as_sink() -> None:
    """Async mode: the functions' follower posts failures that collect never saw to K_SINK,
    which Knative Services only get from a SinkBinding."""
    binding = _one("SinkBinding", "function-replies")
    subject = binding["spec"]["subject"]
    assert (subject["apiVersion"], subject["kind"]) == ("serving.knative.dev/v1", "Service")
    assert "name" not in subject and "namespace" not in subject
    _broker_sink(binding)
    selected = {
        _name(s)
        for s in _knative_services()
        if _selects(binding, s["metadata"].get("labels") or {})
    }
    assert selected == set(ACTIONS), "exactly the three functions (never dead-letter)"
    for other in _all("SinkBinding"):
        if other is not binding and other["spec"]["subject"].get("selector"):
            assert not any(
                _selects(other, s["metadata"].get("labels") or {}) for s in _knative_services()
            )


def test_no_pingsource_pretends_to_send_requests() -> None:
    # A PingSource's events have type dev.knative.sources.ping whatever ceOverrides say.
    for source in _all("PingSource"):
        extensions = (source["spec"].get("ceOverrides") or {}).get("extensions") or {}
        assert "type" not in extensions, f"PingSource/{_name(source)} cannot override type"
        # Nor any other spec attribute: the adapter refuses to send such an event.
        assert not {"subject", "id", "source", "specversion", "time"} & set(extensions)


# --- RBAC: least privilege ----------------------------------------------------------------


TEKTON_LEADER = "resource-functions-tekton-leader"
TEKTON_ROLES = {TEKTON_CONTROLLER, TEKTON_LEADER}


def test_role_grants_exactly_the_task_verbs() -> None:
    roles = [r for r in _all("Role") if _name(r) not in TEKTON_ROLES]
    assert [_name(r) for r in roles] == ["resource-functions-tasks"]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in roles[0]["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected keys in {rule}"
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key not in granted, f"{key} granted twice"
                granted[key] = set(rule["verbs"])
    assert granted == EXPECTED_ROLE_RULES
    assert roles[0]["metadata"]["namespace"] == _config_data()["TASK_NAMESPACE"]


def test_credentials_role_only_gets_secrets_and_is_bound_per_team() -> None:
    role = _one("ClusterRole", CREDENTIALS_ROLE)
    assert "namespace" not in role["metadata"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    bound = [b["roleRef"]["name"] for b in _all("ClusterRoleBinding")]
    assert CREDENTIALS_ROLE not in bound, "never bound cluster-wide"
    team_bindings = [
        b
        for b in _all("RoleBinding")
        if b["roleRef"]["kind"] == "ClusterRole"
        # knative/tekton/examples/: Tekton Triggers' own roles for its EventListener
        and not b["roleRef"]["name"].startswith("tekton-triggers-eventlistener-")
    ]
    assert [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in team_bindings] == [
        (TEAM_NAMESPACE, CREDENTIALS_ROLE)
    ]
    assert team_bindings[0]["subjects"] == [
        {"kind": "ServiceAccount", "name": FUNCTION_SA, "namespace": NAMESPACE}
    ]
    from functions.credentials.namespace_secrets import DEFAULT_PREFIX

    prefix = _config_data()["CREDENTIALS_KUBERNETES_NAMESPACE_PREFIX"]
    assert prefix == DEFAULT_PREFIX and TEAM_NAMESPACE.startswith(prefix)
    included = {path.resolve() for path in _kustomize_resources(KNATIVE)}
    assert not any(p.is_relative_to(TEAMS) for p in included), "applied per team"


def test_role_is_bound_to_the_functions_only() -> None:
    bindings = [
        b
        for b in _all("RoleBinding")
        if b["roleRef"]["kind"] == "Role" and _name(b) not in TEKTON_ROLES
    ]
    assert len(bindings) == 1
    binding = bindings[0]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "resource-functions-tasks",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FUNCTION_SA, "namespace": NAMESPACE}
    ]


@pytest.mark.parametrize("account", [TASK_SA, "dead-letter"])
def test_unprivileged_accounts_have_no_token_and_no_binding(account: str) -> None:
    assert _one("ServiceAccount", account).get("automountServiceAccountToken") is False
    for binding in _all("RoleBinding") + _all("ClusterRoleBinding"):
        names = {s.get("name") for s in binding.get("subjects", [])}
        assert account not in names, f"{_name(binding)} binds {account}"
    assert _config_data()["TASK_SERVICE_ACCOUNT"] == TASK_SA


# --- Services -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "service", [pytest.param(s, id=f"Service/{_name(s)}") for s in _knative_services()]
)
def test_every_service_is_cluster_local(service: dict) -> None:
    labels = service["metadata"].get("labels") or {}
    assert labels.get("networking.knative.dev/visibility") == "cluster-local"


@pytest.mark.parametrize(
    "service",
    [
        pytest.param(s, id=f"Service/{_name(s)}")
        for s in _knative_services()
        if _runs_project_image(s)
    ],
)
def test_project_services_are_probed_and_locked_down(service: dict) -> None:
    template = service["spec"]["template"]
    container = _container(service)
    assert container["ports"] == [{"containerPort": 8080}]
    # The action services are ready when their store and runtime answer (/readyz); the
    # relay and the dead-letter sink have no runtime and serve /healthz for both.
    ready = "/readyz" if _name(service) in ("check", "get", "put") else "/healthz"
    assert container["readinessProbe"]["httpGet"] == {"path": ready, "port": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    assert "periodSeconds" not in container["readinessProbe"], "keeps Knative's fast probing"
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert "emptyDir" in volumes[next(n for n, p in mounts.items() if p == "/tmp")]
    resources = container["resources"]
    assert resources["requests"]
    assert resources["limits"].get("memory")
    annotations = template["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "0"
    assert int(annotations["autoscaling.knative.dev/max-scale"]) >= 1
    assert container["args"][0] == "serve"
    assert "command" not in container


@pytest.mark.parametrize("service", _function_services())
def test_function_service_contract(service: dict) -> None:
    name = _name(service)
    spec = service["spec"]["template"]["spec"]
    container = _container(service)
    assert spec["serviceAccountName"] == FUNCTION_SA
    _one("ServiceAccount", FUNCTION_SA)
    assert container["image"] == PROJECT_IMAGE
    assert container["args"] == ["serve", name]
    assert (spec["containerConcurrency"], spec["timeoutSeconds"]) == EXPECTED_SERVICE_SETTINGS[name]
    sources = [
        ("configMap", e["configMapRef"]["name"])
        if "configMapRef" in e
        else ("secret", e["secretRef"]["name"])
        for e in container["envFrom"]
    ]
    assert sources == [
        ("configMap", CONFIG_MAP),
        ("secret", CACHE_SECRET),
        ("secret", STORE_SECRET),
    ]
    # Configuration lives in the ConfigMap, credentials in Secrets; inline values only to fit
    # the task budget into a Service's timeout (see test_task_budget_fits_the_request_timeout).
    for item in container.get("env", []):
        assert set(item) == {"name", "value"} and item["name"] in BUDGET_ENV, item


def _effective_env(service: dict) -> dict[str, str]:
    """The function's environment from the manifests: envFrom ConfigMaps, then `env`
    (which wins, as in Kubernetes). Secrets are left out: they hold no timing settings."""
    container = _container(service)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(_one("ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    return env


@pytest.mark.parametrize("service", _function_services())
def test_task_budget_fits_the_request_timeout(service: dict) -> None:
    """In sync mode the function holds the request until the task Job ends: the resource's
    timeout, the margin for pulls/stage/collect and the runtime's slack past the Job's
    deadline (plus the wait for a completed Job's result) must end before Knative's
    timeoutSeconds, or Knative cuts the request and the Broker redelivers a running task."""
    from functions.runtimes.kube.job_plan import KubernetesConfig
    from functions.settings import Settings

    settings = Settings.from_env({**_effective_env(service), "CACHE_SECRET": "0" * 64})
    runtime = KubernetesConfig(namespace="ns", service_account="sa", task_image="img")
    waits = runtime.deadline_slack_seconds + runtime.result_wait_seconds
    assert runtime.deadline_slack_seconds >= 30
    limit = service["spec"]["template"]["spec"]["timeoutSeconds"]
    timeouts = {"TASK_TIMEOUT_SECONDS": settings.task_timeout_seconds}
    timeouts |= {
        f"RESOURCE_TYPES[{name}].timeout_seconds": rt.timeout_seconds
        for name, rt in settings.resource_types.items()
        if rt.timeout_seconds
    }
    for what, timeout in timeouts.items():
        total = timeout + settings.task_margin_seconds + waits
        assert total < limit, (
            f"Service/{_name(service)}: {what} {timeout:g} + TASK_MARGIN_SECONDS "
            f"{settings.task_margin_seconds:g} + {waits:g} s = {total:g} s, not under "
            f"timeoutSeconds {limit}"
        )


def test_dead_letter_service_sees_no_secrets() -> None:
    service = _one("Service", "dead-letter", "serving.knative.dev")
    container = _container(service)
    assert container["args"] == ["serve", "dead-letter"]
    assert service["spec"]["template"]["spec"]["serviceAccountName"] == "dead-letter"
    assert all("secretRef" not in e for e in container.get("envFrom", []))
    assert "env" not in container


# --- configuration and secrets ------------------------------------------------------------


def test_config_holds_no_secrets() -> None:
    data = _config_data()
    secret_keys, secret_values = set(SECRET_ENV_NAMES), set()
    for secret in _all("Secret"):
        values = _secret_values(secret)
        secret_keys |= set(values)
        secret_values |= {v for v in values.values() if len(v) >= 8}
    assert not secret_keys & set(data), (
        f"credential keys in the ConfigMap: {secret_keys & set(data)}"
    )
    for key, value in data.items():
        assert not any(s in value for s in secret_values), f"{key} holds a Secret's value"


def test_config_values_are_what_the_functions_accept() -> None:
    data = _config_data()
    assert data["RUNTIME"] == "kubernetes"
    assert data["REPLY_MODE"] in {"sync", "async"}
    assert data["ARCHIVE_FORMAT"] in {"zstd", "gzip", "none"}
    assert int(data["ARCHIVE_LEVEL"]) >= 1
    assert int(data["TASK_TIMEOUT_SECONDS"]) > 0
    assert int(data["TASK_TTL_SECONDS"]) > 0
    assert data["STORE_URL"].split("://")[0] in {"s3", "gs"}
    assert data["TASK_IMAGE"] == PROJECT_IMAGE  # rewritten by kustomize (see replacements)
    assert data["TASK_STORE_SECRET"] == STORE_SECRET
    types = json.loads(data["RESOURCE_TYPES"])
    assert {"git", "time", "registry-image", "s3"} <= set(types)
    for name, spec in types.items():
        image = spec if isinstance(spec, str) else spec["image"]
        assert re.fullmatch(
            r"[a-z0-9.-]+(:\d+)?/[a-z0-9./_-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", image
        ), f"{name}: {image!r} is not a fully qualified image reference"

    # The functions' own parser is the judge of the rest (types, choices, numbers).
    from functions.settings import Settings

    settings = Settings.from_env({**data, "CACHE_SECRET": "0" * 64})
    assert settings.runtime == "kubernetes"
    assert settings.task_namespace == TASKS_NAMESPACE
    assert settings.task_service_account == TASK_SA
    assert set(settings.resource_types) == set(types)
    assert settings.allowed_images == (), "the shipped config runs the catalogue only"
    assert settings.credentials_provider == "kubernetes"


EXPECTED_SECRET_KEYS = {
    STORE_SECRET: {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_ENDPOINT_URL_S3",
    },
    CACHE_SECRET: {"CACHE_SECRET"},
    "resource-functions-kafka-auth": {"protocol", "sasl.mechanism", "user", "password", "ca.crt"},
}


@pytest.mark.parametrize(("path", "doc"), _params(kinds={"Secret"}))
def test_example_secrets_hold_placeholders_only(path: Path, doc: dict) -> None:
    assert "data" not in doc, "examples use readable stringData placeholders"
    assert set(doc["stringData"]) == EXPECTED_SECRET_KEYS[_name(doc)]
    for key, value in doc["stringData"].items():
        if key in SECRET_ENV_NAMES:
            assert value.startswith("REPLACE-ME"), f"{key} must be a placeholder"


def test_deployment_never_overwrites_credentials() -> None:
    # `kubectl apply -k knative/` is re-run on every upgrade: it must not carry Secrets.
    included = list(_kustomize_resources(KNATIVE))
    kinds = {_kind(doc) for path in included for doc in _load(path)}
    assert "Secret" not in kinds, "Secrets belong in knative/credentials/, applied once"


# --- kustomize -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "directory",
    sorted({p.parent for p in YAML_FILES}),
    ids=lambda d: _rel(d) if d != KNATIVE else "knative",
)
def test_kustomization_lists_every_file(directory: Path) -> None:
    kustomization_path = directory / KUSTOMIZATION
    assert kustomization_path.is_file(), f"{directory} has YAML files but no {KUSTOMIZATION}"
    kustomization = yaml.safe_load(kustomization_path.read_text())
    if kustomization["kind"] == "Component":  # namespaced by the kustomization using it
        assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    else:
        assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
        assert kustomization["kind"] == "Kustomization"
        # Each manifest names its own namespace (the deployment spans two); a team's
        # binding is namespaced per team by its kustomization.
        # The extras (examples/, monitoring/) live in the functions' namespace alone.
        single = {
            TEAMS: TEAM_NAMESPACE,
            KNATIVE: None,
            KNATIVE / "credentials": None,
            TEKTON_STEPS: TEKTON_STEPS_NAMESPACE,
            TEKTON_EXAMPLES: None,
        }
        assert kustomization.get("namespace") == single.get(directory, NAMESPACE)
    assert "configMapGenerator" not in kustomization
    assert "secretGenerator" not in kustomization
    listed = kustomization.get("resources", []) + [
        p["path"] for p in kustomization.get("patches", [])
    ]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    for entry in listed:
        assert (directory / entry).exists(), f"listed but missing: {entry}"
    files = {
        p.name
        for p in directory.iterdir()
        if p.suffix in {".yaml", ".yml"} and p not in NOT_MANIFESTS | APPLIED_BY_HAND
    } - {KUSTOMIZATION}
    listed_files = {e for e in listed if (directory / e).is_file()}
    assert files == listed_files, (
        f"not listed: {sorted(files - listed_files)}; "
        f"not files here: {sorted(listed_files - files)}"
    )


def test_kustomization_sets_the_project_image_everywhere() -> None:
    kustomization = yaml.safe_load((KNATIVE / KUSTOMIZATION).read_text())
    images = {i["name"]: i for i in kustomization["images"]}
    assert set(images[PROJECT_IMAGE]) >= {"name", "newName"}
    # TASK_IMAGE follows the rewritten image of the check Service.
    (replacement,) = kustomization["replacements"]
    source = replacement["source"]
    assert (source["kind"], source["name"]) == ("Service", "check")
    assert source["fieldPath"] == "spec.template.spec.containers.[name=function].image"
    assert _container(_one("Service", "check", "serving.knative.dev"))["name"] == "function"
    (target,) = replacement["targets"]
    assert target["select"] == {"kind": "ConfigMap", "name": CONFIG_MAP}
    assert target["fieldPaths"] == ["data.TASK_IMAGE"]
    # Examples and credentials are applied on their own, never by the main kustomization.
    assert not {"examples", "credentials", "teams", "monitoring"} & {
        Path(r).parts[0] for r in kustomization["resources"]
    }


def _kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def test_kustomize_build_renders_the_image_into_services_and_task_image() -> None:
    command = _kustomize_command()
    if command is None:
        if os.environ.get("CI"):
            pytest.fail(
                "neither kustomize nor kubectl is installed (.ci/setup --tests installs one)"
            )
        pytest.skip("neither kustomize nor kubectl is installed")
    out = subprocess.run(
        [*command, str(KNATIVE)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    kustomization = yaml.safe_load((KNATIVE / KUSTOMIZATION).read_text())
    image = kustomization["images"][0]
    expected = image["newName"] + (f":{image['newTag']}" if image.get("newTag") else "")
    services = [
        d for d in rendered if d["kind"] == "Service" and _group(d) == "serving.knative.dev"
    ]
    assert {c["image"] for s in services for c in s["spec"]["template"]["spec"]["containers"]} == {
        expected
    }
    (config,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert config["data"]["TASK_IMAGE"] == expected
    selectors = {
        d["metadata"]["name"]: d["spec"]["subject"].get("selector", {}).get("matchLabels")
        for d in rendered
        if d["kind"] == "SinkBinding"
    }
    assert selectors == {
        "function-replies": {"resource-functions.dev/role": "function"},
        "relay-replies": None,  # the relay's Deployment by name
    }, "common labels must not leak into selectors"
    (relay,) = [d for d in rendered if d["kind"] == "Deployment"]
    assert (
        relay["spec"]["selector"]["matchLabels"]
        == relay["spec"]["template"]["metadata"]["labels"]
        == {
            "app.kubernetes.io/name": "resource-functions",
            "app.kubernetes.io/component": "reply-relay",
        }
    )
    assert {c["image"] for c in relay["spec"]["template"]["spec"]["containers"]} == {expected}


# --- the sender-auth component -------------------------------------------------------------

SENDER_AUTH = KNATIVE / "sender-auth"


def _merged(base: Any, patch: Any) -> Any:
    """A strategic-merge patch as kustomize applies ours: maps merge, anything else replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {k: _merged(base.get(k), v) for k, v in patch.items()} | {
            k: v for k, v in base.items() if k not in patch
        }
    return patch


def _with_component(directory: Path) -> list[dict]:
    """The main deployment with a component applied (resources added, patches merged)."""
    component = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    docs = [doc for path in _kustomize_resources(KNATIVE) for doc in _load(path)]
    docs += [doc for entry in component.get("resources", []) for doc in _load(directory / entry)]
    for entry in component.get("patches", []):
        for patch in _load(directory / entry["path"]):
            matches = [
                i
                for i, doc in enumerate(docs)
                if (_kind(doc), _name(doc)) == (_kind(patch), _name(patch))
            ]
            assert len(matches) == 1, (
                f"{entry['path']}: {_kind(patch)}/{_name(patch)} patches nothing"
            )
            if patch.get("$patch") == "delete":
                del docs[matches[0]]
            else:
                docs[matches[0]] = _merged(docs[matches[0]], patch)
    return docs


def _with_sender_auth() -> list[dict]:
    return _with_component(SENDER_AUTH)


def test_the_broker_takes_a_teams_events_only_from_its_senders() -> None:
    """Through the Broker the function sees only its Trigger: the Broker's policy per team
    names the original senders and filters on the team attribute; the functions let the
    Triggers relay any team (SENDER_TEAMS), requiring the attribute to equal build.team."""
    policy = _one("EventPolicy", "broker-team-main")
    (target,) = policy["spec"]["to"]
    assert target["ref"] == {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Broker",
        "name": "default",
    }
    assert all(set(sender) == {"sub"} for sender in policy["spec"]["from"])
    assert policy["spec"]["filters"] == [{"exact": {"team": "main"}}]
    from functions.replies import TEAM_ATTRIBUTE
    from functions.service.teams import allows
    from functions.settings import Settings

    assert TEAM_ATTRIBUTE == "team"
    config = yaml.safe_load((SENDER_AUTH / "config-patch.yaml").read_text())["data"]
    settings = Settings.from_env({**config, "CACHE_SECRET": "x" * 32})
    trigger = f"system:serviceaccount:{NAMESPACE}:get-requested-oidc-eventing.knative.dev-trigger"
    assert allows(settings.sender_teams, trigger, "main")
    assert not allows(
        settings.sender_teams, "system:serviceaccount:ci:pipeline-engine-main", "main"
    )


def _policy_passes(policy: dict, **attributes: str) -> bool:
    """Whether an event with ``attributes`` passes an EventPolicy's filters (all of them)."""
    return all(_filter_matches(e, attributes) for e in policy["spec"].get("filters") or [])


def _event_kinds() -> dict[str, set[str]]:
    from functions.replies import DISCOVERED_TYPE, reply_type

    return {
        "replies": {reply_type(a, ok) for a in ACTIONS for ok in (True, False)},
        "requests": {f"dev.resourcefunctions.{a}.requested" for a in ACTIONS},
        "discovered": {DISCOVERED_TYPE},
    }


def test_the_broker_takes_replies_and_discoveries_from_the_functions_and_nothing_else() -> None:
    """Once a policy applies to the Broker, it takes only what a policy allows: the functions'
    and the relay's SinkBinding identities (their posts) and the Triggers' (replies in a
    delivery's response) may post replies and discovered versions, never a request."""
    policy = _one("EventPolicy", "broker-replies")
    assert policy["spec"]["to"] == _one("EventPolicy", "broker-team-main")["spec"]["to"]
    bindings = {
        f"system:serviceaccount:{NAMESPACE}:{_name(d)}-oidc-sources.knative.dev-sinkbinding"
        for p, d in DOCS
        if _kind(d) == "SinkBinding" and p.parent == KNATIVE
    }
    assert len(bindings) == 2  # the functions' and the relay's
    senders = {s["sub"] for s in policy["spec"]["from"]}
    assert senders == set(_trigger_identities()) | bindings
    kinds = _event_kinds()
    for kind in set().union(*kinds.values()):
        passes = _policy_passes(policy, type=kind, team="main")
        assert passes == (kind not in kinds["requests"]), kind
    team_senders = {s["sub"] for s in _one("EventPolicy", "broker-team-main")["spec"]["from"]}
    assert not team_senders & senders, "one policy per sender"


def test_the_tekton_controller_may_post_requests_of_its_teams_alone() -> None:
    policy = _one("EventPolicy", "broker-tekton-controller")
    (sender,) = policy["spec"]["from"]
    binding = _from_tekton("SinkBinding", "tekton-controller-requests")
    assert sender["sub"] == (
        f"system:serviceaccount:{NAMESPACE}:{_name(binding)}-oidc-sources.knative.dev-sinkbinding"
    )
    kinds = _event_kinds()
    for kind in set().union(*kinds.values()):
        passes = _policy_passes(policy, type=kind, team="tekton-main")
        assert passes == (kind in kinds["requests"]), kind
    assert not _policy_passes(policy, type="dev.resourcefunctions.get.requested", team="main")
    assert not _policy_passes(policy, type="dev.resourcefunctions.get.requested")
    others = {
        s["sub"]
        for name in ("broker-team-main", "broker-replies")
        for s in _one("EventPolicy", name)["spec"]["from"]
    }
    assert sender["sub"] not in others, "one policy per sender"


def test_sender_auth_component_renders_a_consistent_deployment() -> None:
    """Only the three Triggers' own identities may deliver, each delivery carries a token for
    the functions' audience, the functions may review tokens, and replies stay asynchronous:
    the functions and the relay keep their SinkBindings (whose tokens the Broker takes)."""
    from functions.settings import Settings

    docs = _with_sender_auth()
    for doc in docs:
        if _group(doc) in KNATIVE_GROUPS and _kind(doc) not in NO_CRD_KINDS:
            assert not _crd_errors(doc), (_kind(doc), _name(doc), _crd_errors(doc))
    (config,) = [d for d in docs if _kind(d) == "ConfigMap"]
    settings = Settings.from_env({**config["data"], "CACHE_SECRET": "x" * 32})
    assert settings.reply_mode == "async" and settings.sender_audience
    triggers = [d for d in docs if _kind(d) == "Trigger"]
    assert {t["spec"]["subscriber"]["audience"] for t in triggers} == {settings.sender_audience}
    identities = {
        f"system:serviceaccount:{NAMESPACE}:{_name(t)}-oidc-eventing.knative.dev-trigger"
        for t in triggers
    }
    assert set(settings.allowed_senders) == identities
    (binding,) = [d for d in docs if _kind(d) == "ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FUNCTION_SA, "namespace": NAMESPACE}
    ]
    (role,) = [
        d for d in docs if _kind(d) == "ClusterRole" and _name(d) == binding["roleRef"]["name"]
    ]
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    sinks = {_name(d) for d in docs if _kind(d) == "SinkBinding"}
    assert sinks == {"function-replies", "relay-replies"}, "K_SINK and its token stay"
    main = yaml.safe_load((KNATIVE / KUSTOMIZATION).read_text())
    assert "components" not in main, "opt-in: it needs authentication-oidc"


# --- NetworkPolicies: who may reach whom ------------------------------------------------------

PRIVATE_RANGES = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"}


def test_task_pods_get_no_ingress_and_reach_only_dns_the_relay_and_public_addresses() -> None:
    policy = _one("NetworkPolicy", "task-pods")
    assert policy["metadata"]["namespace"] == _config_data()["TASK_NAMESPACE"]
    spec = policy["spec"]
    assert spec["podSelector"] == {} and set(spec["policyTypes"]) == {"Ingress", "Egress"}
    assert spec["ingress"] == []
    peers = [peer for rule in spec["egress"] for peer in rule["to"]]
    blocks = [peer["ipBlock"] for peer in peers if "ipBlock" in peer]
    (v4,) = [b for b in blocks if b["cidr"] == "0.0.0.0/0"]
    assert set(v4["except"]) >= PRIVATE_RANGES, "the cluster, the API and metadata stay out"
    selected = [p for p in peers if "ipBlock" not in p]
    names = {p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in selected}
    assert names == {"kube-system", NAMESPACE}
    (relay,) = [
        p
        for p in selected
        if p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == NAMESPACE
    ]
    assert relay["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "reply-relay"}}


def test_only_knative_reaches_the_functions_and_only_tasks_reach_the_relay() -> None:
    functions = _one("NetworkPolicy", "functions-from-knative")["spec"]
    (selector,) = functions["podSelector"]["matchExpressions"]
    assert set(selector["values"]) == {*ACTIONS, "dead-letter"}
    (rule,) = functions["ingress"]
    (peer,) = rule["from"]
    (namespaces,) = peer["namespaceSelector"]["matchExpressions"]
    assert set(namespaces["values"]) == {"knative-eventing", "knative-serving"}
    relay = _one("NetworkPolicy", "reply-relay-from-tasks")["spec"]
    (rule,) = relay["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TASKS_NAMESPACE}}}
    ]
    served = {
        c["ports"][0]["containerPort"]
        for c in _one("Deployment", "reply-relay")["spec"]["template"]["spec"]["containers"]
    }
    assert {p["port"] for p in rule["ports"]} == served


def test_a_warm_pods_agent_takes_checks_from_the_check_functions_pods_alone() -> None:
    """The agent's port, from the pods of the check Service (their component label), of the
    functions' namespace; the label the policy selects is the one warm pods carry."""
    from functions.runtimes.labels import WARM_POD_KEY_LABEL
    from functions.runtimes.warm.agent import PORT

    policy = _one("NetworkPolicy", "warm-pods-from-check")
    assert policy["metadata"]["namespace"] == TASKS_NAMESPACE
    spec = policy["spec"]
    assert spec["podSelector"] == {
        "matchExpressions": [{"key": WARM_POD_KEY_LABEL, "operator": "Exists"}]
    }
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": PORT}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    component = peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
    check = _one("Service", "check", "serving.knative.dev")
    labels = check["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == component == "check"


def test_the_functions_may_touch_secrets_only_in_the_task_namespace() -> None:
    for role in _all("Role"):
        for rule in role["rules"]:
            if "secrets" in rule["resources"]:
                assert role["metadata"]["namespace"] == TASKS_NAMESPACE, _name(role)
    own = [r for r in _all("Role") if r["metadata"]["namespace"] == NAMESPACE]
    assert [_name(r) for r in own] == [TEKTON_LEADER]  # the controller's Lease, nothing else
    assert own[0]["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]


# --- the Tekton Custom Task component (knative/tekton/) ------------------------------------


def _tekton_docs() -> list[dict]:
    return [d for p, d in DOCS if p.is_relative_to(TEKTON) and not p.is_relative_to(TEKTON_STEPS)]


def _from_tekton(kind: str, name: str) -> dict:
    (found,) = [d for d in _tekton_docs() if _kind(d) == kind and _name(d) == name]
    return found


def test_the_tekton_component_is_a_component_outside_the_base() -> None:
    component = yaml.safe_load((TEKTON / KUSTOMIZATION).read_text())
    assert component["kind"] == "Component"
    base = yaml.safe_load((KNATIVE / KUSTOMIZATION).read_text())
    assert "tekton" not in base.get("resources", []) + base.get("components", [])


def _reply_attributes(event_type: str, subject: str | None) -> dict[str, str]:
    return {
        "specversion": "1.0",
        "type": event_type,
        "source": "/resource-functions/get",
        "id": "1",
        **({"subject": subject} if subject else {}),
    }


def test_the_controllers_trigger_takes_replies_to_customruns_only() -> None:
    from functions.tekton.decide import subject

    trigger = _from_tekton("Trigger", "tekton-replies")
    ours = subject("team-a", "pr-1-fetch")

    def matches(event_type: str, subject_: str | None) -> bool:
        attributes = _reply_attributes(event_type, subject_)
        return all(_filter_matches(e, attributes) for e in trigger["spec"]["filters"])

    assert all(matches(t, ours) for t in REPLY_TYPES)
    assert not any(matches(t, ours) for t in REQUEST_TYPES.values())  # requests: secrets
    assert not matches("dev.resourcefunctions.version.discovered", ours)
    assert not any(matches(t, "pipelines/main") for t in REPLY_TYPES)  # another engine's
    assert not any(matches(t, None) for t in REPLY_TYPES)
    ref = trigger["spec"]["subscriber"]["ref"]
    assert (ref["kind"], ref["name"]) == ("Service", "tekton-controller")


def test_the_controller_may_read_customruns_and_write_their_status_not_touch_task_jobs() -> None:
    """It stops a run by a stop request through the Broker (functions.service.stop_requests):
    it has no right in the task namespace. It reads Resources and writes their status, not
    the Resources themselves (their spec is their namespace's)."""
    role = _from_tekton("ClusterRole", TEKTON_CONTROLLER)
    granted = {
        (g, r): sorted(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert granted == {
        ("tekton.dev", "customruns"): ["get", "list", "watch"],
        ("tekton.dev", "customruns/status"): ["get", "patch", "update"],
        ("resource-functions.dev", "resources"): ["get", "list", "watch"],
        ("resource-functions.dev", "resources/status"): ["get", "patch", "update"],
        ("", "namespaces"): ["get"],  # the team label
        ("", "events"): ["create"],  # on its CustomRuns
        ("authentication.k8s.io", "tokenreviews"): ["create"],  # its replies' tokens
    }
    task_namespace = _config_data()["TASK_NAMESPACE"]
    assert not [
        doc
        for doc in _tekton_docs()
        if _kind(doc) in ("Role", "RoleBinding") and doc["metadata"]["namespace"] == task_namespace
    ]
    account = {"kind": "ServiceAccount", "name": "tekton-controller", "namespace": NAMESPACE}
    binding = _from_tekton("ClusterRoleBinding", TEKTON_CONTROLLER)
    assert binding["subjects"] == [account]
    assert binding["roleRef"]["name"] == TEKTON_CONTROLLER


def test_the_controller_writes_status_only_of_its_own_kinds_by_admission() -> None:
    """RBAC cannot say which CustomRuns: a ValidatingAdmissionPolicy keeps the controller's
    status writes to resource-functions.dev ones (the cluster tier shows the API enforcing
    it)."""
    policy = _from_tekton(
        "ValidatingAdmissionPolicy", "resource-functions-tekton-controller-status"
    )
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["tekton.dev"], ["customruns/status"])
    (condition,) = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:resource-functions:tekton-controller" in condition["expression"]
    (validation,) = policy["spec"]["validations"]
    assert validation["expression"].count("'resource-functions.dev/v1alpha1'") == 2
    binding = _from_tekton(
        "ValidatingAdmissionPolicyBinding", "resource-functions-tekton-controller-status"
    )
    assert binding["spec"] == {
        "policyName": "resource-functions-tekton-controller-status",
        "validationActions": ["Deny"],
    }
    label = _from_tekton("ValidatingAdmissionPolicy", "resource-functions-team-label")
    (rule,) = label["spec"]["matchConstraints"]["resourceRules"]
    # every subresource too: an update of namespaces/status carries the labels (issue 50)
    assert rule["resources"] == ["namespaces", "namespaces/*"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert "resource-functions.dev/team" in json.dumps(label["spec"]["variables"])


def test_the_artifacts_service_holds_the_store_keys_and_may_only_review_tokens() -> None:
    """Tasks reach the store only through it: it has the store Secret (as the functions do)
    and may create TokenReviews and read Namespaces, nothing else."""
    from functions.cli.commands import build_parser

    deployment = _from_tekton("Deployment", "tekton-artifacts")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert build_parser().parse_args(container["args"]).action == "artifacts"
    assert {"configMapRef": {"name": CONFIG_MAP}} in container["envFrom"]
    assert {"secretRef": {"name": "resource-functions-store", "optional": True}} in container[
        "envFrom"
    ]
    assert spec["serviceAccountName"] == "tekton-artifacts"
    role = _from_tekton("ClusterRole", "resource-functions-tekton-artifacts")
    assert role["rules"] == [
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
    ]
    binding = _from_tekton("ClusterRoleBinding", "resource-functions-tekton-artifacts")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tekton-artifacts", "namespace": NAMESPACE}
    ]
    service = _from_tekton("Service", "tekton-artifacts")
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert _config_data()["ARTIFACT_AUDIENCE"] == "resource-functions-artifacts"
    assert _config_data()["TEKTON_TEAMS"] == ""


def test_pipeline_namespaces_reach_no_receiver_of_knative_eventing() -> None:
    fence = _from_tekton("NetworkPolicy", "eventing-not-from-pipelines")
    assert fence["metadata"]["namespace"] == "knative-eventing"
    (selector,) = fence["spec"]["podSelector"]["matchExpressions"]
    assert set(selector["values"]) == {
        "broker-ingress",
        "broker-filter",
        "imc-dispatcher",
        "kafka-broker-receiver",
        "kafka-channel-receiver",
    }
    ((source,),) = [rule["from"] for rule in fence["spec"]["ingress"]]
    assert source["namespaceSelector"]["matchExpressions"] == [
        {"key": "resource-functions.dev/team", "operator": "DoesNotExist"}
    ]


def test_the_controller_runs_the_subcommand_with_the_functions_config_and_no_secret() -> None:
    from functions.cli.commands import build_parser
    from functions.tekton.controller_config import ControllerConfig

    deployment = _from_tekton("Deployment", "tekton-controller")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == PROJECT_IMAGE
    assert build_parser().parse_args(container["args"]).command == "tekton-controller"
    assert container["envFrom"] == [{"configMapRef": {"name": CONFIG_MAP}}]
    assert "secret" not in json.dumps(spec).lower()
    env = {e["name"]: e.get("value", "from-the-pod") for e in container["env"]}
    # with the sender-auth component's settings, which the controller needs to start
    with_auth = yaml.safe_load((KNATIVE / "sender-auth" / "config-patch.yaml").read_text())
    config = ControllerConfig.from_env(
        {**_config_data(), **with_auth["data"], **env, "K_SINK": "http://broker"}
    )
    assert config.teams is None  # TEKTON_TEAMS empty: the namespaces labelled as teams
    assert config.leader_lease == "tekton-controller" and deployment["spec"]["replicas"] == 2
    downward = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert downward == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    binding = _from_tekton("SinkBinding", "tekton-controller-requests")
    assert binding["spec"]["subject"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "tekton-controller",
    }
    assert binding["spec"]["sink"]["ref"]["kind"] == "Broker"
    service = _from_tekton("Service", "tekton-controller")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == labels
    fence = _from_tekton("NetworkPolicy", "tekton-controller-from-knative")
    assert fence["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("name", ["resource-functions-unpack", "resource-functions-pack"])
def test_the_stepactions_reach_the_artifacts_service_with_the_pods_token_alone(name: str) -> None:
    from functions.cli.commands import build_parser

    (action,) = [d for p, d in DOCS if p.parent == TEKTON_STEPS and _name(d) == name]
    spec = action["spec"]
    assert spec["image"] == PROJECT_IMAGE
    assert spec["command"][:3] == ["python", "-m", "functions"]
    given = {p["name"]: f"/given/{p['name']}" for p in spec["params"]}
    argv = [
        re.sub(
            r"\$\((?:params|step\.results)\.([a-z-]+)(?:\.path)?\)",
            lambda m: given.get(m.group(1), "/tekton/result"),
            a,
        )
        for a in spec["command"][3:] + spec["args"]
    ]
    parsed = build_parser().parse_args(argv)
    assert (parsed.command, parsed.verb) == ("artifact", name.rpartition("-")[2])
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert set(env) == {"ARTIFACTS_URL", "ARTIFACTS_TOKEN_FILE"}, "no store settings"
    params = {p["name"]: p for p in spec["params"]}
    assert "store-credentials" not in params and "store-url" not in params and "team" not in params
    assert params["artifacts-url"]["default"] == (
        f"http://tekton-artifacts.{NAMESPACE}.svc.cluster.local"
    )
    (mount,) = spec["volumeMounts"]
    assert mount == {
        "name": "$(params.token-volume)",
        "mountPath": env["ARTIFACTS_TOKEN_FILE"].rpartition("/")[0],
        "readOnly": True,
    }
    assert params["token-volume"]["default"] == "resource-functions-token"


def test_no_example_task_holds_a_store_credential() -> None:
    """The example's Task mounts its pod's token for the artifacts service, no Secret."""
    docs = {(_kind(d), _name(d)): d for p, d in DOCS if p.parent == TEKTON_EXAMPLES}
    task = docs[("Task", "run-tests")]["spec"]
    (volume,) = task["volumes"]
    (projected,) = volume["projected"]["sources"]
    assert projected["serviceAccountToken"]["audience"] == _config_data()["ARTIFACT_AUDIENCE"]
    assert volume["name"] == "resource-functions-token"
    everything = json.dumps([d for p, d in DOCS if p.parent == TEKTON_EXAMPLES])
    assert "secretName" not in everything and "store-url" not in everything


def test_kustomize_renders_the_component_into_the_deployment(tmp_path: Path) -> None:
    command = _kustomize_command()
    if command is None:
        pytest.fail("neither kustomize nor kubectl is installed (.ci/setup --tests installs one)")
    copy_of = tmp_path / "knative"
    shutil.copytree(KNATIVE, copy_of)
    kustomization = yaml.safe_load((copy_of / KUSTOMIZATION).read_text())
    kustomization["components"] = ["tekton"]
    (copy_of / KUSTOMIZATION).write_text(yaml.safe_dump(kustomization))
    out = subprocess.run(
        [*command, str(copy_of)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    image = kustomization["images"][0]
    (controller,) = [
        d for d in rendered if d["kind"] == "Deployment" and _name(d) == "tekton-controller"
    ]
    assert controller["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"{image['newName']}:{image['newTag']}"
    )
    assert controller["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "resource-functions",
        "app.kubernetes.io/component": "tekton-controller",
    }
    steps = subprocess.run(
        [*command, str(copy_of / "tekton" / "steps")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert steps.returncode == 0, steps.stderr
    actions = [d for d in yaml.safe_load_all(steps.stdout) if d]
    assert {d["spec"]["image"] for d in actions} == {f"{image['newName']}:{image['newTag']}"}


def test_new_versions_reach_the_event_listener_through_a_channel_with_no_reply() -> None:
    docs = {(_kind(d), _name(d)): d for p, d in DOCS if p.parent == TEKTON_EXAMPLES}
    trigger = docs[("Trigger", "new-versions-to-tekton")]
    assert set(trigger["spec"]["filter"]["attributes"]) == {"type", "subject", "team"}
    assert trigger["spec"]["filter"]["attributes"]["type"] == (
        "dev.resourcefunctions.version.discovered"
    )
    assert not any(_trigger_matches(trigger, t) for t in [*REQUEST_TYPES.values(), *REPLY_TYPES])
    subscription = docs[("Subscription", "new-versions-to-tekton")]["spec"]
    assert "reply" not in subscription, "the listener's CloudEvent answer must be dropped"
    assert subscription["channel"] == trigger["spec"]["subscriber"]["ref"]
    listener = docs[("EventListener", "new-versions")]
    namespace = listener["metadata"]["namespace"]
    assert subscription["subscriber"]["uri"] == (
        f"http://el-{_name(listener)}.{namespace}.svc.cluster.local:8080"
    )
    binding = {
        p["name"]: p["value"] for p in docs[("TriggerBinding", "new-version")]["spec"]["params"]
    }
    assert binding["id"] == "$(header.Ce-Id)"
    (template,) = docs[("TriggerTemplate", "build-new-version")]["spec"]["resourcetemplates"]
    assert template["metadata"]["name"] == "new-$(tt.params.id)", "named after the event"
    assert "generateName" not in template["metadata"]


def test_the_git_example_checks_what_its_route_and_pipeline_take() -> None:
    """knative/tekton/examples/git-pipeline.yaml: the CronJob's check is a request the CLI
    parses, with the subject new-versions.yaml's Trigger routes on, for the repository the
    Pipeline builds; the TriggerTemplate runs that Pipeline with params it has; the tag is put
    only after the tests, from the Get's own artifact."""
    from functions.cli.commands import build_parser

    docs = {(_kind(d), _name(d)): d for p, d in DOCS if p.parent == TEKTON_EXAMPLES}
    cron = docs[("CronJob", "check-app")]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = cron["containers"]
    assert container["command"][:3] == ["python", "-m", "functions"]
    argv = [*container["command"][3:], *container["args"]]  # the kubelet expands $(EVENT_ID)
    args = build_parser().parse_args([a.replace("$(EVENT_ID)", "check-app-1") for a in argv])
    request = json.loads(args.data)
    trigger = docs[("Trigger", "new-versions-to-tekton")]["spec"]["filter"]["attributes"]
    assert (args.action, args.id, args.subject) == ("check", "check-app-1", trigger["subject"])
    assert request["type"] == "git" and request["version"] == "latest-known"

    pipeline = docs[("Pipeline", "build")]["spec"]
    defaults = {p["name"]: p.get("default") for p in pipeline["params"]}
    assert request["source"] == {"uri": defaults["repository"], "branch": defaults["branch"]}
    assert request["build"]["team"] == docs[("Pipeline", "build")]["metadata"]["namespace"]
    (run,) = docs[("TriggerTemplate", "build-new-version")]["spec"]["resourcetemplates"]
    assert run["spec"]["pipelineRef"]["name"] == "build"
    assert {p["name"] for p in run["spec"]["params"]} <= set(defaults)
    assert {p["name"] for p in pipeline["params"] if "default" not in p} == {"ref"}
    tasks = {t["name"]: t for t in pipeline["tasks"]}
    assert tasks["tag"]["runAfter"] == ["test"] and tasks["test"]["runAfter"] == ["fetch"]
    steps = docs[("Task", "run-tests")]["spec"]["steps"]
    assert not any("workingDir" in step for step in steps), "unpack could not write into it"
    inputs = {p["name"]: p["value"] for p in tasks["tag"]["params"]}["inputs"]
    assert inputs == '{"app": $(tasks.fetch.results.artifact)}'
    bound = docs[("SinkBinding", "check-app")]["spec"]["subject"]["selector"]["matchLabels"]
    job = docs[("CronJob", "check-app")]["spec"]["jobTemplate"]["metadata"]
    assert bound.items() <= job["labels"].items(), "the SinkBinding reaches the check's Jobs"


# --- the kafka component -----------------------------------------------------------------------

KAFKA = KNATIVE / "kafka"


def test_the_kafka_component_makes_the_broker_kafka_with_the_same_delivery() -> None:
    """The shipped choice of a durable Broker: class Kafka, its topic config beside it, and
    the delivery (retries, backoff, timeout, dead letter) of the in-memory one, unchanged."""
    component = yaml.safe_load((KAFKA / KUSTOMIZATION).read_text())
    assert component["kind"] == "Component"
    base = yaml.safe_load((KNATIVE / KUSTOMIZATION).read_text())
    assert "kafka" not in base.get("resources", []) + base.get("components", [])
    docs = _with_component(KAFKA)
    (broker,) = [d for d in docs if _kind(d) == "Broker"]
    assert broker["metadata"]["annotations"]["eventing.knative.dev/broker.class"] == "Kafka"
    assert broker["spec"]["delivery"] == _one("Broker", "default")["spec"]["delivery"]
    reference = broker["spec"]["config"]
    (config,) = [
        d
        for d in docs
        if _kind(d) == reference["kind"]
        and _name(d) == reference["name"]
        and d["metadata"]["namespace"] == reference["namespace"]
    ]
    data = config["data"]
    assert set(data) == {
        "bootstrap.servers",
        "default.topic.partitions",
        "default.topic.replication.factor",
        "auth.secret.ref.name",
    }
    assert int(data["default.topic.partitions"]) >= 1
    assert int(data["default.topic.replication.factor"]) == 3
    errors = _crd_errors(broker)
    assert not errors, "\n".join(errors)


# The Kafka Broker's pods that connect to Kafka (app labels of eventing-kafka-broker 1.22's
# release manifests): the control plane makes topics, the data planes produce and consume.
KAFKA_CLIENTS = {
    "kafka-controller",
    "kafka-broker-receiver",
    "kafka-broker-dispatcher",
    "kafka-channel-receiver",
    "kafka-channel-dispatcher",
}


def test_the_kafka_component_fences_kafka_to_knatives_kafka_pods_and_its_own() -> None:
    """Only Knative's Kafka pods and Kafka's own namespace reach Kafka's pods: the policy sits
    in the namespace the bootstrap servers name and admits nothing else."""
    docs = _with_component(KAFKA)
    (config,) = [
        d for d in docs if _kind(d) == "ConfigMap" and _name(d) == "resource-functions-kafka"
    ]
    host = config["data"]["bootstrap.servers"].split(",")[0].rsplit(":", 1)[0]
    (policy,) = [
        d for d in docs if _kind(d) == "NetworkPolicy" and _name(d) == "kafka-from-knative-only"
    ]
    _validate_core(policy, "1.34")
    assert policy["metadata"]["namespace"] == host.split(".")[1]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"] and spec["podSelector"]["matchLabels"]
    (rule,) = spec["ingress"]
    assert "ports" not in rule
    own, knative = rule["from"]
    assert own == {"podSelector": {}}  # Kafka's namespace alone: no namespaceSelector
    assert knative["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "knative-eventing"}
    }
    (expression,) = knative["podSelector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("app", "In")
    assert set(expression["values"]) == KAFKA_CLIENTS


def test_the_kafka_broker_authenticates_with_the_secret_its_config_names() -> None:
    """The component's ConfigMap names the Secret, in its own namespace (where the Kafka
    Broker looks); the credentials' example holds the keys the Kafka Broker reads, for
    SASL/SCRAM over TLS (placeholders: test_example_secrets_hold_placeholders_only)."""
    docs = _with_component(KAFKA)
    (config,) = [
        d for d in docs if _kind(d) == "ConfigMap" and _name(d) == "resource-functions-kafka"
    ]
    example = yaml.safe_load((KNATIVE / "credentials" / "kafka-credentials.yaml").read_text())
    _validate_core(example, "1.34")
    assert example["metadata"] == {
        "name": config["data"]["auth.secret.ref.name"],
        "namespace": config["metadata"]["namespace"],
    }
    data = example["stringData"]
    assert (data["protocol"], data["sasl.mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    assert data["user"] == data["password"] == "REPLACE-ME" and "REPLACE-ME" in data["ca.crt"]


def test_the_controller_takes_replies_only_from_its_reply_triggers_identity() -> None:
    """The reply Trigger asks Knative for a token of the audience the controller checks, and
    the controller's default reply sender is that Trigger's OIDC identity (issue 50)."""
    from functions.tekton.controller_config import REPLY_AUDIENCE, REPLY_TRIGGER, ControllerConfig

    trigger = _from_tekton("Trigger", REPLY_TRIGGER)
    assert trigger["spec"]["subscriber"]["audience"] == REPLY_AUDIENCE
    env = {**_config_data(), "K_SINK": "http://broker", "POD_NAMESPACE": NAMESPACE}
    env |= {"STORE_URL": "s3://bucket/ci", "SENDER_AUDIENCE": "resource-functions"}
    config = ControllerConfig.from_env(env)
    assert config.reply_audience == REPLY_AUDIENCE
    assert config.reply_senders == (
        f"system:serviceaccount:{NAMESPACE}:{REPLY_TRIGGER}-oidc-eventing.knative.dev-trigger",
    )
