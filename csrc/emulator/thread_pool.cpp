// parallel_for over a persistent pool: num_threads() - 1 workers plus the calling thread; between
// jobs an idle worker reads a prefetch request into the caches (prefetch_in_background).
// The pool is created on first use and deliberately never destroyed, so process exit cannot wait
// on a worker (the OS reclaims the threads); a forked child starts a fresh pool.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

#include "emulator/kernels.h"

namespace orion::emu::kernels {
namespace {

// Set on pool workers for their lifetime and on a caller while its job runs: nested
// parallel_for calls then run inline instead of waiting on the pool they occupy.
thread_local bool t_in_parallel_region = false;

// Workers and a waiting caller spin this long before sleeping: back-to-back kernel calls (a decode
// step runs hundreds) and the Python between a step's programs then start without a futex wake-up.
// A trade-off: GPT-2 124M decode p50 on a quiet 2-core machine, 200 us: 12.3-13.4 ms, 20 us: 13.1-13.8;
// but on a loaded one the spins burn a core the caller's thread (or a server's event loop) wants:
// an 8-lane decode step at load 6-9, 200 us: 40 ms of CPU, 20 us: 33 ms.
constexpr auto kSpinTime = std::chrono::microseconds(200);
// A prefetching worker looks for a job (or a newer request) after each step of this many bytes:
// a job waits at most about a microsecond for it.
constexpr size_t kPrefetchStep = size_t{16} << 10;
constexpr size_t kCacheLine = 64;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
}

template <typename Predicate>
bool spin_until(Predicate done) {
    const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (done()) return true;
            cpu_relax();
        }
        if (std::chrono::steady_clock::now() > deadline) return done();
    }
}

class ThreadPool {
public:
    explicit ThreadPool(int threads) {
        for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    }

    // Runs chunk_fn(i) for i in [0, chunks) on the workers and the caller; rethrows the first
    // exception. Returns false without running anything if another caller holds the pool.
    bool try_run(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
        std::unique_lock<std::mutex> submit(submit_mutex_, std::try_to_lock);
        if (!submit.owns_lock()) return false;
        Job job;
        job.chunk_fn = &chunk_fn;
        job.chunks = chunks;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            job_ = &job;
            generation_.fetch_add(1, std::memory_order_release);
        }
        wake_cv_.notify_all();
        t_in_parallel_region = true;
        work_on(job);
        t_in_parallel_region = false;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            job_ = nullptr;  // late workers skip this job; the ones inside are counted in `entered`
        }
        auto all_left = [&job] { return job.entered.load(std::memory_order_acquire) == 0; };
        if (!spin_until(all_left)) {
            std::unique_lock<std::mutex> lock(mutex_);
            done_cv_.wait(lock, all_left);
        }
        if (job.error) std::rethrow_exception(job.error);
        return true;
    }

private:
    struct Job {
        const std::function<void(int64_t)>* chunk_fn = nullptr;
        int64_t chunks = 0;
        std::atomic<int64_t> next{0};
        std::atomic<int> entered{0};  // workers currently inside work_on(job)
        std::mutex error_mutex;
        std::exception_ptr error;
    };

    static void work_on(Job& job) {
        for (;;) {
            const int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
            if (i >= job.chunks) return;
            try {
                (*job.chunk_fn)(i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(job.error_mutex);
                if (!job.error) job.error = std::current_exception();
                job.next.store(job.chunks, std::memory_order_relaxed);  // skip the remaining chunks
            }
        }
    }

    void worker_loop() {
        t_in_parallel_region = true;
        uint64_t seen = 0;
        for (;;) {
            auto has_new_job = [&] { return generation_.load(std::memory_order_acquire) != seen; };
            auto has_work = [&] { return has_new_job() || prefetch_posted_.load(std::memory_order_acquire); };
            if (!spin_until(has_work)) {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_cv_.wait(lock, has_work);
            }
            if (!has_new_job()) {
                prefetch(has_new_job);
                continue;
            }
            Job* job;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                seen = generation_.load(std::memory_order_relaxed);
                job = job_;
                if (!job) continue;
                job->entered.fetch_add(1, std::memory_order_relaxed);
            }
            work_on(*job);
            if (job->entered.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                std::lock_guard<std::mutex> lock(mutex_);  // `job` may be gone now: touch only the pool
                done_cv_.notify_all();
            }
        }
    }

    // Reads the posted request's ranges a step at a time until they are done or a newer request
    // replaces it (the rest of this one is then dropped: it is only a hint). A job interrupts it: the
    // worker runs the job, then goes on where it was unless a newer request came meanwhile. Where a
    // request repeats the range this worker was reading (the chain ahead of the next weight repeats
    // most of the chain ahead of the last), it starts there: the ranges before it were read already.
    template <typename Predicate>
    void prefetch(Predicate has_new_job) {
        thread_local const char* reading = nullptr;  // this worker's place: a range and the bytes read of it
        thread_local size_t read = 0;
        std::shared_ptr<const PrefetchRanges> request;
        {
            std::lock_guard<std::mutex> lock(prefetch_mutex_);
            request = std::move(prefetch_);
            prefetch_posted_.store(false, std::memory_order_relaxed);
        }
        if (!request) return;  // another worker took it
        const auto& ranges = request->ranges;
        size_t first = 0, offset = 0;
        for (size_t i = 0; i < ranges.size(); ++i)
            if (ranges[i].first == reading) {
                first = i, offset = read;
                break;
            }
        for (size_t i = first; i < ranges.size(); ++i, offset = 0) {
            const auto [data, bytes] = ranges[i];
            const std::shared_ptr<const void> owner = request->owners[i].lock();  // its memory stays while read
            if (!owner) continue;
            reading = data;
            for (read = offset; read < bytes; read += kPrefetchStep) {
                if (prefetch_posted_.load(std::memory_order_relaxed)) return;
                if (has_new_job()) {
                    std::lock_guard<std::mutex> lock(prefetch_mutex_);
                    if (!prefetch_) {  // resumed after the job, from `reading`
                        prefetch_ = std::move(request);
                        prefetch_posted_.store(true, std::memory_order_relaxed);
                    }
                    return;
                }
                const size_t end = std::min(bytes, read + kPrefetchStep);
                for (size_t line = read; line < end; line += kCacheLine) __builtin_prefetch(data + line);
            }
        }
    }

