#pragma once

// A private redis-server per test, plus raw RESP probes that do not go through the library, so
// that the fixture can check the server without relying on the code under test.

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace redislock::test {

// Outcome of sending one command over a fresh connection.
struct reply_probe {
    bool connected = false;
    std::optional<std::string> line;  // first reply line without CRLF, if it arrived in time
};

namespace detail {

using clock = std::chrono::steady_clock;

class unique_fd {
public:
    unique_fd() = default;
    explicit unique_fd(int fd) : fd_(fd) {}
    unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    unique_fd& operator=(unique_fd&& other) noexcept {
        if (this != &other) {
            reset();
            fd_ = std::exchange(other.fd_, -1);
        }
        return *this;
    }
    unique_fd(const unique_fd&) = delete;
    unique_fd& operator=(const unique_fd&) = delete;
    ~unique_fd() { reset(); }

    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    void reset() {
        if (fd_ >= 0) {
            ::close(fd_);
            fd_ = -1;
        }
    }

private:
    int fd_ = -1;
};

inline std::runtime_error sys_error(const std::string& what) {
    return std::runtime_error(what + ": " + std::strerror(errno));
}

inline int remaining_ms(clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    return static_cast<int>(std::max<std::chrono::milliseconds::rep>(left.count(), 0));
}

inline std::string encode_command(const std::vector<std::string>& args) {
    // append() rather than operator+: g++ 12 at -O2 warns falsely (-Wrestrict) on the latter.
    std::string out;
    out.append("*").append(std::to_string(args.size())).append("\r\n");
    for (const auto& arg : args) {
        out.append("$").append(std::to_string(arg.size())).append("\r\n");
        out.append(arg).append("\r\n");
    }
    return out;
}

inline reply_probe probe(int family, const sockaddr* addr, socklen_t addr_len,
                         const std::vector<std::string>& command,
                         std::chrono::milliseconds timeout) {
    reply_probe result;
    const auto deadline = clock::now() + timeout;
    unique_fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
        throw sys_error("socket");
    }
    if (::connect(fd.get(), addr, addr_len) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            return result;
        }
        pollfd pfd{fd.get(), POLLOUT, 0};
        if (::poll(&pfd, 1, remaining_ms(deadline)) != 1) {
            return result;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
            return result;
        }
    }
    result.connected = true;

    const std::string payload = encode_command(command);
    std::size_t sent = 0;
    while (sent < payload.size()) {
        // MSG_NOSIGNAL: a server that died mid-probe must not kill the test with SIGPIPE.
        ssize_t n = ::send(fd.get(), payload.data() + sent, payload.size() - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno == EAGAIN) {
            pollfd pfd{fd.get(), POLLOUT, 0};
            if (::poll(&pfd, 1, remaining_ms(deadline)) == 1) {
                continue;
            }
        }
        return result;
    }

    std::string received;
    for (;;) {
        if (auto pos = received.find("\r\n"); pos != std::string::npos) {
            result.line = received.substr(0, pos);
            return result;
        }
        pollfd pfd{fd.get(), POLLIN, 0};
        int ready = ::poll(&pfd, 1, remaining_ms(deadline));
        if (ready < 0 && errno == EINTR) {
            continue;
        }
        if (ready != 1) {
            return result;
        }
        char buf[512];
        ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            continue;
        }
        if (n <= 0) {
            return result;
        }
        received.append(buf, static_cast<std::size_t>(n));
    }
}

inline int pick_free_port() {
    unique_fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) {
        throw sys_error("socket");
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        throw sys_error("bind 127.0.0.1:0");
    }
    socklen_t len = sizeof(addr);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        throw sys_error("getsockname");
    }
    return ntohs(addr.sin_port);
}

inline std::string find_executable(const std::string& name) {
    if (name.find('/') != std::string::npos) {
        return name;
    }
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
    for (std::string dir; std::getline(dirs, dir, ':');) {
        std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
        if (::access(candidate.c_str(), X_OK) == 0) {
            return candidate;
        }
    }
    throw std::runtime_error(name + " not found in PATH");
}

