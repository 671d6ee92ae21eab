#include "tessera/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tessera {
namespace {

// A counter several threads increment under a MutexLock; annotated as the library's users are.
class Counter {
 public:
  void Add() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++value_;
  }
  int value() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return value_;
  }

 private:
  Mutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

TEST(Mutex, MutexLockSerializesWriters) {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c] {
      for (int i = 0; i < 10000; ++i) c.Add();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
}

// A one-slot mailbox: Put waits for the slot to empty, Take for it to fill.
class Mailbox {
 public:
  void Put(int v) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (full_) changed_.Wait(mu_);
    value_ = v;
    full_ = true;
    changed_.NotifyAll();
  }
  int Take() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (!full_) changed_.Wait(mu_);
    full_ = false;
    changed_.NotifyAll();
    return value_;
  }

 private:
  Mutex mu_;
  CondVar changed_;
  int value_ GUARDED_BY(mu_) = 0;
  bool full_ GUARDED_BY(mu_) = false;
};

TEST(Mutex, CondVarWaitReleasesAndRetakesTheMutex) {
  Mailbox box;
  std::thread producer([&box] {
    for (int i = 1; i <= 1000; ++i) box.Put(i);
  });
  long sum = 0;
  for (int i = 1; i <= 1000; ++i) sum += box.Take();
  producer.join();
  EXPECT_EQ(sum, 1000L * 1001 / 2);
}

// While one thread holds the mutex another cannot take it: the other thread is started and
// reaches Lock while the mutex is held, and whatever it saw inside must be what the holder left
// there at Unlock. If the mutex did not exclude, the other thread would enter as soon as it ran
// and see the holder mid-way (the holder yields 10,000 times between writes): a broken mutex
// fails this almost surely, not certainly (a no-op Lock/Unlock did). A MutexLock releases at
// scope end: otherwise the second Lock would never return (ctest's timeout).
TEST(Mutex, LockExcludesOtherThreadsUntilUnlock) {
  Mutex mu;
  std::atomic<bool> started{false};
  std::atomic<int> progress{0};
  int seen_inside = -1;
  mu.Lock();
  std::thread other([&] {
    started = true;
    MutexLock lock(mu);
    seen_inside = progress.load();
  });
  while (!started.load()) std::this_thread::yield();
  for (int i = 1; i <= 10000; ++i) {
    progress = i;
    std::this_thread::yield();
  }
  mu.Unlock();
  other.join();
  EXPECT_EQ(seen_inside, 10000);
  { MutexLock lock(mu); }
  mu.Lock();  // released by the MutexLock above
  mu.Unlock();
}

}  // namespace
}  // namespace tessera
