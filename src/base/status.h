// Status and Result<T>: the project's one error model for operating errors (see STYLE.md §4).
// An OK Status holds no heap memory; an error carries a code, the errno and a message with context.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "src/base/assert.h"

namespace zinf {

enum class StatusCode : std::uint8_t {
    kOk = 0,
    kInvalidArgument,
    kNotSupported,
    kBusy,
    kIo,
    kNoSpace,
    kCorruption,
    kCuda,
    kNccl,
    kInternal,
    kNotFound,
    kTimeout,
};

std::string_view status_code_name(StatusCode code) noexcept;

class [[nodiscard]] Status {
public:
    Status() noexcept = default;
    Status(StatusCode code, std::string message, int errno_value = 0);

    static Status ok() noexcept { return Status(); }
    static Status invalid_argument(std::string message) {
        return {StatusCode::kInvalidArgument, std::move(message)};
    }
    static Status not_supported(std::string message, int errno_value = 0) {
        return {StatusCode::kNotSupported, std::move(message), errno_value};
    }
    static Status busy(std::string message = "busy") {
        return {StatusCode::kBusy, std::move(message)};
    }
    // An I/O error; errno_value is the positive errno (EIO, ...). ENOSPC maps to kNoSpace.
    static Status io_error(std::string message, int errno_value);
    static Status no_space(std::string message, int errno_value = 28) {
        return {StatusCode::kNoSpace, std::move(message), errno_value};
    }
    static Status corruption(std::string message) {
        return {StatusCode::kCorruption, std::move(message)};
    }
    static Status internal(std::string message) {
        return {StatusCode::kInternal, std::move(message)};
    }
    static Status not_found(std::string message, int errno_value = 0) {
        return {StatusCode::kNotFound, std::move(message), errno_value};
    }
    static Status timeout(std::string message) {
        return {StatusCode::kTimeout, std::move(message)};
    }
    static Status cuda(std::string message) { return {StatusCode::kCuda, std::move(message)}; }
    static Status nccl(std::string message) { return {StatusCode::kNccl, std::move(message)}; }
    // Builds an error from a failed syscall: "<what>: <strerror(errno_value)>".
    static Status from_errno(int errno_value, std::string_view what);

    bool is_ok() const noexcept { return rep_ == nullptr; }
    explicit operator bool() const noexcept { return is_ok(); }
    StatusCode code() const noexcept { return rep_ ? rep_->code : StatusCode::kOk; }
    int errno_value() const noexcept { return rep_ ? rep_->errno_value : 0; }
    // The message without the code; empty for OK.
    const std::string& message() const noexcept;
    // "<code>: <message>" or "OK".
    std::string to_string() const;
    // Returns a copy whose message is "<context>: <message>"; OK stays OK. Keeps the code, the
    // errno and the injected mark.
    Status with_context(std::string_view context) const;

    // True when fault injection made this error (io::FaultyBackend, io::FaultyFileSystem, a
    // test's failing fake), not the system: callers and sweeps recognise an injected fault by
    // this mark, never by searching the message, which is for people. Copies, moves and
    // with_context keep it; a Status built anew from another's code and message does not.
    bool is_injected() const noexcept { return rep_ != nullptr && rep_->injected; }
    // This error, marked as injected. Precondition: not OK.
    Status mark_injected() &&;

    Status(const Status& other) : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}
    Status& operator=(const Status& other) {
        if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
        return *this;
    }
    Status(Status&&) noexcept = default;
    Status& operator=(Status&&) noexcept = default;

private:
    struct Rep {
        StatusCode code;
        int errno_value;
        std::string message;
        bool injected = false;
    };
    std::unique_ptr<Rep> rep_;
};

// A value or an error Status; keeps to the part of std::expected's API it shares.
template <typename T>
class [[nodiscard]] Result {
public:
    Result(const T& value) : v_(std::in_place_index<0>, value) {}  // NOLINT: implicit by design
    Result(T&& value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT
    Result(Status status) : v_(std::in_place_index<1>, std::move(status)) {  // NOLINT
        ZINF_ASSERT(!std::get<1>(v_).is_ok());
    }
    // Not a hidden copy or move constructor: the constraint excludes Result itself (clang-tidy 14
    // does not read requires-clauses).
    // NOLINTBEGIN(bugprone-forwarding-reference-overload)
    template <typename U>
    requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
             !std::is_same_v<std::decay_t<U>, Status> && !std::is_same_v<std::decay_t<U>, Result>)
        Result(U&& value)
        : v_(std::in_place_index<0>, std::forward<U>(value)) {}  // NOLINT
    // NOLINTEND(bugprone-forwarding-reference-overload)

    bool has_value() const noexcept { return v_.index() == 0; }
    explicit operator bool() const noexcept { return has_value(); }
    T& value() & {
        ZINF_ASSERT_MSG(has_value(), error().to_string());
        return std::get<0>(v_);
    }
    const T& value() const& {
        ZINF_ASSERT_MSG(has_value(), error().to_string());
        return std::get<0>(v_);
    }
    T&& value() && {
        ZINF_ASSERT_MSG(has_value(), error().to_string());
        return std::get<0>(std::move(v_));
    }
    const Status& error() const& {
        ZINF_ASSERT(!has_value());
        return std::get<1>(v_);
    }
    Status status() const { return has_value() ? Status::ok() : std::get<1>(v_); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

private:
    std::variant<T, Status> v_;
};

}  // namespace zinf

#define ZINF_CONCAT_INNER_(a, b) a##b
#define ZINF_CONCAT_(a, b) ZINF_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define ZINF_TRY(expr)                                          \
    do {                                                        \
        ::zinf::Status zinf_try_status_ = (expr);               \
        if (!zinf_try_status_.is_ok()) return zinf_try_status_; \
    } while (0)

// `tmp` and `lhs` are a name and a declaration: they cannot be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define ZINF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
    auto tmp = (expr);                              \
    if (!tmp.has_value()) return tmp.error();       \
    lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

// `ZINF_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its error.
#define ZINF_ASSIGN_OR_RETURN(lhs, expr) \
    ZINF_ASSIGN_OR_RETURN_IMPL_(ZINF_CONCAT_(zinf_result_, __LINE__), lhs, expr)
