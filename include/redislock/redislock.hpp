// redislock: distributed locks on Redis. Include this header for everything: redislock::client,
// which takes any topology from its URI (any_connection.hpp), the clients of one topology each
// (node_client, sentinel_client, cluster_client) and Redlock's (redlock_client).
#pragma once

#include <redislock/any_connection.hpp>
#include <redislock/client.hpp>
#include <redislock/client_options.hpp>
#include <redislock/cluster.hpp>
#include <redislock/connection.hpp>
#include <redislock/counting_semaphore.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/mutex.hpp>
#include <redislock/quorum_error.hpp>
#include <redislock/recursive_mutex.hpp>
#include <redislock/redlock.hpp>
#include <redislock/redlock_mutex.hpp>
#include <redislock/redlock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>
#include <redislock/semaphore_options.hpp>
#include <redislock/sentinel.hpp>
#include <redislock/sentinel_endpoint.hpp>
#include <redislock/shared_mutex.hpp>
#include <redislock/version.hpp>
#include <redislock/watchdog.hpp>

namespace redislock {

/// The client: any topology, chosen by the URI at run time (see client.hpp and
/// any_connection.hpp).
using client = basic_client<any_connection>;
/// The simple lock of a redislock::client.
using mutex = basic_mutex<any_connection>;
/// The reentrant lock of a redislock::client.
using recursive_mutex = basic_recursive_mutex<any_connection>;
/// The read-write lock of a redislock::client.
using shared_mutex = basic_shared_mutex<any_connection>;
/// The counting semaphore of leased permits of a redislock::client (client.semaphore()).
using counting_semaphore = basic_counting_semaphore<any_connection>;
/// The watchdog of a redislock::client.
using watchdog = basic_watchdog<any_connection>;

/// A Redlock client over hiredis connections to independent masters.
using redlock_client = basic_redlock_client<hiredis_connection>;
/// The lock of a redislock::redlock_client.
using redlock_mutex = basic_redlock_mutex<hiredis_connection>;

/// A client of one Redis server over hiredis, the topology fixed at compile time.
using node_client = basic_client<hiredis_connection>;
/// The simple lock of a redislock::node_client.
using node_mutex = basic_mutex<hiredis_connection>;
/// The reentrant lock of a redislock::node_client.
using node_recursive_mutex = basic_recursive_mutex<hiredis_connection>;
/// The read-write lock of a redislock::node_client.
using node_shared_mutex = basic_shared_mutex<hiredis_connection>;
/// The watchdog of a redislock::node_client.
using node_watchdog = basic_watchdog<hiredis_connection>;

/// A client of a Redis Cluster (see cluster.hpp); takes the seed form redis://h1,h2.
using cluster_client = basic_client<hiredis_cluster_connection>;
/// The simple lock of a redislock::cluster_client.
using cluster_mutex = basic_mutex<hiredis_cluster_connection>;
/// The reentrant lock of a redislock::cluster_client.
using cluster_recursive_mutex = basic_recursive_mutex<hiredis_cluster_connection>;
/// The read-write lock of a redislock::cluster_client.
using cluster_shared_mutex = basic_shared_mutex<hiredis_cluster_connection>;

/// A client of the master that Redis Sentinel names (see sentinel.hpp).
using sentinel_client = basic_client<sentinel_connection>;
/// The simple lock of a redislock::sentinel_client.
using sentinel_mutex = basic_mutex<sentinel_connection>;
/// The reentrant lock of a redislock::sentinel_client.
using sentinel_recursive_mutex = basic_recursive_mutex<sentinel_connection>;
/// The read-write lock of a redislock::sentinel_client.
using sentinel_shared_mutex = basic_shared_mutex<sentinel_connection>;

}  // namespace redislock
