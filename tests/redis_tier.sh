#!/usr/bin/env bash
# tests/redis_tier.sh BINARY [RUN MODEL_DIR] - two processes share a system prompt's prefix
# blocks through a Redis server this script starts on a free loopback port
# and stops at the end (examples/redis/prefix_redis.c, the `redis` step of
# tests/run_matrix.sh). Checks: the second process reuses the whole prompt
# from the server with outputs bit for bit those of recomputation; after the
# server forgets everything, or with one record corrupted in the server,
# the lookup is a miss or stops at the bad block, and nothing crashes.
# With RUN (kvattn_run_redis) and MODEL_DIR (bench/model): a restart of
# `kvattn_run --serve --prefix-redis` loads the first run's blocks and
# starts warm with the outputs of a run without a tier; a run of another
# cache configuration refuses them all.
set -u
bin=${1:?usage: redis_tier.sh PATH/TO/prefix_redis [PATH/TO/kvattn_run_redis MODEL_DIR]}
run_bin=${2:-}
model_dir=${3:-}
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    { echo "redis_tier: redis-server / redis-cli not found (Debian: redis-server)"; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/kvattn_redis.XXXXXX")
pid=
stop() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap stop EXIT
fails=0
check() { # WHAT CONDITION...
    local what=$1
    shift
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}

# a free port: the server exits at once when its port is taken, so try a few
for try in 1 2 3 4 5 6 7 8; do
    port=$((20000 + (RANDOM % 20000)))
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
        --logfile "$work/redis.log" &
    pid=$!
    for _ in $(seq 50); do
        redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break 2
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
done
[ -n "$pid" ] || { echo "redis_tier: could not start redis-server on a free port"; cat "$work/redis.log"; exit 1; }
echo "redis_tier: redis-server on 127.0.0.1:$port"

"$bin" "127.0.0.1:$port" publish > "$work/publish.out"
check "publish: computed, published and saved to the server" [ $? = 0 ]
keys=$(redis-cli -p "$port" --raw keys 'kvattn:pb:*' | wc -l)
check "the server holds the prompt's 8 block records ($keys)" [ "$keys" = 8 ]
"$bin" "127.0.0.1:$port" reuse > "$work/reuse.out"
check "reuse: a second process reused the whole prompt, bit for bit recomputation's output" [ $? = 0 ]
a=$(sed -n 's/.*output //p' "$work/publish.out")
b=$(sed -n 's/.*output //p' "$work/reuse.out" | head -n 1)
same=no; [ -n "$a" ] && [ "$a" = "$b" ] && same=yes
check "the two processes' outputs are the same bytes" [ "$same" = yes ]
grep -q "128 of 128 prompt tokens reused" "$work/reuse.out"
check "reuse: 128 of 128 prompt tokens reused" [ $? = 0 ]

# one record corrupted in the server (a byte of its rows): refused, the lookup stops there
key=$(redis-cli -p "$port" --raw keys 'kvattn:pb:*' | head -n 1)
redis-cli -p "$port" setrange "$key" 2000 X >/dev/null
"$bin" "127.0.0.1:$port" reuse > "$work/bad.out" 2> "$work/bad.err"
rc=$?
grep -q "1 records refused" "$work/bad.out" && counted=yes || counted=no
check "a corrupted record: refused (exit 1, not a crash), counted" [ "$rc:$counted" = 1:yes ]
redis-cli -p "$port" flushall >/dev/null
"$bin" "127.0.0.1:$port" reuse > "$work/empty.out" 2> "$work/empty.err"
rc=$?
grep -q "0 of 128 prompt tokens reused" "$work/empty.out" && missed=yes || missed=no
check "an empty server: every lookup a miss (exit 1, not a crash)" [ "$rc:$missed" = 1:yes ]

# kvattn_run --serve --prefix-redis: a restart starts warm, bit for bit
if [ -n "$run_bin" ]; then
    redis-cli -p "$port" flushall >/dev/null
    base="Once upon a time, there was a little girl named Lily. She liked to play outside in the park with her"
    printf '%s friends. One day\n%s dog. Then\n%s mom and\n' "$base" "$base" "$base" > "$work/prompts.txt"
    serve() { # OUT ERR FLAGS...
        local out=$1 err=$2
        shift 2
        "$run_bin" "$model_dir/model.bin" -z "$model_dir/tokenizer.bin" -t 0 -n 60 --block-size 8 \
            --serve "$work/prompts.txt" "$@" > "$out" 2> "$err"
    }
    serve "$work/plain.out" "$work/plain.err"
    check "kvattn_run --serve without a tier" [ $? = 0 ]
    serve "$work/cold.out" "$work/cold.err" --prefix-redis "127.0.0.1:$port"
    check "kvattn_run --serve --prefix-redis, first run" [ $? = 0 ]
    grep -q "0 records loaded at the start" "$work/cold.err" && grep -q " 6 saved to it" "$work/cold.err"
    check "first run: nothing to load, 6 blocks saved" [ $? = 0 ]
    serve "$work/warm.out" "$work/warm.err" --prefix-redis "127.0.0.1:$port"
    check "kvattn_run --serve --prefix-redis, restarted" [ $? = 0 ]
    grep -q "6 records loaded at the start, 0 refused" "$work/warm.err" &&
        grep -q "found in the prefix tier" "$work/warm.err"
    check "restarted: the 6 records loaded, the shared prefix found there" [ $? = 0 ]
    cmp -s "$work/plain.out" "$work/cold.out" && cmp -s "$work/plain.out" "$work/warm.out"
    check "outputs of both runs equal the run without a tier" [ $? = 0 ]
    serve "$work/f16.out" "$work/f16.err" --prefix-redis "127.0.0.1:$port" --kv-dtype f16
    grep -q "0 records loaded at the start, 6 refused" "$work/f16.err"
    check "an F16 cache refuses the F32 cache's records" [ $? = 0 ]
fi

# the server gone: the program says so
kill "$pid"; wait "$pid" 2>/dev/null; pid=
"$bin" "127.0.0.1:$port" reuse > /dev/null 2> "$work/down.err"
rc=$?
grep -q "no Redis server" "$work/down.err" && said=yes || said=no
check "no server: a message and exit 1" [ "$rc:$said" = 1:yes ]

[ "$fails" = 0 ] && echo "redis_tier: all checks passed" || echo "redis_tier: $fails check(s) failed"
[ "$fails" = 0 ]
