#!/usr/bin/env bash
# Runs every test of wxguard on this machine, from a fresh Debian 12 install if need be:
#
#   setup     scripts/setup.sh (Debian packages, Kafka broker jars; seconds when done before)
#   build     configure and build build/ (Ninja, -DWXG_WERROR=ON, valgrind tests registered)
#   format    the format-check target (clang-format)
#   test      every test in build/ except the valgrind ones and the fixture self-test: unit,
#             lint and integration; the integration tests run against a real redis-server and
#             Kafka broker that the "services" CTest fixture starts once and stops at the end
#   valkey    the tests labelled valkey in build/ again, against valkey-server and valkey-cli
#             (from the release's backports, scripts/setup.sh): the guard's suites (native
#             design: the Lua design's scripts run on the same server code), the connection and
#             cluster clients, TLS, Sentinel, Cluster, and the consumer suites that exercise Redis
#   valgrind  every unit test under valgrind memcheck (0 errors, no definite/indirect leaks)
#   asan      build-asan/ (ASan+UBSan) and the whole suite again, except the lint tests, the
#             fixture test (scripts/services.sh again, which no build changes), the soak
#             (ASan's quarantine grows the resident memory the soak requires to stay flat) and
#             the guard's nemesis test (a fixed-time run: instrumented, it would do a fraction
#             of its operations)
#   tsan      build-tsan/ (TSan) and the tests labelled tsan
#   fuzz      build-fuzz/ (clang, libFuzzer + ASan/UBSan) and each fuzz harness for a bounded
#             time (WXG_FUZZ_SECONDS, default 60), failing on any crash, leak or report
#   fixture   only with --fixture: the tests labelled fixture in build/
#
# Each run writes its phase timings and the ten slowest tests to build/test-times.txt.
#
# Usage: scripts/test.sh [--quick] [--fixture] [--skip PHASE[,PHASE...]]
#   --quick   skip valkey, valgrind, asan, tsan and fuzz (a fast local check)
#   --fixture only the fixture self-test: scripts/services.sh started and stopped 30 times in a
#             row, each time checked (tests/fixture/services_cycle.sh; after a change to
#             scripts/services.sh or the fixture's CMake, not on every run)
#   --skip    skip the named phases; WXG_TEST_SKIP="asan tsan" does the same
# Environment: WXG_JOBS (parallel jobs, default: the number of cores), WXG_TEST_TIMEOUT_SCALE
# (integer factor for every timeout, default 1; sanitizer phases use three times it).
#
# Exits non-zero when any phase fails. Servers started for the tests are stopped on exit, also
# when the run is interrupted.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"

jobs=${WXG_JOBS:-$(nproc 2>/dev/null || echo 2)}
scale=${WXG_TEST_TIMEOUT_SCALE:-1}
[[ $scale =~ ^[1-9][0-9]*$ ]] || scale=1
skip=" ${WXG_TEST_SKIP:-} "
fixture_only=0

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

while (($#)); do
  case $1 in
  --quick) skip+=" valkey valgrind asan tsan fuzz " ;;
  --fixture)
    fixture_only=1
    skip+=" format test valkey valgrind asan tsan fuzz "
    ;;
  --skip)
    (($# >= 2)) || usage
    skip+=" ${2//,/ } "
    shift
    ;;
  -h | --help) usage ;;
  *) usage ;;
  esac
  shift
done

say() { printf '\n==== %s\n' "$*"; }

# --- bookkeeping: phase timings, test counts, cleanup -------------------------------------

declare -a phase_names=() phase_secs=()
current_phase=
phase_t0=0
child=
total_tests=0
total_failed=0
t_start=$(date +%s)

summary() {
  local i
  printf '\n==== timings\n'
  for i in "${!phase_names[@]}"; do
    printf '  %-10s %5d s\n' "${phase_names[$i]}" "${phase_secs[$i]}"
  done
  if [[ -n $current_phase ]]; then
    printf '  %-10s %5d s (did not finish)\n' "$current_phase" "$(($(date +%s) - phase_t0))"
  fi
  printf '  %-10s %5d s\n' total "$(($(date +%s) - t_start))"
}

# The phase timings and the ten slowest tests of every ctest report of this run, to
# build/test-times.txt (for bench/test-time.md and for finding what a run spends its time on).
write_times() {
  [[ -d $repo/build ]] || return 0
  {
    summary
    printf '\n==== ten slowest tests\n'
    python3 - "$repo" <<'PY' || true
import glob, os, sys, xml.etree.ElementTree as ET
rows = []
for d in ("build", "build-asan", "build-tsan", "build-fuzz"):
    for f in glob.glob(os.path.join(sys.argv[1], d, "ctest-*.xml")):
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError:
            continue
        phase = os.path.basename(f)[6:-4]
        for tc in root.iter("testcase"):
            rows.append((float(tc.get("time", 0) or 0), phase, tc.get("name", "?")))
for t, phase, name in sorted(rows, reverse=True)[:10]:
    print(f"  {t:8.1f} s  {phase:<9} {name}")
PY
  } >"$repo/build/test-times.txt" 2>&1
}

