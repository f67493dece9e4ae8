// A mutex, its scoped lock and a condition variable that clang's thread-safety analysis understands
// (thread_annotations.h): std::mutex and std::condition_variable with the annotations, nothing
// more. Fields a Mutex guards are declared KOLO_GUARDED_BY(mu); the analysis then checks, in a
// clang build with -Wthread-safety, that every access holds it.
//
//   kolo::Mutex mu;
//   int count KOLO_GUARDED_BY(mu) = 0;
//   kolo::CondVar cv;
//   ...
//   kolo::MutexLock lock(mu);
//   if (!cv.WaitFor(mu, timeout, [&]() KOLO_REQUIRES(mu) { return count > 0; })) ...
//
// A predicate runs with the mutex held, but the analysis checks a lambda's body on its own: a
// predicate that reads guarded fields says KOLO_REQUIRES(mu), as above.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "engine/common/thread_annotations.h"

namespace kolo {

// std::mutex as a capability. Prefer MutexLock to calling lock() and unlock().
class KOLO_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() KOLO_ACQUIRE() { mu_.lock(); }
  void unlock() KOLO_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction (std::lock_guard).
class KOLO_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) KOLO_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() KOLO_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// std::condition_variable over a Mutex. Every wait takes the mutex the caller holds (through a
// MutexLock, or lock()), releases it while blocked and holds it again when it returns, as the
// std::condition_variable call of the same name does with a std::unique_lock; the analysis checks
// that the caller holds it.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

  // Waits until notified, or `timeout` has passed (std::cv_status::timeout), or spuriously.
  template <class Rep, class Period>
  std::cv_status WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout)
      KOLO_REQUIRES(mu) {
    Adopted held(mu);
    return cv_.wait_for(held.lock, timeout);
  }
  // Waits until pred() is true (checked first, and after each wake-up, with `mu` held) or
  // `timeout` has passed; returns pred() as it was last checked.
  template <class Rep, class Period, class Predicate>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout, Predicate pred)
      KOLO_REQUIRES(mu) {
    Adopted held(mu);
    return cv_.wait_for(held.lock, timeout, std::move(pred));
  }
  // Waits until notified, or `deadline` has passed (std::cv_status::timeout), or spuriously.
  template <class Clock, class Duration>
  std::cv_status WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline)
      KOLO_REQUIRES(mu) {
    Adopted held(mu);
    return cv_.wait_until(held.lock, deadline);
  }

 private:
  // The caller's hold on `mu` as the std::unique_lock that std::condition_variable waits with: it
  // adopts the held mutex and, when the wait is over (returned or thrown, either way with the
  // mutex held again), lets go of it without unlocking, so the caller's lock still releases it.
  struct Adopted {
    explicit Adopted(Mutex& mu) : lock(mu.mu_, std::adopt_lock) {}
    ~Adopted() { lock.release(); }
    Adopted(const Adopted&) = delete;
    Adopted& operator=(const Adopted&) = delete;
    std::unique_lock<std::mutex> lock;
  };

  std::condition_variable cv_;
};

}  // namespace kolo
