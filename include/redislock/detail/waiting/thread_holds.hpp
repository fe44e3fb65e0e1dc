// detail::thread_hold_mark: counts, per thread, the holds a thread has under its own owner id
// through reentrant and read-write lock objects (of any client, on any name). A thread that holds
// none cannot re-enter the lock it waits for, so it waits in its process's local gate at once
// (see waiting/acquire_in_line.hpp); one that holds some first tries alone, since its own release
// may be what the threads in the gate wait for.
//
// A hold is counted on the thread that starts it (the owner: an acquisition runs on its
// caller's thread) and uncounted when that thread ends it. A hold ended from another thread (an
// object destroyed elsewhere, a loss found by a background release) stays counted on its
// thread, which then only makes that thread's waits try alone first; the count never falls
// below the holds the thread has. Holds of an explicit lock_options::owner are not counted:
// other threads and processes may share that owner, so its waits always try alone first.
#pragma once

#include <cstddef>
#include <cstdint>

#include <redislock/detail/kinds/owner_id.hpp>

namespace redislock::detail {

/// The calling thread's counted holds.
inline std::size_t& thread_hold_count() noexcept {
    thread_local std::size_t count = 0;
    return count;
}

/// True when the calling thread may hold some reentrant or read-write lock under its own owner.
inline bool thread_may_hold_any() noexcept {
    return thread_hold_count() > 0;
}

/// Kept in each hold: the thread whose count includes it, if any, by its detail::thread_number()
/// (0: none), which no other thread of the process gets, even after that thread ended or in a
/// forked child (std::thread::id values are reused).
struct thread_hold_mark {
    std::uint64_t counted_on = 0;

    /// Counts the hold on the calling thread, unless it already is.
    void count() noexcept {
        const std::uint64_t me = thread_number();
        if (counted_on != me) {
            ++thread_hold_count();
            counted_on = me;
        }
    }

    /// Uncounts the hold when the calling thread counted it; else leaves it counted.
    void uncount() noexcept {
        if (counted_on == thread_number()) {
            --thread_hold_count();
            counted_on = 0;
        }
    }
};

}  // namespace redislock::detail