inline std::string make_temp_dir() {
    // A unix socket path must fit in sun_path (108 bytes), so fall back to /tmp for a long TMPDIR.
    std::string base = "/tmp";
    if (const char* tmp = std::getenv("TMPDIR");
        tmp != nullptr && *tmp != '\0' && std::strlen(tmp) <= 60) {
        base = tmp;
    }
    // mkdtemp replaces the trailing six placeholder characters.
    std::string templ = base + "/redislock-test-" + std::string(6, 'X');
    if (::mkdtemp(templ.data()) == nullptr) {
        throw sys_error("mkdtemp " + templ);
    }
    return templ;
}

// Forks and execs argv[0] (a full path) with stdin on /dev/null and stdout/stderr on the given
// descriptors. The child gets SIGKILL when the forking thread dies, so a crashed test never
// leaves processes behind.
inline pid_t spawn(const std::vector<std::string>& args, int out_fd, int err_fd) {
    // Everything the child needs is prepared before fork: after fork in a multi-threaded
    // process only async-signal-safe calls are allowed.
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (const auto& arg : args) {
        argv.push_back(const_cast<char*>(arg.c_str()));
    }
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    rlimit nofile{};
    int max_fd = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
        max_fd = static_cast<int>(std::min<rlim_t>(nofile.rlim_cur, 1 << 20));
    }

    pid_t pid = ::fork();
    if (pid < 0) {
        throw sys_error("fork");
    }
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) {
            ::_exit(127);
        }
        sigset_t none;
        ::sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        int null_fd = ::open("/dev/null", O_RDONLY);
        if (null_fd < 0 || ::dup2(null_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 ||
            ::dup2(err_fd, 2) < 0) {
            ::_exit(127);
        }
        // Inherited descriptors (e.g. the test's client connections) must not stay open in the
        // child, or closing them in the test would not close the connection.
        bool closed = false;
#ifdef SYS_close_range
        closed = ::syscall(SYS_close_range, 3U, ~0U, 0U) == 0;
#endif
        for (int fd = 3; !closed && fd < max_fd; ++fd) {
            ::close(fd);
        }
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    return pid;
}

inline std::optional<int> reap(pid_t pid, bool block) {
    int status = 0;
    for (;;) {
        pid_t r = ::waitpid(pid, &status, block ? 0 : WNOHANG);
        if (r == pid) {
            return status;
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            // ECHILD: already reaped, or SIGCHLD is ignored by the test; either way it is gone.
            return -1;
        }
        return std::nullopt;
    }
}

struct process_output {
    int status = 0;
    std::string out;
    std::string err;
};

inline process_output run_capture(const std::vector<std::string>& args,
                                  std::chrono::milliseconds timeout) {
    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
        throw sys_error("pipe2");
    }
    unique_fd out_read(out_pipe[0]);
    unique_fd out_write(out_pipe[1]);
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        throw sys_error("pipe2");
    }
    unique_fd err_read(err_pipe[0]);
    unique_fd err_write(err_pipe[1]);

    const pid_t pid = spawn(args, out_write.get(), err_write.get());
    out_write.reset();
    err_write.reset();

    process_output result;
    const auto deadline = clock::now() + timeout;
    std::optional<int> status;
    bool out_open = true;
    bool err_open = true;
    // Stop at EOF or once the child is gone and the pipes are drained: another fork in the test
    // process may hold a copy of the write ends, so EOF alone is not guaranteed.
    while (out_open || err_open) {
        if (!status) {
            status = reap(pid, false);
        }
        pollfd pfds[2] = {{out_open ? out_read.get() : -1, POLLIN, 0},
                          {err_open ? err_read.get() : -1, POLLIN, 0}};
        int ready = ::poll(pfds, 2, status ? 0 : std::min(remaining_ms(deadline), 50));
        if (ready < 0 && errno == EINTR) {
            continue;
        }
        if (ready <= 0) {
            if (status) {
                break;
            }
            if (clock::now() >= deadline) {
                ::kill(pid, SIGKILL);
                reap(pid, true);
                throw std::runtime_error("timed out running " + args.front());
            }
            continue;
        }
        for (int i = 0; i < 2; ++i) {
            if (pfds[i].fd < 0 || pfds[i].revents == 0) {
                continue;
            }
            char buf[4096];
            ssize_t n = ::read(pfds[i].fd, buf, sizeof(buf));
            if (n > 0) {
                (i == 0 ? result.out : result.err).append(buf, static_cast<std::size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                (i == 0 ? out_open : err_open) = false;
            }
        }
    }
    if (!status) {
        status = reap(pid, true);
    }
    result.status = *status;
    return result;
}

