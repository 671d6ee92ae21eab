// HTTP (civetweb): the owner thread, the per-client limit, the handlers, RunServe.
#include "tessera_tools/serve.h"

#include <civetweb.h>
#include <signal.h>
#include <strings.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "serve_internal.h"
#include "tessera/mutex.h"

namespace tessera {

using namespace serve_detail;  // NOLINT(google-build-using-namespace): the files of one server

namespace {

void Reply(mg_connection* conn, int status, const char* type, const std::string& body) {
  const char* reason = status == 200   ? "OK"
                       : status == 400 ? "Bad Request"
                       : status == 401 ? "Unauthorized"
                       : status == 404 ? "Not Found"
                       : status == 405 ? "Method Not Allowed"
                       : status == 408 ? "Request Timeout"
                       : status == 409 ? "Conflict"
                       : status == 411 ? "Length Required"
                       : status == 413 ? "Payload Too Large"
                       : status == 503 ? "Service Unavailable"
                                       : "Internal Server Error";
  mg_printf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status,
            reason, type, body.size());
  mg_write(conn, body.data(), body.size());
}

// Runs the API calls on one thread of its own: the manager has one owner at a time, and
// civetweb's workers have small stacks (the Redis client's buffers live on the caller's stack).
class OwnerThread {
 public:
  OwnerThread() : thread_([this] { Loop(); }) {}
  ~OwnerThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Run(const std::function<void()>& f) {
    std::promise<void> done;
    std::future<void> finished = done.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([&] {
        f();
        done.set_value();
      });
    }
    cv_.notify_one();
    finished.wait();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Connections per client address (http.max_connections_per_client), counted from the moment
// their headers are in (civetweb's begin_request) to civetweb's connection_close. Civetweb 1.15
// gives its init_connection callback no address (mg_get_request_info is NULL there), so the
// limit cannot act before the headers: the header phase is bounded by http.header_timeout_ms
// instead (docs/adr/0031-serve-hardening.md).
class ClientLimit {
 public:
  explicit ClientLimit(uint32_t max) : max_(max) {}
  // True when the connection from `address` is admitted (and counted).
  bool Enter(const std::string& address) {
    MutexLock lock(mu_);
    auto it = open_.find(address);
    if (it != open_.end() && it->second >= max_) return false;
    ++open_[address];
    return true;
  }
  void Leave(const std::string& address) {
    MutexLock lock(mu_);
    auto it = open_.find(address);
    if (it != open_.end() && --it->second == 0) open_.erase(it);
  }

