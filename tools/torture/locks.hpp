// redislock-torture: one face for every client and lock kind the workers drive, over the
// library's public API only: redislock::client, sentinel_client, cluster_client and
// redlock_client, and their mutex, recursive_mutex, shared_mutex, counting_semaphore (of
// semaphore_permits permits) and redlock mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "torture/journal.hpp"
#include "torture/plan.hpp"
#include "torture/topology.hpp"

namespace redislock::torture {

struct acquire_args {
    call_kind call = call_kind::try_lock;
    std::chrono::milliseconds timeout{0};
    std::chrono::steady_clock::time_point until{};
    std::stop_token stop{};
};

/// A lock object of any kind.
class any_lock {
public:
    virtual ~any_lock() = default;
    virtual bool acquire(const acquire_args& a, bool shared) = 0;
    virtual std::error_code release(bool shared) = 0;
    virtual void release_quietly(bool shared) = 0;
    virtual bool extend(std::chrono::milliseconds lease) = 0;
    virtual bool verify() = 0;
    virtual std::chrono::milliseconds remaining() const = 0;
    virtual std::int64_t fence() const = 0;
};

template <class Lock>
class lock_of final : public any_lock {
public:
    explicit lock_of(Lock lock) : lock_{std::move(lock)} {}

    bool acquire(const acquire_args& a, bool shared) override {
        if constexpr (requires(Lock & l) { l.lock_shared(); }) {
            if (shared) {
                switch (a.call) {
                    case call_kind::lock:
                        lock_.lock_shared();
                        return true;
                    case call_kind::try_lock:
                        return lock_.try_lock_shared();
                    case call_kind::try_lock_for:
                        return lock_.try_lock_shared_for(a.timeout);
                    case call_kind::try_lock_until:
                        return lock_.try_lock_shared_until(a.until);
                    case call_kind::lock_stop:
                        return lock_.lock_shared(a.stop);
                    case call_kind::try_lock_for_stop:
                        return lock_.try_lock_shared_for(a.timeout, a.stop);
                }
                return false;
            }
        }
        switch (a.call) {
            case call_kind::lock:
                lock_.lock();
                return true;
            case call_kind::try_lock:
                return lock_.try_lock();
            case call_kind::try_lock_for:
                return lock_.try_lock_for(a.timeout);
            case call_kind::try_lock_until:
                return lock_.try_lock_until(a.until);
            case call_kind::lock_stop:
                return lock_.lock(a.stop);
            case call_kind::try_lock_for_stop:
                return lock_.try_lock_for(a.timeout, a.stop);
        }
        return false;
    }

    std::error_code release(bool shared) override {
        std::error_code ec;
        if constexpr (requires(Lock & l, std::error_code & e) { l.unlock_shared(e); }) {
            if (shared) {
                lock_.unlock_shared(ec);
                return ec;
            }
        }
        lock_.unlock(ec);
        return ec;
    }

    void release_quietly(bool shared) override {
        if constexpr (requires(Lock & l) { l.unlock_shared(); }) {
            if (shared) {
                lock_.unlock_shared();
                return;
            }
        }
        lock_.unlock();
    }

    bool extend(std::chrono::milliseconds lease) override { return lock_.extend(lease); }
    bool verify() override { return lock_.verify(); }
    std::chrono::milliseconds remaining() const override { return lock_.remaining(); }

    std::int64_t fence() const override {
        if constexpr (requires(const Lock& l) { l.fencing_token(); }) {
            return lock_.fencing_token();
        } else {
            return 0;
        }
    }

private:
    Lock lock_;
};

/// A client of any kind; makes lock objects.
class any_client {
public:
    virtual ~any_client() = default;
    virtual std::unique_ptr<any_lock> make(const std::string& name, lock_type type,
                                           const lock_options& options) = 0;
};

template <class Client>
class client_of final : public any_client {
public:
    template <class... Args>
    explicit client_of(Args&&... args)
        : client_{std::make_unique<Client>(std::forward<Args>(args)...)} {}

