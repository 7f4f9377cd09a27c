#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test wxguard:
#   1. the Debian packages listed in scripts/debian-packages.txt (compilers, -dev libraries,
#      redis-server, a JDK, Maven, ...), running `apt-get update` only when one is missing;
#   2. Valkey (valkey-server, valkey-tools) from the release's backports, for the server matrix
#      (scripts/test.sh's valkey phase), adding the backports suite of the mirror the system
#      already uses when it is not configured;
#   3. the Apache Kafka broker jars from Maven Central (scripts/kafka/pom.xml) into a cache
#      outside version control: $WXG_CACHE_DIR/kafka-libs (default <repo>/.cache/kafka-libs);
#   4. kustomize, built with Go into $WXG_CACHE_DIR/bin, to render the Kubernetes files.
# It is idempotent: a second run checks, finds everything in place, and returns in seconds.
#
# Runs as root (or through sudo when that exists). Environment:
#   WXG_CACHE_DIR      cache directory (default <repo>/.cache)
#   WXG_KAFKA_VERSION  force one Kafka version instead of trying 4.1.2, then 4.4.0
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_dir=${WXG_CACHE_DIR:-$repo/.cache}
kafka_libs=$cache_dir/kafka-libs
pom=$here/kafka/pom.xml
package_list=$here/debian-packages.txt

# Kafka versions to try, each with the Log4j 2 version that release was built with. 4.1.2 is
# the choice; 4.4.0 is the fallback should 4.1.2 ever stop resolving.
kafka_candidates=("4.1.2:2.25.3" "4.4.0:2.25.5")

