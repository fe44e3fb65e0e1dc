// The baseline of the compile-time benchmark: what a file that talks to Redis through hiredis
// alone includes and does.
#include <hiredis/hiredis.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
    const std::string host = argc > 1 ? argv[1] : "127.0.0.1";
    std::unique_ptr<redisContext, void (*)(redisContext*)> ctx{redisConnect(host.c_str(), 6379),
                                                               redisFree};
    std::mutex m;
    std::vector<std::function<void()>> work{[&] { std::lock_guard guard{m}; }};
    std::thread t{[&] { work.front()(); }};
    t.join();
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
    return ctx && ctx->err == 0 ? 0 : 1;
}
