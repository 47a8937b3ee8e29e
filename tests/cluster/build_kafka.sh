#!/usr/bin/env bash
# Build what the test cluster needs to run Knative's Kafka Broker, once, cached:
#   - the control plane (kafka-controller, webhook-kafka, and the post-install job's
#     post-install and storage-version migrate), from the release source with its vendor/ in
#     ../shared/third_party (not served by the module proxy), as static binaries, offline;
#   - the release's manifests (control-plane/config, data-plane/config);
#   - the data plane (the Vert.x receiver and dispatcher, Java), built with Maven from Maven
#     Central as the release's images are (the -loom modules): each one's jar and its runtime
#     dependencies in data-plane/NAME/libs, the layout jib puts under /app/libs;
#   - Apache Kafka itself (no Debian package): the jars of kafka_2.13 and kafka-tools from
#     Maven Central, the version the data plane is built against.
# The release's pieces are cached by the tarball's sha256, so a new tarball rebuilds; the
# unpacked sources are deleted; Maven's repository stays in the cache (m2/, 220 MB). Prints one
# line per piece: NAME=DIR (kafka-broker: bin/, config/, data-plane/; kafka: libs/). The first
# time, on 2 cores: Go 35 s when Knative's build has filled the Go cache (3.5 min without),
# Maven 2.5 min with an empty repository (1.5 min without downloads), Kafka's jars 7 s.
#
#   tests/cluster/build_kafka.sh
#   RF_THIRD_PARTY=/path/to/third_party RF_JAVA_HOME=/path/to/jdk21+ tests/cluster/build_kafka.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
third_party="${RF_THIRD_PARTY:-$here/../../../shared/third_party}"
cache="${RF_CLUSTER_CACHE:-$HOME/.cache/resource-functions}/kafka-broker"
broker_version=1.22.3
kafka_version=3.9.1
scala_version=2.13
# Java 21 or newer compiles the data plane; Debian's default JDK is 17.
java_home="${RF_JAVA_HOME:-/usr/lib/jvm/temurin-25-jdk-amd64}"
maven_central=https://repo.maven.apache.org/maven2
export CGO_ENABLED=0 GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"
command -v go >/dev/null || { echo "build_kafka.sh: go is not installed" >&2; exit 1; }
command -v mvn >/dev/null || { echo "build_kafka.sh: mvn is not installed" >&2; exit 1; }
[ -x "$java_home/bin/javac" ] || { echo "build_kafka.sh: no JDK at $java_home" >&2; exit 1; }
tarball="$third_party/eventing-kafka-broker-$broker_version.tar.xz"
[ -f "$tarball" ] || { echo "build_kafka.sh: $tarball is missing" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/build.lock"
flock 9

sum=$(sha256sum "$tarball" | cut -c1-16)
dir="$cache/$broker_version-$sum"
src="$dir/src"
mkdir -p "$dir"

# Maven: its own local repository in the cache, and every repository a pom names (the data
# plane's names a snapshot repository that is not reachable) mirrored by Maven Central.
settings="$cache/maven-settings.xml"
cat >"$settings" <<EOF
<settings>
  <localRepository>$cache/m2</localRepository>
  <mirrors>
    <mirror><id>central</id><mirrorOf>*</mirrorOf><url>$maven_central</url></mirror>
  </mirrors>
</settings>
EOF
mvn_() {
  JAVA_HOME="$java_home" MAVEN_OPTS="${MAVEN_OPTS:-} -XX:+UseSerialGC" \
    mvn --batch-mode --no-transfer-progress --settings "$settings" "$@"
}

unpack() {
  if [ ! -f "$src/.unpacked" ]; then
    local start; start=$(date +%s)
    rm -rf "$src" && mkdir -p "$src"
    tar -xJf "$tarball" -C "$src" --strip-components=1
    touch "$src/.unpacked"
    echo "build_kafka.sh: unpacked $(basename "$tarball") in $(( $(date +%s) - start ))s" >&2
  fi
}

# Control plane: static binaries, offline from vendor/. post-install and migrate are the
# release's post-install job (storage version migration on upgrades; a fresh install skips it).
if [ ! -f "$dir/bin/.complete" ]; then
  unpack
  start=$(date +%s)
  echo "build_kafka.sh: building the kafka broker control plane $broker_version" >&2
  rm -rf "$dir/bin" && mkdir -p "$dir/bin"
  (cd "$src" && go build -mod=vendor -trimpath -ldflags="-s -w" -o "$dir/bin/" \
     ./control-plane/cmd/kafka-controller ./control-plane/cmd/webhook-kafka \
     ./control-plane/cmd/post-install knative.dev/pkg/apiextensions/storageversion/cmd/migrate >&2)
  touch "$dir/bin/.complete"
  echo "build_kafka.sh: control plane built in $(( $(date +%s) - start ))s" >&2
fi

# The release manifests (the data plane's name its images as ${KNATIVE_KAFKA_*_IMAGE}).
if [ ! -f "$dir/config/.complete" ]; then
  unpack
  rm -rf "$dir/config" && mkdir -p "$dir/config"
  cp -rL "$src/control-plane/config" "$dir/config/control-plane"
  cp -rL "$src/data-plane/config" "$dir/config/data-plane"
  touch "$dir/config/.complete"
fi

# Data plane: the -loom modules (what the release's images run) and the modules they need;
# tests compiled (the -loom modules name the test jars of core and receiver) but not run; no
# coverage agent, no license reports (they download every license), no enforcer, no shaded
# jar (the release's images run the plain jars, as jib lays them out).
if [ ! -f "$dir/data-plane/.complete" ]; then
  unpack
  start=$(date +%s)
  echo "build_kafka.sh: building the kafka broker data plane $broker_version (Maven)" >&2
  (cd "$src/data-plane" && mvn_ -Drelease -DskipTests -Djacoco.skip=true \
     -Dlicense.skip=true -Dlicense.skipAggregateDownloadLicenses=true \
     -Dlicense.skipAggregateAddThirdParty=true -Denforcer.skip=true \
     -pl receiver-loom,dispatcher-loom -am package \
     org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
     -DincludeScope=runtime >&2)
  rm -rf "$dir/data-plane" && mkdir -p "$dir/data-plane"
  for name in receiver dispatcher; do
    libs="$dir/data-plane/$name/libs"
    mkdir -p "$libs"
    cp "$src/data-plane/$name-loom"/target/dependency/*.jar "$libs/"
    cp "$src/data-plane/$name-loom/target/$name-loom-1.0-SNAPSHOT.jar" "$libs/"
    # The -loom modules' jars are shaded (each holds every dependency again, 66 MB): keep their
    # plain jars (the dispatcher's libs hold the receiver's too).
    for jar in "$libs"/*-loom-1.0-SNAPSHOT.jar; do
      module=$(basename "$jar" -1.0-SNAPSHOT.jar)
      cp "$src/data-plane/$module/target/original-$module-1.0-SNAPSHOT.jar" "$jar"
    done
  done
  touch "$dir/data-plane/.complete"
  echo "build_kafka.sh: data plane built in $(( $(date +%s) - start ))s" >&2
fi
rm -rf "$src"
echo "kafka-broker=$dir"

# Kafka: the broker (kafka_2.13: kafka.Kafka, kafka.tools.StorageTool), its tools
# (org.apache.kafka.tools: topics, console producer and consumer; not Connect's, which bring a
# web stack) and the log4j binding Kafka's own distribution ships, with their runtime
# dependencies, through a generated pom.
kafka="$cache/kafka-$kafka_version"
if [ ! -f "$kafka/.complete" ]; then
  start=$(date +%s)
  echo "build_kafka.sh: fetching kafka $kafka_version from Maven Central" >&2
  rm -rf "$kafka" && mkdir -p "$kafka/pom"
  cat >"$kafka/pom/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.resource-functions.test</groupId>
  <artifactId>kafka-libs</artifactId>
  <version>$kafka_version</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_$scala_version</artifactId>
      <version>$kafka_version</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$kafka_version</version>
      <exclusions>
        <exclusion>
          <groupId>org.apache.kafka</groupId>
          <artifactId>connect-runtime</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>1.7.36</version>
    </dependency>
    <dependency>
      <groupId>ch.qos.reload4j</groupId>
      <artifactId>reload4j</artifactId>
      <version>1.2.25</version>
    </dependency>
  </dependencies>
</project>
EOF
  (cd "$kafka/pom" && mvn_ org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
     -DincludeScope=runtime -DoutputDirectory="$kafka/libs" >&2)
  rm -rf "$kafka/pom"
  touch "$kafka/.complete"
  echo "build_kafka.sh: kafka fetched in $(( $(date +%s) - start ))s" >&2
fi
echo "kafka=$kafka"
