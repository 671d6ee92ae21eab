// The one way the C++ tests and benchmarks start a real redis-server (tests/test_support.h's
// RedisServer and bench/tier_bench.cc use it; Python's is python/tests/redis_support.py). No
// GoogleTest here, so that the benchmarks can use it too.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera::testing {

enum class RedisLaunch { kUp, kExited, kTimeout };

// Forks redis-server on 127.0.0.1:`port` with no persistence (no RDB, no AOF), its --dir `dir`,
// log level warning and `extra` arguments, and waits up to 5 s until the server on that port
// reports this child's process id (INFO server), so that another process's server on a port
// taken first is never mistaken for ours. *pid: the child (running when kUp or kTimeout; -1 when
// it exited: bad arguments, the port taken). The child dies with its parent. A build without
// Redis (no hiredis) cannot check and answers kExited.
RedisLaunch LaunchRedisServer(int port, const std::string& dir, const std::vector<std::string>& extra, pid_t* pid);

// SIGKILL and reap *pid when it is running; *pid becomes -1.
void StopRedisServer(pid_t* pid);

// A TCP port on 127.0.0.1 that was free when asked (nothing reserves it); 0 when none could be had.
int FreeLoopbackPort();

}  // namespace tessera::testing
