"""Server-side defaults the kube-apiserver fills in on every write (apps/v1 and core/v1)."""

from __future__ import annotations

from scaler.emulator.apierrors import Obj

# apps/v1 SetDefaults_Deployment: 25% surge and 25% unavailable (of spec.replicas), ten old
# ReplicaSets kept, and 600 s for a rollout to make progress before it is marked failed.
ROLLING_UPDATE = {"maxUnavailable": "25%", "maxSurge": "25%"}
REVISION_HISTORY_LIMIT = 10
PROGRESS_DEADLINE_S = 600
# core/v1 pod defaults: 30 s between SIGTERM and SIGKILL.
TERMINATION_GRACE_PERIOD_S = 30


def _image_pull_policy(image: str) -> str:
    """`Always` for `:latest` or an untagged image, `IfNotPresent` otherwise (a digest pins)."""
    if "@" in image:
        return "IfNotPresent"
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod_spec(spec: Obj) -> None:
    """The defaults of a PodSpec, in place: the ones `kubectl get -o yaml` shows."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", TERMINATION_GRACE_PERIOD_S)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", _image_pull_policy(str(container.get("image", ""))))
        container.setdefault("resources", {})


def deployment(obj: Obj) -> None:
    """apps/v1 Deployment defaults, in place (on create, update and patch alike)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    strategy = spec.setdefault("strategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                for key, value in ROLLING_UPDATE.items():
                    rolling.setdefault(key, value)
    spec.setdefault("revisionHistoryLimit", REVISION_HISTORY_LIMIT)
    spec.setdefault("progressDeadlineSeconds", PROGRESS_DEADLINE_S)
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        pod_spec(template["spec"])


def namespace(obj: Obj) -> None:
    """core/v1 Namespace: the name label, the `kubernetes` finalizer (the namespace
    controller removes it once the contents are gone), and phase Active."""
    meta = obj.setdefault("metadata", {})
    meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    obj.setdefault("status", {}).setdefault("phase", "Active")


def apply(key: tuple[str, str], obj: Obj) -> None:
    """The defaults of the resource `key` ((group, plural)), in place; others have none here."""
    if key == ("apps", "deployments"):
        deployment(obj)
    elif key == ("", "namespaces"):
        namespace(obj)
