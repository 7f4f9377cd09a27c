#!/usr/bin/env bash
# `cmake --install` of this build as a package lays it out (DESTDIR, prefix /usr), and into a
# prefix of its own: every file the install rules promise is there; the systemd units name
# /usr/bin and /etc/wxguard, and Documentation= files that are installed; the programs print
# the version of include/wxguard/common.h and load the installed configuration; a plugin builds
# against the installed headers alone, through wxguard-plugin.pc; and systemd verifies the units
# (the template with an instance name) where their paths exist.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
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

root=$tmp/root
if ! DESTDIR=$root cmake --install "$build" --prefix /usr >"$tmp/install.log" 2>&1; then
  fail "cmake --install: $(cat "$tmp/install.log")"
fi
for f in usr/bin/wxguard-consumer usr/bin/wxguard-ingest usr/bin/wxguardctl usr/bin/wxguard-bench \
  usr/include/wxguard/plugin.h usr/include/wxguard/common.h usr/include/wxguard/err.h \
  usr/include/wxguard/msg.h usr/share/pkgconfig/wxguard-plugin.pc \
  etc/wxguard/consumer.properties etc/wxguard/ingest.properties \
  usr/lib/systemd/system/wxguard-consumer@.service usr/lib/systemd/system/wxguard-ingest.service \
  usr/share/doc/wxguard/LICENSE usr/share/doc/wxguard/changelog.gz usr/share/doc/wxguard/copyright \
  usr/share/doc/wxguard/README.md usr/share/doc/wxguard/operating.md; do
  [ -e "$root/$f" ] || fail "not installed: /$f"
done
units=$root/usr/lib/systemd/system
grep -qx 'ExecStart=/usr/bin/wxguard-consumer --config /etc/wxguard/consumer.properties' \
  "$units/wxguard-consumer@.service" || fail "the consumer unit does not start /usr/bin/wxguard-consumer"
grep -qx 'ExecStart=/usr/bin/wxguard-ingest --config /etc/wxguard/ingest.properties' \
  "$units/wxguard-ingest.service" || fail "the ingest unit does not start /usr/bin/wxguard-ingest"
for u in "$units"/*.service; do
  grep -q '@[A-Z_]*@' "$u" && fail "$(basename "$u") keeps a template variable"
  doc=$(sed -n 's|^Documentation=file://||p' "$u")
  if [ -z "$doc" ] || [ ! -f "$root$doc" ]; then
    fail "$(basename "$u"): Documentation= $doc is not installed"
  fi
done

for p in wxguard-consumer wxguard-ingest wxguardctl wxguard-bench; do
  out=$("$root/usr/bin/$p" --version 2>&1)
  case "$out" in
  "$p $version"*) ;;
  *) fail "$p --version printed '$out', expected version $version" ;;
  esac
done
for p in consumer ingest; do
  "$root/usr/bin/wxguard-$p" --config "$root/etc/wxguard/$p.properties" --check \
    >"$tmp/$p.conf" 2>"$tmp/$p.err" || fail "wxguard-$p does not load the installed configuration: $(cat "$tmp/$p.err")"
done

# A plugin author has the installed headers and the .pc file, nothing of the source tree.
cflags=$(PKG_CONFIG_PATH=$root/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root \
  pkg-config --cflags wxguard-plugin) || fail "pkg-config does not know wxguard-plugin"
[ "$(PKG_CONFIG_PATH=$root/usr/share/pkgconfig pkg-config --modversion wxguard-plugin)" = "$version" ] ||
  fail "wxguard-plugin.pc does not carry version $version"
cp "$src/tests/plugins/example_plugin.c" "$tmp/"
# shellcheck disable=SC2086 # cflags is a list of flags
cc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Werror -fPIC -shared -fvisibility=hidden $cflags -o "$tmp/example.so" \
  "$tmp/example_plugin.c" 2>"$tmp/cc.err" || fail "a plugin does not build against the installed headers: $(cat "$tmp/cc.err")"

# Into a prefix of its own, the units name paths that exist here: systemd can verify them.
pfx=$tmp/pfx
cmake --install "$build" --prefix "$pfx" >"$tmp/install2.log" 2>&1 || fail "cmake --install --prefix: $(cat "$tmp/install2.log")"
[ -f "$pfx/etc/wxguard/consumer.properties" ] || fail "the configuration is not under the prefix"
# systemd-analyze comes with the systemd package (scripts/debian-packages.txt).
(cd "$pfx/lib/systemd/system" && systemd-analyze verify ./wxguard-consumer@1.service \
  ./wxguard-ingest.service) >"$tmp/verify.out" 2>&1 || fail "systemd-analyze verify: $(cat "$tmp/verify.out")"
[ -s "$tmp/verify.out" ] && fail "systemd-analyze verify warns: $(cat "$tmp/verify.out")"
[ $status -eq 0 ] && echo "install: ok ($version)"
exit $status
