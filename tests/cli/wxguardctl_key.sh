#!/bin/sh
# wxguardctl key on every reference sample: the key (or error) printed for each message must be
# the one in expected.tsv, and the exit status must say whether the record was rejected. Also
# checks --lines, standard input, --text, and the usage errors.
# usage: wxguardctl_key.sh <wxguardctl> <samples dir>
set -u
ctl=$1
dir=$2
failures=0
checked=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wxg-cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# Each manifest row: file, format, message index, expected key | error:NAME.
tab=$(printf '\t')
while IFS="$tab" read -r file format index expect; do
    case $file in '#'* | '') continue ;; esac
    "$ctl" key --format "$format" "$dir/$file" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    checked=$((checked + 1))
    case $expect in
    error:*)
        name=${expect#error:}
        [ $rc -eq 1 ] || fail "$file ($format): exit status $rc, expected 1"
        grep -F -q "\"error\":\"$name\"" "$tmp/out" || fail "$file ($format): no $name in: $(cat "$tmp/out")"
        grep -F -q '"reason":"' "$tmp/out" || fail "$file ($format): no reason"
        ;;
    *)
        [ $rc -eq 0 ] || fail "$file ($format): exit status $rc, expected 0: $(cat "$tmp/out" "$tmp/err")"
        grep -F "\"message\":$index," "$tmp/out" | grep -F -q "\"key\":\"$expect\"" ||
            fail "$file ($format) #$index: expected key $expect, got: $(cat "$tmp/out")"
        ;;
    esac
done <"$dir/expected.tsv"
[ $checked -ge 40 ] || fail "only $checked manifest rows were checked"

# Every line printed is one JSON object.
"$ctl" key "$dir/sync_batch.json" >"$tmp/out"
[ "$(wc -l <"$tmp/out")" -eq 2 ] || fail "sync batch: expected 2 lines"
grep -v -q '^{.*}$' "$tmp/out" && fail "sync batch: a line is not a JSON object"

# Content is escaped: the NUL of E7 and the invalid byte of E9 never reach the output raw.
"$ctl" key "$dir/E7.json" | grep -F -q '"content_len":3,"content_utf8":true,"content":"a\u0000b"' ||
    fail "E7: content not shown escaped with its length"
"$ctl" key "$dir/E9.json" | grep -F -q '"content_utf8":false,"content":"bad \ufffd byte"' ||
    fail "E9: invalid UTF-8 not shown as U+FFFD"

# --lines: one record per line, record = line number; a rejected line makes the status 1.
cat "$dir/E1.json" "$dir/E8.json" >"$tmp/lines"
printf '\n' >>"$tmp/lines"
cat "$dir/E10b.json" >>"$tmp/lines"
"$ctl" key --lines "$tmp/lines" >"$tmp/out"
rc=$?
[ $rc -eq 1 ] || fail "--lines: exit status $rc, expected 1"
grep -F -q '"record":1,"message":0,' "$tmp/out" || fail "--lines: record 1 missing"
grep -F -q '"record":2,"error":"EIDCONFLICT"' "$tmp/out" || fail "--lines: record 2 not rejected"
grep -F -q '"record":4,"message":0,"format":"gewe","key":"wxid_fakebot000002:n:7773700000000000001"' \
    "$tmp/out" || fail "--lines: record 4 missing"
[ "$(wc -l <"$tmp/out")" -eq 3 ] || fail "--lines: the blank line was not skipped"

# Standard input, and --text.
"$ctl" key - <"$dir/W1.json" | grep -F -q '"key":"wxid_fakebot000001:n:7301234567890123457"' ||
    fail "stdin: wrong key"
"$ctl" key --text "$dir/W1.json" | grep -q '^wxid_fakebot000001:n:7301234567890123457	wkteam	' ||
    fail "--text: wrong line"

# Usage: help is status 0, mistakes are status 2.
expect_status() {
    want=$1
    shift
    "$@" >/dev/null 2>&1
    got=$?
    [ $got -eq "$want" ] || fail "'$*': exit status $got, expected $want"
}
expect_status 0 "$ctl" --help
expect_status 0 "$ctl" key --help
expect_status 0 "$ctl" help key
expect_status 0 "$ctl" --version
expect_status 2 "$ctl"
expect_status 2 "$ctl" no-such-command
expect_status 2 "$ctl" key --format nonsense "$dir/W1.json"
expect_status 2 "$ctl" key --max-depth 0 "$dir/W1.json"
expect_status 2 "$ctl" key "$dir/W1.json" "$dir/W2.json"
expect_status 2 "$ctl" key "$tmp/does-not-exist"
expect_status 1 "$ctl" key --max-bytes 10 "$dir/W1.json"
"$ctl" key --help | grep -q -- '--format' || fail "key --help does not describe --format"

if [ $failures -ne 0 ]; then
    echo "$failures check(s) failed" >&2
    exit 1
fi
echo "wxguardctl key: $checked manifest rows and the option checks passed"
