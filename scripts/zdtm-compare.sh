#!/usr/bin/env bash
# Runs the zdtm regression list with stock CRIU and with criu-rocm (same tarball, same zdtm
# harness) and compares the outcome of every test.
#   usage: scripts/zdtm-compare.sh STOCK_CRIU CRIU_ROCM CRIU_TREE LIST
set -uo pipefail

stock=$1 rocm=$2 tree=$3 list=$4
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d /tmp/zdtm-compare.XXXXXX)

"$here/zdtm.sh" --criu-bin "$stock" --tree "$tree" --list "$list" >"$out/stock.txt" 2>&1
"$here/zdtm.sh" --criu-bin "$rocm" --tree "$tree" --list "$list" >"$out/rocm.txt" 2>&1
outcome() { sed -n 's/^zdtm: \(zdtm\/[^ ]*\) *[^ ]* *\(PASS\|FAIL\).*/\1 \2/p' "$1"; }
outcome "$out/stock.txt" >"$out/stock.sum"
outcome "$out/rocm.txt" >"$out/rocm.sum"
echo "stock CRIU: $(grep -o '[0-9]* passed, [0-9]* failed in [0-9]* s' "$out/stock.txt" | tail -n1)"
echo "criu-rocm:  $(grep -o '[0-9]* passed, [0-9]* failed in [0-9]* s' "$out/rocm.txt" | tail -n1)"
if diff -u "$out/stock.sum" "$out/rocm.sum"; then
	echo "zdtm-compare: same outcome for all $(wc -l <"$out/rocm.sum") tests"
	rm -rf "$out"
else
	echo "zdtm-compare: outcomes differ (logs in $out)"
	exit 1
fi
