#!/usr/bin/env bash
# Builds the project and runs the test suite: the layout check (clang-format), the API reference
# (Doxygen), release (g++), g++-11, then clang++ with ASan+UBSan against hiredis 1.x, then g++
# with TSan; ends with a summary of each stage.
# Usage: tests/run.sh [--quick]    --quick: the layout check, release build and tests, and the API
#                                  reference, only.
set -euo pipefail

usage() {
    echo "usage: $0 [--quick]" >&2
    exit 2
}

quick=0
case "${1:-}" in
    "") ;;
    --quick) quick=1 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
esac
[[ $# -le 1 ]] || usage

cd "$(dirname "${BASH_SOURCE[0]}")/.."

SECONDS=0

# One line per stage for the summary: name, result, tests, time; and what was skipped and why.
summary=()
current_stage=""
current_log=""
stage_started=0

minutes() {
    printf '%dm%02ds' $(($1 / 60)) $(($1 % 60))
}

# Counts from the last ctest summary in a log: "N run, P passed, F failed[, S skipped]".
ctest_counts() {
    local log=$1 line total failed skipped
    [[ -f $log ]] || { echo "tests not reached"; return 0; }
    line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1) ||
        true
    [[ -n $line ]] || { echo "tests did not finish"; return 0; }
    total=${line##* out of }
    failed=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")
    skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log" || true)
    printf '%d run, %d passed, %d failed' "$total" $((total - failed - skipped)) "$failed"
    ((skipped == 0)) || printf ', %d skipped' "$skipped"
    echo
}

# stage_begin NAME [CTEST_LOG]: times a stage; stage_end RESULT records it.
stage_begin() {
    current_stage=$1
    current_log=${2:-}
    stage_started=$SECONDS
    [[ -z $current_log ]] || rm -f "$current_log"
}
stage_end() {
    local counts="-"
    [[ -z $current_log ]] || counts=$(ctest_counts "$current_log")
    summary+=("$(printf '%-14s %-8s %-42s %s' "$current_stage" "$1" "$counts" \
        "$(minutes $((SECONDS - stage_started)))")")
    current_stage=""
}
skip_stage() {
    summary+=("$(printf '%-14s %-8s %s' "$1" skipped "$2")")
}
# What a stage left out on purpose, printed under the summary.
summary_notes=()

report_time() {
    local status=$?
    # The summary must print whatever failed: no early exit from here on. (In a trap, a bare
    # `return` would also return the status the trap was entered with.)
    set +e
    local verdict="PASSED"
    [[ $status -eq 0 ]] || verdict="FAILED (exit $status)"
    # A stage still open here ended the run early, even when a signal left the status at 0.
    if [[ -n $current_stage ]]; then
        [[ $status -ne 0 ]] || verdict="FAILED (interrupted)"
        stage_end FAILED
    fi
    if ((${#summary[@]} > 0)); then
        printf '\n==== summary ====\n'
        printf '%s\n' "${summary[@]}"
        ((${#summary_notes[@]} == 0)) || printf '%s\n' "${summary_notes[@]}"
    fi
    printf '\n==== %s in %s ====\n' "$verdict" "$(minutes $SECONDS)"
}
trap report_time EXIT

banner() {
    printf '\n==== %s ====\n' "$*"
}

# Builds and test runs share at most two cores.
jobs=$(nproc 2>/dev/null || echo 1)
((jobs <= 2)) || jobs=2

# libgmock-dev: GoogleTest's CMake package (in libgtest-dev) checks gmock's files too. Sentinels
# run as `redis-server --sentinel`; redis-tools brings redis-cli for the cluster set-up.
packages=(
    g++ cmake make pkg-config
    libhiredis-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
    redis-server redis-tools openssl doxygen clang-format-14
)

install_missing_packages() {
    banner "dependencies"
    stage_begin dependencies
    if ! command -v dpkg >/dev/null; then
        echo "dpkg not found: this script expects Debian 12" >&2
        exit 1
    fi
    local missing=() pkg
    for pkg in "${packages[@]}"; do
        dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        echo "all packages present"
        stage_end "ok"
        return
    fi
    echo "installing: ${missing[*]}"
    local as_root=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "not root and sudo is missing" >&2; exit 1; }
        as_root=(sudo)
    fi
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}"
    # Installing redis-server may start its system service on port 6379. The tests start their
    # own servers on free ports, so that service is neither needed nor touched.
    stage_end "ok"
}

# GCC 12's sanitizer runtimes cannot map their shadow memory when the kernel uses more than 28
# bits of mmap randomisation; running without address randomisation avoids that.
sanitizer_launcher=()
rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)
if ((rnd_bits > 28)) && setarch "$(uname -m)" -R true 2>/dev/null; then
    sanitizer_launcher=(setarch "$(uname -m)" -R)
fi

warnings="-Wall -Wextra -Wpedantic -Werror"

# Extra ctest arguments (such as a label filter) for the next run_suite calls.
ctest_args=()

# run_suite NAME CXX_FLAGS [extra cmake args...] -- [env for ctest...]
run_suite() {
    local name=$1 cxx_flags=$2
    shift 2
    local cmake_args=()
    while (($# > 0)) && [[ $1 != -- ]]; do
        cmake_args+=("$1")
        shift
    done
    (($# == 0)) || shift
    local test_env=("$@")
    local dir="build/$name"

    stage_begin "$name" "$dir/ctest.log"
    banner "$name: configure"
    cmake -S . -B "$dir" \
        "-DCMAKE_CXX_FLAGS=$cxx_flags" \
        -DREDISLOCK_BUILD_TESTS=ON \
        -DREDISLOCK_BUILD_EXAMPLES=ON \
        -DREDISLOCK_BUILD_BENCHMARKS=ON \
        "${cmake_args[@]}"

    banner "$name: build"
    cmake --build "$dir" -j "$jobs"

    banner "$name: test"
    local launcher=()
    [[ $name == release ]] || launcher=("${sanitizer_launcher[@]}")
    # Also kept in the build directory, where the summary reads the counts from.
    env "${test_env[@]}" "${launcher[@]}" \
        ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$jobs" --timeout 300 "${ctest_args[@]}" \
        2>&1 | tee "$dir/ctest.log"
    stage_end passed
}

# The later stages: the gcc11 stage builds with GCC 11, the oldest compiler supported; the clang
# stage builds with Debian's clang (clang 14 on Debian 12) and its default libstdc++, against
# hiredis 1.x built with hiredis_ssl against OpenSSL from sources npm fetches, as the Redlock
# interop test fetches node-redlock. Debian's npm (with nodejs) is installed only when no npm is
# on the PATH.
if ((quick == 0)); then
    packages+=(g++-11 clang libssl-dev)
    if ! command -v npm >/dev/null; then
        packages+=(npm)
    fi
fi

install_missing_packages

# The C++ sources as .clang-format lays them out with clang-format 14 (Debian 12's; other versions
# lay some lines out otherwise); the generated detail/wire/scripts.hpp keeps its scripts as written.
stage_begin format
banner "format: $(clang-format-14 --version)"
find include tests bench examples tools \( -name '*.hpp' -o -name '*.cpp' \) -print0 |
    xargs -0 clang-format-14 --dry-run --Werror
stage_end passed

# The API reference from the public headers; a public name without a comment fails the stage.
stage_begin docs
banner "docs: API reference"
cmake -S . -B build/docs -DREDISLOCK_BUILD_DOCS=ON
cmake --build build/docs --target redislock_docs
echo "API reference: build/docs/api/html/index.html"
stage_end passed

# Optimised as users build it, without debug information (it would add a third to the build).
run_suite release "$warnings" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG"


if ((quick)); then
    for stage in gcc11 clang-asan tsan; do
        skip_stage "$stage" "--quick"
    done
    exit 0
fi

# GCC 11, the oldest compiler the README promises, with its own libstdc++: the examples and one
# file including every public header, warnings as errors. The tests run with the other compilers.
stage_begin gcc11
banner "gcc11: headers and examples with g++-11"
cmake -S . -B build/gcc11 -DCMAKE_CXX_COMPILER=g++-11 "-DCMAKE_CXX_FLAGS=$warnings" \
    -DCMAKE_BUILD_TYPE= -DREDISLOCK_BUILD_EXAMPLES=ON
cmake --build build/gcc11 -j "$jobs"
for header in include/redislock/*.hpp; do
    echo "#include <redislock/${header##*/}>"
done | g++-11 -std=c++20 $warnings -fsyntax-only -Iinclude -x c++ -
stage_end passed
summary_notes+=("gcc11: builds, runs no tests")

# The release stage runs every test, with the benchmarks, the package consumers and the topology
# tests (clusters, five masters, sentinels). Each later stage runs the tests that start threads
# or inject faults, where a compiler, a sanitizer or another hiredis can change the outcome.
threaded_and_fault_tests=(
    mutex_test recursive_mutex_test shared_mutex_test safety_test fault_exclusion_test
    fault_matrix_test fault_proxy_test faulty_connection_test watchdog_test waiting_test
    events_test hiredis_test client_test reconnect_relay_test internals_test semaphore_test
)
joined() {
    local IFS=$1
    shift
    echo "$*"
}
summary_notes+=("clang-asan, tsan: only ${threaded_and_fault_tests[*]} run (all run in release)")
only_threaded_and_fault="-DREDISLOCK_TEST_ONLY=$(joined ';' "${threaded_and_fault_tests[@]}")"
ctest_args=(--label-exclude "package|topology")

# hiredis 1.x: Debian 12 ships 0.14 only (the release and tsan stages build against it). The npm
# registry's redis-fast-driver package carries hiredis 1.2.0's sources (deps/hiredis); build them
# once into build/hiredis1-dist, and the clang stage builds against that install, found through
# hiredis's own CMake package, so the adapter keeps building and working with 1.x. hiredis_ssl is
# built too (OpenSSL), so rediss:// is tested.
hiredis1_dist=$PWD/build/hiredis1-dist
fetch_hiredis1() {
    banner "hiredis 1.x: fetch and build"
    if [[ -f $hiredis1_dist/prefix/lib/cmake/hiredis_ssl/hiredis_ssl-config.cmake ]]; then
        echo "already built"
        return 0
    fi
    rm -rf "$hiredis1_dist"
    mkdir -p "$hiredis1_dist"
    if ! command -v npm >/dev/null ||
        ! (cd "$hiredis1_dist" && npm pack --silent redis-fast-driver@2.2.6 >/dev/null); then
        echo "not run: the npm package redis-fast-driver@2.2.6 (hiredis 1.2.0) is unavailable"
        return 1
    fi
    tar xzf "$hiredis1_dist/redis-fast-driver-2.2.6.tgz" -C "$hiredis1_dist"
    cmake -S "$hiredis1_dist/package/deps/hiredis" -B "$hiredis1_dist/build" \
        -DCMAKE_BUILD_TYPE=Release -DDISABLE_TESTS=ON -DENABLE_SSL=ON \
        "-DCMAKE_INSTALL_PREFIX=$hiredis1_dist/prefix"
    cmake --build "$hiredis1_dist/build" -j "$jobs"
    cmake --install "$hiredis1_dist/build"
}

stage_begin "hiredis1 fetch"
hiredis1_args=()
asan_tests=("${threaded_and_fault_tests[@]}")
if fetch_hiredis1; then
    stage_end ok
    hiredis1_args=("-DCMAKE_PREFIX_PATH=$hiredis1_dist/prefix")
    # With hiredis 1.x the adapter's own tests run too: connections, TLS, URIs.
    asan_tests+=(connection_test tls_test endpoint_test)
    summary_notes+=("clang-asan: against hiredis 1.2 with TLS; also connection_test tls_test endpoint_test")
else
    stage_end "not run"
    summary_notes+=("clang-asan: hiredis 1.x sources unavailable (see 'not run' above): built against Debian's hiredis")
fi

# clang++ (Debian's, with libstdc++) with the same warnings as errors builds the library, the
# tests it runs and the examples, with AddressSanitizer and UndefinedBehaviorSanitizer
# (unoptimised: GCC takes three times as long to build the same with sanitizers).
asan_flags="-fsanitize=address,undefined"
ctest_args+=(--label-regex ":($(joined '|' "${asan_tests[@]}"))\$")
run_suite clang-asan "$warnings $asan_flags -O0 -g1 -fno-omit-frame-pointer -fno-sanitize-recover=all" \
    -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE= \
    "${hiredis1_args[@]}" \
    "-DREDISLOCK_TEST_ONLY=$(joined ';' "${asan_tests[@]}")" \
    -DREDISLOCK_CHECK_HEADERS=OFF \
    -DREDISLOCK_BUILD_BENCHMARKS=OFF \
    "-DCMAKE_EXE_LINKER_FLAGS=$asan_flags" \
    "-DCMAKE_SHARED_LINKER_FLAGS=$asan_flags" \
    -- \
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest_args=(--label-exclude "package|topology")

# ThreadSanitizer with g++, building only the tests it runs. GCC 12 reports false "may be used
# uninitialized" warnings in libstdc++'s <stop_token> when optimising with sanitizers, so that
# one warning is off here.
run_suite tsan "$warnings -Wno-maybe-uninitialized -fsanitize=thread -O1 -g1 -fno-omit-frame-pointer" \
    -DCMAKE_BUILD_TYPE= \
    "$only_threaded_and_fault" \
    -DREDISLOCK_CHECK_HEADERS=OFF \
    -DREDISLOCK_BUILD_EXAMPLES=OFF \
    -DREDISLOCK_BUILD_BENCHMARKS=OFF \
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
    -- \
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:die_after_fork=0
