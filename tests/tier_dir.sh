#!/usr/bin/env bash
# tests/tier_dir.sh BINARY - the directory prefix tier (examples/tier_dir.h)
# under concurrent writers and crashed ones, through examples/prefix_tier.c
# (the `tier-dir` step of tests/run_matrix.sh). Checks: four processes
# spilling the same records at once leave whole records that a fifth process
# reuses; a crashed writer's temporary file is never read; a record cut
# short under its real name is refused, recomputed and written again.
set -u
bin=${1:?usage: tier_dir.sh PATH/TO/prefix_tier}
work=$(mktemp -d "${TMPDIR:-/tmp}/kvattn_tierdir.XXXXXX")
trap 'rm -rf "$work"' EXIT
fails=0
check() { # WHAT CONDITION...
    local what=$1
    shift
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
dir=$work/store
pids=()
for i in 1 2 3 4; do "$bin" "$dir" > "$work/w$i.out" 2>&1 & pids+=($!); done
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
check "four concurrent writers of the same records all succeed" [ "$bad" = 0 ]
n=$(find "$dir" -name '*.kvpb' | wc -l)
left=$(find "$dir" -name '*.tmp.*' | wc -l)
check "8 whole records, no temporary file left ($n, $left)" [ "$n:$left" = 8:0 ]
"$bin" "$dir" > "$work/r.out" 2>&1
check "a fifth process reuses the whole prompt from them" grep -q "request A: 128 of 128" "$work/r.out"
# a writer killed mid-record: its temporary name holds half a record
first=$(find "$dir" -name '*.kvpb' | sort | head -n 1)
head -c 100 "$first" > "$first.tmp.99999.0"
"$bin" "$dir" > "$work/k.out" 2>&1
check "a crashed writer's temporary file is not read" grep -q "request A: 128 of 128" "$work/k.out"
# a record cut short under its real name (a store without rename): refused, recomputed, written again
size=$(wc -c < "$first")
head -c $((size / 2)) "$first" > "$work/cut" && mv "$work/cut" "$first"
"$bin" "$dir" > "$work/c.out" 2>&1
rc=$?
grep -q "request A: 128 of 128" "$work/c.out" && whole=yes || whole=no
check "a cut record: refused (exit $rc, the prompt recomputed), then whole again" [ "$rc:$whole" = 0:no ]
check "the cut record was counted as refused" grep -q "[1-9][0-9]* records refused" "$work/c.out"
"$bin" "$dir" > "$work/a.out" 2>&1
check "and the next process reuses everything again" grep -q "request A: 128 of 128" "$work/a.out"
[ "$fails" = 0 ] && echo "tier_dir: all checks passed" || echo "tier_dir: $fails check(s) failed"
[ "$fails" = 0 ]
