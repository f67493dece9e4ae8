// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), so
// that the compiler checks which mutex guards which state: build with clang and -Wthread-safety
// (the CMake preset "thread-safety") to have every access to a KOLO_GUARDED_BY field without its
// mutex, and every call that breaks a KOLO_REQUIRES / KOLO_EXCLUDES contract, reported. Other
// compilers see nothing. kolo::Mutex (mutex.h) is the annotated mutex these refer to.
#pragma once

#if defined(__clang__)
#define KOLO_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KOLO_THREAD_ANNOTATION_(x)
#endif

// A class whose objects are capabilities (mutexes); `x` names the kind in diagnostics.
#define KOLO_CAPABILITY(x) KOLO_THREAD_ANNOTATION_(capability(x))
// An RAII class that holds a capability from its constructor to its destructor.
#define KOLO_SCOPED_CAPABILITY KOLO_THREAD_ANNOTATION_(scoped_lockable)
// A field that may be read or written only with capability `x` held.
#define KOLO_GUARDED_BY(x) KOLO_THREAD_ANNOTATION_(guarded_by(x))
// A pointer field whose pointee may be accessed only with capability `x` held.
#define KOLO_PT_GUARDED_BY(x) KOLO_THREAD_ANNOTATION_(pt_guarded_by(x))
// A function that must be called with the capabilities held (and leaves them held).
#define KOLO_REQUIRES(...) KOLO_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
// A function that must be called without the capabilities held (it takes them itself).
#define KOLO_EXCLUDES(...) KOLO_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
// A function that acquires the capabilities (none named: `this`) and returns holding them.
#define KOLO_ACQUIRE(...) KOLO_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
// A function that releases the capabilities (none named: `this`), which the caller held.
#define KOLO_RELEASE(...) KOLO_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
// A function the analysis does not check. Only where it cannot express a correct pattern; say why.
#define KOLO_NO_THREAD_SAFETY_ANALYSIS KOLO_THREAD_ANNOTATION_(no_thread_safety_analysis)
// A function that returns a reference to capability `x` (an accessor of a mutex).
#define KOLO_RETURN_CAPABILITY(x) KOLO_THREAD_ANNOTATION_(lock_returned(x))
