#!/usr/bin/env bash
# tests/readme_commands.sh - every command in README.md's ```sh blocks runs as
# written from the repository root (the `readme-commands` step of
# tests/run_matrix.sh; runs alone too: bash tests/readme_commands.sh [ROOT]).
#
# The repository (git ls-files, or every file outside .git/ and build/) is
# copied to a scratch directory, so that the commands' build/ does not meet
# the matrix's; there each block runs in one bash (a variable set on one line
# is seen by the next), line by line, and every line must exit 0 (pipefail).
# The commands that other steps run, or that cannot run inside a test, are
# listed in SKIP with the reason; a README command matching none of them runs.
#
# Prints one line per command ([ok] / [FAIL] / [skip] and why), then a
# summary line.  Exit status 0 when every command ran, 1 otherwise.
{
set -u -o pipefail
export LC_ALL=C

ROOT=${1:-"$(dirname "$0")/.."}
cd "$ROOT" || { echo "readme_commands: cannot enter $ROOT"; exit 2; }
DOC=README.md
[ -f "$DOC" ] || { echo "readme_commands: no $DOC in $PWD"; exit 2; }

# command (as written, before any # comment) -> why this test does not run it
declare -A SKIP=(
    ["make test"]="this test is one of its steps"
    ["make test-all"]="this test is one of its steps"
    ["make bench"]="minutes of timing; the bench-smoke step builds the bench and runs its quick summary"
    ["make plot"]="the bench's timed runs (and gnuplot); the bench-smoke step runs the bench"
    ["make fuzz"]="FUZZ_SECONDS per harness; the fuzz-* steps run each harness briefly"
    ["make install"]="writes under /usr/local; the consumer-* steps run it with DESTDIR and PREFIX"
    ["make uninstall"]="the consumer-cmake-installed step runs it after its make install"
    ['cc $(pkg-config --cflags kvattn) app.c $(pkg-config --libs kvattn)']="app.c is the reader's program; the consumer-pkgconfig step builds one this way"
)

work=$(mktemp -d "${TMPDIR:-/tmp}/kvattn_readme.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -z |
        while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
        xargs -0 cp --parents -t "$work/repo" || exit 2
else
    find . -type d \( -name .git -o -name build \) -prune -o -type f -print0 |
        xargs -0 cp --parents -t "$work/repo" || exit 2
fi

# block: the current sh block's lines, "N<TAB>text"
n_run=0 n_fail=0 n_skip=0
block=()
run_block() {
    local entry line text cmd rc lines=() cmds=() joined=() pending=""
    # a line ending in a backslash continues on the next: one command, at its first line
    for entry in "${block[@]}"; do
        if [ -n "$pending" ]; then
            entry="${pending%\\} ${entry#*$'\t'}"
            pending=""
        fi
        if [[ $entry == *\\ ]]; then pending=$entry; else joined+=("$entry"); fi
    done
    [ -z "$pending" ] || joined+=("$pending")
    for entry in "${joined[@]}"; do
        line=${entry%%$'\t'*}
        text=${entry#*$'\t'}
        # the command as written, without its trailing "# comment"
        cmd=$(sed -E 's/^[[:space:]]*#.*$//; s/[[:space:]]+#.*$//; s/[[:space:]]+$//' <<<"$text")
        [ -n "$cmd" ] || continue # a comment line
        if [ -n "${SKIP[$cmd]+x}" ]; then
            echo "[skip] $DOC:$line: $cmd (${SKIP[$cmd]})"
            n_skip=$((n_skip + 1))
        else
            lines+=("$line")
            cmds+=("$cmd")
        fi
    done
    block=()
    [ ${#cmds[@]} -gt 0 ] || return
    # one bash for the block: each line, then its exit status and line number to fd 3
    : >"$work/status"
    {
        echo 'set -o pipefail'
        for ((i = 0; i < ${#cmds[@]}; i++)); do
            printf '%s\n' "${cmds[i]}"
            printf 'echo "$? %s" >&3\n' "${lines[i]}"
        done
    } >"$work/run.sh"
    (cd "$work/repo" && timeout 600 bash "$work/run.sh" 3>"$work/status" >"$work/log" 2>&1 </dev/null)
    for ((i = 0; i < ${#cmds[@]}; i++)); do
        rc=$(awk -v l="${lines[i]}" '$2 == l { print $1 }' "$work/status")
        n_run=$((n_run + 1))
        if [ "$rc" = 0 ]; then
            echo "[ok] $DOC:${lines[i]}: ${cmds[i]}"
        else
            n_fail=$((n_fail + 1))
            echo "[FAIL] $DOC:${lines[i]}: ${cmds[i]} (exit status ${rc:-none: the block was stopped})"
            tail -n 15 "$work/log" | sed 's/^/    /'
        fi
    done
}
in_block=0
n=0
while IFS= read -r text; do
    n=$((n + 1))
    if [ "$in_block" = 0 ]; then
        [ "$text" = '```sh' ] && in_block=1
        continue
    fi
    if [ "$text" = '```' ]; then
        in_block=0
        run_block
        continue
    fi
    case $text in '' | '#'*) continue ;; esac
    block+=("$n"$'\t'"$text")
done <"$DOC"

echo "readme_commands: $n_run command(s) of $DOC run, $n_fail failed, $n_skip skipped (other steps run them)"
[ "$n_run" -gt 0 ] || { echo "readme_commands: no command found in $DOC's sh blocks"; exit 1; }
[ "$n_fail" -eq 0 ]
exit
}
