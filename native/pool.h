// A pool of threads for the native modules (cpu_forward.cpp, lab_csv_module.cpp): run(task, wanted) runs a
// task on several threads at once, the caller's among them, with no Python in between, so that work split
// finer than Python's threads could hand out (a 1 MB piece of text, 8 images) costs microseconds to share.
// No Python API here: callers release the GIL around run().

#ifndef CNNLAB_POOL_H
#define CNNLAB_POOL_H

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace cnnlab {

// Threads that wait for work and run it with the calling thread: run(task, wanted) calls task(worker) once on
// each of min(wanted, threads) threads (worker 0 is the caller) and returns when all have returned. Workers
// are made as a call first wants them, so a small batch (the lab's 4 images) starts no thread it cannot use.
// A process forked from one that made them has none of them: it runs every task on its calling thread alone.
class Pool {
  public:
    explicit Pool(int threads) : threads_(threads), pid_(getpid()) {}

    ~Pool() { stop(); }

    int threads() const { return threads_; }

    // Whether this process made the pool: a forked child's copy has none of its threads (see release()).
    bool made_here() const { return getpid() == pid_; }

    void run(const std::function<void(int)> &task, int wanted)
    {
        if (!made_here()) {  // a forked child: the workers are not here, and a lock may be held forever
            task(0);
            return;
        }
        std::lock_guard<std::mutex> one_call(calls_);
        const int workers = std::min(std::max(wanted, 1), threads_) - 1;
        try {
            while (static_cast<int>(workers_.size()) < workers) {
                const int worker = static_cast<int>(workers_.size()) + 1;
                workers_.emplace_back([this, worker] { wait_for_work(worker); });
            }
        } catch (const std::system_error &) {  // no more threads: the ones made share the work
        }
        const int used = std::min(workers, static_cast<int>(workers_.size()));
        {
            std::lock_guard<std::mutex> lock(mutex_);
            task_ = &task;
            used_ = used;
            running_ = used;
            ++generation_;
        }
        wake_.notify_all();
        task(0);
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [this] { return running_ == 0; });
        task_ = nullptr;
    }

    void stop()
    {
        if (!made_here() || workers_.empty())
            return;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (std::thread &worker : workers_)
            worker.join();
        workers_.clear();
    }

  private:
    void wait_for_work(int worker)
    {
        unsigned long seen = 0;
        for (;;) {
            const std::function<void(int)> *task;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
                if (stopping_)
                    return;
                seen = generation_;
                if (worker > used_)  // not wanted by this call
                    continue;
                task = task_;
            }
            (*task)(worker);
            std::lock_guard<std::mutex> lock(mutex_);
            if (--running_ == 0)
                done_.notify_one();
        }
    }

    const int threads_;
    const pid_t pid_;
    std::vector<std::thread> workers_;
    std::mutex calls_, mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(int)> *task_ = nullptr;
    unsigned long generation_ = 0;
    int used_ = 0, running_ = 0;
    bool stopping_ = false;
};

// Stop `pool`'s threads and delete it; a forked child's copy of its parent's pool is left as it is: destroying its
// threads (never started here) would terminate the process, and its locks may wait forever for the parent's threads.
inline void release(Pool *pool)
{
    if (pool->made_here()) {
        pool->stop();
        delete pool;
    }
}

}  // namespace cnnlab

#endif
