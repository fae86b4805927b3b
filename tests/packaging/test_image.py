"""The container image from scripts/build-image, run with runc as the chart runs it.

Each command runs in a fresh container from the image's own runtime configuration (its
user, entrypoint, environment and working directory, as `umoci raw runtime-config` derives
them), with a read-only root file system, a tmpfs on /tmp and a network namespace of its
own (loopback only), like the chart's `readOnlyRootFilesystem` pod with an emptyDir /tmp.
Building takes about 100 s with the base root file system cached (debootstrap adds about
75 s the first time); SCALER_TEST_IMAGE_ARCHIVE=dist/scaler-<version>.oci.tar tests an
archive built before instead. Deselect with `-m "not image"`.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.image, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BUILD_IMAGE = REPO / "scripts" / "build-image"
CONTAINERFILE = REPO / "Containerfile"
VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
ARCHIVE_ENV = "SCALER_TEST_IMAGE_ARCHIVE"
# The build needs debootstrap and umoci, the checks skopeo, running needs runc.
TOOLS = ("runc", "umoci", "skopeo", "debootstrap")
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120
SERVICE_UID = 65532
_container_ids = itertools.count()


def _unavailable() -> str | None:
    """Why the image cannot be built and run here, or None."""
    if os.geteuid() != 0:
        return "not root: building (debootstrap, chroot) and running (runc) the image need root"
    needed = TOOLS[:-1] if os.environ.get(ARCHIVE_ENV) else TOOLS  # no build, no debootstrap
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if "runc" in missing:
        return f"no container runtime: install runc (apt-get install {' '.join(missing)})"
    if missing:
        return f"missing {', '.join(missing)}: apt-get install {' '.join(missing)}"
    return None


@dataclass(frozen=True)
class Image:
    """One tag of the archive, unpacked: its root file system and runtime configuration."""

    tag: str
    bundle: Path
    image_config: dict[str, Any]
    runtime_config: dict[str, Any]

    @property
    def rootfs(self) -> Path:
        return self.bundle / "rootfs"

    def site_packages(self) -> Path:
        """The venv's site-packages as a path inside the container."""
        (found,) = self.rootfs.glob("opt/scaler/lib/python3.*/site-packages")
        return Path("/") / found.relative_to(self.rootfs)

    def run(self, *args: str, state: Path,
            timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """`scaler ARGS...` in a new container: the image's entrypoint with these arguments."""
        config = copy.deepcopy(self.runtime_config)
        config["process"]["args"] = [*config["process"]["args"], *args]
        config["process"]["terminal"] = False
        config["root"]["readonly"] = True
        config["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                                 "options": ["nosuid", "nodev", "mode=1777", "size=262144k"]})
        (self.bundle / "config.json").write_text(json.dumps(config))
        container = f"scaler-test-{os.getpid()}-{next(_container_ids)}"
        try:
            return subprocess.run(
                ["runc", "--root", str(state), "run", "--bundle", str(self.bundle), container],
                capture_output=True, text=True, timeout=timeout, check=False,
                stdin=subprocess.DEVNULL)
        finally:
            subprocess.run(["runc", "--root", str(state), "delete", "--force", container],
                           capture_output=True, timeout=30, check=False)


# In memory when the machine has a /dev/shm: the build and the two root file systems (about
# 700 MB) are written, read and removed in seconds there, against a minute on this VM's disk.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    # Removed at the end (not kept as pytest keeps tmp_path): they are large.
    with tempfile.TemporaryDirectory(prefix="scaler-image-test-", dir=SCRATCH) as name:
        yield Path(name)


@pytest.fixture(scope="module")
def archive(workdir: Path) -> Path:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true" and os.geteuid() == 0:
            pytest.fail(f"{reason}: in CI scripts/test installs these")
        pytest.skip(reason)
    given = os.environ.get(ARCHIVE_ENV)
    if given:
        return Path(given).resolve()
    out = workdir / "dist"
    built = subprocess.run(["bash", str(BUILD_IMAGE), "--out", str(out)], capture_output=True,
                           text=True, timeout=BUILD_TIMEOUT_S, check=False, cwd=REPO,
                           env={**os.environ, "TMPDIR": str(workdir)})
    assert built.returncode == 0, built.stderr[-3000:]
    path = out / f"scaler-{VERSION}.oci.tar"
    assert path.is_file(), built.stdout + built.stderr[-3000:]
    return path


@pytest.fixture(scope="module")
def layout(archive: Path, workdir: Path) -> Path:
    path = workdir / "layout"
    with tarfile.open(archive) as tar:
        tar.extractall(path, filter="data")
    return path


def _blob(layout: Path, digest: str) -> dict[str, Any]:
    algorithm, _, hexdigest = digest.partition(":")
    document: dict[str, Any] = json.loads((layout / "blobs" / algorithm / hexdigest).read_text())
    return document


def _manifest_digest(layout: Path, tag: str) -> str:
    index = json.loads((layout / "index.json").read_text())
    (digest,) = [m["digest"] for m in index["manifests"]
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    return str(digest)


def _unpack(layout: Path, tag: str, bundle: Path) -> Image:
    rootfs = bundle / "rootfs"
    bundle.mkdir()
    # `raw unpack`: the root file system alone, without umoci's mtree (twice as fast).
    for command in (["umoci", "raw", "unpack", "--image", f"{layout}:{tag}", str(rootfs)],
                    ["umoci", "raw", "runtime-config", "--image", f"{layout}:{tag}",
                     "--rootfs", str(rootfs), str(bundle / "config.json")]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr
    manifest = _blob(layout, _manifest_digest(layout, tag))
    return Image(tag=tag, bundle=bundle, image_config=_blob(layout, manifest["config"]["digest"]),
                 runtime_config=json.loads((bundle / "config.json").read_text()))


@pytest.fixture(scope="module")
def service(layout: Path, workdir: Path) -> Image:
    return _unpack(layout, VERSION, workdir / "service")


@pytest.fixture(scope="module")
def demo(layout: Path, workdir: Path) -> Image:
    return _unpack(layout, f"{VERSION}-demo", workdir / "demo")


@pytest.fixture(scope="module")
def state(workdir: Path) -> Path:
    """runc's state directory, private to these tests (not /run/runc)."""
    path = workdir / "runc"
    path.mkdir()
    return path


def _containerfile() -> dict[str, list[str]]:
    """The Containerfile's final stage: instruction -> its arguments, in order."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    stages = re.split(r"^FROM\s", text, flags=re.M)
    out: dict[str, list[str]] = {}
    for line in stages[-1].splitlines()[1:]:
        instruction, _, rest = line.strip().partition(" ")
        if instruction and not instruction.startswith("#"):
            out.setdefault(instruction, []).append(rest.strip())
    return out


def test_the_image_config_is_the_containerfiles(service: Image) -> None:
    """Both ways of building (buildah from the Containerfile, scripts/build-image) make the
    image the chart expects: uid 65532, the venv's `scaler` as entrypoint, no bytecode
    writes, the OCI labels."""
    config = service.image_config["config"]
    containerfile = _containerfile()
    assert config["User"] == f"{SERVICE_UID}:{SERVICE_UID}" == containerfile["USER"][-1]
    assert config["Entrypoint"] == json.loads(containerfile["ENTRYPOINT"][-1])
    assert config["WorkingDir"] == containerfile["WORKDIR"][-1]
    env = dict(item.split("=", 1) for item in config["Env"])
    declared = dict(pair.split("=", 1) for line in containerfile["ENV"] for pair in line.split())
    assert env == declared
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", labels["org.opencontainers.image.revision"])
    assert service.runtime_config["process"]["user"]["uid"] == SERVICE_UID


def test_the_archive_copies_with_its_digest(archive: Path, layout: Path, workdir: Path) -> None:
    """The publishing path (docs/release.md): skopeo reads the archive by tag and the copy
    keeps the manifest digest, so the digest printed at build time is the one to pin."""
    copied = workdir / "copied"
    for tag in (VERSION, f"{VERSION}-demo"):
        done = subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{archive}:{tag}",
                               f"oci:{copied}:{tag}"], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        assert _manifest_digest(copied, tag) == _manifest_digest(layout, tag)


def test_version(service: Image, state: Path) -> None:
    done = service.run("--version", state=state)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"scaler {VERSION}"


def test_validate_the_shipped_examples(service: Image, state: Path) -> None:
    policies = service.site_packages() / "scaler" / "data" / "policies"
    done = service.run("validate", str(policies), state=state)
    assert done.returncode == 0, done.stdout + done.stderr
    examples = sorted(p.name for p in (REPO / "config").glob("*.yaml"))
    assert examples and all(f"({policies}/{name}, document 0)" in done.stdout
                            for name in examples), done.stdout
    policy_count = sum((REPO / "config" / name).read_text().count("\nkind: ScalePolicy\n")
                       for name in examples)
    assert f"{policy_count} valid, 0 error(s)" in done.stdout


def test_run_starts_on_a_read_only_root(service: Image, state: Path) -> None:
    """`scaler run` gets as far as looking for a cluster (none here) without writing."""
    policies = service.site_packages() / "scaler" / "data" / "policies"
    done = service.run("run", "--dry-run", "--policies", str(policies), state=state)
    assert done.returncode == 1
    assert done.stderr.startswith("scaler could not start: no Kubernetes cluster to talk to"), \
        done.stderr


def test_the_code_is_compiled_at_build_time(service: Image) -> None:
    """Nothing is left for Python to compile (and write) at start-up."""
    package = service.rootfs / service.site_packages().relative_to("/") / "scaler"
    sources = sorted(package.rglob("*.py"))
    assert sources
    uncompiled = [str(p.relative_to(package)) for p in sources
                  if not list((p.parent / "__pycache__").glob(f"{p.stem}.cpython-3*.pyc"))]
    assert uncompiled == []


def test_the_service_image_has_no_simulator(service: Image, state: Path) -> None:
    """The service image carries the base install only: the demo says which extra it needs."""
    done = service.run("demo", "--duration", "60", "--no-ui", state=state)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "'sim' extra" in done.stderr, done.stderr


def test_the_demo_runs_in_the_demo_image(demo: Image, state: Path) -> None:
    """The demo tag adds the demo extra: the embedded nats-server, simulator and service run
    on loopback inside the container and the score table comes out."""
    done = demo.run("demo", "--duration", "60", "--no-ui", state=state, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = re.search(r"^inference/llama-8b: \d+ scale-ups, \d+ scale-downs, (\d+) "
                        r"evaluations, (\d+) reports", done.stdout, flags=re.M)
    assert summary is not None, done.stdout[-2000:]
    evaluations, reports = (int(group) for group in summary.groups())
    assert evaluations > 0 and reports > 0
    assert re.search(r"^scaler\s+\d", done.stdout, flags=re.M), done.stdout[-2000:]
