#!/usr/bin/env bash
# tests/check_repo.sh - the repository stands on its own (the `repo-check`
# step of tests/run_matrix.sh; runs alone too: bash tests/check_repo.sh [ROOT]).
#
# (a) References: every text file of the repository (git ls-files, tracked or
#     new but not ignored; every file under ROOT outside .git/ and build/ when
#     ROOT is not a git checkout; binary files such as bench/model/*.bin and
#     data that is not prose - the corpora, token ids and tables under
#     bench/model/, *.csv, *.tsv, *.ids - are skipped) is searched for references to things a reader of the
#     repository cannot open:
#       - machine paths: a user's, root's, a mount's or a workspace's
#         directory on some machine, a directory beside the checkout, and
#         /tmp (a program that needs scratch space writes under
#         "${TMPDIR:-/tmp}", which is allowed, or uses mktemp);
#       - documents outside the repository: a fact sheet, any API reference
#         but docs/API.md;
#       - the process that produced the code: the write-up it grew from and
#         the tracker's tickets (a random seed, --seed, kt_seed(...) are fine);
#       - markdown links [text](path) and `dir/file` paths quoted in markdown
#         (under examples/ tests/ bench/ docs/ cmake/ .ci/) that name a file
#         the repository does not have.
#     This script itself is not searched, and it spells its patterns in
#     pieces ('a''b' is "ab" to the shell) so that it does not contain the
#     words it looks for.
# (b) docs/API.md covers kvattn.h: every public name of the header (KVA_API
#     functions, kva_* types, KVA_* / KVATTN_* enum constants and macros
#     without a double underscore, and the fields of every public struct)
#     must appear in docs/API.md as a word; its "API at a glance" block must
#     declare every public struct with every field and name every enum
#     constant; and every kva_* / KVA_* / KVATTN_* name that docs/API.md
#     mentions must exist in kvattn.h.
# (c) The examples of docs/API.md and README.md run: every ```c block whose
#     first line is #include "kvattn.h" is a whole program; each is built
#     with $CC (cc) -std=c99 -O2 -pedantic -Wall -Wextra -Werror and with
#     $CXX (c++) as C++11, and must exit 0.  Every other ```c block compiles
#     after #include "kvattn.h" under the same warnings: declarations quoted
#     from the header must agree with it (check_declaration_blocks says how),
#     and a block whose first line is a "statements" comment compiles as a
#     function body.
#
# Prints every finding as FILE:LINE: what: the text, then a summary line;
# CHECK_REPO_LIST=1 also prints every public name of kvattn.h it looks for.
# Exit status 0 when nothing was found, 1 otherwise, 2 on a usage error.
{
set -u -o pipefail
export LC_ALL=C

ROOT=${1:-"$(dirname "$0")/.."}
cd "$ROOT" || { echo "check_repo: cannot enter $ROOT"; exit 2; }
SELF=tests/check_repo.sh
HEADER=kvattn.h
DOC=docs/API.md
bad=0

say() { printf '%s\n' "$*"; bad=$((bad + 1)); }

# ------------------------------------------------------------ the file list
files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    while IFS= read -r f; do files+=("$f"); done < <(git ls-files --cached --others --exclude-standard | sort -u)
    how="git ls-files"
else
    while IFS= read -r f; do files+=("${f#./}"); done < <(find . -type d \( -name .git -o -name build \) -prune -o -type f -print | sort)
    how="find (not a git checkout)"
fi
text=()
n_bin=0
n_data=0
for f in "${files[@]}"; do
    [ -f "$f" ] || continue # deleted in the work tree, not yet committed
    [ "$f" = "$SELF" ] && continue
    case $f in
        *.bin | *.png | *.jpg | *.gz | *.tar | *.zip) n_bin=$((n_bin + 1)); continue ;;
        bench/model/*.txt | *.csv | *.tsv | *.ids) n_data=$((n_data + 1)); continue ;;
    esac
    if [ -s "$f" ] && ! grep -Iq . "$f"; then # grep -I: a file with NUL bytes is binary
        n_bin=$((n_bin + 1))
        continue
    fi
    text+=("$f")
done
echo "check_repo: ${#text[@]} text files ($how; $n_bin binary and $n_data data files skipped)"

# ------------------------------------------------------- (a) references
# hit FILE EXTENDED-REGEX WHAT [grep options]: report every matching line
hit() {
    local f=$1 re=$2 what=$3 line
    shift 3
    while IFS= read -r line; do
        say "$f:${line%%:*}: $what: ${line#*:}"
    done < <(grep -nE "$@" -e "$re" -- "$f")
}

P_BESIDE='\.\./sha''red'
P_OUTSIDE_DOC='\bFA''CTS\b'
P_WRITEUP='\bthe se''ed\b|\bse''ed/|\bse''ed[ -](write-?up|text|module|says)'
P_TRACKER='\biss''ues?\b'
n_refs_before=$bad
for f in "${text[@]}"; do
    hit "$f" '/(work|home|root|Users|mnt)/' "machine path"
    hit "$f" "$P_BESIDE" "outside directory"
    # /tmp: only the "${TMPDIR:-/tmp}" idiom
    while IFS= read -r line; do
        rest=${line#*:}
        # shellcheck disable=SC2016  # the literal text ${TMPDIR:-/tmp}
        rest=${rest//'${TMPDIR:-/tmp}'/}
        if grep -qE '(^|[^A-Za-z0-9_.-])/tmp($|[^A-Za-z0-9_])' <<<"$rest"; then
            say "$f:${line%%:*}: machine path (write scratch files under \${TMPDIR:-/tmp} or mktemp): ${line#*:}"
        fi
    done < <(grep -n '/tmp' -- "$f")
    hit "$f" "$P_OUTSIDE_DOC" "outside document (state the fact and its public source where it is used)"
    # API.md: only docs/API.md (also ./docs/API.md, ../docs/API.md)
    while IFS= read -r line; do
        m=${line#*:}
        [[ $m =~ ^(\.\.?/)*docs/API\.md$ ]] && continue
        say "$f:${line%%:*}: outside document (the reference is docs/API.md): $m"
    done < <(grep -noE '[A-Za-z0-9_./-]*API\.md' -- "$f")
    hit "$f" "$P_WRITEUP" "the process, not the repository (a random seed is fine)" -i
    hit "$f" "$P_TRACKER" "the process, not the repository" -i
done

# markdown: links and quoted repository paths must resolve
# shellcheck disable=SC2016  # backquotes of markdown, not a command
QUOTED_PATH='`(examples|tests|bench|docs|cmake|\.ci)/[A-Za-z0-9_./*-]+`'
for f in "${text[@]}"; do
    case $f in *.md) ;; *) continue ;; esac
    dir=$(dirname "$f")
    while IFS= read -r line; do
        n=${line%%:*}
        target=${line#*:}
        target=${target#*](}
        target=${target%)}
        target=${target%% *} # [x](path "title")
        case $target in
            '' | '#'* | http://* | https://* | mailto:* | ftp://*) continue ;;
            /*) say "$f:$n: absolute link: $target"; continue ;;
        esac
        target=${target%%#*}
        [ -e "$dir/$target" ] || say "$f:$n: link to a file the repository does not have: $target"
    done < <(grep -noE '\[[^]]*\]\([^)]*\)' -- "$f")
    while IFS= read -r line; do
        n=${line%%:*}
        p=${line#*:}
        p=${p#\`}
        p=${p%\`}
        case $p in *'*'* | *'$'* | *'<'* | *'{'*) continue ;; esac
        [ -e "$p" ] || say "$f:$n: names a file the repository does not have: $p"
    done < <(grep -noE "$QUOTED_PATH" -- "$f")
done
echo "check_repo: references: $((bad - n_refs_before)) finding(s)"

# ------------------------------------------------ (b) docs/API.md coverage
if [ ! -f "$HEADER" ]; then
    say "$HEADER: does not exist"
elif [ ! -f "$DOC" ]; then
    say "$DOC: does not exist (the API reference for $HEADER)"
else
    # the header without comments (awk: comments may span lines)
    code=$(awk '
        {
            out = ""; s = $0
            while (s != "") {
                if (inc) {
                    i = index(s, "*/"); if (i == 0) { s = ""; break }
                    s = substr(s, i + 2); inc = 0
                } else {
                    i = index(s, "/*"); j = index(s, "//")
                    if (j > 0 && (i == 0 || j < i)) { out = out substr(s, 1, j - 1); s = ""; break }
                    if (i == 0) { out = out s; s = ""; break }
                    out = out substr(s, 1, i - 1) " "; s = substr(s, i + 2); inc = 1
                }
            }
            print out
        }' "$HEADER")
    names=()
    # functions
    while IFS= read -r w; do names+=("function $w"); done < <(grep -oE '^KVA_API [^(]*\(' <<<"$code" |
        grep -oE 'kva_[a-z0-9_]+\($' | tr -d '(' | grep -v '^kva__' | sort -u)
    # types: typedef ... } kva_x;  and typedef struct kva_x kva_x;
    while IFS= read -r w; do names+=("type $w"); done < <(
        { grep -E '^(typedef|\})' <<<"$code" | grep -oE '\} *kva_[a-z0-9_]+;'
          grep -oE '^typedef (struct|enum) kva_[a-z0-9_]+ kva_[a-z0-9_]+;' <<<"$code"; } |
            grep -oE 'kva_[a-z0-9_]+;' | tr -d ';' | grep -v '^kva__' | sort -u)
    # enum constants and macros (also those only named in comments, e.g. KVA_API)
    while IFS= read -r w; do names+=("constant/macro $w"); done < <(grep -ohE '\bKVA(TTN)?_[A-Z0-9_]+\b' "$HEADER" |
        grep -v '__' | sort -u)
    # fields of public structs: "typedef struct {" ... "} kva_x;" (one line or many)
    while IFS= read -r w; do names+=("field $w"); done < <(awk '
        /^typedef struct *\{/ { inside = 1; body = ""; sub(/^typedef struct *\{/, "") }
        inside && /\} *[A-Za-z0-9_]+;/ {
            inside = 0
            name = $0; sub(/^.*\} */, "", name); sub(/;.*/, "", name)
            line = $0; sub(/\}[^}]*$/, "", line); body = body " " line
            if (name !~ /^kva_/ || name ~ /^kva__/) next
            n = split(body, decl, ";")
            for (k = 1; k <= n; k++) {
                d = decl[k]
                if (match(d, /\(\*[A-Za-z_][A-Za-z0-9_]*\)/)) {   # function pointer
                    print name "." substr(d, RSTART + 2, RLENGTH - 3); continue
                }
                gsub(/\[[^]]*\]/, "", d)
                m = split(d, part, ",")
                for (p = 1; p <= m; p++) {
                    q = part[p]; gsub(/[*]/, " ", q); gsub(/[ \t]+$/, "", q)
                    if (q !~ /[A-Za-z0-9_]$/) continue
                    match(q, /[A-Za-z_][A-Za-z0-9_]*$/)
                    print name "." substr(q, RSTART, RLENGTH)
                }
            }
            next
        }
        inside { body = body " " $0 }' <<<"$code" | sort -u)

    [ -n "${CHECK_REPO_LIST:-}" ] && printf "%s\n" "${names[@]}"
    missing=0
    for entry in "${names[@]}"; do
        kind=${entry% *}
        w=${entry##* }
        word=${w##*.} # a field is looked up by its own name
        if ! grep -qw -- "$word" "$DOC"; then
            say "$DOC: missing $kind $w (public in $HEADER)"
            missing=$((missing + 1))
        fi
    done
    # the "API at a glance" block declares every public struct with all of its
    # fields, and every enum constant, so that it is the whole API on one page
    glance=$(awk '/^## API at a glance/ { on = 1 } on && /^```c$/ { inb = 1; next }
                  inb && /^```$/ { exit } inb' "$DOC")
    glance_start=$(grep -n '^## API at a glance' "$DOC" | head -n 1 | cut -d: -f1)
    declare -A glance_struct=()
    while IFS=$'\t' read -r sname sbody; do
        glance_struct[$sname]=$sbody
    done < <(awk '
        /typedef struct/ { inside = 1; body = "" }
        inside { body = body " " $0 }
        inside && /\} *kva_[a-z0-9_]+;/ {
            inside = 0; name = $0; sub(/^.*\} */, "", name); sub(/;.*/, "", name)
            print name "\t" body
        }' <<<"$glance")
    n_glance=0
    for entry in "${names[@]}"; do
        kind=${entry% *}
        w=${entry##* }
        case $kind in
            field)
                sname=${w%%.*}
                if [ -z "${glance_struct[$sname]+x}" ]; then
                    say "$DOC:$glance_start: API at a glance: no declaration of struct $sname (public in $HEADER)"
                    glance_struct[$sname]=" " # say it once
                elif ! grep -qw -- "${w##*.}" <<<"${glance_struct[$sname]}"; then
                    say "$DOC:$glance_start: API at a glance: $sname lacks the field ${w##*.} (public in $HEADER)"
                fi
                n_glance=$((n_glance + 1)) ;;
        esac
    done
    while IFS= read -r w; do
        n_glance=$((n_glance + 1))
        grep -qw -- "$w" <<<"$glance" || say "$DOC:$glance_start: API at a glance: no enum constant $w (public in $HEADER)"
    done < <(awk '/^typedef enum/ { inside = 1 } inside { print } inside && /\}/ { inside = 0 }' <<<"$code" |
        grep -oE '\bKVA_[A-Z0-9_]+\b' | grep -v '__' | sort -u)
    echo "check_repo: $DOC: API at a glance: $n_glance struct fields and enum constants checked"
    # the other way: names the document uses must exist
    stale=0
    while IFS= read -r w; do
        if ! grep -qw -- "$w" "$HEADER"; then
            say "$DOC:$(grep -nw -- "$w" "$DOC" | head -n 1 | cut -d: -f1): names $w, which $HEADER does not have"
            stale=$((stale + 1))
        fi
    done < <(grep -ohE '\b(kva_[a-z0-9_]*[a-z0-9]|KVA(TTN)?_[A-Z0-9_]*[A-Z0-9])\b' "$DOC" | grep -v '__' | sort -u)
    echo "check_repo: $DOC: ${#names[@]} public names of $HEADER checked, $missing missing; $stale unknown name(s) in $DOC"
fi

# ------------------------------- (c) the examples of docs/API.md and README.md run

# c_blocks DOC PREFIX SUFFIX WHOLE: writes DOC's ```c blocks that are whole
# programs (WHOLE 1: the first line is #include "kvattn.h") or the others
# (WHOLE 0) to $work/PREFIX<n>SUFFIX; prints "n:first line" for each
c_blocks() {
    awk -v dir="$work" -v prefix="$2" -v suffix="$3" -v whole="$4" '
        /^```c$/ { inb = 1; first = 1; buf = ""; start = NR + 1; next }
        inb && /^```$/ {
            inb = 0
            if (keep) { n++; f = dir "/" prefix n suffix; printf "%s", buf > f; close(f); print n ":" start }
            keep = 0; next
        }
        inb { if (first) { keep = (($0 == "#include \"kvattn.h\"") == (whole == 1)); first = 0 } buf = buf $0 "\n" }' "$1"
}

# check_declaration_blocks DOC: every other ```c block (declarations quoted from
# kvattn.h, or statements) compiles after #include "kvattn.h" with
# -Wall -Wextra -Werror: a prototype that differs from the header's is a
# conflicting-types error, a #define a redefinition; a typedef the block
# declares is compiled under another name (kva_x_doc_, its enum constants
# KVA_Y_doc_) and must have the header's size and constant values.  A block
# of statements (no declaration at file scope) is compiled as the body of a
# function whose parameters are the names it uses from the example before it.
check_declaration_blocks() {
    local doc=$1 n=0 i start src types consts t k
    while IFS=: read -r i start; do
        n=$((n + 1))
        src=$work/decl_$i.c
        types=$(grep -oE '\} *kva_[a-z0-9_]+;' "$work/decl_$i.txt" | grep -oE 'kva_[a-z0-9_]+')
        consts=$(awk '/typedef enum/ { on = 1 } on { print } on && /\}/ { on = 0 }' "$work/decl_$i.txt" |
            grep -oE '\bKVA_[A-Z0-9_]+\b' | sort -u)
        {
            echo '#include "kvattn.h"'
            if head -n 1 "$work/decl_$i.txt" | grep -q '^/\* statements'; then
                echo 'void kvadoc_fragment(kva_cache *c, kva_attn a, int *seqs, int *n_new, int n_seqs,'
                echo '                     float *q_all, float *out_all);'
                echo 'void kvadoc_fragment(kva_cache *c, kva_attn a, int *seqs, int *n_new, int n_seqs,'
                echo '                     float *q_all, float *out_all) {'
                cat "$work/decl_$i.txt"
                echo '}'
            else
                # the names the block defines get another name: a typedef's at "} kva_x;", the constants
                # inside a typedef enum (uses elsewhere keep the header's names)
                sed -E -e '/typedef enum/,/\}/ s/\b(KVA_[A-Z0-9_]+)\b/\1_doc_/g; s/\} *(kva_[a-z0-9_]+);/} \1_doc_;/g' \
                    -e 's/^typedef struct (kva_[a-z0-9_]+) +(kva_[a-z0-9_]+);/typedef struct \1 \2_doc_;/' \
                    "$work/decl_$i.txt"
                for t in $types; do
                    echo "typedef char ${t}_doc_size[sizeof(${t}_doc_) == sizeof($t) ? 1 : -1];"
                done
                for k in $consts; do
                    echo "typedef char ${k}_doc_value[(long)${k}_doc_ == (long)$k ? 1 : -1];"
                done
            fi
        } >"$src"
        if ! "$cc" -std=c99 -pedantic -Wall -Wextra -Werror -Wno-unused-local-typedefs -I. -c "$src" \
            -o "$work/decl_$i.o" >"$work/log" 2>&1; then
            say "$doc:$start: the declarations starting here do not compile after kvattn.h (or differ from it):"
            sed 's/^/    /' "$work/log" | head -n 20
        fi
    done < <(c_blocks "$doc" decl_ .txt 0)
    echo "check_repo: $doc: $n block(s) of declarations or statements compiled after kvattn.h ($cc)"
}
# Each whole-program example is built as C99 with $CC and as C++11 with $CXX
# (C++ accepts C's `= {0}` but -Wextra calls it missing initializers: C++
# code writes `= {}`, so that one warning is off for the C++ build).
if [ -f "$DOC" ] && [ -f "$HEADER" ]; then
    cc=${CC:-cc}
    cxx=${CXX:-c++}
    if ! command -v "$cc" >/dev/null 2>&1; then
        say "$DOC: cannot build its examples: no C compiler ($cc; set CC)"
    elif ! command -v "$cxx" >/dev/null 2>&1; then
        say "$DOC: cannot build its examples as C++: no C++ compiler ($cxx; set CXX)"
    else
        work=$(mktemp -d "${TMPDIR:-/tmp}/kvattn_check.XXXXXX") || exit 2
        trap 'rm -rf "$work"' EXIT
        for doc in "$DOC" README.md; do
            [ -f "$doc" ] || continue
            n_ex=0
            rm -f "$work"/example_*
            while IFS=: read -r i start; do
                n_ex=$((n_ex + 1))
                src=$work/example_$i.c
                for lang in c c++; do
                    if [ "$lang" = c ]; then
                        # -O2: the flow warnings (a variable maybe used uninitialized)
                        build=("$cc" -std=c99 -O2 -pedantic -Wall -Wextra -Werror)
                    else
                        build=("$cxx" -x c++ -std=c++11 -pedantic -Wall -Wextra -Wno-missing-field-initializers -Werror)
                    fi
                    if ! "${build[@]}" -I. "$src" -o "$work/example_$i" -lm >"$work/log" 2>&1; then
                        say "$doc:$start: the example starting here does not build as $lang (${build[0]}):"
                        sed 's/^/    /' "$work/log" | head -n 20
                    elif ! (cd "$work" && timeout 60 "./example_$i") >"$work/log" 2>&1; then
                        say "$doc:$start: the example starting here exits with a failure (built as $lang):"
                        sed 's/^/    /' "$work/log" | head -n 20
                    fi
                done
            done < <(c_blocks "$doc" example_ .c 1)
            echo "check_repo: $doc: $n_ex example(s) built as C ($cc) and C++ ($cxx) and run"
            check_declaration_blocks "$doc"
        done
    fi
fi

if [ "$bad" -gt 0 ]; then
    echo "check_repo: FAILED: $bad finding(s)"
    exit 1
fi
echo "check_repo: OK"
exit 0
}
