#!/usr/bin/env bash
# The compile-time benchmark: compiler CPU time (user + system, of the compiler's processes) of
# a file that uses redislock, as a ratio to a baseline file that includes hiredis and a few
# standard headers and connects (compile_time/baseline.cpp), with the same compiler and flags.
# Each figure is the minimum over interleaved rounds (baseline, then each file, per round), so
# other work on the machine inflates it as little as possible.
#   (a) compile_time/one_mutex.cpp: the umbrella header, one mutex locked through
#       redislock::client made from a URI
#   (b) compile_time/every_kind.cpp: every lock kind on that client
# Usage: bench/compile_time.sh [--rounds N] [--cxx COMPILER] [-- FLAGS...]
#        (defaults: 5 rounds, c++, -std=c++20 -O2)
set -euo pipefail

rounds=5
cxx=c++
flags=(-std=c++20 -O2)
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --cxx) cxx=$2; shift 2 ;;
        --) shift; flags=("$@"); break ;;
        -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "--rounds takes a positive count" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
include=$here/../include
files=(baseline one_mutex every_kind)
declare -A best

# CPU seconds (user + system) the compiler's processes took to compile one file.
cpu_seconds() {
    local TIMEFORMAT='%U %S' times
    times=$({ time "$cxx" "${flags[@]}" -I"$include" -c "$here/compile_time/$1.cpp" \
        -o /dev/null >/dev/null 2>&1; } 2>&1) || {
        echo "compiling compile_time/$1.cpp failed" >&2
        "$cxx" "${flags[@]}" -I"$include" -c "$here/compile_time/$1.cpp" -o /dev/null
        exit 1
    }
    awk '{ printf "%.3f", $1 + $2 }' <<<"$times"
}

echo "compiler: $("$cxx" --version | head -n 1); flags: ${flags[*]}; rounds: $rounds"
for ((round = 1; round <= rounds; ++round)); do
    line="round $round:"
    for f in "${files[@]}"; do
        s=$(cpu_seconds "$f")
        line+=" $f ${s}s"
        if [[ -z ${best[$f]:-} ]] || awk -v a="$s" -v b="${best[$f]}" 'BEGIN { exit !(a < b) }'; then
            best[$f]=$s
        fi
    done
    echo "$line"
done
echo
printf '%-44s %9s %7s\n' "file (minimum of $rounds)" "CPU s" "ratio"
for f in "${files[@]}"; do
    printf '%-44s %9s %6.2fx\n' "compile_time/$f.cpp" "${best[$f]}" \
        "$(awk -v a="${best[$f]}" -v b="${best[baseline]}" 'BEGIN { print a / b }')"
done
echo "(c) separately compiled mode: not built yet (REDISLOCK_SEPARATE_COMPILATION does not exist)"
