// redislock-torture: a worker process. It makes its clients, runs one thread per thread_plan,
// each playing its episodes in order, and writes what happened to its log in the journal. A
// holder checks owned() every few milliseconds and records the time of each check that said
// yes (its hold counts until the last of them), and writes its fencing token to the protected
// resource after each. Around the work: a thread that requests the stops the plan asks for,
// and a probe that notes when the process itself was not scheduled on time (so a late return
// is told apart from a slow scheduler). Before its clients exist and after they are gone it
// counts its open descriptors and threads.
//
// A worker restarted after kill -9 goes on with the episode after the one it was killed in.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include "support/exclusion.hpp"
#include "torture/journal.hpp"
#include "torture/locks.hpp"
#include "torture/plan.hpp"
#include "torture/topology.hpp"

namespace redislock::torture {

/// What a worker process needs; copied into it by fork().
struct worker_setup {
    const plan* the_plan = nullptr;
    endpoints where;
    std::vector<std::string> names;
    journal* log = nullptr;
};

inline long count_entries(const char* dir) {
    DIR* d = ::opendir(dir);
    if (d == nullptr) {
        return -1;
    }
    long n = 0;
    while (const dirent* e = ::readdir(d)) {
        if (e->d_name[0] != '.') {
            ++n;
        }
    }
    ::closedir(d);
    return n - (std::string_view{dir} == "/proc/self/fd" ? 1 : 0);  // opendir's own
}

/// Requests stops at the times the plan says, from a thread of its own.
class stopper {
public:
    struct request {
        std::stop_source source;
        std::atomic<std::int64_t> requested_at{0};
        std::atomic<bool> cancelled{false};
    };

    stopper() : thread_{[this] { run(); }} {}
    stopper(const stopper&) = delete;
    stopper& operator=(const stopper&) = delete;
    ~stopper() {
        {
            std::lock_guard guard{mutex_};
            done_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }

    std::shared_ptr<request> at(std::int64_t when_ns) {
        auto r = std::make_shared<request>();
        {
            std::lock_guard guard{mutex_};
            due_.emplace(when_ns, r);
        }
        wake_.notify_all();
        return r;
    }

private:
    void run() {
        std::unique_lock lock{mutex_};
        while (!done_) {
            if (due_.empty()) {
                wake_.wait(lock);
                continue;
            }
            const std::int64_t now = monotonic_ns();
            auto first = due_.begin();
            if (first->first > now) {
                wake_.wait_for(lock, std::chrono::nanoseconds{first->first - now});
                continue;
            }
            auto r = first->second;
            due_.erase(first);
            if (!r->cancelled.load()) {
                lock.unlock();
                r->requested_at.store(monotonic_ns());
                r->source.request_stop();
                lock.lock();
            }
        }
    }

    std::mutex mutex_;
    std::condition_variable wake_;
    std::multimap<std::int64_t, std::shared_ptr<request>> due_;
    bool done_ = false;
    std::thread thread_;
};

/// Notes when this process's threads were not scheduled on time: a thread that asks to sleep
/// 5 ms and wakes more than 10 ms late writes a `late` record.
class lateness_probe {
public:
    lateness_probe(journal& log, int process) : log_{log}, process_{process} {
        thread_ = std::thread{[this] { run(); }};
    }
    lateness_probe(const lateness_probe&) = delete;
    lateness_probe& operator=(const lateness_probe&) = delete;
    ~lateness_probe() {
        done_.store(true);
        thread_.join();
    }

private:
    void run() {
        constexpr std::int64_t period = 5'000'000;
        while (!done_.load()) {
            const std::int64_t before = monotonic_ns();
            std::this_thread::sleep_for(std::chrono::nanoseconds{period});
            const std::int64_t late = monotonic_ns() - before - period;
            if (late > 10'000'000) {
                log_.append(process_, [&](record& r) {
                    r.type = record_type::late;
                    r.process = static_cast<std::uint8_t>(process_);
                    r.t1 = before + period;
                    r.t2 = late;
                });
            }
        }
    }

    journal& log_;
    int process_;
    std::atomic<bool> done_{false};
    std::thread thread_;
};

/// Lets one thread fork while the process's other threads wait between their episodes.
class fork_gate {
public:
    explicit fork_gate(int threads) : active_{threads} {}

