#!/usr/bin/env bash
# Builds the Debian packages of this build tree (cpack -G DEB, into a temporary directory) and
# checks them without installing them (the machine that runs the tests is not changed):
# unpacked with dpkg-deb -x into a temporary root, the programs run from there (--version,
# --check with the packaged configuration); the properties files are conffiles; every
# library a binary needs (its NEEDED entries) comes from a package the runtime package depends
# on; the units name /usr/bin and verify with systemd-analyze; lintian reports no warning.
# Usage: test_packages.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
fail() {
  echo "FAIL: $*" >&2
  status=1
}
version=$(sed -n 's/^#define WXG_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' "$src/include/wxguard/common.h" |
  paste -sd.)
(cd "$build" && cpack -G DEB -B "$tmp/out") >"$tmp/cpack.log" 2>&1 || {
  echo "FAIL: cpack: $(cat "$tmp/cpack.log")" >&2
  exit 1
}
run=$tmp/out/wxguard_${version}-1_amd64.deb
dev=$tmp/out/wxguard-dev_${version}-1_amd64.deb
for d in "$run" "$dev"; do
  [ -f "$d" ] || {
    echo "FAIL: $(basename "$d") was not built: $(ls "$tmp/out")" >&2
    exit 1
  }
done

root=$tmp/root
for d in "$run" "$dev"; do
  dpkg-deb -x "$d" "$root" || fail "dpkg-deb -x $(basename "$d")"
done
for p in wxguard-consumer wxguard-ingest wxguardctl wxguard-bench; do
  case "$("$root/usr/bin/$p" --version 2>&1)" in
  "$p $version"*) ;;
  *) fail "$p from the package does not print version $version" ;;
  esac
  [ -f "$root/usr/share/man/man1/$p.1.gz" ] || fail "no manual page for $p"
done
for p in consumer ingest; do
  "$root/usr/bin/wxguard-$p" --config "$root/etc/wxguard/$p.properties" --check \
    >/dev/null 2>"$tmp/$p.err" || fail "wxguard-$p does not load the packaged configuration: $(cat "$tmp/$p.err")"
done
for f in usr/include/wxguard/plugin.h usr/share/pkgconfig/wxguard-plugin.pc; do
  [ -f "$root/$f" ] || fail "wxguard-dev lacks /$f"
done

dpkg-deb -e "$run" "$tmp/control"
for f in /etc/wxguard/consumer.properties /etc/wxguard/ingest.properties; do
  grep -qx "$f" "$tmp/control/conffiles" || fail "$f is not a conffile"
done

# Every NEEDED library of every binary, resolved as the dynamic linker resolves it here, belongs
# to a package that wxguard depends on (dpkg-shlibdeps made the list; this checks it).
depends=$(dpkg-deb -f "$run" Depends)
for b in "$root"/usr/bin/*; do
  for lib in $(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    path=$(ldd "$b" | awk -v l="$lib" '$1 == l { print $3 }')
    pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1)
    if [ -z "$pkg" ]; then
      fail "$(basename "$b") needs $lib ($path), which no installed package provides"
    elif ! grep -qE "(^|, )$pkg( |,|$)" <<<"$depends"; then
      fail "$(basename "$b") needs $lib from $pkg, which Depends ($depends) does not name"
    fi
  done
done

units=$root/usr/lib/systemd/system
grep -qx 'ExecStart=/usr/bin/wxguard-consumer --config /etc/wxguard/consumer.properties' \
  "$units/wxguard-consumer@.service" || fail "the consumer unit does not start /usr/bin/wxguard-consumer"
grep -qx 'ExecStart=/usr/bin/wxguard-ingest --config /etc/wxguard/ingest.properties' \
  "$units/wxguard-ingest.service" || fail "the ingest unit does not start /usr/bin/wxguard-ingest"
# systemd-analyze checks that ExecStart is executable: verify copies that point at the unpacked
# programs (the grep above holds the packaged paths).
mkdir -p "$tmp/units"
for u in wxguard-consumer@.service wxguard-ingest.service; do
  sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$units/$u" >"$tmp/units/$u"
done
(cd "$tmp/units" && systemd-analyze verify ./wxguard-consumer@1.service ./wxguard-ingest.service) \
  >"$tmp/verify.out" 2>&1 || fail "systemd-analyze verify: $(cat "$tmp/verify.out")"
[ -s "$tmp/verify.out" ] && fail "systemd-analyze verify warns: $(cat "$tmp/verify.out")"

# lintian and help2man come with scripts/debian-packages.txt.
lintian --tag-display-limit 0 --fail-on warning "$run" "$dev" >"$tmp/lintian.out" 2>&1 ||
  fail "lintian: $(grep -v 'root privileges' "$tmp/lintian.out")"
[ $status -eq 0 ] && echo "packages: ok ($(basename "$run"), $(basename "$dev"))"
exit $status
