// What the serve tests share: `tessera serve` as a child process, one HTTP call, a ZeroMQ drain,
// msgpack readers, framed bodies and a view of the manager's state (tests/serve_*_test.cc).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "tessera_tools/serve.h"
#include "test_support.h"

namespace tessera::serve_test {

using testing::TempDir;

// ---- The wire format ----------------------------------------------------------------------

inline std::string Bin(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::BIN);
  return std::string(o.via.bin.ptr, o.via.bin.size);
}

inline std::string Str(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  return std::string(o.via.str.ptr, o.via.str.size);
}

inline std::string HashBytes(const Hash128& h) {
  std::string s(16, '\0');
  for (int i = 0; i < 8; ++i) {
    s[static_cast<size_t>(i)] = static_cast<char>(h.hi >> (8 * (7 - i)));
    s[static_cast<size_t>(8 + i)] = static_cast<char>(h.lo >> (8 * (7 - i)));
  }
  return s;
}

// ---- The server, end to end ---------------------------------------------------------------

// `tessera serve --config FILE` as a child process, its stdout read for the ready line.
class Server {
 public:
  Server(const std::string& config, std::vector<std::string> extra = {}) {
    int out[2], err[2];
    EXPECT_EQ(::pipe(out), 0);
    EXPECT_EQ(::pipe(err), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::close(out[0]);
      ::close(err[0]);
      std::vector<std::string> args = {TESSERA_BINARY, "serve", "--config", config};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~Server() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
    ::close(err_);
  }
  // Waits (10 s at most) for "ready http=H:P events=E"; false if the process exits first.
  bool Ready() {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) return false;
      line.append(buf, static_cast<size_t>(n));
      if (line.find('\n') == std::string::npos) continue;
      const size_t h = line.find("http=127.0.0.1:");
      const size_t e = line.find("events=");
      if (h == std::string::npos || e == std::string::npos) return false;
      port_ = std::stoi(line.substr(h + 15));
      events_ = line.substr(e + 7, line.find('\n', e) - e - 7);
      return true;
    }
    return false;
  }
  // SIGTERM (or nothing), then the exit code (-1 if it had not exited within 20 s).
  int Stop(bool term = true) {
    if (term) ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        waited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  std::string Stderr() {
    std::string s;
    char buf[4096];
    ::fcntl(err_, F_SETFL, O_NONBLOCK);
    for (ssize_t n; (n = ::read(err_, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
    return s;
  }
  int port() const { return port_; }
  const std::string& events() const { return events_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  bool waited_ = false;
  int port_ = 0;
  std::string events_;
};

struct HttpReply {
  int status = 0;
  std::string body;
};

// One HTTP/1.1 request on a fresh connection (the server closes it after the reply).
inline HttpReply Http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                      const std::string& extra_headers = "") {
  HttpReply r;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (method == "POST" && extra_headers.find("Content-Length") == std::string::npos) {
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) all.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (all.size() > 12 && all.starts_with("HTTP/1.1 ")) r.status = std::stoi(all.substr(9, 3));
  const size_t split = all.find("\r\n\r\n");
  if (split != std::string::npos) r.body = all.substr(split + 4);
  return r;
}

inline std::string WriteConfig(const TempDir& dir, const std::string& text) {
  const std::string path = dir.path() + "/serve.yaml";
  std::ofstream(path) << text;
  return path;
}

inline std::string Tokens(uint32_t first, uint32_t n) {
  std::string s = "[";
  for (uint32_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(first + i);
  return s + "]";
}

inline std::string BaseConfig(const TempDir& dir, const std::string& write = "write-back") {
  return "model: deepseek-v3\nkv_format: fp8_ds_mla\ncapacity_blocks: 64\nmax_requests: 16\n"
         "http:\n  listen: 127.0.0.1:0\n  max_body_bytes: 65536\n"
         "events:\n  endpoint: tcp://127.0.0.1:*\n  topic: kv\n  data_parallel_rank: 2\n"
         "tiers:\n  disk_dir: " +
         dir.path() + "/disk\n  write: " + write + "\n";
}

// The events of every batch received within `ms`, as (tag, block hash count) pairs.
struct Received {
  std::vector<std::string> tags;
  std::vector<std::string> stored_hashes;  // the 16-byte hashes of every BlockStored
  uint64_t last_seq = 0;
  uint32_t rank = 0;
};

// Stops once `want_events` events are in and nothing more is queued (the deadline is then only a
// bound on a failure: no result depends on it).
inline void Drain(zmq::socket_t& sub, int ms, Received* got, size_t want_events = SIZE_MAX) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<zmq::message_t> parts;
    zmq::message_t m;
    if (!sub.recv(m, zmq::recv_flags::dontwait)) {
      if (got->tags.size() >= want_events) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    parts.push_back(std::move(m));
    while (parts.back().more()) {
      zmq::message_t next;
      ASSERT_TRUE(sub.recv(next, zmq::recv_flags::none));
      parts.push_back(std::move(next));
    }
    ASSERT_EQ(parts.size(), 3u);  // topic, sequence, payload
    EXPECT_EQ(parts[0].to_string(), "kv");
    ASSERT_EQ(parts[1].size(), 8u);
    uint64_t seq = 0;
    for (size_t i = 0; i < 8; ++i) seq = (seq << 8) | static_cast<const uint8_t*>(parts[1].data())[i];
    got->last_seq = seq;
    msgpack::object_handle h = msgpack::unpack(static_cast<const char*>(parts[2].data()), parts[2].size());
    const msgpack::object_array& batch = h.get().via.array;
    got->rank = batch.ptr[2].as<uint32_t>();
    const msgpack::object_array& events = batch.ptr[1].via.array;
    for (uint32_t i = 0; i < events.size; ++i) {
      const msgpack::object_array& e = events.ptr[i].via.array;
      got->tags.push_back(Str(e.ptr[0]));
      if (got->tags.back() == "BlockStored") {
        for (uint32_t k = 0; k < e.ptr[1].via.array.size; ++k)
          got->stored_hashes.push_back(Bin(e.ptr[1].via.array.ptr[k]));
      }
    }
  }
}

// ---- Engine KV bytes (ADR 0027) ------------------------------------------------------------

// A framed body: "TKV1", the header's length (u32 little-endian), the JSON header, the records.
inline std::string Frame(const std::string& header, const std::string& records, int64_t length = -1) {
  const uint32_t h = length < 0 ? static_cast<uint32_t>(header.size()) : static_cast<uint32_t>(length);
  std::string out = "TKV1";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((h >> (8 * i)) & 0xff));
  return out + header + records;
}

inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

inline ServeConfig EngineConfig(const std::string& model = "tiny-mla") {
  ServeConfig c;
  c.model = model;
  c.capacity_blocks = 32;
  c.max_requests = 8;
  c.events_enabled = false;
  c.kv_engine = true;
  return c;
}

// What a test can see of the manager: a bad body must leave all of it as it was.
inline std::string ManagerState(ServeCore& core) {
  RequestManager& m = core.manager();
  return std::to_string(m.live_requests()) + "/" + std::to_string(m.bytes_held()) + "/" +
         std::to_string(m.pool().stats().allocations.load()) + "/" + std::to_string(m.pool().stats().seals.load()) +
         "/" + std::to_string(m.metrics().requests_admitted.load());
}

inline std::string FieldOf(const std::pair<int, std::string>& r) {
  const nlohmann::json j = nlohmann::json::parse(r.second, nullptr, false);
  return j.is_object() && j.contains("field") ? j["field"].get<std::string>() : "(" + r.second + ")";
}

// A core for `c`, or null with the failure recorded (the caller ASSERTs it is not null).
inline std::unique_ptr<ServeCore> MakeCore(const ServeConfig& c) {
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return made.ok() ? std::move(*made) : nullptr;
}

}  // namespace tessera::serve_test