    /// Called by a thread between episodes: waits while a fork is under way.
    void pass() {
        std::unique_lock lock{mutex_};
        if (!requested_) {
            return;
        }
        ++parked_;
        changed_.notify_all();
        changed_.wait(lock, [&] { return !requested_; });
        --parked_;
    }

    /// A thread leaves for good.
    void leave() {
        std::lock_guard guard{mutex_};
        --active_;
        changed_.notify_all();
    }

    /// Asks the other threads to wait; true once they all do (false after `patience`, and the
    /// request is withdrawn).
    bool close(std::chrono::milliseconds patience) {
        std::unique_lock lock{mutex_};
        requested_ = true;
        if (changed_.wait_for(lock, patience, [&] { return parked_ >= active_ - 1; })) {
            return true;
        }
        requested_ = false;
        changed_.notify_all();
        return false;
    }

    void open() {
        std::lock_guard guard{mutex_};
        requested_ = false;
        changed_.notify_all();
    }

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    bool requested_ = false;
    int parked_ = 0;
    int active_;
};

class worker {
public:
    worker(int process, const worker_setup& setup)
        : p_{process},
          setup_{setup},
          plan_{*setup.the_plan},
          proc_plan_{plan_.processes[static_cast<std::size_t>(process)]},
          log_{*setup.log},
          now_{log_.process(process)},
          gate_{static_cast<int>(proc_plan_.threads.size())} {}

    /// The worker's life; its exit code.
    int run() {
        for (auto& t : now_.threads) {
            t.waiting_name.store(-1);
            t.hold_name.store(-1);
        }
        now_.fds_before.store(count_entries("/proc/self/fd"));
        now_.tasks_before.store(count_entries("/proc/self/task"));
        while (log_.header().go.load() == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds{1});
        }
        {
            stopper stops;
            lateness_probe probe{log_, p_};
            stops_ = &stops;
            make_clients();
            std::vector<std::thread> threads;
            for (std::size_t t = 0; t < proc_plan_.threads.size(); ++t) {
                threads.emplace_back([this, t] { thread_main(static_cast<int>(t)); });
            }
            for (auto& t : threads) {
                t.join();
            }
            clients_.clear();
            stops_ = nullptr;
        }
        // The library's threads end when the last client and lock are gone; the process's
        // reaper thread lives on (one per process, by design).
        long fds = 0;
        long tasks = 0;
        // Cleanups left to the reaper keep their client's connection and threads until they
        // are done or their lease has surely run out.
        const int polls = (plan_.max_lease_ms() + 6000) / 10;
        for (int i = 0; i < polls; ++i) {
            fds = count_entries("/proc/self/fd");
            tasks = count_entries("/proc/self/task");
            if (fds <= now_.fds_before.load() && tasks <= now_.tasks_before.load() + 1) {
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds{10});
        }
        now_.fds_after.store(fds);
        now_.tasks_after.store(tasks);
        if (fds > now_.fds_before.load()) {
            note("descriptors still open: " + open_descriptors());
        }
        now_.finished.store(1);
        return 0;
    }

private:
    struct holding {
        const episode* ep = nullptr;
        const object_spec* spec = nullptr;
        any_lock* lock = nullptr;
        std::uint32_t actor = 0;
        int thread = 0;
        std::int64_t call_start = 0;
        std::int64_t acquired = 0;
        std::int64_t last_owned = 0;
        std::int64_t remaining_ms = 0;
        std::int64_t lost_at = 0;
        std::int64_t fence = 0;
        int lease_ms = 0;
        std::uint8_t flags = 0;
        bool publish = true;     ///< in thread_now (not in a forked child)
        bool told_lost = false;  ///< a release of this hold answered lock_lost
    };

    static std::string open_descriptors() {
        std::string out;
        DIR* d = ::opendir("/proc/self/fd");
        if (d == nullptr) {
            return out;
        }
        while (const dirent* e = ::readdir(d)) {
            if (e->d_name[0] == '.') {
                continue;
            }
            char target[256] = {};
            const std::string link = std::string{"/proc/self/fd/"} + e->d_name;
            const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
            if (n > 0 && std::atoi(e->d_name) > 2) {
                out += std::string{e->d_name} + "->" +
                       std::string{target, static_cast<std::size_t>(n)} + " ";
            }
        }
        ::closedir(d);
        return out;
    }