public:
    void post(std::shared_ptr<const PrefetchRanges> request) {
        std::shared_ptr<const PrefetchRanges> replaced;  // released outside the locks
        {
            std::lock_guard<std::mutex> lock(prefetch_mutex_);
            replaced = std::exchange(prefetch_, std::move(request));
            prefetch_posted_.store(true, std::memory_order_release);
        }
        { std::lock_guard<std::mutex> lock(mutex_); }  // a worker between its check and its wait sees the flag
        wake_cv_.notify_one();
    }

private:
    std::mutex submit_mutex_;  // one job at a time
    std::mutex mutex_;         // guards job_ and the condition variables' predicates
    std::condition_variable wake_cv_;
    std::condition_variable done_cv_;
    Job* job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::mutex prefetch_mutex_;  // guards prefetch_
    std::shared_ptr<const PrefetchRanges> prefetch_;
    std::atomic<bool> prefetch_posted_{false};
    std::vector<std::thread> workers_;
};

std::mutex g_pool_mutex;
ThreadPool* g_pool = nullptr;

ThreadPool& pool() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!g_pool) {
#if defined(__unix__) || defined(__APPLE__)
        static const bool fork_handlers = [] {
            pthread_atfork([] { g_pool_mutex.lock(); }, [] { g_pool_mutex.unlock(); },
                           [] {
                               g_pool = nullptr;  // the parent's workers do not exist in the child
                               g_pool_mutex.unlock();
                           });
            return true;
        }();
        (void)fork_handlers;
#endif
        g_pool = new ThreadPool(num_threads());
    }
    return *g_pool;
}

int threads_from_environment() {
    if (const char* env = std::getenv("ORION_NUM_THREADS")) {
        char* end = nullptr;
        const long n = std::strtol(env, &end, 10);
        if (end != env && *end == '\0' && n > 0) return static_cast<int>(std::min(n, 256L));
    }
    return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

int num_threads() {
    static const int threads = threads_from_environment();
    return threads;
}

void prefetch_in_background(std::shared_ptr<const PrefetchRanges> request) {
    if (num_threads() == 1 || !request || request->ranges.empty()) return;
    pool().post(std::move(request));
}

namespace {

// Runs fn(0, n) on this thread and returns true when [0, n) is too small for chunks of at least `grain` on the
// pool, or when this thread is in the pool's job already.
bool ran_inline(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return true;
    if (num_threads() == 1 || n < 2 * grain || t_in_parallel_region) {
        fn(0, n);
        return true;
    }
    return false;
}

// chunk_fn(i) for i in [0, chunks), on the pool's threads as each takes the next.
void run_chunks(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
    if (!pool().try_run(chunks, chunk_fn)) {
        // The pool is busy with another caller's job: do this one on the calling thread.
        for (int64_t i = 0; i < chunks; ++i) chunk_fn(i);
    }
}

}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    grain = std::max<int64_t>(grain, 1);
    if (ran_inline(n, grain, fn)) return;
    // A few chunks per thread balance the load when a neighbour steals a core; each is >= grain.
    const int64_t chunks = std::min<int64_t>(n / grain, int64_t{4} * num_threads());
    const int64_t base = n / chunks, extra = n % chunks;
    run_chunks(chunks, [&](int64_t i) {
        const int64_t begin = i * base + std::min(i, extra);
        fn(begin, begin + base + (i < extra ? 1 : 0));
    });
}

void parallel_for_guided(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    grain = std::max<int64_t>(grain, 1);
    if (ran_inline(n, grain, fn)) return;
    // Each chunk a 1/(2 * threads) share of what is left, at least grain (the last takes a shorter rest): long ones
    // first, short ones last.
    constexpr int64_t kMaxChunks = 64;
    const int64_t share = 2 * num_threads();
    int64_t ends[kMaxChunks];
    int64_t chunks = 0;
    for (int64_t done = 0; done < n; ++chunks) {
        const int64_t left = n - done, size = std::max(grain, (left + share - 1) / share);
        done += left - size < grain || chunks == kMaxChunks - 1 ? left : size;
        ends[chunks] = done;
    }
    run_chunks(chunks, [&](int64_t i) { fn(i ? ends[i - 1] : 0, ends[i]); });
}

}  // namespace orion::emu::kernels