inline std::string read_from(const std::string& path, std::streamoff offset) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        return {};
    }
    in.seekg(offset);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::streamoff file_size(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::streamoff>(st.st_size) : 0;
}

inline std::string tail_lines(const std::string& text, std::size_t max_lines) {
    std::size_t pos = text.size();
    if (pos > 0 && text[pos - 1] == '\n') {
        --pos;
    }
    for (std::size_t lines = 0; pos > 0; --pos) {
        if (text[pos - 1] == '\n' && ++lines == max_lines) {
            break;
        }
    }
    return text.substr(pos);
}

// Whether process `pid` holds a TCP socket listening on 127.0.0.1:`port`; nullopt if /proc
// cannot tell. Another test's server can win a race for the same free port, so answering PING
// alone does not prove that the server on the port is ours.
inline std::optional<bool> listens_on(pid_t pid, int port) {
    std::ifstream tcp("/proc/net/tcp");
    if (!tcp) {
        return std::nullopt;
    }
    char wanted[32];
    std::snprintf(wanted, sizeof(wanted), "0100007F:%04X", static_cast<unsigned>(port));
    std::vector<std::string> inodes;
    std::string line;
    std::getline(tcp, line);
    while (std::getline(tcp, line)) {
        std::istringstream fields(line);
        std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
        fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
            timeout >> inode;
        if (local == wanted && state == "0A") {
            inodes.push_back("socket:[" + inode + "]");
        }
    }
    if (inodes.empty()) {
        return false;
    }
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* dir = ::opendir(fd_dir.c_str());
    if (dir == nullptr) {
        return std::nullopt;
    }
    bool found = false;
    while (dirent* entry = ::readdir(dir)) {
        char target[64];
        std::string link = fd_dir + "/" + entry->d_name;
        ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
        if (n > 0 && std::find(inodes.begin(), inodes.end(),
                               std::string(target, static_cast<std::size_t>(n))) != inodes.end()) {
            found = true;
            break;
        }
    }
    ::closedir(dir);
    return found;
}

// Scheduler state letter from /proc/<pid>/stat ('T' when stopped), or '\0' if unreadable.
inline char process_state(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto pos = stat.rfind(')');
    return pos != std::string::npos && pos + 2 < stat.size() ? stat[pos + 2] : '\0';
}

}  // namespace detail

inline reply_probe probe_tcp(const std::string& host, int port,
                             const std::vector<std::string>& command,
                             std::chrono::milliseconds timeout) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
        throw std::invalid_argument("not an IPv4 address: " + host);
    }
    return detail::probe(AF_INET, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), command,
                         timeout);
}

inline reply_probe probe_unix(const std::string& path, const std::vector<std::string>& command,
                              std::chrono::milliseconds timeout) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) {
        throw std::invalid_argument("unix socket path too long: " + path);
    }
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return detail::probe(AF_UNIX, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), command,
                         timeout);
}