    void make_clients() {
        for (const client_spec& spec : proc_plan_.clients) {
            std::unique_ptr<any_client> made;
            // A worker restarted during a fault may not reach the servers at once.
            for (int attempt = 0; !made && attempt < 200; ++attempt) {
                try {
                    made = make_client(setup_.where, spec);
                } catch (const std::exception& e) {
                    if (attempt == 199) {
                        note(std::string{"cannot make a client: "} + e.what());
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds{50});
                }
            }
            clients_.push_back(std::move(made));
        }
    }

    void note(const std::string& text, int thread = 0) {
        log_.append(p_, [&](record& r) {
            r.type = record_type::note;
            r.process = static_cast<std::uint8_t>(p_);
            r.thread = static_cast<std::uint8_t>(thread);
            r.t1 = monotonic_ns();
            set_text(r, text);
        });
    }

    lock_options options_of(const object_spec& o, int thread) const {
        lock_options opts;
        opts.lease = std::chrono::milliseconds{o.lease_ms};
        opts.watchdog = o.watchdog;
        opts.fencing = o.fencing;
        opts.min_replicas = o.min_replicas;
        opts.backoff_max = std::chrono::milliseconds{o.backoff_max_ms};
        opts.max_hold = std::chrono::milliseconds{o.max_hold_ms};
        if (o.explicit_owner) {
            opts.owner = "o" + std::to_string(p_) + "." + std::to_string(thread);
        }
        return opts;
    }

    std::unique_ptr<any_lock> make_lock(any_client& client, const object_spec& o, int thread) {
        return client.make(setup_.names[static_cast<std::size_t>(o.name)],
                           plan_.names[static_cast<std::size_t>(o.name)], options_of(o, thread));
    }

    static std::uint8_t flags_of(const object_spec& o, bool shared) {
        std::uint8_t f = 0;
        f |= o.watchdog ? flag_watchdog : 0;
        f |= o.fencing ? flag_fencing : 0;
        f |= shared ? flag_shared : 0;
        f |= o.explicit_owner ? flag_explicit_owner : 0;
        return f;
    }

    void thread_main(int t) {
        const thread_plan& tp = proc_plan_.threads[static_cast<std::size_t>(t)];
        thread_now& now = now_.threads[t];
        const std::uint32_t actor = log_.new_actor();
        std::vector<std::unique_ptr<any_lock>> objects(tp.objects.size());
        const int first = now.episode.load() + 1;
        // --brisk replays the thread's episodes until the run's time is up (`stop`).
        const int count = static_cast<int>(tp.episodes.size());
        const int end = plan_.shape.brisk && count > 0 ? std::numeric_limits<int>::max() : count;
        for (int e = first; e < end; ++e) {
            if (log_.header().stop.load() != 0) {
                break;
            }
            gate_.pass();
            now.episode.store(e);
            const episode& ep = tp.episodes[static_cast<std::size_t>(e % count)];
            try {
                switch (ep.what) {
                    case episode::kind::hold:
                        hold_episode(t, e, ep, tp, objects, actor, nullptr);
                        break;
                    case episode::kind::fresh_client:
                        fresh_client_episode(t, e, ep, tp, objects, actor);
                        break;
                    case episode::kind::fork:
                        fork_episode(t, e, ep, tp);
                        break;
                }
            } catch (const std::exception& x) {
                note("episode " + std::to_string(e) + ": " + x.what(), t);
            }
            if (ep.idle_ms > 0) {
                std::this_thread::sleep_for(std::chrono::milliseconds{ep.idle_ms});
            }
        }
        objects.clear();
        gate_.leave();
    }

    any_client* client_for(const object_spec& o) {
        return clients_[static_cast<std::size_t>(o.client)].get();
    }

