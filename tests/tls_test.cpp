// rediss:// against a real redis-server listening for TLS, with certificates made for the test.
// Built without TLS (hiredis 0.14), the same servers are used to check that rediss:// is refused
// with a message that says what to install.

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>

#include <redislock/redislock.hpp>

#include "support/deadline.hpp"
#include "support/tls_certs.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::test::run_to_end;
using redislock::test::stop_after;
using redislock::test::tls_certs;
using redislock::test::tls_server;

// One set of certificates for the whole file: making them takes a few openssl runs.
const tls_certs& certs() {
    static const tls_certs shared;
    return shared;
}

// The message of the exception that building a client for `uri` throws, or "" if none.
template <class Error>
std::string construction_error(const std::string& uri) {
    try {
        redislock::node_client client{uri};
    } catch (const Error& e) {
        return e.what();
    }
    return {};
}

#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS

std::string trusted(const std::string& extra = {}) {
    return "tls_ca_file=" + certs().ca_file() + (extra.empty() ? "" : "&" + extra);
}

TEST(Tls, BuildReportsTlsSupport) {
    EXPECT_TRUE(redislock::detail::hiredis_has_tls);
}

TEST(Tls, AllThreeLockKindsWorkOverTls) {
    tls_server srv{certs()};
    redislock::client client{srv.uri(trusted())};

    auto m = client.mutex("tls:mutex", {.lease = 10s});
    {
        std::unique_lock guard{m};
        EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:mutex"}), "1");
        EXPECT_TRUE(m.verify());
    }
    EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:mutex"}), "0");

    auto rm = client.recursive_mutex("tls:recursive", {.lease = 10s});
    rm.lock();
    rm.lock();
    EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:recursive"}), "1");
    rm.unlock();
    rm.unlock();
    EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:recursive"}), "0");

    auto rw = client.shared_mutex("tls:rw", {.lease = 10s});
    {
        std::shared_lock reader{rw};
        EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:rw"}), "1");
    }
    {
        std::unique_lock writer{rw};
        EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:rw"}), "1");
    }
    EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:rw"}), "0");
}

TEST(Tls, WatchdogRenewsOverTls) {
    tls_server srv{certs()};
    redislock::client client{srv.uri(trusted())};
    auto m = client.mutex("tls:watched", {.lease = 300ms, .watchdog = true});
    std::unique_lock guard{m};
    std::this_thread::sleep_for(900ms);
    EXPECT_TRUE(m.verify());
    EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:watched"}), "1");
}

TEST(Tls, UntrustedServerCertificateIsAClearError) {
    tls_server srv{certs()};
    const std::string message = construction_error<redislock::connection_error>(
        srv.uri("tls_ca_file=" + certs().other_ca_file()));
    EXPECT_NE(message.find("TLS handshake"), std::string::npos) << message;
    EXPECT_NE(message.find("certificate was rejected"), std::string::npos) << message;
}

TEST(Tls, CertificateForAnotherNameIsRejectedUnlessOnlyTheChainIsChecked) {
    tls_server srv{certs()};
    const std::string message = construction_error<redislock::connection_error>(
        srv.uri(trusted("tls_server_name=redis.example.org")));
    EXPECT_NE(message.find("mismatch"), std::string::npos) << message;

    // The certificate names localhost: as SNI and expected name it passes.
    EXPECT_NO_THROW(redislock::node_client{srv.uri(trusted("tls_server_name=localhost"))});
    // tls_verify=ca checks the chain only.
    EXPECT_NO_THROW(redislock::node_client{
        srv.uri(trusted("tls_server_name=redis.example.org&tls_verify=ca"))});
}