// Runs a private redis-server for one test. Not thread-safe; create it on a thread that outlives
// it, since the server is killed when the creating thread exits.
class redis_server {
public:
    struct options {
        bool unix_socket = false;               // also listen on a unix socket in the temp dir
        std::vector<std::string> extra_args{};  // e.g. {"--requirepass", "pw"}
    };

    redis_server() : redis_server(options{}) {}

    explicit redis_server(options opts) : opts_(std::move(opts)), owner_pid_(::getpid()) {
        for (std::size_t i = 0; i + 1 < opts_.extra_args.size(); ++i) {
            if (opts_.extra_args[i] == "--requirepass") {
                password_ = opts_.extra_args[i + 1];
            }
        }
        dir_ = detail::make_temp_dir();
        if (opts_.unix_socket) {
            unix_path_ = dir_ + "/redis.sock";
        }
        try {
            launch(true);
        } catch (...) {
            remove_dir();
            throw;
        }
    }

    ~redis_server() {
        if (is_owner()) {
            stop();
            remove_dir();
        }
    }

    redis_server(const redis_server&) = delete;
    redis_server& operator=(const redis_server&) = delete;

    int port() const { return port_; }
    std::string host() const { return "127.0.0.1"; }
    std::string unix_path() const { return unix_path_; }
    std::string uri() const { return "redis://" + host() + ":" + std::to_string(port_); }
    std::string unix_uri() const { return unix_path_.empty() ? "" : "unix://" + unix_path_; }
    pid_t pid() const { return pid_; }
    const std::string& dir() const { return dir_; }

    void pause() { signal_and_wait(SIGSTOP, true); }

    void resume() { signal_and_wait(SIGCONT, false); }

    // Only the process that started the server stops it, so forked workers leaving their scope
    // or exiting do not take the server down under the parent.
    void stop() {
        if (!is_owner() || pid_ <= 0) {
            return;
        }
        ::kill(pid_, SIGKILL);
        detail::reap(pid_, true);
        pid_ = -1;
    }

    void start() {
        if (!is_owner()) {
            throw std::logic_error("redis_server::start called from a forked child");
        }
        if (pid_ > 0) {
            return;
        }
        launch(false);
    }

    void restart() {
        stop();
        start();
    }

    // Server faults. Each acts on this server at once and returns when it has taken effect.

    // kill -9, then a new server on the same port with no data and no scripts loaded (as after a
    // crash of a server without persistence). Clients see their connections closed.
    void kill_and_restart_empty() {
        stop();
        std::error_code ignored;
        std::filesystem::remove(dir_ + "/dump.rdb", ignored);
        std::filesystem::remove_all(dir_ + "/appendonlydir", ignored);
        start();
    }

    void flushall() { expect_ok(cli({"FLUSHALL"}), "FLUSHALL"); }

    // Forgets every loaded script, so the next EVALSHA gets NOSCRIPT.
    void script_flush() { expect_ok(cli({"SCRIPT", "FLUSH"}), "SCRIPT FLUSH"); }

    // Closes every normal client connection (not the redis-cli that asks: CLIENT KILL skips the
    // caller). Returns how many were closed.
    int client_kill_all() { return std::stoi(cli({"CLIENT", "KILL", "TYPE", "normal"})); }

    // Holds every client's commands for `duration` (CLIENT PAUSE ... ALL); connections stay open.
    void client_pause(std::chrono::milliseconds duration) {
        expect_ok(cli({"CLIENT", "PAUSE", std::to_string(duration.count()), "ALL"}),
                  "CLIENT PAUSE");
    }