    // Acquire, hold, release. `own_client`: a client made for this episode, destroyed right
    // after the acquisition (the lock outlives it).
    void hold_episode(int t, int e, const episode& ep, const thread_plan& tp,
                      std::vector<std::unique_ptr<any_lock>>& objects, std::uint32_t actor,
                      std::unique_ptr<any_client>* own_client, bool publish = true,
                      std::uint8_t extra_flags = 0) {
        const object_spec& o = tp.objects[static_cast<std::size_t>(ep.object)];
        auto& lock = objects[static_cast<std::size_t>(ep.object)];
        if (!lock) {
            any_client* client = own_client ? own_client->get() : client_for(o);
            if (client == nullptr) {
                return;
            }
            lock = make_lock(*client, o, t);
        }
        thread_now& now = now_.threads[t];
        holding h;
        h.ep = &ep;
        h.spec = &o;
        h.lock = lock.get();
        h.actor = actor;
        h.thread = t;
        h.lease_ms = o.lease_ms;
        h.flags = static_cast<std::uint8_t>(flags_of(o, ep.shared) | extra_flags);
        h.publish = publish;

        // The acquisition.
        const std::int64_t start = monotonic_ns();
        if (publish) {
            now.waiting_lease.store(o.lease_ms);
            now.waiting_since.store(start);
            now.waiting_name.store(o.name);
        }
        const bool got = acquire(t, e, o, *h.lock, ep.call, ep.timeout_ms, ep.stop_ms, ep.shared,
                                 call_op::acquire, h.flags, 0);
        if (publish) {
            now.waiting_name.store(-1);
        }
        if (!got) {
            if (own_client) {
                lock.reset();
                own_client->reset();
            }
            return;
        }
        h.call_start = start;
        h.acquired = monotonic_ns();
        h.fence = (o.fencing && !ep.shared) ? h.lock->fence() : 0;
        if (publish) {
            now.hold_acquired.store(h.acquired);
            now.hold_last_owned.store(0);
            now.hold_fence.store(h.fence);
            now.hold_lease.store(o.lease_ms);
            now.hold_actor.store(actor);
            now.hold_flags.store(h.flags);
            now.hold_object.store(ep.object);
            now.hold_episode.store(e);
            now.hold_min_replicas.store(o.min_replicas);
            now.hold_name.store(o.name);
        }
        if (own_client) {
            own_client->reset();  // the lock lives on without its client
        }

        // The critical section, with the steps the plan puts in it.
        bool lost = !run_steps(h, ep, tp, objects, t, e);
        release_kind how = ep.release;
        if (how == release_kind::expire && o.watchdog) {
            how = release_kind::unlock_ec;  // a renewed lease does not run out
        }
        if (!lost && how == release_kind::expire) {
            // Let the lease run out, still checking (the hold ends with the loss).
            lost = !hold_for(h, o.lease_ms + 2000, t);
        }
        finish(h, ep, lock, how, lost, t, e, o);
        if (publish) {
            now.hold_name.store(-1);
        }
    }

    // Runs the steps of the episode, holding between them until ep.hold_ms from the
    // acquisition; false once the hold was found lost.
    bool run_steps(holding& h, const episode& ep, const thread_plan& tp,
                   std::vector<std::unique_ptr<any_lock>>& objects, int t, int e) {
        for (const inner_step& s : ep.steps) {
            if (!hold_until(h, h.acquired + std::int64_t{s.at_ms} * 1'000'000, t)) {
                return false;
            }
            const std::int64_t before_ms = h.lock->remaining().count();
            switch (s.what) {
                case inner_step::kind::reenter: {
                    const object_spec& so = tp.objects[static_cast<std::size_t>(s.object)];
                    auto& sibling = objects[static_cast<std::size_t>(s.object)];
                    if (!sibling) {
                        any_client* client = client_for(so);
                        if (client == nullptr) {
                            break;
                        }
                        sibling = make_lock(*client, so, t);
                    }
                    const std::uint8_t f = flags_of(so, s.shared);
                    const bool got =
                        acquire(t, e, so, *sibling, call_kind::try_lock_for, s.timeout_ms, 0,
                                s.shared, call_op::reenter, f, before_ms);
                    if (got) {
                        h.lease_ms = std::max(h.lease_ms, so.lease_ms);
                        publish_lease(h, t);
                        const bool kept = hold_for(h, s.hold_ms, t);
                        const std::error_code ec =
                            timed_release(t, e, so, *sibling, s.shared,
                                          static_cast<std::uint8_t>(
                                              f | flag_inner | (h.told_lost ? flag_after_loss : 0)),
                                          h.lock->remaining().count());
                        h.told_lost = h.told_lost || ec == redislock::errc::lock_lost;
                        if (!kept) {
                            return false;
                        }
                    }
                    break;
                }
                case inner_step::kind::extend:
                case inner_step::kind::verify: {
                    const bool extend = s.what == inner_step::kind::extend;
                    const std::int64_t start = monotonic_ns();
                    bool answer = false;
                    error_class err = error_class::none;
                    std::string what;
                    try {
                        answer = extend ? h.lock->extend(std::chrono::milliseconds{s.lease_ms})
                                        : h.lock->verify();
                    } catch (...) {
                        std::tie(err, what) = classify(std::current_exception());
                    }
                    const std::int64_t end = monotonic_ns();
                    if (extend && answer) {
                        h.lease_ms = std::max(h.lease_ms, s.lease_ms);
                        publish_lease(h, t);
                    }
                    log_.append(p_, [&](record& r) {
                        fill_call(r, t, e, *h.spec, extend ? call_op::extend : call_op::verify,
                                  h.flags);
                        r.t1 = start;
                        r.t2 = end;
                        r.result = static_cast<std::uint8_t>(
                            err == error_class::none ? outcome::done : outcome::threw);
                        r.error = static_cast<std::uint8_t>(err);
                        r.value = answer ? 1 : 0;
                        r.lease_ms = extend ? s.lease_ms : h.spec->lease_ms;
                        r.remaining_ms = static_cast<std::int32_t>(before_ms);
                        set_text(r, what);
                    });
                    break;
                }
            }
        }
        return hold_until(h, h.acquired + std::int64_t{ep.hold_ms} * 1'000'000, t);
    }

