// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with the annotations
// Clang's thread-safety analysis needs (thread_annotations.h), so that what a mutex guards and
// the order mutexes are taken in are checked at compile time.
//
//   class Queue {
//     Mutex mu_;
//     CondVar ready_;
//     std::deque<Job> jobs_ GUARDED_BY(mu_);
//     Job Pop() EXCLUDES(mu_) {
//       MutexLock lock(mu_);
//       while (jobs_.empty()) ready_.Wait(mu_);  // a loop, not a predicate: the analysis sees it
//       ...
//
// Thread-safety: Mutex and CondVar are thread-safe (they are the primitives); a MutexLock
// belongs to the thread that made it.
#pragma once

#include <condition_variable>
#include <mutex>

#include "tessera/thread_annotations.h"

namespace tessera {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases `mu`, sleeps until notified (or woken spuriously: callers wait in a loop that
  // rechecks their condition) and takes `mu` again before returning. REQUIRES: `mu` held.
  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: ownership stays with the caller's MutexLock
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tessera
