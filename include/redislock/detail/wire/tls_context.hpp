// TLS for the hiredis adapter: one OpenSSL client context per connection pool, and the step that
// turns a freshly connected hiredis context into a TLS one.
//
// Only compiled with REDISLOCK_HAVE_TLS (hiredis >= 1.0 with hiredis_ssl, and OpenSSL), which the
// CMake package defines when it finds them.
//
// The SSL_CTX is built here rather than with redisCreateSSLContext() for two reasons: the
// adapter keeps each connection's SSL object (SSL_pending() tells the bounded call path whether
// a reply already sits decrypted inside OpenSSL, where poll(2) on the socket cannot see it), and
// hiredis checks the certificate chain but not the name in it, which tls_verify::full adds. The
// SSL object is still handed to hiredis with redisInitiateSSL(), so hiredis reads, writes and
// frees it as usual.
//
// A TLS context works non-blocking (its socket O_NONBLOCK, hiredis told so): OpenSSL reads whole
// records, and on a blocking socket a record that arrives in parts, or a handshake the server
// never answers, would hold a call until the socket's timeout. Non-blocking, hiredis reports
// "not yet" instead, and the caller waits for the socket with poll(2), by its deadline. The
// handshake itself is driven here the same way.
//
// Thread safety: a tls_context is immutable after construction; attach() may run on several
// threads at once (OpenSSL's SSL_CTX is thread-safe for SSL_new). Lifetime: the pool owns it and
// destroys it after its last context.
#pragma once

#if !defined(REDISLOCK_HAVE_TLS) || !REDISLOCK_HAVE_TLS
#error "redislock/detail/wire/tls_context.hpp needs REDISLOCK_HAVE_TLS"
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>

#include <hiredis/hiredis.h>
#include <hiredis/hiredis_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#if !defined(HIREDIS_MAJOR) || HIREDIS_MAJOR < 1
#error "REDISLOCK_HAVE_TLS needs hiredis >= 1.0 with hiredis_ssl"
#endif

#include <redislock/detail/wire/socket_io.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>