    // The longest lease the hold's key may carry now, for the checks to close it at a kill.
    void publish_lease(const holding& h, int t) {
        if (h.publish) {
            now_.threads[t].hold_lease.store(h.lease_ms);
        }
    }

    bool hold_for(holding& h, int ms, int t) {
        return hold_until(h, monotonic_ns() + std::int64_t{ms} * 1'000'000, t);
    }

    // Holds until `until`, checking owned() every few ms; false once it says no.
    bool hold_until(holding& h, std::int64_t until, int t) {
        for (;;) {
            const std::int64_t asked = monotonic_ns();
            const auto left = h.lock->remaining();
            if (left <= std::chrono::milliseconds::zero()) {
                h.lost_at = monotonic_ns();
                return false;
            }
            h.last_owned = asked;
            h.remaining_ms = left.count();
            if (h.publish) {
                now_.threads[t].hold_last_owned.store(asked);
            }
            write_resource(h);
            const std::int64_t now = monotonic_ns();
            if (now >= until) {
                return true;
            }
            std::this_thread::sleep_for(
                std::chrono::nanoseconds{std::min<std::int64_t>(until - now, 3'000'000)});
        }
    }

    // The protected resource keeps the highest token written; a lower one is refused.
    void write_resource(const holding& h) {
        if (h.fence <= 0) {
            return;
        }
        auto& hdr = log_.header();
        const int n = h.spec->name;
        std::int64_t seen = hdr.resource_token[n].load();
        while (h.fence > seen) {
            if (hdr.resource_token[n].compare_exchange_weak(seen, h.fence)) {
                hdr.resource_actor[n].store(h.actor);
                hdr.resource_acquired[n].store(h.acquired);
                return;
            }
        }
        if (h.fence < seen) {
            hdr.resource_refused.fetch_add(1);
        }
    }

    void fill_call(record& r, int t, int e, const object_spec& o, call_op op,
                   std::uint8_t flags) const {
        r.type = record_type::call;
        r.op = static_cast<std::uint8_t>(op);
        r.process = static_cast<std::uint8_t>(p_);
        r.thread = static_cast<std::uint8_t>(t);
        r.episode = static_cast<std::uint32_t>(e);
        r.name = static_cast<std::uint16_t>(o.name);
        r.flags = flags;
        r.min_replicas = static_cast<std::uint8_t>(o.min_replicas);
        r.lease_ms = o.lease_ms;
        r.client = o.client;
    }

