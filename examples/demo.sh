#!/usr/bin/env bash
# Builds the examples and runs the demo: several processes increment one counter in Redis, first
# without a lock (increments are lost to the race), then under one redislock::mutex (none are),
# on a private redis-server that this script starts and stops.
# Usage: examples/demo.sh [workers (4)] [increments per worker (5000)]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build/demo"
workers="${1:-4}"
increments="${2:-5000}"

# Installs only what is missing, with one apt-get update before the first install.
install_missing() {
    local missing=()
    local tool package
    for tool in g++ cmake make pkg-config redis-server redis-cli; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            case "$tool" in
                redis-cli) package=redis-tools ;;
                *) package="$tool" ;;
            esac
            missing+=("$package")
        fi
    done
    if ! dpkg-query -W -f='${Status}' libhiredis-dev 2>/dev/null | grep -q 'ok installed'; then
        missing+=(libhiredis-dev)
    fi
    if ((${#missing[@]} == 0)); then
        return
    fi
    local sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        sudo=(sudo)
    fi
    echo "installing: ${missing[*]}"
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}"
}

# A port nobody on 127.0.0.1 answers on; the server's own bind is the final check.
pick_port() {
    local port tries
    for ((tries = 0; tries < 50; tries++)); do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    echo "no free port found on 127.0.0.1" >&2
    exit 1
}

server_pid=""
server_dir=""
kill_server() {
    if [[ -n "$server_pid" ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
stop_server() {
    kill_server
    if [[ -n "$server_dir" ]]; then
        rm -rf "$server_dir"
        server_dir=""
    fi
}
trap stop_server EXIT

# Starts redis-server on a free loopback port and waits until it answers PING; sets $port.
start_server() {
    local attempt tries
    server_dir="$(mktemp -d "${TMPDIR:-/tmp}/redislock-demo-XXXXXX")"
    for ((attempt = 1; attempt <= 5; attempt++)); do
        port="$(pick_port)"
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --daemonize no --dir "$server_dir" --logfile "$server_dir/redis.log" &
        server_pid=$!
        for ((tries = 0; tries < 100; tries++)); do
            if ! kill -0 "$server_pid" 2>/dev/null; then
                break  # exited at once, most likely because another process took the port
            fi
            if [[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" == PONG ]]; then
                return
            fi
            sleep 0.1
        done
        kill_server
    done
    echo "redis-server did not start; its log:" >&2
    cat "$server_dir/redis.log" >&2 || true
    exit 1
}

install_missing

echo "building into $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DREDISLOCK_BUILD_TESTS=OFF \
    -DREDISLOCK_BUILD_BENCHMARKS=OFF -DREDISLOCK_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build" --target demo -j "$(nproc 2>/dev/null || echo 2)" >/dev/null

start_server
echo "redis-server on 127.0.0.1:$port (pid $server_pid)"
status=0
"$build/examples/demo" "redis://127.0.0.1:$port" "$workers" "$increments" || status=$?
stop_server
exit "$status"
