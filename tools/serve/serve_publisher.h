// The KV-event publisher of `tessera serve` (private to tools/serve): ZeroMQ PUB on a thread of
// its own, fed by a hand-off from the core's calls (below).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "tessera/kv_events.h"
#include "tessera/mutex.h"
#include "tessera/request_manager.h"
#include "tessera_tools/serve.h"

namespace tessera {

// Publishes KV events from a thread of its own. A call on the core pays for recording its events
// in the manager's log (kv_events.h) and, once per interval, for a hand-off: no encoding, no
// I/O, no system call, and no wait for the publisher.
//
// Every events.interval_ms (default 5) the thread sends what was handed off and asks for the
// next log (want_). The first call on the core after that swaps the manager's log into the
// hand-off slot (an uncontended mutex and an O(1) swap) under the core's mutex, so the thread
// never takes the core's mutex while calls arrive: a call's unlock never has a waiter to wake.
// (The first version took the core's mutex every interval; on this VM the wake-up that a step's
// unlock then owed the waiting thread cost the host-pool decode step 8 µs, ~8%.) When no call
// took the log during a whole interval (the server is idle, or one call is long), the thread
// drains the manager itself under the core's mutex. Idle for about 100 ms, it sleeps until a
// call wakes it; the race between "about to sleep" and a call that saw it awake is closed by a
// last drain after announcing the sleep (the core's mutex orders that drain after any such
// call). A subscriber sees an event within about two intervals of the call that made it, in one
// message per interval however many steps ran in it (vLLM sends one per step, whose model run
// takes milliseconds; the batch is the same shape, longer).
class EventPublisher {
 public:
  // `core_mu` guards `manager` (the core's mutex); the thread takes it only to drain an idle
  // core and at Stop.
  static Result<std::unique_ptr<EventPublisher>> Create(const ServeConfig& c, Mutex* core_mu, RequestManager* manager) {
    auto p = std::unique_ptr<EventPublisher>(new EventPublisher());
    p->topic_ = c.events_topic;
    p->rank_ = c.events_data_parallel_rank;
    p->core_mu_ = core_mu;
    p->manager_ = manager;
    p->interval_ = std::chrono::milliseconds(c.events_interval_ms);
    p->idle_polls_ = std::max<int>(1, 100 / static_cast<int>(c.events_interval_ms));
    try {
      p->socket_ = zmq::socket_t(p->context_, zmq::socket_type::pub);
      p->socket_.set(zmq::sockopt::sndhwm, static_cast<int>(c.events_hwm));
      p->socket_.set(zmq::sockopt::linger, 1000);
      p->socket_.bind(c.events_endpoint);
      p->endpoint_ = p->socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("events.endpoint", "cannot bind \"" + c.events_endpoint + "\": " + e.what());
    }
    EventPublisher* raw = p.get();
    p->thread_ = std::thread([raw] { raw->Loop(); });
    return p;
  }
  ~EventPublisher() { Stop(); }

  // At the end of every call on the core, the core's mutex held: two relaxed loads, unless the
  // thread asked for the log (once per interval) or sleeps.
  void AfterCall() {
    if (want_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(hand_mu_);
      if (handoff_.empty()) {
        manager_->TakeKvEventLog(&handoff_);
        want_.store(false, std::memory_order_relaxed);
      }
    }
    if (!sleeping_.load(std::memory_order_seq_cst)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      poked_ = true;
    }
    cv_.notify_one();
  }
  // Drains and sends what is left, then stops the thread. Call without the core's mutex held.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  uint64_t batches() const { return batches_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  EventPublisher() = default;

  // What a call handed off; sends it. False when there was nothing.
  bool SendHandedOff() {
    events_.clear();
    {
      std::lock_guard<std::mutex> lock(hand_mu_);
      std::swap(events_, handoff_);  // the slot gets cleared storage back
    }
    return SendIfAny(events_);
  }
  // Everything not yet sent, oldest first (the hand-off slot, then the manager's log), under the
  // core's mutex; sends it. False when there was nothing.
  bool DrainCore() {
    events_.clear();
    {
      MutexLock core(*core_mu_);
      {
        std::lock_guard<std::mutex> lock(hand_mu_);
        std::swap(events_, handoff_);
      }
      manager_->TakeKvEventLog(&later_);
    }
    const bool a = SendIfAny(events_);
    const bool b = SendIfAny(later_);
    return a || b;
  }
  bool SendIfAny(const KvEventLog& log) {
    if (log.empty()) return false;
    Send(log, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    return true;
  }
  void Loop() {
    int idle = 0;
    while (true) {
      bool stopping = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!stop_) cv_.wait_for(lock, interval_, [this] { return stop_; });
        stopping = stop_;
      }
      bool sent = SendHandedOff();
      // No call took the log during the interval (idle, or one long call), or stopping.
      if (want_.load(std::memory_order_relaxed) || stopping) sent = DrainCore() || sent;
      if (stopping) return;
      want_.store(true, std::memory_order_relaxed);
      idle = sent ? 0 : idle + 1;
      if (idle < idle_polls_) continue;
      // Announce the sleep, look once more, and only then wait to be woken.
      sleeping_.store(true, std::memory_order_seq_cst);
      if (!DrainCore()) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || poked_; });
        poked_ = false;
      }
      sleeping_.store(false, std::memory_order_seq_cst);
      idle = 0;
    }
  }
  void Send(const KvEventLog& log, double ts) {
    payload_.clear();
    EncodeKvEventBatch(log, ts, rank_, &payload_);
    char seq[8];
    for (int i = 0; i < 8; ++i) seq[i] = static_cast<char>(seq_ >> (8 * (7 - i)));
    ++seq_;
    try {
      socket_.send(zmq::buffer(topic_), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      socket_.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      socket_.send(zmq::buffer(payload_), zmq::send_flags::dontwait);
      published_.fetch_add(log.size(), std::memory_order_relaxed);
      batches_.fetch_add(1, std::memory_order_relaxed);
    } catch (const zmq::error_t&) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  zmq::context_t context_{1};
  zmq::socket_t socket_;  // used by the thread only, once started
  std::string topic_;
  std::string endpoint_;
  uint32_t rank_ = 0;
  Mutex* core_mu_ = nullptr;
  RequestManager* manager_ = nullptr;
  std::chrono::milliseconds interval_{5};
  int idle_polls_ = 20;  // idle intervals (about 100 ms) before it sleeps until woken
  // The hand-off slot (hand_mu_): a log a call swapped out of the manager, not yet sent.
  std::mutex hand_mu_;
  KvEventLog handoff_;
  std::atomic<bool> want_{true};  // the thread asks the next call for the manager's log
  // The thread's own: the logs it sends (their storage recycled), the encoding.
  KvEventLog events_, later_;
  std::string payload_;
  uint64_t seq_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool poked_ = false;
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> published_{0}, batches_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace tessera