 private:
  const uint32_t max_;
  Mutex mu_;
  std::unordered_map<std::string, uint32_t> open_ GUARDED_BY(mu_);
};

struct HttpContext {
  ServeCore* core;
  OwnerThread* owner;
  ClientLimit* limit;
};

void ConnectionClosed(const mg_connection* conn) {
  // The user data of a counted connection: its address (owned).
  auto* address = static_cast<std::string*>(mg_get_user_connection_data(conn));
  if (address == nullptr) return;
  const auto* http = static_cast<const HttpContext*>(mg_get_user_data(mg_get_context(conn)));
  http->limit->Leave(*address);
  delete address;
}

// Before any handler, once the headers are in: a client address over its connection limit, and
// requests whose framing is ambiguous (two Content-Length headers, or one beside
// Transfer-Encoding), are answered here, their body unread (the reply closes the connection).
int BeginRequest(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  const auto* http = static_cast<const HttpContext*>(mg_get_user_data(mg_get_context(conn)));
  if (mg_get_user_connection_data(conn) == nullptr) {
    if (!http->limit->Enter(ri->remote_addr)) {
      Reply(conn, 503, "application/json",
            Error(Status(StatusCode::kOutOfBlocks, "connections",
                         "over http.max_connections_per_client from this client address"))
                .dump());
      return 503;
    }
    mg_set_user_connection_data(conn, new std::string(ri->remote_addr));
  }
  int lengths = 0;
  bool chunked = false;
  for (int i = 0; i < ri->num_headers; ++i) {
    if (ri->http_headers[i].name == nullptr) continue;
    if (::strcasecmp(ri->http_headers[i].name, "Content-Length") == 0) ++lengths;
    if (::strcasecmp(ri->http_headers[i].name, "Transfer-Encoding") == 0) chunked = true;
  }
  if (lengths > 1 || (lengths == 1 && chunked)) {
    Reply(conn, 400, "application/json",
          Error(InvalidArgument("Content-Length", lengths > 1 ? "given twice" : "given beside Transfer-Encoding"))
              .dump());
    return 400;
  }
  return 0;
}

}  // namespace

class ServeHttp {
 public:
  static int Metrics(mg_connection* conn, void* data) {
    ServeCore* core = static_cast<HttpContext*>(data)->core;
    if (std::strcmp(mg_get_request_info(conn)->request_method, "GET") != 0) {
      Reply(conn, 405, "text/plain", "GET only\n");
      return 405;
    }
    Reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", core->MetricsText());
    return 200;
  }
  static int Health(mg_connection* conn, void*) {
    Reply(conn, 200, "text/plain", "ok\n");
    return 200;
  }
  static int Api(mg_connection* conn, void* data) {
    const int status = ApiCall(conn, static_cast<HttpContext*>(data));
    if (status != 200) static_cast<HttpContext*>(data)->core->http_errors_.fetch_add(1, std::memory_order_relaxed);
    return status;
  }
  static int ApiCall(mg_connection* conn, HttpContext* http) {
    ServeCore* core = http->core;
    const mg_request_info* ri = mg_get_request_info(conn);
    if (!core->Authorized(mg_get_header(conn, "Authorization"))) {
      const std::string body =
          Error(InvalidArgument("authorization", "a bearer token is required (http.token_file)")).dump();
      mg_printf(conn,
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Type: application/json\r\n"
                "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                body.size());
      mg_write(conn, body.data(), body.size());
      return 401;
    }
    const std::string_view uri = ri->local_uri;
    if (std::strcmp(ri->request_method, "GET") == 0 && (uri == "/v1/layout" || uri.starts_with("/v1/requests/"))) {
      std::string path(uri);
      if (ri->query_string != nullptr) path += "?" + std::string(ri->query_string);
      std::pair<int, std::string> r;
      bool binary = false;
      http->owner->Run([&] { r = core->HandleGet(path, &binary); });
      Reply(conn, r.first, binary ? "application/octet-stream" : "application/json", r.second);
      return r.first;
    }
    if (std::strcmp(ri->request_method, "POST") != 0) {
      Reply(conn, 405, "application/json", Error(InvalidArgument("method", "POST only")).dump());
      return 405;
    }
    if (ri->content_length < 0) {
      Reply(conn, 411, "application/json", Error(InvalidArgument("body", "Content-Length required")).dump());
      return 411;
    }
    if (static_cast<uint64_t>(ri->content_length) > core->config_.http_max_body_bytes) {
      Reply(conn, 413, "application/json",
            Error(OutOfRange("body", "larger than http.max_body_bytes (" +
                                         std::to_string(core->config_.http_max_body_bytes) + ")"))
                .dump());
      return 413;
    }
    // The body is read only now, after the token and the length were checked, and within
    // http.body_timeout_ms in all (each read waits at most http.header_timeout_ms).
    std::string body(static_cast<size_t>(ri->content_length), '\0');
    size_t got = 0;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(core->config_.http_body_timeout_ms);
    while (got < body.size()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        Reply(conn, 408, "application/json",
              Error(InvalidArgument("body", "not received within http.body_timeout_ms")).dump());
        return 408;
      }
      const int n = mg_read(conn, body.data() + got, body.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != body.size()) {
      Reply(conn, 400, "application/json", Error(InvalidArgument("body", "shorter than its Content-Length")).dump());
      return 400;
    }
    const std::string path = ri->local_uri;
    std::pair<int, std::string> r;
    http->owner->Run([&] { r = core->Handle(path, body); });
    Reply(conn, r.first, "application/json", r.second);
    return r.first;
  }
};

class ServeCore::Http {
 public:
  ~Http() {
    if (ctx != nullptr) mg_stop(ctx);  // no request runs past this point
    mg_exit_library();
  }
  OwnerThread owner;
  std::unique_ptr<ClientLimit> limit;
  HttpContext context{nullptr, nullptr, nullptr};
  mg_context* ctx = nullptr;
  int port = 0;
};

void ServeCore::HttpStop::operator()(Http* http) const { delete http; }

Result<ServeCore::HttpHandle> ServeCore::StartHttp(ServeCore* core) {
  HttpHandle http(new Http());
  http->limit = std::make_unique<ClientLimit>(core->config_.http_max_connections_per_client);
  http->context = HttpContext{core, &http->owner, http->limit.get()};
  mg_init_library(0);
  const std::string threads = std::to_string(core->config_.http_threads);
  const std::string read_timeout = std::to_string(core->config_.http_header_timeout_ms);
  const std::string& listen = core->config_.http_listen;
  // request_timeout_ms bounds the request line and headers in all (civetweb's read_message
  // counts from the connection's start) and each later read; keep-alive stays off (each reply
  // closes), so a connection holds its worker for one request.
  const char* options[] = {
      "listening_ports",    listen.c_str(),      "num_threads", threads.c_str(), "request_timeout_ms",
      read_timeout.c_str(), "enable_keep_alive", "no",          nullptr};
  mg_callbacks callbacks{};
  callbacks.begin_request = &BeginRequest;
  callbacks.connection_close = &ConnectionClosed;  // the user data is still set (not in connection_closed)
  http->ctx = mg_start(&callbacks, &http->context, options);
  if (http->ctx == nullptr) return InvalidArgument("http.listen", "cannot listen on " + listen);
  mg_set_request_handler(http->ctx, "/metrics$", &ServeHttp::Metrics, &http->context);
  mg_set_request_handler(http->ctx, "/health$", &ServeHttp::Health, &http->context);
  mg_set_request_handler(http->ctx, "/v1/", &ServeHttp::Api, &http->context);
  mg_server_port ports[1];
  if (mg_get_server_ports(http->ctx, 1, ports) > 0) http->port = ports[0].port;
  return http;
}

int ServeCore::HttpPort(const Http& http) { return http.port; }

int RunServe(const ServeConfig& config) {
  // SIGTERM and SIGINT are taken by sigwait below: blocked before any thread starts, so every
  // thread (civetweb's, ZeroMQ's, the store's) inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> core = ServeCore::Create(config, &warnings);
  for (const std::string& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (!core.ok()) {
    std::fprintf(stderr, "tessera: error: %s\n", core.status().ToString().c_str());
    // As the CLI's other commands: a bad configuration, or a tier that is not there, is input.
    return core.status().code() == StatusCode::kInternal ? 1 : 2;
  }
  ServeCore* c = core->get();
  Result<ServeCore::HttpHandle> http = ServeCore::StartHttp(c);
  if (!http.ok()) {
    std::fprintf(stderr, "tessera: error: %s\n", http.status().ToString().c_str());
    return 2;
  }
  const std::string& listen = config.http_listen;
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? "0.0.0.0" : listen.substr(0, colon);
  std::printf("tessera serve: ready http=%s:%d events=%s\n", host.c_str(), ServeCore::HttpPort(**http),
              c->events_endpoint().empty() ? "off" : c->events_endpoint().c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "tessera serve: %s: checkpointing\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  http->reset();  // stops serving: no request runs past this point
  Status st = c->Shutdown();
  if (!st.ok()) {
    std::fprintf(stderr, "tessera: error: checkpoint: %s\n", st.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "tessera serve: stopped\n");
  return 0;
}

}  // namespace tessera
