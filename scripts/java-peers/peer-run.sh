# Builds a Java peer project (compile + its runtime classpath) when needed and runs one of its
# classes; sourced by scripts/java-peers/run and scripts/java-peers/rmq55/run.
# java_peer_run DIR [CLASS ARGS...]: without CLASS it only builds. Maven's output goes to
# stderr; the peer's own lines go to stdout.
#
# It builds when there is no classpath file yet, when pom.xml or a source is newer than it,
# or when a jar it lists is missing (a fresh machine whose ~/.m2 lacks what an older build
# resolved: the run would otherwise fail with NoClassDefFoundError).
java_peer_run() {
  local here=$1
  shift
  local stamp=$here/target/classpath.txt
  local stale=
  if [[ ! -f $stamp || -n $(find "$here/pom.xml" "$here/src" -newer "$stamp" -print -quit) ]]; then
    stale=yes
  else
    local entry
    local -a entries
    IFS=: read -r -a entries <"$stamp" || true # the file has no final newline
    for entry in "${entries[@]}"; do
      [[ -z $entry || -e $entry ]] || { stale=yes; break; }
    done
  fi
  if [[ -n $stale ]]; then
    local attempt
    for attempt in 1 2 3; do
      if mvn -B -q -f "$here/pom.xml" compile dependency:build-classpath \
        -Dmdep.outputFile="$stamp" -Dmdep.includeScope=runtime >&2; then
        break
      fi
      [[ $attempt == 3 ]] && { echo "java-peers: the build failed 3 times" >&2; return 1; }
      sleep 5
    done
  fi
  [[ $# -ge 1 ]] || return 0
  local main=$1
  shift
  exec java -Xmx256m -XX:+UseSerialGC -cp "$here/target/classes:$(cat "$stamp")" "peers.$main" "$@"
}
