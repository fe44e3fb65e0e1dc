#include <redislock/endpoint.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <string_view>

#include <redislock/redislock.hpp>

namespace {

using namespace std::chrono_literals;
using redislock::endpoint;

// The message of the invalid_argument that parsing `uri` throws, or "" if it parses.
std::string parse_error(std::string_view uri) {
    try {
        (void)endpoint::from_uri(uri);
    } catch (const redislock::invalid_argument& e) {
        return e.what();
    }
    return {};
}

// Expects `uri` to be rejected with a message that names the URI and says `why`.
void expect_rejected(std::string_view uri, std::string_view why) {
    const std::string message = parse_error(uri);
    EXPECT_NE(message.find(why), std::string::npos) << "uri: " << uri << "\nmessage: " << message;
    EXPECT_NE(message.find("'" + std::string{uri} + "'"), std::string::npos)
        << "the message should quote the URI: " << message;
}

TEST(Endpoint, DefaultsMatchAPlainLocalServer) {
    const endpoint ep;
    EXPECT_EQ(ep.host, "127.0.0.1");
    EXPECT_EQ(ep.port, 6379);
    EXPECT_TRUE(ep.unix_socket.empty());
    EXPECT_TRUE(ep.user.empty());
    EXPECT_TRUE(ep.password.empty());
    EXPECT_EQ(ep.db, 0);
    EXPECT_EQ(ep.connect_timeout, 2000ms);
    EXPECT_EQ(ep.command_timeout, 2000ms);
    EXPECT_EQ(ep.pool_size, 8U);
}

TEST(Endpoint, HostAloneKeepsTheDefaultPortAndDb) {
    const auto ep = endpoint::from_uri("redis://cache.internal");
    EXPECT_EQ(ep.host, "cache.internal");
    EXPECT_EQ(ep.port, 6379);
    EXPECT_EQ(ep.db, 0);
    EXPECT_TRUE(ep.unix_socket.empty());
}

TEST(Endpoint, HostPortAndDbAreParsed) {
    const auto ep = endpoint::from_uri("redis://127.1.2.3:7000/5");
    EXPECT_EQ(ep.host, "127.1.2.3");
    EXPECT_EQ(ep.port, 7000);
    EXPECT_EQ(ep.db, 5);
}

TEST(Endpoint, TrailingSlashMeansDbZero) {
    const auto ep = endpoint::from_uri("redis://h:7001/");
    EXPECT_EQ(ep.port, 7001);
    EXPECT_EQ(ep.db, 0);
}

TEST(Endpoint, PortBoundsAreInclusive) {
    EXPECT_EQ(endpoint::from_uri("redis://h:1").port, 1);
    EXPECT_EQ(endpoint::from_uri("redis://h:65535").port, 65535);
}

TEST(Endpoint, BracketedIpv6HostIsParsed) {
    const auto with_port = endpoint::from_uri("redis://[::1]:6380/2");
    EXPECT_EQ(with_port.host, "::1");
    EXPECT_EQ(with_port.port, 6380);
    EXPECT_EQ(with_port.db, 2);

    const auto without_port = endpoint::from_uri("redis://[fe80::1:2]");
    EXPECT_EQ(without_port.host, "fe80::1:2");
    EXPECT_EQ(without_port.port, 6379);
}

TEST(Endpoint, UserAndPasswordArePercentDecoded) {
    const auto ep = endpoint::from_uri("redis://us%40er:p%40ss%3Aw%2Frd%25@h:6390");
    EXPECT_EQ(ep.user, "us@er");
    EXPECT_EQ(ep.password, "p@ss:w/rd%");
    EXPECT_EQ(ep.host, "h");
    EXPECT_EQ(ep.port, 6390);
}

TEST(Endpoint, EmptyUserMeansPasswordOnly) {
    const auto ep = endpoint::from_uri("redis://:secret@h");
    EXPECT_TRUE(ep.user.empty());
    EXPECT_EQ(ep.password, "secret");
}

TEST(Endpoint, UserinfoWithoutColonIsThePassword) {
    const auto ep = endpoint::from_uri("redis://secret@h");
    EXPECT_TRUE(ep.user.empty());
    EXPECT_EQ(ep.password, "secret");
}

TEST(Endpoint, UnencodedAtSignInThePasswordSplitsAtTheLastOne) {
    const auto ep = endpoint::from_uri("redis://u:a@b@h:1234");
    EXPECT_EQ(ep.user, "u");
    EXPECT_EQ(ep.password, "a@b");
    EXPECT_EQ(ep.host, "h");
    EXPECT_EQ(ep.port, 1234);
}

TEST(Endpoint, QueryOptionsAreApplied) {
    const auto ep = endpoint::from_uri(
        "redis://h:1/1?db=4&user=alice&password=p%20w&connect_timeout=150&command_timeout=250"
        "&pool_size=3");
    EXPECT_EQ(ep.db, 4);  // the query overrides the path
    EXPECT_EQ(ep.user, "alice");
    EXPECT_EQ(ep.password, "p w");
    EXPECT_EQ(ep.connect_timeout, 150ms);
    EXPECT_EQ(ep.command_timeout, 250ms);
    EXPECT_EQ(ep.pool_size, 3U);
}

TEST(Endpoint, EmptyQueryIsAccepted) {
    const auto ep = endpoint::from_uri("redis://h:2?");
    EXPECT_EQ(ep.host, "h");
    EXPECT_EQ(ep.port, 2);
}

TEST(Endpoint, UnixSocketUriTakesAnAbsolutePathAndOptions) {
    const auto ep = endpoint::from_uri("unix:///run/redis/redis.sock?db=2&pool_size=1");
    EXPECT_EQ(ep.unix_socket, "/run/redis/redis.sock");
    EXPECT_EQ(ep.db, 2);
    EXPECT_EQ(ep.pool_size, 1U);
}

TEST(Endpoint, DescribeNamesHostPortOrSocket) {
    EXPECT_EQ(endpoint::from_uri("redis://h:7000").describe(), "h:7000");
    EXPECT_EQ(endpoint::from_uri("unix:///tmp/r.sock").describe(), "/tmp/r.sock");
}

TEST(Endpoint, UnknownSchemeIsRejected) {
    for (std::string_view uri : {"", "http://h:6379", "redis:/h", "h:6379"}) {
        expect_rejected(uri, "the scheme must be redis://, rediss:// or unix://");
    }
}

TEST(Endpoint, RelativeUnixPathIsRejected) {
    expect_rejected("unix://redis.sock", "a unix socket path must be absolute");
    expect_rejected("unix://", "a unix socket path must be absolute");
}

TEST(Endpoint, TruncatedPercentEscapeIsRejected) {
    expect_rejected("redis://:pw%4@h", "truncated percent escape");
    expect_rejected("redis://:pw%@h", "truncated percent escape");
    expect_rejected("redis://h?password=%", "truncated percent escape");
}

TEST(Endpoint, BadPercentEscapeIsRejected) {
    expect_rejected("redis://:pw%zz@h", "bad percent escape");
    expect_rejected("redis://u%g1:pw@h", "bad percent escape");
    expect_rejected("redis://h?user=%-1", "bad percent escape");
}

TEST(Endpoint, QueryOptionWithoutValueIsRejected) {
    expect_rejected("redis://h?db", "query option 'db' has no value");
    expect_rejected("redis://h?db=1&&pool_size=2", "query option '' has no value");
}

TEST(Endpoint, UnknownQueryOptionIsRejected) {
    expect_rejected("redis://h?timeout=5", "unknown query option 'timeout'");
    expect_rejected("unix:///tmp/s?ssl=true", "unknown query option 'ssl'");
}

TEST(Endpoint, BadDbIsRejected) {
    expect_rejected("redis://h/abc", "db 'abc' is not a valid number");
    expect_rejected("redis://h/1x", "db '1x' is not a valid number");
    expect_rejected("redis://h?db=-1", "db '-1' is not a valid number");
    expect_rejected("redis://h/99999999999", "db '99999999999' is not a valid number");
}

TEST(Endpoint, BadPortIsRejected) {
    expect_rejected("redis://h:abc", "port 'abc' is not a valid number");
    expect_rejected("redis://h:0", "port '0' is not a valid number");
    expect_rejected("redis://h:-1", "port '-1' is not a valid number");
    expect_rejected("redis://h:99999999999999999999", "is not a valid number");
    expect_rejected("redis://h:65536", "port 65536 is out of range");
}

TEST(Endpoint, BadTimeoutsAndPoolSizeAreRejected) {
    expect_rejected("redis://h?connect_timeout=0", "connect_timeout '0' is not a valid number");
    expect_rejected("redis://h?command_timeout=fast", "command_timeout 'fast' is not a valid");
    expect_rejected("redis://h?command_timeout=-5", "command_timeout '-5' is not a valid");
    expect_rejected("redis://h?pool_size=0", "pool_size '0' is not a valid number");
}

TEST(Endpoint, UnclosedIpv6BracketIsRejected) {
    expect_rejected("redis://[::1:6379", "unclosed '[' in the host");
}

TEST(Endpoint, JunkAfterIpv6HostIsRejected) {
    expect_rejected("redis://[::1]6379", "expected ':' after the IPv6 host");
}

TEST(Endpoint, MissingHostIsRejected) {
    expect_rejected("redis://", "no host");
    expect_rejected("redis://:6379", "no host");
    expect_rejected("redis://[]:6379", "no host");
    expect_rejected("redis://:pw@/2", "no host");
}

TEST(Endpoint, RedissEnablesTlsWithFullVerificationByDefault) {
    const auto ep = endpoint::from_uri("rediss://alice:pw@cache.internal:6380/3");
    EXPECT_TRUE(ep.tls.enabled);
    EXPECT_EQ(ep.tls.verify, redislock::tls_verify::full);
    EXPECT_EQ(ep.host, "cache.internal");
    EXPECT_EQ(ep.port, 6380);
    EXPECT_EQ(ep.db, 3);
    EXPECT_EQ(ep.user, "alice");
    EXPECT_EQ(ep.password, "pw");
    EXPECT_TRUE(ep.tls.ca_file.empty());
    EXPECT_TRUE(ep.tls.server_name.empty());
}

TEST(Endpoint, PlainRedisLeavesTlsOff) {
    EXPECT_FALSE(endpoint::from_uri("redis://h:1").tls.enabled);
    EXPECT_FALSE(endpoint::from_uri("unix:///tmp/s.sock").tls.enabled);
    EXPECT_FALSE(endpoint{}.tls.enabled);
}

TEST(Endpoint, TlsQueryOptionsAreApplied) {
    const auto ep = endpoint::from_uri(
        "rediss://[::1]:7000?tls_ca_file=/etc/ca%20dir/ca.pem&tls_ca_dir=/etc/certs"
        "&tls_cert_file=/k/client.crt&tls_key_file=/k/client.key&tls_server_name=redis.internal"
        "&tls_verify=ca&command_timeout=300");
    EXPECT_EQ(ep.host, "::1");
    EXPECT_EQ(ep.port, 7000);
    EXPECT_EQ(ep.tls.ca_file, "/etc/ca dir/ca.pem");
    EXPECT_EQ(ep.tls.ca_dir, "/etc/certs");
    EXPECT_EQ(ep.tls.cert_file, "/k/client.crt");
    EXPECT_EQ(ep.tls.key_file, "/k/client.key");
    EXPECT_EQ(ep.tls.server_name, "redis.internal");
    EXPECT_EQ(ep.tls.verify, redislock::tls_verify::ca_only);
    EXPECT_EQ(ep.command_timeout, 300ms);
}

TEST(Endpoint, TlsVerifyAcceptsItsSpellings) {
    using redislock::tls_verify;
    EXPECT_EQ(endpoint::from_uri("rediss://h?tls_verify=full").tls.verify, tls_verify::full);
    EXPECT_EQ(endpoint::from_uri("rediss://h?tls_verify=true").tls.verify, tls_verify::full);
    EXPECT_EQ(endpoint::from_uri("rediss://h?tls_verify=none").tls.verify, tls_verify::none);
    EXPECT_EQ(endpoint::from_uri("rediss://h?tls_verify=false").tls.verify, tls_verify::none);
    expect_rejected("rediss://h?tls_verify=maybe", "tls_verify must be full, ca or none");
}

TEST(Endpoint, TlsOptionsWithoutTlsAreRejected) {
    expect_rejected("redis://h:1?tls_ca_file=/ca.pem", "needs TLS: use rediss://");
    expect_rejected("redis://h:1?tls_verify=none", "needs TLS: use rediss://");
    expect_rejected("unix:///tmp/s.sock?tls_ca_file=/ca.pem", "needs TLS: use rediss://");
}

TEST(Endpoint, ContradictoryTlsOptionsAreRejected) {
    expect_rejected("rediss://h?tls_cert_file=/c.pem", "needs both tls_cert_file and tls_key_file");
    expect_rejected("rediss://h?tls_key_file=/k.pem", "needs both tls_cert_file and tls_key_file");
    expect_rejected("rediss://h?tls_verify=none&tls_ca_file=/ca.pem",
                    "tls_verify=none contradicts tls_ca_file");
    expect_rejected("rediss://h?tls_ca_file=", "'tls_ca_file' is empty");
    expect_rejected("rediss://h?tls_ca=/ca.pem", "unknown TLS option 'tls_ca'");
}

TEST(Endpoint, CheckTlsRejectsContradictionsInAStruct) {
    endpoint ep;
    ep.tls.ca_file = "/ca.pem";
    EXPECT_THROW(ep.check_tls(), redislock::invalid_argument);  // TLS options, TLS off
    ep.tls.enabled = true;
    EXPECT_NO_THROW(ep.check_tls());
    ep.tls.cert_file = "/c.pem";
    EXPECT_THROW(ep.check_tls(), redislock::invalid_argument);  // certificate without key
}

TEST(Endpoint, UnknownSchemeMessageNamesRediss) {
    expect_rejected("redisss://h", "redis://, rediss:// or unix://");
}

TEST(Endpoint, ClientRejectsABadUriWithInvalidArgument) {
    EXPECT_THROW(redislock::client{"http://127.0.0.1:6379"}, redislock::invalid_argument);
    EXPECT_THROW(redislock::client{"redis://127.0.0.1:6379?pool_size=0"},
                 redislock::invalid_argument);
}

TEST(Endpoint, ZeroPoolSizeInAnEndpointIsRejected) {
    endpoint ep;
    ep.pool_size = 0;
    EXPECT_THROW(redislock::hiredis_connection{ep}, redislock::invalid_argument);
}

TEST(Endpoint, InvalidArgumentIsARedislockError) {
    try {
        (void)endpoint::from_uri("nope");
        FAIL() << "a bad URI must throw";
    } catch (const redislock::error& e) {
        EXPECT_NE(dynamic_cast<const redislock::invalid_argument*>(&e), nullptr);
    }
}

}  // namespace
