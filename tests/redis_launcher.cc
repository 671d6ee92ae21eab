#include "redis_launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string_view>
#include <thread>

#if TESSERA_HAVE_REDIS
#include <hiredis/hiredis.h>
#endif

namespace tessera::testing {

namespace {

#if TESSERA_HAVE_REDIS
// Whether the server on `port` answers INFO with `mine` ("process_id:<pid>\r\n"). Without hiredis
// nothing here can ask (LaunchRedisServer then stops the server it started).
bool AnswersAs(int port, const std::string& mine) {
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeval{0, 200000});
  if (c == nullptr) return false;
  bool up = false;
  if (c->err == 0) {
    redisSetTimeout(c, timeval{1, 0});
    auto* r = static_cast<redisReply*>(redisCommand(c, "INFO server"));
    up = r != nullptr && r->type == REDIS_REPLY_STRING &&
         std::string_view(r->str, r->len).find(mine) != std::string_view::npos;
    if (r != nullptr) freeReplyObject(r);
  }
  redisFree(c);
  return up;
}
#endif

}  // namespace

RedisLaunch LaunchRedisServer(int port, const std::string& dir, const std::vector<std::string>& extra, pid_t* pid) {
  std::vector<std::string> args{
      "redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
      "--dir",        dir,      "--loglevel",         "warning"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  *pid = ::fork();
  if (*pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that dies does not leave servers behind
    ::execvp("redis-server", argv.data());
    ::_exit(127);
  }
  if (*pid < 0) {
    *pid = -1;
    return RedisLaunch::kExited;
  }
#if !TESSERA_HAVE_REDIS
  StopRedisServer(pid);  // nothing here can tell whether it is up
  return RedisLaunch::kExited;
#else
  const std::string mine = "process_id:" + std::to_string(*pid) + "\r\n";
  for (int i = 0; i < 500; ++i) {                     // up to 5 s
    if (::waitpid(*pid, nullptr, WNOHANG) == *pid) {  // exited: bad arguments, port taken
      *pid = -1;
      return RedisLaunch::kExited;
    }
    if (AnswersAs(port, mine)) return RedisLaunch::kUp;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return RedisLaunch::kTimeout;
#endif
}

void StopRedisServer(pid_t* pid) {
  if (*pid <= 0) return;
  ::kill(*pid, SIGKILL);
  ::waitpid(*pid, nullptr, 0);
  *pid = -1;
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

}  // namespace tessera::testing