    std::unique_ptr<any_lock> make(const std::string& name, lock_type type,
                                   const lock_options& options) override {
        if constexpr (requires(Client & c) { c.recursive_mutex(name, options); }) {
            switch (type) {
                case lock_type::mutex:
                    return std::make_unique<lock_of<decltype(client_->mutex(name, options))>>(
                        client_->mutex(name, options));
                case lock_type::recursive:
                    return std::make_unique<
                        lock_of<decltype(client_->recursive_mutex(name, options))>>(
                        client_->recursive_mutex(name, options));
                case lock_type::shared:
                    return std::make_unique<
                        lock_of<decltype(client_->shared_mutex(name, options))>>(
                        client_->shared_mutex(name, options));
                case lock_type::semaphore: {
                    const semaphore_options s{.permits = semaphore_permits,
                                              .lease = options.lease,
                                              .watchdog = options.watchdog,
                                              .fencing = options.fencing,
                                              .on_lost = options.on_lost,
                                              .backoff_min = options.backoff_min,
                                              .backoff_max = options.backoff_max,
                                              .max_hold = options.max_hold,
                                              .min_replicas = options.min_replicas,
                                              .replica_timeout = options.replica_timeout,
                                              .on_lost_reason = options.on_lost_reason};
                    return std::make_unique<lock_of<decltype(client_->semaphore(name, s))>>(
                        client_->semaphore(name, s));
                }
            }
            return nullptr;
        } else {
            (void)type;
            return std::make_unique<lock_of<decltype(client_->mutex(name, options))>>(
                client_->mutex(name, options));
        }
    }

private:
    std::unique_ptr<Client> client_;
};

/// `uri` with the query options added (before a Sentinel URI's #master-name).
inline std::string with_query(const std::string& uri, const std::string& query) {
    const auto hash = uri.find('#');
    const std::string base = uri.substr(0, hash);
    const std::string tail = hash == std::string::npos ? std::string{} : uri.substr(hash);
    return base + (base.find('?') == std::string::npos ? "?" : "&") + query + tail;
}

/// A client of the topology, as `spec` says (path and timeouts).
inline std::unique_ptr<any_client> make_client(const endpoints& where, const client_spec& spec) {
    const std::string query = "command_timeout=" + std::to_string(spec.command_timeout_ms) +
                              "&connect_timeout=" + std::to_string(spec.connect_timeout_ms);
    switch (where.kind) {
        case topology_kind::single:
        case topology_kind::given: {
            const std::string& uri =
                spec.path < 0 || where.proxied.empty()
                    ? where.direct
                    : where.proxied[static_cast<std::size_t>(spec.path) % where.proxied.size()];
            return std::make_unique<client_of<redislock::client>>(with_query(uri, query));
        }
        case topology_kind::sentinel:
            return std::make_unique<client_of<redislock::sentinel_client>>(
                with_query(where.direct, query));
        case topology_kind::cluster:
            return std::make_unique<client_of<redislock::cluster_client>>(
                with_query(where.direct, query));
        case topology_kind::redlock: {
            const auto& masters = spec.path < 0 ? where.masters : where.masters_proxied;
            std::vector<std::string> uris;
            for (const auto& m : masters) {
                uris.push_back(with_query(m, query));
            }
            return std::make_unique<client_of<redislock::redlock_client>>(
                uris,
                redlock_options{.node_timeout = std::chrono::milliseconds{spec.node_timeout_ms}});
        }
    }
    throw std::logic_error{"torture: unknown topology"};
}

/// The kind of the exception in flight, and its message.
inline std::pair<error_class, std::string> classify(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const redislock::quorum_error& x) {
        return {error_class::quorum, x.what()};
    } catch (const redislock::timeout_error& x) {
        return {error_class::timeout, x.what()};
    } catch (const redislock::connection_error& x) {
        return {error_class::connection, x.what()};
    } catch (const redislock::cancelled_error& x) {
        return {error_class::cancelled, x.what()};
    } catch (const redislock::unavailable_error& x) {
        return {error_class::unavailable, x.what()};
    } catch (const redislock::server_error& x) {
        return {error_class::server, x.what()};
    } catch (const redislock::replication_error& x) {
        return {error_class::replication, x.what()};
    } catch (const redislock::invalid_argument& x) {
        return {error_class::invalid_argument, x.what()};
    } catch (const redislock::error& x) {
        return {error_class::other, x.what()};
    } catch (const std::system_error& x) {
        return {error_class::system, x.what()};
    } catch (const std::exception& x) {
        return {error_class::other, x.what()};
    } catch (...) {
        return {error_class::other, "an exception of unknown type"};
    }
}

}  // namespace redislock::torture