namespace redislock::detail {

/// The text of OpenSSL's most recent error on this thread, or `fallback`.
inline std::string openssl_error(const char* fallback) {
    const unsigned long code = ERR_peek_last_error();
    ERR_clear_error();
    if (code == 0) {
        return fallback;
    }
    char text[256];
    ERR_error_string_n(code, text, sizeof text);
    return text;
}

inline bool is_ip_literal(const std::string& host) {
    in6_addr v6{};
    in_addr v4{};
    return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
           ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

class tls_context {
public:
    /// Loads the CAs and the client certificate named by `ep.tls`.
    /// @throws redislock::invalid_argument when a file cannot be loaded or the settings
    ///         contradict each other.
    explicit tls_context(const endpoint& ep) : options_{ep.tls} {
        ep.check_tls();
        static std::once_flag openssl_ready;
        std::call_once(openssl_ready, [] { redisInitOpenSSL(); });

        ctx_.reset(SSL_CTX_new(TLS_client_method()));
        if (!ctx_) {
            throw connection_error{"redislock: cannot create a TLS context: " +
                                   openssl_error("SSL_CTX_new failed")};
        }
        SSL_CTX_set_min_proto_version(ctx_.get(), TLS1_2_VERSION);
        SSL_CTX_set_verify(ctx_.get(),
                           options_.verify == tls_verify::none ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                           nullptr);
        if (!options_.ca_file.empty() || !options_.ca_dir.empty()) {
            if (SSL_CTX_load_verify_locations(
                    ctx_.get(), options_.ca_file.empty() ? nullptr : options_.ca_file.c_str(),
                    options_.ca_dir.empty() ? nullptr : options_.ca_dir.c_str()) != 1) {
                throw invalid_argument{"redislock: cannot load the trusted CAs from '" +
                                       options_.ca_file + options_.ca_dir +
                                       "': " + openssl_error("no certificates found")};
            }
        } else if (options_.verify != tls_verify::none &&
                   SSL_CTX_set_default_verify_paths(ctx_.get()) != 1) {
            throw invalid_argument{"redislock: cannot load the system's trusted CAs: " +
                                   openssl_error("SSL_CTX_set_default_verify_paths failed")};
        }
        if (!options_.cert_file.empty()) {
            if (SSL_CTX_use_certificate_chain_file(ctx_.get(), options_.cert_file.c_str()) != 1) {
                throw invalid_argument{"redislock: cannot load the client certificate '" +
                                       options_.cert_file + "': " + openssl_error("bad file")};
            }
            if (SSL_CTX_use_PrivateKey_file(ctx_.get(), options_.key_file.c_str(),
                                            SSL_FILETYPE_PEM) != 1 ||
                SSL_CTX_check_private_key(ctx_.get()) != 1) {
                throw invalid_argument{"redislock: cannot use the private key '" +
                                       options_.key_file + "': " + openssl_error("bad file")};
            }
        }
    }

    /// Runs the TLS handshake on `c`, a connected blocking context, by `deadline` (`allowed` is
    /// how long that was, for messages) or until *stop is requested, and leaves `c` non-blocking
    /// (see the top of this file). Returns the SSL object hiredis now owns (valid until
    /// redisFree(c)). `host` is the address connected to.
    /// @throws redislock::timeout_error when the server does not complete the handshake in time
    ///         (a server stopped, or one that does not speak TLS on that port);
    ///         redislock::cancelled_error on a stop request;
    ///         redislock::connection_error when the handshake or the certificate check fails
    ///         (the message says which).
    SSL* attach(redisContext& c, const std::string& host, const std::string& where,
                std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds allowed,
                const std::stop_token* stop) const {
        const std::string& name = options_.server_name.empty() ? host : options_.server_name;
        SSL* ssl = SSL_new(ctx_.get());
        if (ssl == nullptr) {
            throw connection_error{"redislock: cannot create a TLS session for " + where + ": " +
                                   openssl_error("SSL_new failed")};
        }
        // SNI carries host names only, never an address literal (RFC 6066).
        bool ok = is_ip_literal(name) || SSL_set_tlsext_host_name(ssl, name.c_str()) == 1;
        if (ok && options_.verify == tls_verify::full) {
            X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
            ok = is_ip_literal(name) ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) == 1
                                     : X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0) == 1;
        }
        if (!ok) {
            SSL_free(ssl);
            throw connection_error{"redislock: cannot set the TLS server name '" + name + "' for " +
                                   where};
        }
        // Non-blocking, hiredis's own SSL_connect() sends the hello and takes "want to read" as a
        // handshake under way; the rest is driven below.
        if (!set_nonblocking(c.fd, true)) {
            SSL_free(ssl);
            throw connection_error{"redislock: cannot make the connection to " + where +
                                   " non-blocking: " + std::strerror(errno)};
        }
        c.flags &= ~REDIS_BLOCK;
        ERR_clear_error();
        if (redisInitiateSSL(&c, ssl) != REDIS_OK) {
            const std::string why = failure(ssl, c.errstr);
            SSL_free(ssl);  // hiredis leaves it to the caller when the handshake fails
            throw connection_error{"redislock: TLS handshake with " + where + " failed: " + why};
        }
        // From here hiredis owns `ssl`: it is freed with the context.
        for (;;) {
            ERR_clear_error();
            const int done = SSL_do_handshake(ssl);
            if (done == 1) {
                return ssl;
            }
            const int want = SSL_get_error(ssl, done);
            const short events = want == SSL_ERROR_WANT_READ    ? POLLIN
                                 : want == SSL_ERROR_WANT_WRITE ? POLLOUT
                                                                : 0;
            if (events == 0) {
                const int saved = errno;
                std::string why =
                    want == SSL_ERROR_SYSCALL
                        ? (saved != 0 ? std::strerror(saved) : "the server closed the connection")
                        : openssl_error("the server's answer was not TLS");
                throw connection_error{"redislock: TLS handshake with " + where +
                                       " failed: " + failure(ssl, why)};
            }
            switch (wait_socket(c.fd, events, deadline, stop)) {
                case socket_wait::ready:
                    break;
                case socket_wait::timed_out:
                    throw timeout_error{"redislock: TLS handshake with " + where +
                                        " did not finish within " +
                                        std::to_string(allowed.count()) +
                                        " ms (a server that does not speak TLS on that port "
                                        "waits for more bytes, and so does a stopped one)"};
                case socket_wait::stopped:
                    throw cancelled_error{
                        "redislock: a stop was requested during the TLS "
                        "handshake with " +
                        where};
                case socket_wait::failed:
                    throw connection_error{"redislock: TLS handshake with " + where +
                                           " failed: " + std::strerror(errno)};
            }
        }
    }

    /// Decrypted bytes OpenSSL holds for `ssl` that the socket will never signal again.
    static bool pending(const SSL* ssl) noexcept { return SSL_pending(ssl) > 0; }

private:
    // Why a handshake failed: the certificate check when that is what refused the server, else
    // `why`.
    std::string failure(const SSL* ssl, std::string why) const {
        const long verify = SSL_get_verify_result(ssl);
        if (options_.verify != tls_verify::none && verify != X509_V_OK) {
            return std::string{"the server's certificate was rejected: "} +
                   X509_verify_cert_error_string(verify);
        }
        return why;
    }

    struct ctx_deleter {
        void operator()(SSL_CTX* ctx) const noexcept { SSL_CTX_free(ctx); }
    };

    tls_options options_;
    std::unique_ptr<SSL_CTX, ctx_deleter> ctx_;
};

}  // namespace redislock::detail
