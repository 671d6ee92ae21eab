// Clang thread-safety annotations (-Wthread-safety): the compiler checks that every guarded
// member is touched only with its mutex held, that a function's lock requirements hold at each
// call, and (with -Wthread-safety-beta) that mutexes are taken in their declared order.
// Under other compilers every macro expands to nothing.
//
//   CAPABILITY(name)       a class that is a lock (Mutex)
//   SCOPED_CAPABILITY      an RAII class that holds a lock for its lifetime (MutexLock)
//   GUARDED_BY(mu)         a member read or written only with `mu` held
//   PT_GUARDED_BY(mu)      the object a (smart) pointer member points to, only with `mu` held
//   REQUIRES(mu...)        the caller holds `mu`
//   EXCLUDES(mu...)        the caller does not hold `mu` (the function takes it)
//   ACQUIRE(mu...)         the function takes `mu` and returns holding it
//   RELEASE(mu...)         the function releases `mu`
//   ACQUIRED_AFTER(mu...)  lock order: this mutex is taken only after those named
//   ACQUIRED_BEFORE(mu...) lock order: this mutex is taken only before those named
//   ASSERT_CAPABILITY(mu)  the function checks at run time that `mu` is held
//   NO_THREAD_SAFETY_ANALYSIS  opt a function out (say why beside it)
#pragma once

#if defined(__clang__)
#define TESSERA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TESSERA_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(name) TESSERA_THREAD_ANNOTATION(capability(name))
#define SCOPED_CAPABILITY TESSERA_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(mu) TESSERA_THREAD_ANNOTATION(guarded_by(mu))
#define PT_GUARDED_BY(mu) TESSERA_THREAD_ANNOTATION(pt_guarded_by(mu))
#define REQUIRES(...) TESSERA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) TESSERA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) TESSERA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) TESSERA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define ACQUIRED_AFTER(...) TESSERA_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) TESSERA_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ASSERT_CAPABILITY(mu) TESSERA_THREAD_ANNOTATION(assert_capability(mu))
#define NO_THREAD_SAFETY_ANALYSIS TESSERA_THREAD_ANNOTATION(no_thread_safety_analysis)