    // Caps memory at `bytes` and refuses writes past it (OOM) instead of evicting keys.
    void set_maxmemory_noeviction(std::size_t bytes) {
        expect_ok(cli({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "CONFIG SET");
        expect_ok(cli({"CONFIG", "SET", "maxmemory", std::to_string(bytes)}), "CONFIG SET");
    }

    // used_memory from INFO memory, in bytes.
    std::size_t used_memory() const {
        const std::string info = cli({"INFO", "memory"});
        const std::string field = "used_memory:";
        const auto at = info.find(field);
        if (at == std::string::npos) {
            throw std::runtime_error("INFO memory has no used_memory: " + info);
        }
        return static_cast<std::size_t>(std::stoull(info.substr(at + field.size())));
    }

    // Sets maxmemory a little above what the server uses now (noeviction), then writes keys
    // "<prefix><n>" until the server answers OOM even to a small write: values start at
    // `value_size` bytes and halve after each OOM down to 64, since a big write can be refused
    // (its own query buffer counts) while a small one still fits. Returns how many keys were
    // written. Needs a server without a password (the writes are raw probes).
    // @throws std::runtime_error if that takes more than 8192 writes or 10 s.
    int fill_memory_until_oom(std::size_t headroom = std::size_t{1} << 20,
                              std::size_t value_size = std::size_t{1} << 16,
                              const std::string& prefix = "oom-filler:") {
        if (!password_.empty()) {
            throw std::logic_error("fill_memory_until_oom needs a server without a password");
        }
        constexpr std::size_t smallest = 64;
        set_maxmemory_noeviction(used_memory() + headroom);
        const auto deadline = detail::clock::now() + std::chrono::seconds(10);
        int written = 0;
        for (int attempt = 0; attempt < 8192 && detail::clock::now() < deadline; ++attempt) {
            const auto reply =
                probe_tcp(host(), port_,
                          {"SET", prefix + std::to_string(written), std::string(value_size, 'x')},
                          std::chrono::seconds(2));
            if (!reply.line) {
                throw std::runtime_error("no reply while filling memory");
            }
            if (reply.line->rfind("-OOM", 0) == 0) {
                if (value_size <= smallest) {
                    return written;
                }
                value_size = std::max(value_size / 2, smallest);
                continue;
            }
            if (*reply.line != "+OK") {
                throw std::runtime_error("filling memory: unexpected reply " + *reply.line);
            }
            ++written;
        }
        throw std::runtime_error("the server did not run out of memory");
    }

    // Runs one redis-cli command; nil replies come back as an empty string.
    std::string cli(const std::vector<std::string>& args) const {
        std::vector<std::string> argv{detail::find_executable("redis-cli"), "-h", host(), "-p",
                                      std::to_string(port_)};
        if (!password_.empty()) {
            argv.insert(argv.end(), {"--no-auth-warning", "-a", password_});
        }
        argv.insert(argv.end(), args.begin(), args.end());
        auto result = detail::run_capture(argv, std::chrono::seconds(10));
        if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0) {
            throw std::runtime_error("redis-cli failed (status " + std::to_string(result.status) +
                                     "): " + result.err + result.out);
        }
        if (!result.out.empty() && result.out.back() == '\n') {
            result.out.pop_back();
        }
        return result.out;
    }

private:
    enum class launch_result { ready, bind_failed };

    bool is_owner() const { return ::getpid() == owner_pid_; }

    static void expect_ok(const std::string& answer, const std::string& what) {
        if (answer != "OK") {
            throw std::runtime_error(what + " answered: " + answer);
        }
    }

    std::string log_path() const { return dir_ + "/log"; }
    std::string stdout_path() const { return dir_ + "/stdout"; }

    void launch(bool pick_port) {
        constexpr int max_attempts = 5;
        for (int attempt = 1;; ++attempt) {
            if (pick_port) {
                port_ = detail::pick_free_port();
            }
            if (spawn_and_wait() == launch_result::ready) {
                return;
            }
            if (attempt == max_attempts) {
                throw std::runtime_error("redis-server could not bind port " +
                                         std::to_string(port_) + ":\n" + log_tail(0, 0));
            }
            if (!pick_port) {
                // The same port is required, so give whoever holds it a moment to let go.
                std::this_thread::sleep_for(std::chrono::milliseconds(200 * attempt));
            }
        }
    }

    launch_result spawn_and_wait() {
        std::vector<std::string> args{detail::find_executable("redis-server")};
        args.insert(args.end(), {"--port", std::to_string(port_), "--bind", "127.0.0.1"});
        args.insert(args.end(), {"--save", "", "--appendonly", "no", "--daemonize", "no"});
        args.insert(args.end(), {"--dir", dir_, "--logfile", log_path()});
        if (!unix_path_.empty()) {
            args.insert(args.end(), {"--unixsocket", unix_path_, "--unixsocketperm", "700"});
        }
        args.insert(args.end(), opts_.extra_args.begin(), opts_.extra_args.end());

        const auto log_start = detail::file_size(log_path());
        const auto stdout_start = detail::file_size(stdout_path());
        detail::unique_fd out(
            ::open(stdout_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
        if (!out) {
            throw detail::sys_error("open " + stdout_path());
        }
        pid_ = detail::spawn(args, out.get(), out.get());
        out.reset();

        const auto deadline = detail::clock::now() + std::chrono::seconds(10);
        auto delay = std::chrono::milliseconds(5);
        for (;;) {
            if (detail::reap(pid_, false)) {
                pid_ = -1;
                const std::string log = detail::read_from(log_path(), log_start);
                if (log.find("Address already in use") != std::string::npos) {
                    return launch_result::bind_failed;
                }
                throw std::runtime_error("redis-server exited during startup:\n" +
                                         log_tail(log_start, stdout_start));
            }
            if (is_ready()) {
                return launch_result::ready;
            }
            if (detail::clock::now() >= deadline) {
                stop();
                throw std::runtime_error("redis-server did not answer PING within 10 s:\n" +
                                         log_tail(log_start, stdout_start));
            }
            std::this_thread::sleep_for(delay);
            delay = std::min(delay * 2, std::chrono::milliseconds(100));
        }
    }

    bool is_ready() const {
        if (auto ours = detail::listens_on(pid_, port_); ours && !*ours) {
            return false;
        }
        auto reply = probe_tcp(host(), port_, {"PING"}, std::chrono::milliseconds(500));
        if (!reply.line || !answers(*reply.line)) {
            return false;
        }
        if (!unix_path_.empty()) {
            reply = probe_unix(unix_path_, {"PING"}, std::chrono::milliseconds(500));
            return reply.line && answers(*reply.line);
        }
        return true;
    }

    static bool answers(const std::string& line) {
        // With a password set the server is up but refuses PING until AUTH.
        return line == "+PONG" || line.rfind("-NOAUTH", 0) == 0 || line.rfind("-ERR", 0) == 0;
    }

    void signal_and_wait(int sig, bool want_stopped) {
        if (pid_ <= 0) {
            throw std::logic_error("redis_server is not running");
        }
        if (::kill(pid_, sig) != 0) {
            throw detail::sys_error("kill");
        }
        // Signals are delivered asynchronously; wait so the caller observes the new state.
        const auto deadline = detail::clock::now() + std::chrono::seconds(2);
        while (((detail::process_state(pid_) == 'T') != want_stopped) &&
               detail::clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    std::string log_tail(std::streamoff log_start, std::streamoff stdout_start) const {
        constexpr std::size_t lines = 30;
        std::string text;
        for (const auto& [path, start] :
             {std::pair{log_path(), log_start}, std::pair{stdout_path(), stdout_start}}) {
            std::string tail = detail::tail_lines(detail::read_from(path, start), lines);
            if (!tail.empty()) {
                text += "--- " + path + "\n" + tail + "\n";
            }
        }
        return text.empty() ? "(no server output)" : text;
    }

    void remove_dir() noexcept {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    options opts_;
    pid_t owner_pid_;
    std::string password_;
    std::string dir_;
    std::string unix_path_;
    int port_ = 0;
    pid_t pid_ = -1;
};

}  // namespace redislock::test
