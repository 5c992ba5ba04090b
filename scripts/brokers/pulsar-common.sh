# The Pulsar server distribution the Pulsar scripts share (scripts/brokers/pulsar and
# scripts/brokers/pulsar-cluster). Sourced after common.sh, not run.
# shellcheck shell=bash

# 4.0.3 (the version of the reported stall) is not served by this Maven Central mirror; 4.0.8 is
# the newest 4.0.x that is, and has the same 4.0 unacked accounting.
PULSAR_VERSION=${PULSAR_VERSION:-4.0.8}
PULSAR_WORK=$BROKERS_DIR/pulsar
HOME_DIR=$PULSAR_WORK/apache-pulsar-$PULSAR_VERSION
TARBALL=$HOME/.m2/repository/org/apache/pulsar/pulsar-server-distribution/$PULSAR_VERSION/pulsar-server-distribution-$PULSAR_VERSION-bin.tar.gz

# fetch: the distribution unpacked in $HOME_DIR (the tarball from Maven Central, cached in ~/.m2).
fetch() {
  if [ -x "$HOME_DIR/bin/pulsar" ]; then return 0; fi
  mkdir -p "$PULSAR_WORK"
  if [ ! -s "$TARBALL" ]; then
    log "fetching the Pulsar $PULSAR_VERSION server distribution from Maven Central (cached in ~/.m2)"
    retry 3 mvn -B -q org.apache.maven.plugins:maven-dependency-plugin:3.6.1:get \
      -Dartifact="org.apache.pulsar:pulsar-server-distribution:$PULSAR_VERSION:tar.gz:bin" \
      -Dtransitive=false >&2 || die "could not fetch Pulsar $PULSAR_VERSION"
  fi
  tar xzf "$TARBALL" -C "$PULSAR_WORK" || die "could not unpack $TARBALL"
  [ -x "$HOME_DIR/bin/pulsar" ] || die "unexpected layout: no $HOME_DIR/bin/pulsar"
}