TEST(Tls, VerificationOptOutConnectsWithoutTrustedCa) {
    tls_server srv{certs()};
    redislock::client client{srv.uri("tls_verify=none")};
    auto m = client.mutex("tls:unverified", {.lease = 5s});
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST(Tls, UnreadableCaFileIsAnInvalidArgument) {
    tls_server srv{certs()};
    const std::string message =
        construction_error<redislock::invalid_argument>(srv.uri("tls_ca_file=/nonexistent/ca.pem"));
    EXPECT_NE(message.find("/nonexistent/ca.pem"), std::string::npos) << message;
}

TEST(Tls, MutualTlsNeedsTheClientCertificate) {
    tls_server srv{certs(), true};
    const std::string refused = construction_error<redislock::connection_error>(srv.uri(trusted()));
    EXPECT_NE(refused.find("tls_cert_file"), std::string::npos) << refused;

    redislock::client client{srv.uri(trusted("tls_cert_file=" + certs().client_cert() +
                                             "&tls_key_file=" + certs().client_key()))};
    auto m = client.mutex("tls:mutual", {.lease = 5s});
    std::unique_lock guard{m};
    EXPECT_EQ(srv.plain().cli({"EXISTS", "tls:mutual"}), "1");
}

TEST(Tls, PlainClientCannotTalkToTheTlsPort) {
    tls_server srv{certs()};
    redislock::hiredis_connection conn{"redis://127.0.0.1:" + std::to_string(srv.tls_port()) +
                                       "?connect_timeout=500&command_timeout=500"};
    const std::array<std::string_view, 1> ping{"PING"};
    EXPECT_THROW(conn.execute(ping), redislock::connection_error);
}

// The bounded path polls the socket; a reply larger than one TLS record, and pipelined replies,
// must come back whole even when part of them is already decrypted inside OpenSSL.
TEST(Tls, BoundedCallsReadLargeAndPipelinedReplies) {
    tls_server srv{certs()};
    redislock::hiredis_connection conn{srv.uri(trusted())};
    const std::string big(200'000, 'x');
    const std::array<std::string_view, 3> set{"SET", "tls:big", big};
    EXPECT_TRUE(conn.execute(set).is_status());

    const auto deadline = std::chrono::steady_clock::now() + 5s;
    const std::array<std::string_view, 2> get{"GET", "tls:big"};
    const redislock::reply r = conn.execute(get, redislock::call_context{.deadline = deadline});
    ASSERT_TRUE(r.is_string());
    EXPECT_EQ(r.text().size(), big.size());

    const std::array<std::string_view, 1> ping{"PING"};
    const std::array<redislock::command, 4> commands{get, ping, get, ping};
    const std::array<redislock::call_context, 4> hows{};
    std::array<redislock::call_context, 4> bounded_hows = hows;
    for (auto& how : bounded_hows) {
        how.deadline = deadline;
    }
    for (int round = 0; round < 20; ++round) {
        const auto replies = conn.execute_pipeline(commands, bounded_hows);
        ASSERT_EQ(replies.size(), 4U);
        EXPECT_EQ(replies[0].text().size(), big.size());
        EXPECT_EQ(replies[1].text(), "PONG");
        EXPECT_EQ(replies[2].text().size(), big.size());
        EXPECT_EQ(replies[3].text(), "PONG");
    }
    EXPECT_EQ(conn.connections_opened(), 1U);
}

// A context the server closed while it sat idle is noticed and replaced, over TLS as in plain.
TEST(Tls, ConnectionKilledByTheServerIsReplaced) {
    tls_server srv{certs()};
    redislock::hiredis_connection conn{srv.uri(trusted())};
    const std::array<std::string_view, 1> ping{"PING"};
    EXPECT_EQ(conn.execute(ping).text(), "PONG");
    std::this_thread::sleep_for(5ms);
    EXPECT_EQ(conn.execute(ping).text(), "PONG");  // an idle TLS context is still reusable
    EXPECT_EQ(conn.connections_opened(), 1U);
    srv.plain().cli({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(conn.execute(ping).text(), "PONG");
    EXPECT_EQ(conn.connections_opened(), 2U);
}

// A TLS handshake that gets no answer (the server stopped) is a timeout, after the connect
// timeout, not a connection error with an empty reason. (Timed from the first call of a
// connection made with defer_connect: the connect timeout bounds connecting, not building the
// TLS context, local work that a busy machine may stretch.)
TEST(Tls, HandshakeWithAServerThatStoppedAnsweringIsATimeout) {
    tls_server srv{certs()};
    redislock::hiredis_connection conn{
        redislock::endpoint::from_uri(srv.uri(trusted("connect_timeout=300"))),
        redislock::defer_connect};
    const std::array<std::string_view, 1> ping{"PING"};
    srv.plain().pause();
    const auto deadline = std::chrono::steady_clock::now() + 300ms;
    const auto end = run_to_end([&] { (void)conn.execute(ping); });
    srv.plain().resume();
    EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
    EXPECT_NE(end.how.find("timeout_error"), std::string::npos) << end.how;
    EXPECT_NE(end.how.find("TLS handshake"), std::string::npos) << end.how;
}

// A connection opened inside a timed call, whose TLS handshake then gets no answer, ends by the
// call's deadline; and at once on a stop request.
TEST(Tls, TimedCallsEndInTimeWhileATlsConnectionIsOpened) {
    tls_server srv{certs()};
    redislock::node_client client{srv.uri(trusted())};
    auto m = client.mutex("tls:deadline", {.lease = 10s});
    const auto break_server = [&] {
        ASSERT_NE(srv.plain().cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
        srv.plain().pause();
    };
    {
        break_server();
        const auto deadline = std::chrono::steady_clock::now() + 50ms;
        const auto end = run_to_end([&] { (void)m.try_lock_until(deadline); });
        srv.plain().resume();
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
    }
    {
        break_server();
        stop_after stop{100ms};
        const auto end = run_to_end([&] { (void)m.lock(stop.token()); });
        const auto requested = stop.requested_at();
        srv.plain().resume();
        EXPECT_TRUE(end.by(requested)) << end.late_after(requested) << end.how;
    }
    {
        redislock::hiredis_connection conn{srv.uri(trusted())};
        const std::array<std::string_view, 1> ping{"PING"};
        break_server();
        const auto deadline = std::chrono::steady_clock::now() + 50ms;
        const auto end = run_to_end([&] { (void)conn.execute(ping, {{}, deadline}); });
        srv.plain().resume();
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
        EXPECT_NE(end.how.find("timeout_error"), std::string::npos) << end.how;
    }
    EXPECT_TRUE(m.try_lock_for(5s));
    m.unlock();
}

// rediss:// pointed at a plain port: the server reads the TLS hello as a command that never ends
// (or answers it in plain text when it holds a newline). Either way the connection fails within
// the connect timeout, as a timeout, or with OpenSSL's reason: never an empty one. (Timed from
// the first call, as above.)
TEST(Tls, RedissAtAPlainPortFailsWithinTheConnectTimeout) {
    tls_server srv{certs()};
    const std::string uri = "rediss://127.0.0.1:" + std::to_string(srv.plain().port()) + "?" +
                            trusted("connect_timeout=300");
    const std::array<std::string_view, 1> ping{"PING"};
    for (int round = 0; round < 5; ++round) {  // each hello is random: newline or not
        SCOPED_TRACE(round);
        redislock::hiredis_connection conn{redislock::endpoint::from_uri(uri),
                                           redislock::defer_connect};
        const auto deadline = std::chrono::steady_clock::now() + 300ms;
        const auto end = run_to_end([&] { (void)conn.execute(ping); });
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
        EXPECT_EQ(end.how.find("(null)"), std::string::npos) << end.how;
        EXPECT_NE(end.how.find("TLS"), std::string::npos) << end.how;
    }
}

#else

TEST(Tls, BuildReportsNoTlsSupport) {
    EXPECT_FALSE(redislock::detail::hiredis_has_tls);
}

// Without hiredis_ssl, every rediss:// form is refused up front, before any connection is made,
// with a message naming what to install; nothing falls back to plain text.
TEST(Tls, RedissWithoutTlsSupportSaysWhatToInstall) {
    tls_server srv{certs()};
    for (const std::string& uri :
         {srv.uri(), srv.uri("tls_ca_file=" + certs().ca_file()), srv.uri("tls_verify=none"),
          srv.uri("tls_ca_file=" + certs().ca_file() + "&tls_cert_file=" + certs().client_cert() +
                  "&tls_key_file=" + certs().client_key())}) {
        const std::string message = construction_error<redislock::invalid_argument>(uri);
        EXPECT_NE(message.find("rediss://"), std::string::npos) << uri << ": " << message;
        EXPECT_NE(message.find("hiredis_ssl"), std::string::npos) << uri << ": " << message;
        EXPECT_NE(message.find("hiredis >= 1.0"), std::string::npos) << uri << ": " << message;
    }
    EXPECT_THROW(redislock::hiredis_connection{srv.uri()}, redislock::invalid_argument);
    // The server itself is fine: the plain port answers.
    redislock::client plain{srv.plain().uri()};
    auto m = plain.mutex("tls:plain", {.lease = 5s});
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

#endif

}  // namespace
