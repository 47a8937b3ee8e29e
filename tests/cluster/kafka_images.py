"""Knative's Kafka Broker's pieces for the test cluster: the build, and local images of its
control and data planes (``kafka_broker.py`` installs them and runs Kafka).

    tools = build_kafka()  # tests/cluster/build_kafka.sh: {"kafka-broker": DIR, "kafka": DIR}
    control_plane_images(tools["kafka-broker"])  # {"ko://…/cmd/kafka-controller": image, …}
    data_plane_images(tools["kafka-broker"])  # {"${KNATIVE_KAFKA_RECEIVER_IMAGE}": image, …}
    kafka_image(tools["kafka"] / "libs")  # Kafka itself, on the data plane's JRE

No registry serves these images, so they are built here, once per content:

- for the control plane's ``ko://knative.dev/…/cmd/<name>`` references of the release's
  manifests (``DIR/config``): each Go binary of ``DIR/bin`` in a ``buildah from scratch`` image
  (``knative.component_image``);
- for the data plane's ``${KNATIVE_KAFKA_RECEIVER_IMAGE}`` and
  ``${KNATIVE_KAFKA_DISPATCHER_IMAGE}`` (``DATA_PLANE``): the Vert.x receiver and dispatcher as
  the release's images run them (jib's layout of the ``-loom`` modules: ``java
  --enable-preview -cp /app/libs/* <Main>``), on the project's Debian base (its ``/bin/sh``,
  ``ls`` and ``cat`` serve the dispatcher's exec probes) with a JRE made by ``jlink`` from the
  Temurin JDK (the data plane needs Java 21 or newer; Debian has 17), as user 1001 (the
  release's ``runAsUser`` for these images; the manifests ask ``runAsNonRoot``). The jars both
  share are one layer, so the two images cost one copy of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from testbed.kubernetes import build_tools
from testbed.kubernetes.containerd_images import run
from testbed.kubernetes.knative import component_image
from tests.support.project_image import (
    BASE_IMAGE,
    build_lock,
    ensure_debian_base,
    image_exists,
    image_id,
)

REPO = "eventing-kafka-broker"
JDK = Path(os.environ.get("RF_JAVA_HOME", "/usr/lib/jvm/temurin-25-jdk-amd64"))
# What the jars need (jdeps of every jar, and the module-info of the modular ones): TLS and EC
# are in java.base, jdk.unsupported is Netty's Unsafe, jdk.management Micrometer's JVM metrics,
# java.desktop (java.beans) Quarkus' and Jackson's; jdk.compiler, named only by Vert.x's code
# generator (build time), is left out.
JRE_MODULES = (
    "java.base",
    "java.compiler",
    "java.desktop",
    "java.logging",
    "java.management",
    "java.naming",
    "java.net.http",
    "java.rmi",
    "java.security.jgss",
    "java.security.sasl",
    "java.sql",
    "java.transaction.xa",
    "java.xml",
    "jdk.crypto.ec",
    "jdk.management",
    "jdk.security.auth",
    "jdk.unsupported",
    "jdk.zipfs",
)
JLINK_OPTIONS = ("--strip-debug", "--no-header-files", "--no-man-pages", "--compress=zip-6")
DATA_PLANE_USER = "1001:1001"
# Name -> (the manifests' image placeholder, main class), as the release's jib builds have them.
DATA_PLANE = {
    "receiver": (
        "${KNATIVE_KAFKA_RECEIVER_IMAGE}",
        "dev.knative.eventing.kafka.broker.receiverloom.Main",
    ),
    "dispatcher": (
        "${KNATIVE_KAFKA_DISPATCHER_IMAGE}",
        "dev.knative.eventing.kafka.broker.dispatcherloom.Main",
    ),
}
JVM_FLAGS = ("--enable-preview",)  # the -loom modules' jib jvmFlags


def build_kafka() -> dict[str, Path]:
    """Directories of the Kafka Broker's build (``kafka-broker``) and of Kafka's jars
    (``kafka``), built on first use (minutes)."""
    return build_tools(Path(__file__).with_name("build_kafka.sh"))


def control_plane_images(build_dir: Path) -> dict[str, str]:
    """``ko://`` reference -> local image, for each one in ``build_dir/config/control-plane``
    whose binary was built (not the KafkaSource's controller); tagged with the build's name
    (release version and tarball hash), so a new tarball makes new images."""
    pattern = re.compile(r"ko://[\w.-]+(?:/[\w.-]+)+")
    config = build_dir / "config" / "control-plane"
    refs = {ref for path in config.rglob("*.yaml") for ref in pattern.findall(path.read_text())}
    images = {}
    for ref in sorted(refs):
        binary = build_dir / "bin" / ref.rsplit("/", 1)[1]
        if binary.is_file():
            images[ref] = component_image(binary, REPO, build_dir.name)
    return images


def data_plane_images(build_dir: Path) -> dict[str, str]:
    """The manifests' placeholders of the receiver's and the dispatcher's images
    (``DATA_PLANE``) -> their local images, tagged by a hash of everything in them (base,
    JDK, recipe, jars): reused when it exists."""
    libs = {name: _jars(build_dir / "data-plane" / name / "libs") for name in DATA_PLANE}
    # The jars of the same name and content in both: one layer under both images.
    first, *others = libs.values()
    shared = {
        jar: digest
        for jar, digest in first.items()
        if all(_digest_of(other, jar.name) == digest for other in others)
    }
    shared_names = {jar.name for jar in shared}
    with build_lock("kafka-data-plane-images"):
        ensure_debian_base(BASE_IMAGE)
        jre = _jre_image()
        base = _layer(
            f"localhost/rf-kafka-data-plane-libs:{_hash(jre, _names(shared))}", jre, shared
        )
        images = {}
        for name, (_, main) in DATA_PLANE.items():
            own = {
                jar: digest for jar, digest in libs[name].items() if jar.name not in shared_names
            }
            entrypoint = ["/opt/java/bin/java", *JVM_FLAGS, "-cp", "/app/libs/*", main]
            tag = _hash(base, _names(own), entrypoint, DATA_PLANE_USER)
            config = ["--entrypoint", json.dumps(entrypoint), "--cmd", ""]
            config += ["--user", DATA_PLANE_USER, "--workingdir", "/app"]
            ref = f"localhost/knative-kafka-broker-{name}-loom:{tag}"
            images[DATA_PLANE[name][0]] = _layer(ref, base, own, config)
        return images


def kafka_image(libs: Path) -> str:
    """Kafka's jars (``libs``, ``build_kafka.sh``) in ``/app/libs`` on the data plane's JRE:
    ``kafka_broker.KafkaServer``'s image, tagged by a hash of its content."""
    jars = _jars(libs)
    with build_lock("kafka-data-plane-images"):
        ensure_debian_base(BASE_IMAGE)
        jre = _jre_image()
        return _layer(f"localhost/rf-kafka:{_hash(jre, _names(jars))}", jre, jars)


def _jre_image() -> str:
    """The Debian base with ``/opt/java``, a JRE of ``JRE_MODULES`` linked from ``JDK``."""
    release = (JDK / "release").read_text()
    tag = _hash(image_id(BASE_IMAGE), release, JRE_MODULES, JLINK_OPTIONS)
    ref = f"localhost/rf-kafka-jre:{tag}"
    if image_exists(ref):
        return ref
    with tempfile.TemporaryDirectory(prefix="rf-kafka-jre-", dir="/var/tmp") as tmp:
        jre = Path(tmp) / "java"
        modules = ",".join(JRE_MODULES)
        jlink = [str(JDK / "bin" / "jlink"), "--add-modules", modules, *JLINK_OPTIONS]
        run([*jlink, "--output", str(jre)])
        env = [
            "JAVA_HOME=/opt/java",
            "PATH=/opt/java/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ]
        _commit(ref, BASE_IMAGE, [str(jre)], "/opt/java", [a for e in env for a in ("--env", e)])
    return ref


def _layer(ref: str, base: str, jars: dict[Path, str], config: list[str] | None = None) -> str:
    """``ref``: ``base`` plus ``jars`` in ``/app/libs`` (one layer) and the ``buildah config``
    arguments ``config``, unless it exists."""
    if not image_exists(ref):
        _commit(ref, base, [str(jar) for jar in sorted(jars)], "/app/libs/", config or [])
    return ref


def _commit(ref: str, base: str, sources: list[str], target: str, config: list[str]) -> None:
    container = run(["buildah", "from", "--pull=never", base])
    try:
        if sources:  # the receiver's jars are all in the shared layer
            run(["buildah", "copy", "--chown", "0:0", container, *sources, target])
        if config:
            run(["buildah", "config", *config, container])
        run(["buildah", "commit", "--quiet", container, ref])
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def _jars(folder: Path) -> dict[Path, str]:
    """Each jar of ``folder`` -> its sha256."""
    jars = {}
    for jar in sorted(folder.glob("*.jar")):
        with jar.open("rb") as stream:
            jars[jar] = hashlib.file_digest(stream, "sha256").hexdigest()
    if not jars:
        raise FileNotFoundError(f"no jars in {folder}: run tests/cluster/build_kafka.sh")
    return jars


def _digest_of(jars: dict[Path, str], name: str) -> str | None:
    return next((digest for jar, digest in jars.items() if jar.name == name), None)


def _names(jars: dict[Path, str]) -> dict[str, str]:
    return {jar.name: digest for jar, digest in jars.items()}


def _hash(*parts: object) -> str:
    """12 hex digits of the JSON of ``parts``."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
