// A node-redlock client for the Redlock interop test.
// Usage: node node_redlock_peer.js MODULES_DIR MODE RESOURCE HOLD_MS PORT...
//   MODE try:  acquire once (no retry); print "acquired" and release, or print "busy".
//   MODE hold: acquire once with a lease of 10 s; print "acquired <token>", keep it HOLD_MS,
//              release, print "released"; or print "busy".
// Exit code 0 unless something unexpected failed.
"use strict";
const path = require("path");
const [modulesDir, mode, resource, holdMs, ...ports] = process.argv.slice(2);
const Redlock = require(path.join(modulesDir, "node_modules", "redlock")).default;
const Redis = require(path.join(modulesDir, "node_modules", "ioredis"));

async function main() {
    const clients = ports.map(
        (port) => new Redis({ host: "127.0.0.1", port: Number(port), maxRetriesPerRequest: 1 }));
    const redlock = new Redlock(clients, { retryCount: 0, driftFactor: 0.01 });
    redlock.on("error", () => {});  // contention is reported through acquire()
    // node-redlock sends EVALSHA and, on NOSCRIPT, EVAL as a second command; one still to be
    // sent when QUIT goes out is lost. Loading the scripts first makes every call one command.
    const sources = Object.values(redlock.scripts).map((s) => s.value);
    await Promise.all(clients.flatMap((c) => sources.map((source) => c.script("LOAD", source))));
    let lock;
    try {
        lock = await redlock.acquire([resource], 10000);
    } catch (e) {
        console.log("busy");
        await quit(clients);
        return;
    }
    console.log("acquired " + lock.value);
    if (mode === "hold") {
        await new Promise((resolve) => setTimeout(resolve, Number(holdMs)));
    }
    await lock.release();
    await quit(clients);
    console.log("released");
}

// release() settles once a quorum answered; QUIT goes after every command already queued, so
// waiting for it lets the releases still in flight reach the other masters before the exit.
async function quit(clients) {
    await Promise.allSettled(clients.map((c) => c.quit()));
}

main().then(() => process.exit(0), (e) => {
    console.log("error " + e);
    process.exit(1);
});