    // One acquisition call, timed and logged.
    bool acquire(int t, int e, const object_spec& o, any_lock& lock, call_kind call, int timeout_ms,
                 int stop_ms, bool shared, call_op op, std::uint8_t flags,
                 std::int64_t remaining_ms) {
        acquire_args a;
        a.call = call;
        a.timeout = std::chrono::milliseconds{timeout_ms};
        const std::int64_t start = monotonic_ns();
        a.until = std::chrono::steady_clock::now() + a.timeout;
        std::shared_ptr<stopper::request> stop;
        const bool stoppable = call == call_kind::lock_stop || call == call_kind::try_lock_for_stop;
        if (stoppable && stops_ != nullptr) {
            stop = stops_->at(start + std::int64_t{stop_ms} * 1'000'000);
            a.stop = stop->source.get_token();
        }
        bool got = false;
        error_class err = error_class::none;
        std::string what;
        try {
            got = lock.acquire(a, shared);
        } catch (...) {
            std::tie(err, what) = classify(std::current_exception());
        }
        const std::int64_t end = monotonic_ns();
        std::int64_t stopped_at = 0;
        if (stop) {
            stop->cancelled.store(true);
            stopped_at = stop->requested_at.load();
        }
        const bool timed = call == call_kind::try_lock_for || call == call_kind::try_lock_until ||
                           call == call_kind::try_lock_for_stop;
        log_.append(p_, [&](record& r) {
            fill_call(r, t, e, o, op, flags);
            r.call = static_cast<std::uint8_t>(call);
            r.t1 = start;
            r.t2 = end;
            r.t3 = timed ? start + std::int64_t{timeout_ms} * 1'000'000 : 0;
            r.t4 = stopped_at;
            r.timeout_ms = timeout_ms;
            r.result = static_cast<std::uint8_t>(err != error_class::none ? outcome::threw
                                                 : got                    ? outcome::acquired
                                                                          : outcome::refused);
            r.error = static_cast<std::uint8_t>(err);
            r.remaining_ms = static_cast<std::int32_t>(remaining_ms);
            set_text(r, what);
        });
        return got;
    }

    // unlock(ec), timed and logged.
    std::error_code timed_release(int t, int e, const object_spec& o, any_lock& lock, bool shared,
                                  std::uint8_t flags, std::int64_t remaining_ms) {
        const std::int64_t start = monotonic_ns();
        const std::error_code ec = lock.release(shared);
        const std::int64_t end = monotonic_ns();
        log_.append(p_, [&](record& r) {
            fill_call(r, t, e, o, call_op::unlock, flags);
            r.t1 = start;
            r.t2 = end;
            r.result = static_cast<std::uint8_t>(outcome::done);
            r.value = ec.value();
            r.remaining_ms = static_cast<std::int32_t>(remaining_ms);
            set_text(r, ec ? ec.message() : std::string{});
        });
        return ec;
    }

    void finish(holding& h, const episode& ep, std::unique_ptr<any_lock>& lock, release_kind how,
                bool lost, int t, int e, const object_spec& o) {
        const std::int64_t let_go = lost ? h.lost_at : monotonic_ns();
        std::error_code ec;
        switch (how) {
            case release_kind::unlock_ec:
            case release_kind::expire:
                ec = timed_release(
                    t, e, o, *h.lock, ep.shared,
                    static_cast<std::uint8_t>(h.flags | (h.told_lost ? flag_after_loss : 0)),
                    h.lock->remaining().count());
                break;
            case release_kind::unlock: {
                const std::int64_t start = monotonic_ns();
                h.lock->release_quietly(ep.shared);
                const std::int64_t end = monotonic_ns();
                log_.append(p_, [&](record& r) {
                    fill_call(r, t, e, o, call_op::unlock, h.flags);
                    r.t1 = start;
                    r.t2 = end;
                    r.result = static_cast<std::uint8_t>(outcome::done);
                    r.value = -1;
                });
                break;
            }
            case release_kind::destroy:
                // A reentrant or read-write lock destroyed while held leaves its entries; the
                // simple lock releases itself.
                lock.reset();
                h.lock = nullptr;
                break;
        }
        const std::int64_t free_at = monotonic_ns();
        log_.append(p_, [&](record& r) {
            r.type = record_type::hold;
            r.op = static_cast<std::uint8_t>(lost ? hold_end::lost : hold_end::released);
            r.result = static_cast<std::uint8_t>(ec.value());
            r.process = static_cast<std::uint8_t>(p_);
            r.thread = static_cast<std::uint8_t>(t);
            r.episode = static_cast<std::uint32_t>(e);
            r.name = static_cast<std::uint16_t>(o.name);
            r.flags = h.flags;
            r.min_replicas = static_cast<std::uint8_t>(o.min_replicas);
            r.actor = h.actor;
            r.t0 = h.call_start;
            r.t1 = h.acquired;
            r.t2 = h.last_owned;
            r.t3 = let_go;
            r.t4 = free_at;
            r.value = h.fence;
            r.lease_ms = h.lease_ms;
            r.remaining_ms = static_cast<std::int32_t>(h.remaining_ms);
            r.client = o.client;
            r.call = static_cast<std::uint8_t>(how);
            set_text(r, ec ? ec.message() : std::string{});
        });
    }

