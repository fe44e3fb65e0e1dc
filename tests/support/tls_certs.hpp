#pragma once

// Throwaway TLS material for the tests, made with the openssl command-line tool: a CA, a server
// certificate it signed for 127.0.0.1 and localhost, a client certificate it signed (mutual
// TLS), and an unrelated CA that trusts nothing here. Plus tls_server: a redis-server that also
// listens for TLS.

#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "support/redis_server.hpp"

namespace redislock::test {

/// The files live in a fresh temporary directory, removed by the destructor.
class tls_certs {
public:
    tls_certs() : dir_{detail::make_temp_dir()} {
        try {
            make_ca("ca", "redislock test CA");
            make_ca("other_ca", "unrelated test CA");
            make_leaf("server", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost");
            make_leaf("client", "redislock test client", "extendedKeyUsage=clientAuth");
        } catch (...) {
            remove();
            throw;
        }
    }
    ~tls_certs() { remove(); }
    tls_certs(const tls_certs&) = delete;
    tls_certs& operator=(const tls_certs&) = delete;

    std::string ca_file() const { return dir_ + "/ca.crt"; }
    std::string other_ca_file() const { return dir_ + "/other_ca.crt"; }
    std::string server_cert() const { return dir_ + "/server.crt"; }
    std::string server_key() const { return dir_ + "/server.key"; }
    std::string client_cert() const { return dir_ + "/client.crt"; }
    std::string client_key() const { return dir_ + "/client.key"; }

private:
    void openssl(std::vector<std::string> args) const {
        args.insert(args.begin(), detail::find_executable("openssl"));
        const auto result = detail::run_capture(args, std::chrono::seconds{30});
        if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0) {
            throw std::runtime_error{"openssl " + args.at(1) + " failed: " + result.err +
                                     result.out};
        }
    }

    // EC keys: much faster to make than RSA, and every TLS stack here takes them.
    std::vector<std::string> new_key(const std::string& name) const {
        return {"-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                dir_ + "/" + name + ".key"};
    }

    void make_ca(const std::string& name, const std::string& cn) const {
        std::vector<std::string> args{"req",   "-x509",     "-days", "2",
                                      "-subj", "/CN=" + cn, "-out",  dir_ + "/" + name + ".crt"};
        const auto key = new_key(name);
        args.insert(args.end(), key.begin(), key.end());
        openssl(args);
    }

    void make_leaf(const std::string& name, const std::string& cn,
                   const std::string& extension) const {
        std::vector<std::string> req{"req",       "-new", "-subj",
                                     "/CN=" + cn, "-out", dir_ + "/" + name + ".csr"};
        const auto key = new_key(name);
        req.insert(req.end(), key.begin(), key.end());
        openssl(req);
        const std::string ext_file = dir_ + "/" + name + ".ext";
        std::ofstream{ext_file} << extension << "\n";
        openssl({"x509", "-req", "-days", "2", "-in", dir_ + "/" + name + ".csr", "-CA", ca_file(),
                 "-CAkey", dir_ + "/ca.key", "-CAcreateserial", "-extfile", ext_file, "-out",
                 dir_ + "/" + name + ".crt"});
    }

    void remove() noexcept {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    std::string dir_;
};

/// A redis-server with TLS on tls_port(). It keeps a plain port too (port(), uri()): the
/// fixture's readiness probe and the tests' out-of-band checks use it, so they never depend on
/// the TLS code under test.
class tls_server {
public:
    explicit tls_server(const tls_certs& certs, bool require_client_cert = false)
        : tls_port_{detail::pick_free_port()},
          server_{redis_server::options{
              .extra_args = {"--tls-port", std::to_string(tls_port_), "--tls-cert-file",
                             certs.server_cert(), "--tls-key-file", certs.server_key(),
                             "--tls-ca-cert-file", certs.ca_file(), "--tls-auth-clients",
                             require_client_cert ? "yes" : "no"}}} {}

    int tls_port() const { return tls_port_; }
    redis_server& plain() { return server_; }

    /// rediss://127.0.0.1:<tls port>, with `query` appended when not empty.
    std::string uri(const std::string& query = {}) const {
        return "rediss://127.0.0.1:" + std::to_string(tls_port_) +
               (query.empty() ? "" : "?" + query);
    }

private:
    int tls_port_;
    redis_server server_;
};

}  // namespace redislock::test
