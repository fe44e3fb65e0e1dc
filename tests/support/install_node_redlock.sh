#!/bin/sh
# Installs node-redlock (npm `redlock`, v5) and ioredis into DIR for the Redlock interop test,
# never globally. Safe to run from several tests at once (flock); a complete install is reused.
# Usage: install_node_redlock.sh DIR
set -eu
dir=$1
mkdir -p "$dir"
exec 9>"$dir/.install.lock"
flock 9
if [ -f "$dir/node_modules/redlock/package.json" ] && [ -f "$dir/node_modules/ioredis/package.json" ]; then
    exit 0
fi
command -v node >/dev/null 2>&1 || { echo "node is not installed"; exit 2; }
command -v npm >/dev/null 2>&1 || { echo "npm is not installed"; exit 2; }
cd "$dir"
[ -f package.json ] || printf '{ "private": true }\n' > package.json
timeout 240 npm install --no-audit --no-fund --loglevel=error redlock@5.0.0-beta.2 ioredis@5