    void fresh_client_episode(int t, int e, const episode& ep, const thread_plan& tp,
                              std::vector<std::unique_ptr<any_lock>>& objects,
                              std::uint32_t actor) {
        const object_spec& o = tp.objects[static_cast<std::size_t>(ep.object)];
        std::unique_ptr<any_client> client;
        const std::int64_t start = monotonic_ns();
        try {
            client =
                make_client(setup_.where, proc_plan_.clients[static_cast<std::size_t>(o.client)]);
        } catch (...) {
            const auto classified = classify(std::current_exception());
            const error_class err = classified.first;
            const std::string what = classified.second;
            log_.append(p_, [&](record& r) {
                fill_call(r, t, e, o, call_op::acquire, flags_of(o, ep.shared) | flag_fresh_client);
                r.call = static_cast<std::uint8_t>(ep.call);
                r.t1 = start;
                r.t2 = monotonic_ns();
                r.result = static_cast<std::uint8_t>(outcome::threw);
                r.error = static_cast<std::uint8_t>(err);
                set_text(r, "making the client: " + what);
            });
            return;
        }
        // Its own object of the same options, on the fresh client.
        std::vector<std::unique_ptr<any_lock>> own(objects.size());
        hold_episode(t, e, ep, tp, own, actor, &client, true, flag_fresh_client);
    }

    void fork_episode(int t, int e, const episode& ep, const thread_plan& tp) {
        if (!gate_.close(std::chrono::seconds{3})) {
            note("episode " + std::to_string(e) + ": fork skipped, the other threads were busy", t);
            return;
        }
        const object_spec& o = tp.objects[static_cast<std::size_t>(ep.object)];
        const std::int64_t start = monotonic_ns();
        std::optional<test::child_process> child;
        try {
            child.emplace([&](test::line_channel&) {
                std::vector<std::unique_ptr<any_lock>> mine(tp.objects.size());
                hold_episode(t, e, ep, tp, mine, log_.new_actor(), nullptr, false, flag_fork_child);
                mine.clear();
                return 0;
            });
        } catch (const std::exception& x) {
            gate_.open();
            note(std::string{"fork failed: "} + x.what(), t);
            return;
        }
        gate_.open();
        const int patience = ep.timeout_ms + ep.hold_ms + o.lease_ms + 10'000;
        const std::optional<int> code = child->wait(std::chrono::milliseconds{patience});
        const std::int64_t end = monotonic_ns();
        if (code != 0) {
            log_.append(p_, [&](record& r) {
                fill_call(r, t, e, o, call_op::fork_child, flag_fork_child);
                r.t1 = start;
                r.t2 = end;
                r.result = static_cast<std::uint8_t>(outcome::hung);
                r.value = code.value_or(-1);
                set_text(r, code ? "the forked child exited with code " + std::to_string(*code)
                                 : "the forked child did not finish within " +
                                       std::to_string(patience) + " ms (killed)");
            });
        }
    }

    int p_;
    const worker_setup& setup_;
    const plan& plan_;
    const process_plan& proc_plan_;
    journal& log_;
    process_now& now_;
    fork_gate gate_;
    stopper* stops_ = nullptr;
    std::vector<std::unique_ptr<any_client>> clients_;
};

/// Forks a worker process for slot `process`. The child dies with the thread that forked it,
/// keeps no descriptor of this process, ignores SIGINT (the run stops it) and never returns.
inline pid_t fork_worker(int process, const worker_setup& setup) {
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
        throw std::system_error{errno, std::generic_category(), "fork"};
    }
    if (pid != 0) {
        return pid;
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) {
        ::_exit(126);
    }
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_DFL);
#ifdef SYS_close_range
    if (::syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
#endif
    {
        for (int fd = 3; fd < 65536; ++fd) {
            ::close(fd);
        }
    }
    int code = 125;
    try {
        setup.log->process(process).pid.store(::getpid());
        worker w{process, setup};
        code = w.run();
    } catch (...) {
        code = 124;
    }
    ::_exit(code);
}

}  // namespace redislock::torture