log() { printf 'setup: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

as_root() {
  if ((EUID == 0)); then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    die "need root (or sudo) to run: $*"
  fi
}

read_packages() {
  local line
  while IFS= read -r line; do
    line=${line%%#*}
    line=${line//[[:space:]]/}
    [[ -n $line ]] && printf '%s\n' "$line"
  done <"$package_list"
}

install_packages() {
  local -a wanted missing=() unknown=()
  local -A installed=()
  local pkg status
  mapfile -t wanted < <(read_packages)
  # One dpkg-query call for the whole list keeps the warm path fast; packages dpkg has never
  # heard of are simply absent from its output.
  while IFS=$'\t' read -r pkg status; do
    [[ $status == "install ok installed" ]] && installed[$pkg]=1
  done < <(dpkg-query -W -f='${Package}\t${Status}\n' "${wanted[@]}" 2>/dev/null || true)
  for pkg in "${wanted[@]}"; do
    [[ -n ${installed[$pkg]:-} ]] || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    log "all ${#wanted[@]} Debian packages are installed"
    return 0
  fi
  log "missing Debian packages: ${missing[*]}"
  as_root apt-get update -q
  for pkg in "${missing[@]}"; do
    if ! apt-cache show --no-all-versions "$pkg" >/dev/null 2>&1; then
      unknown+=("$pkg")
    fi
  done
  ((${#unknown[@]} == 0)) || die "not found in the configured Debian sources: ${unknown[*]}"
  # Recommends stay out: docker-compose would otherwise pull in a container engine.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${missing[@]}"
}

# Packages from <release>-backports: the server matrix's second server.
backports_packages=(valkey-server valkey-tools)

install_backports() {
  local codename uri missing=() pkg
  for pkg in "${backports_packages[@]}"; do
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' ||
      missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    log "the backports packages are installed: ${backports_packages[*]}"
    return 0
  fi
  # shellcheck disable=SC1091 # the system's, read at run time
  codename=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
  [[ -n $codename ]] || die "cannot tell the Debian release (VERSION_CODENAME in /etc/os-release)"
  # shellcheck disable=SC2016 # apt's own $(FIELD) syntax, not the shell's
  if ! apt-get indextargets --format '$(RELEASE)' 2>/dev/null | grep -qx "$codename-backports"; then
    # The mirror that serves the release itself serves its backports too.
    # shellcheck disable=SC2016 # apt's own $(FIELD) syntax
    uri=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
      awk -v r="$codename" '$2 == r { print $1; exit }')
    [[ -n $uri ]] || die "no configured Debian source serves $codename: cannot add $codename-backports"
    log "adding $codename-backports from $uri"
    printf 'Types: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\nSigned-By: %s\n' \
      "$uri" "$codename" /usr/share/keyrings/debian-archive-keyring.gpg |
      as_root tee /etc/apt/sources.list.d/wxguard-backports.sources >/dev/null
  fi
  as_root apt-get update -q
  local -a targets=()
  for pkg in "${missing[@]}"; do
    targets+=("$pkg/$codename-backports")
  done
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${targets[@]}"
}

check_java() {
  local v
  v=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
  if ! [[ $v =~ ^[0-9]+$ ]] || ((v < 17)); then
    die "the Kafka 4 broker needs Java 17 or later; 'java' is version ${v:-unknown}"
  fi
}

# The stamp names what the cache holds; a matching stamp means there is nothing to do.
stamp_for() {
  local kv=$1 lv=$2
  printf 'kafka=%s log4j2=%s pom=%s\n' "$kv" "$lv" "$(sha256sum "$pom" | cut -d' ' -f1)"
}

fetch_kafka() {
  local kv=$1 lv=$2 out=$3
  rm -rf "$out"
  mkdir -p "$out"
  log "fetching the Kafka $kv broker jars (Log4j $lv) with Maven"
  # Maven prints colour resets even in batch mode; they are stripped from what it says.
  (cd "$here/kafka" && mvn -q -B --no-transfer-progress \
    "-Dkafka.version=$kv" "-Dlog4j2.version=$lv" \
    dependency:copy-dependencies -DincludeScope=runtime "-DoutputDirectory=$out" 2>&1) |
    sed -e $'s/\x1b\\[[0-9;]*m//g' -e '/^$/d' >&2 || return 1
  # Exactly one SLF4J API (1.7.x) and its Log4j 2 binding, or the broker logs nothing.
  local n
  n=$(find "$out" -name 'slf4j-api-*.jar' | wc -l)
  ((n == 1)) || {
    log "expected one slf4j-api jar, found $n"
    return 1
  }
  [[ -f $out/kafka_2.13-$kv.jar && -f $out/log4j-slf4j-impl-$lv.jar ]] || {
    log "the broker or the logging binding is missing from $out"
    return 1
  }
}

install_kafka_jars() {
  local cand kv lv stamp tmp
  mkdir -p "$cache_dir"
  # Two setups at once (two checkouts sharing a cache) must not interleave their downloads.
  exec 9>"$cache_dir/.setup.lock"
  flock -w 900 9 || die "timed out waiting for another setup to finish with $cache_dir"
  local -a cands=("${kafka_candidates[@]}")
  if [[ -n ${WXG_KAFKA_VERSION:-} ]]; then
    for cand in "${kafka_candidates[@]}"; do
      [[ ${cand%%:*} == "$WXG_KAFKA_VERSION" ]] && cands=("$cand")
    done
    [[ ${cands[0]%%:*} == "$WXG_KAFKA_VERSION" ]] ||
      die "unknown WXG_KAFKA_VERSION $WXG_KAFKA_VERSION (known: ${kafka_candidates[*]%%:*})"
  fi
  if [[ -f $kafka_libs/.stamp ]]; then
    for cand in "${cands[@]}"; do
      kv=${cand%%:*} lv=${cand#*:}
      if [[ $(<"$kafka_libs/.stamp") == "$(stamp_for "$kv" "$lv")" ]]; then
        log "Kafka $kv jars are cached in $kafka_libs"
        return 0
      fi
    done
  fi
  command -v mvn >/dev/null || die "mvn not found"
  tmp=$cache_dir/kafka-libs.partial
  for cand in "${cands[@]}"; do
    kv=${cand%%:*} lv=${cand#*:}
    if fetch_kafka "$kv" "$lv" "$tmp"; then
      stamp=$(stamp_for "$kv" "$lv")
      printf '%s\n' "$stamp" >"$tmp/.stamp"
      printf '%s\n' "$kv" >"$tmp/KAFKA_VERSION"
      rm -rf "$kafka_libs"
      mv "$tmp" "$kafka_libs"
      log "Kafka $kv: $(find "$kafka_libs" -name '*.jar' | wc -l) jars," \
        "$(du -sh "$kafka_libs" | cut -f1) in $kafka_libs"
      return 0
    fi
    log "Kafka $kv did not resolve; trying the next candidate"
  done
  rm -rf "$tmp"
  die "no Kafka version could be fetched (tried: ${cands[*]%%:*})"
}

# kustomize v5, to render the Kubernetes files in the tests (tests/deploy/test_kustomize.sh):
# Debian's kubectl is too old for them, so it is built from the Go module proxy with the Go
# this machine has, into $cache_dir/bin (its module and build caches beside it).
kustomize_version=v5.7.1
install_kustomize() {
  local bin=$cache_dir/bin/kustomize
  if [[ -x $bin ]] && [[ $("$bin" version 2>/dev/null) == "$kustomize_version"* ]]; then
    log "kustomize $kustomize_version is in $bin"
    return 0
  fi
  command -v go >/dev/null || die "go not found: it builds kustomize (tests/deploy/test_kustomize.sh)"
  log "building kustomize $kustomize_version with $(go version | cut -d' ' -f3)"
  mkdir -p "$cache_dir/bin"
  GOBIN=$cache_dir/bin GOPATH=$cache_dir/go GOCACHE=$cache_dir/go-build GOFLAGS=-modcacherw \
    go install "sigs.k8s.io/kustomize/kustomize/v5@$kustomize_version" ||
    die "kustomize $kustomize_version did not build"
}

main() {
  local t0
  t0=$(date +%s)
  [[ -r /etc/debian_version ]] || log "warning: not a Debian system; package names may differ"
  install_packages
  install_backports
  check_java
  install_kafka_jars
  install_kustomize
  log "done in $(($(date +%s) - t0)) s"
}

main "$@"
