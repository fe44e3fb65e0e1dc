// detail::inplace_function<R(), Capacity>: a move-only callable kept inside the object.
//
// std::function allocates for any capture larger than two pointers or not trivially copyable;
// the loss timer gets one callback per acquisition, and that allocation was a measurable part of
// an uncontended lock+unlock. A callable that does not fit is a compile-time error, not a
// fallback to the heap.
//
// Not thread-safe; a plain value like std::function. Moving leaves the source empty.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace redislock::detail {

template <class Signature, std::size_t Capacity>
class inplace_function;

template <class R, std::size_t Capacity>
class inplace_function<R(), Capacity> {
public:
    inplace_function() noexcept = default;

    template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, inplace_function> &&
             std::is_invocable_r_v<R, std::remove_cvref_t<F>&>)
        inplace_function(F&& f) {  // implicit, as std::function
        using target = std::remove_cvref_t<F>;
        static_assert(sizeof(target) <= Capacity, "the callable does not fit: raise Capacity");
        static_assert(alignof(target) <= alignof(std::max_align_t));
        static_assert(std::is_nothrow_move_constructible_v<target>);
        ::new (static_cast<void*>(storage_)) target(std::forward<F>(f));
        ops_ = &ops_for<target>;
    }

    inplace_function(inplace_function&& other) noexcept { take(other); }
    inplace_function& operator=(inplace_function&& other) noexcept {
        if (this != &other) {
            reset();
            take(other);
        }
        return *this;
    }
    inplace_function(const inplace_function&) = delete;
    inplace_function& operator=(const inplace_function&) = delete;
    ~inplace_function() { reset(); }

    explicit operator bool() const noexcept { return ops_ != nullptr; }

    /// Calls the target; the caller checks it is there.
    R operator()() { return ops_->invoke(storage_); }

    /// Destroys the target, releasing what it captured.
    void reset() noexcept {
        if (ops_ != nullptr) {
            ops_->destroy(storage_);
            ops_ = nullptr;
        }
    }

private:
    struct operations {
        R (*invoke)(void*);
        void (*move_to)(void* from, void* to) noexcept;
        void (*destroy)(void*) noexcept;
    };

    template <class T>
    static constexpr operations ops_for{
        [](void* self) -> R { return (*std::launder(static_cast<T*>(self)))(); },
        [](void* from, void* to) noexcept {
            T* source = std::launder(static_cast<T*>(from));
            ::new (to) T(std::move(*source));
            source->~T();
        },
        [](void* self) noexcept { std::launder(static_cast<T*>(self))->~T(); },
    };

    void take(inplace_function& other) noexcept {
        if (other.ops_ != nullptr) {
            other.ops_->move_to(other.storage_, storage_);
            ops_ = std::exchange(other.ops_, nullptr);
        }
    }

    alignas(std::max_align_t) std::byte storage_[Capacity];
    const operations* ops_ = nullptr;
};

}  // namespace redislock::detail