stop_services() {
  local d
  for d in build build-asan build-tsan build-fuzz; do
    if [[ -f $repo/$d/test-services/services.env ]]; then
      "$here/services.sh" stop "$repo/$d/test-services" || true
    fi
  done
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $child ]] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  stop_services
  write_times
  summary
  if ((rc != 0)); then
    printf '\nFAILED in phase %s (exit status %d)\n' "${current_phase:-?}" "$rc"
  else
    printf '\nall phases passed\n'
  fi
  # The plain closing line: counts over every ctest run of this script.
  printf 'tests: %d passed, %d failed\n' "$((total_tests - total_failed))" "$total_failed"
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs a command as a child the signal traps can end, so that an interrupt does not wait for a
# long ctest run to finish before the servers are stopped.
run() {
  local rc=0
  "$@" &
  child=$!
  wait "$child" || rc=$?
  child=
  return "$rc"
}

skipped() { [[ $skip == *" $1 "* ]]; }

phase() {
  local name=$1
  shift
  if skipped "$name"; then
    say "$name: skipped"
    return 0
  fi
  current_phase=$name
  say "$name"
  phase_t0=$(date +%s)
  "$@"
  phase_names+=("$name")
  phase_secs+=("$(($(date +%s) - phase_t0))")
  current_phase=
}

# Adds the counts of a ctest JUnit report to the totals.
count_junit() {
  local file=$1 tests failures
  [[ -f $file ]] || return 0
  read -r tests failures < <(python3 -c '
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
print(int(r.get("tests", 0)), int(r.get("failures", 0)))' "$file" || echo "0 0")
  total_tests=$((total_tests + tests))
  total_failed=$((total_failed + failures))
}

# ctest in build dir $1 with extra arguments; counts results even when tests fail.
run_ctest() {
  local dir=$1 report rc=0
  shift
  report=$repo/$dir/ctest-$current_phase.xml
  rm -f "$report"
  run ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$jobs" \
    --output-junit "$report" "$@" || rc=$?
  count_junit "$report"
  return "$rc"
}

configure_and_build() {
  local dir=$1 tscale=$2
  shift 2
  WXG_TEST_TIMEOUT_SCALE=$tscale run cmake -S . -B "$dir" -G Ninja -DWXG_WERROR=ON "$@"
  run cmake --build "$dir" --parallel "$jobs"
}

# --- phases -----------------------------------------------------------------------------------

do_setup() { run "$here/setup.sh"; }

do_build() { configure_and_build build "$scale" -DWXG_MEMCHECK=ON; }

do_format() { run cmake --build build --target format-check; }

do_test() { WXG_TEST_TIMEOUT_SCALE=$scale run_ctest build -LE 'memcheck|fixture'; }

do_fixture() { WXG_TEST_TIMEOUT_SCALE=$scale run_ctest build -L fixture; }

do_valkey() {
  WXG_TEST_REDIS_SERVER=valkey-server WXG_TEST_REDIS_CLI=valkey-cli \
    WXG_TEST_TIMEOUT_SCALE=$scale run_ctest build -L valkey
}

do_valgrind() { WXG_TEST_TIMEOUT_SCALE=$scale run_ctest build -L memcheck; }

do_asan() {
  configure_and_build build-asan "$((scale * 3))" -DWXG_SANITIZE=address
  # The sanitizer options are part of each test's environment (tests/CMakeLists.txt).
  WXG_TEST_TIMEOUT_SCALE=$((scale * 3)) run_ctest build-asan -LE 'lint|fixture|soak|nemesis'
}

do_tsan() {
  configure_and_build build-tsan "$((scale * 3))" -DWXG_SANITIZE=thread
  WXG_TEST_TIMEOUT_SCALE=$((scale * 3)) run_ctest build-tsan -L tsan
}

do_fuzz() {
  # Only the harnesses are built here; the rest of the tree is built and tested above.
  WXG_TEST_TIMEOUT_SCALE=$scale CC=clang run cmake -S . -B build-fuzz -G Ninja -DWXG_WERROR=ON \
    -DWXG_FUZZ=ON
  run cmake --build build-fuzz --parallel "$jobs" --target fuzz_decode
  WXG_TEST_TIMEOUT_SCALE=$scale run_ctest build-fuzz -L fuzz
}

phase setup do_setup
if skipped build; then
  echo "the build phase cannot be skipped" >&2
  exit 2
fi
phase build do_build
phase format do_format
phase test do_test
phase valkey do_valkey
phase valgrind do_valgrind
phase asan do_asan
phase tsan do_tsan
phase fuzz do_fuzz
if ((fixture_only)); then
  phase fixture do_fixture
fi
