// Issue 27.1 and 27.2 under load: slow and hostile clients on 127.0.0.2.. hammer `tessera serve`'s
// HTTP front while well-behaved clients on 127.0.0.1 admit, read, step and free. The well-behaved
// calls must all succeed within a generous bound (no timing figure is asserted beyond it), and
// every byte they read must be the bytes of their own prompt.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tessera_tools/serve.h"
#include "test_support.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "load-test-token-0123456789abcdef";

// A TCP connection to 127.0.0.1:port from the local address 127.0.0.`host` (the whole 127/8 is
// this machine's: each host number is another client address to the server). -1 on failure.
int Connect(int port, int host, int recv_timeout_ms) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(0x7f000000u | static_cast<uint32_t>(host));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{recv_timeout_ms / 1000, (recv_timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, std::string_view data) {
  for (size_t sent = 0; sent < data.size();) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

struct Reply {
  int status = 0;
  std::string body;
};

// One well-behaved call from 127.0.0.1 (reads the whole reply; the server closes).
Reply Call(int port, const std::string& method, const std::string& path, const std::string& body) {
  Reply r;
  const int fd = Connect(port, 1, 30000);
  if (fd < 0) return r;
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                    "Authorization: Bearer " + kToken + "\r\n";
  if (method == "POST") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  if (SendAll(fd, req)) {
    std::string all;
    char buf[65536];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) all.append(buf, static_cast<size_t>(n));
    if (all.size() > 12 && all.starts_with("HTTP/1.1 ")) r.status = std::stoi(all.substr(9, 3));
    const size_t split = all.find("\r\n\r\n");
    if (split != std::string::npos) r.body = all.substr(split + 4);
  }
  ::close(fd);
  return r;
}

std::string Tokens(uint32_t first, uint32_t n) {
  std::string s = "[";
  for (uint32_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(first + i);
  return s + "]";
}

// The hostile kinds, each from its own client address.
enum class Hostile {
  kUnauthenticatedDrip,  // POST with a 1 MB Content-Length and no token, then a byte at a time
  kHalfRequestLine,      // "POST /v1/adm", then a byte at a time, reconnecting
  kAuthorizedSlowBody,   // the token, a 100 kB Content-Length, a byte at a time
  kIdleFlood,            // 16 connections that send nothing
  kTwoLengths,           // two Content-Length headers, then a body that smuggles a request
};

void RunHostile(Hostile kind, int port, int host, const std::atomic<bool>& stop, std::atomic<uint64_t>* attempts) {
  const std::string head_unauth = "POST /v1/admit HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n";
  const std::string head_auth = std::string("POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ") + kToken +
                                "\r\nContent-Length: 100000\r\n\r\n{\"tokens\":[";
  const std::string two = std::string("POST /v1/free HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ") + kToken +
                          "\r\nContent-Length: 15\r\nContent-Length: 60\r\n\r\n{\"request\":0}\r\n"
                          "POST /v1/reset HTTP/1.1\r\n\r\n";
  while (!stop.load()) {
    attempts->fetch_add(1);
    if (kind == Hostile::kIdleFlood) {
      std::vector<int> fds;
      for (int i = 0; i < 16; ++i) fds.push_back(Connect(port, host, 200));
      for (int i = 0; i < 10 && !stop.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
      continue;
    }
    const int fd = Connect(port, host, 200);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    bool alive = true;
    if (kind == Hostile::kUnauthenticatedDrip) alive = SendAll(fd, head_unauth);
    if (kind == Hostile::kHalfRequestLine) alive = SendAll(fd, "POST /v1/adm");
    if (kind == Hostile::kAuthorizedSlowBody) alive = SendAll(fd, head_auth);
    if (kind == Hostile::kTwoLengths) alive = SendAll(fd, two);
    char buf[4096];
    while (alive && !stop.load()) {
      // Drain whatever the server says (a 401, a 400), then drip one more byte.
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) break;  // closed by the server
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      alive = SendAll(fd, kind == Hostile::kAuthorizedSlowBody ? "1" : "a");
    }
    ::close(fd);
  }
}

TEST(ServeLoad, WellBehavedClientsAreServedBesideSlowAndHostileOnes) {
  testing::TempDir dir;
  const std::string token_file = dir.path() + "/token";
  std::ofstream(token_file) << kToken;
  ASSERT_EQ(::chmod(token_file.c_str(), 0600), 0);
  ServeConfig c;
  c.model = "tiny-mla";
  c.capacity_blocks = 256;
  c.max_requests = 64;
  c.events_enabled = false;
  c.http_listen = "127.0.0.1:0";
  c.http_token_file = token_file;
  c.http_header_timeout_ms = 1000;  // short, to keep the test short: the bounds are what is tested
  c.http_body_timeout_ms = 2000;
  c.http_max_connections_per_client = 4;
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Result<ServeCore::HttpHandle> http = ServeCore::StartHttp(made->get());
  ASSERT_TRUE(http.ok()) << http.status().ToString();
  const int port = ServeCore::HttpPort(**http);

  // What each good client must read back: its prompt's block 0 from a reference server.
  constexpr int kGood = 4;
  constexpr int kRounds = 4;
  Result<std::unique_ptr<ServeCore>> reference = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(reference.ok());
  const uint32_t bt = static_cast<uint32_t>((*reference)->manager().block_tokens());
  std::vector<std::string> expected(kGood);
  for (int g = 0; g < kGood; ++g) {
    std::pair<int, std::string> a = (*reference)
                                        ->Handle("/v1/admit", "{\"tokens\":" + Tokens(1000 * (g + 1), bt + 2) +
                                                                  ",\"tenant\":" + std::to_string(g + 1) + "}");
    ASSERT_EQ(a.first, 200) << a.second;
    const std::string id = nlohmann::json::parse(a.second)["request"].dump();
    bool binary = false;
    std::pair<int, std::string> r =
        (*reference)->HandleGet("/v1/requests/" + id + "/blocks/0?tenant=" + std::to_string(g + 1), &binary);
    ASSERT_EQ(r.first, 200) << r.second;
    expected[g] = r.second;
  }

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> attempts{0};
  std::vector<std::thread> hostile;
  const Hostile kinds[] = {Hostile::kUnauthenticatedDrip, Hostile::kHalfRequestLine, Hostile::kAuthorizedSlowBody,
                           Hostile::kIdleFlood, Hostile::kTwoLengths};
  int host = 2;
  for (Hostile k : kinds) {
    for (int i = 0; i < 3; ++i) hostile.emplace_back(RunHostile, k, port, host++, std::cref(stop), &attempts);
    // and two clients of the same kind sharing an address (over its connection limit)
    hostile.emplace_back(RunHostile, k, port, host, std::cref(stop), &attempts);
    hostile.emplace_back(RunHostile, k, port, host++, std::cref(stop), &attempts);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the hostile ones are in

  std::vector<std::string> failures(kGood);
  std::vector<int64_t> worst_ms(kGood, 0);
  std::vector<std::thread> good;
  for (int g = 0; g < kGood; ++g) {
    good.emplace_back([&, g] {
      const std::string tenant = std::to_string(g + 1);
      auto timed = [&](const std::string& method, const std::string& path, const std::string& body) {
        const Clock::time_point t0 = Clock::now();
        Reply r = Call(port, method, path, body);
        worst_ms[g] = std::max<int64_t>(
            worst_ms[g], std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
        return r;
      };
      for (int round = 0; round < kRounds && failures[g].empty(); ++round) {
        Reply h = timed("GET", "/health", "");
        if (h.status != 200) failures[g] = "health " + std::to_string(h.status);
        Reply a =
            timed("POST", "/v1/admit", "{\"tokens\":" + Tokens(1000 * (g + 1), bt + 2) + ",\"tenant\":" + tenant + "}");
        if (a.status != 200) {
          failures[g] = "admit " + std::to_string(a.status) + " " + a.body;
          break;
        }
        const std::string id = nlohmann::json::parse(a.body)["request"].dump();
        Reply b = timed("GET", "/v1/requests/" + id + "/blocks/0?tenant=" + tenant, "");
        if (b.status != 200 || b.body != expected[g]) {
          failures[g] = "read " + std::to_string(b.status) + ": not this client's bytes";
          break;
        }
        Reply s = timed("POST", "/v1/step",
                        "{\"requests\":[" + id + "],\"counts\":[1],\"tokens\":[7],\"tenant\":" + tenant + "}");
        if (s.status != 200 ||
            nlohmann::json::parse(s.body, nullptr, false).value("codes", nlohmann::json())[0] != "ok") {
          failures[g] = "step " + std::to_string(s.status) + " " + s.body;
          break;
        }
        Reply f = timed("POST", "/v1/free", "{\"request\":" + id + ",\"tenant\":" + tenant + "}");
        if (f.status != 200) failures[g] = "free " + std::to_string(f.status) + " " + f.body;
      }
    });
  }
  for (std::thread& t : good) t.join();
  stop.store(true);
  for (std::thread& t : hostile) t.join();

  for (int g = 0; g < kGood; ++g) {
    std::printf("good client %d: worst call %lld ms\n", g, static_cast<long long>(worst_ms[g]));
    EXPECT_EQ(failures[g], "") << "good client " << g;
    // Generous: a hostile connection holds a worker at most header + body timeouts (3 s), and
    // there are workers to spare; a good call waits for none of them.
    EXPECT_LT(worst_ms[g], 15000) << "good client " << g;
  }
  EXPECT_GT(attempts.load(), 20u);
  // Nothing hostile got in: no request was admitted but the good clients' (and none is live).
  EXPECT_EQ((*made)->manager().metrics().requests_admitted.load(), uint64_t{kGood} * kRounds);
  EXPECT_EQ((*made)->manager().live_requests(), 0u);
}

}  // namespace
}  // namespace tessera
