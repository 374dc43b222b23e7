// Assertions for programmer errors (STYLE.md §4, §8). ZINF_ASSERT stays on in release builds and
// aborts with file, line and the values involved; ZINF_DASSERT is for O(n) checks, debug only.
#pragma once

#include <sstream>
#include <string>

namespace zinf::detail {
[[noreturn]] void assert_fail(const char* expr, const char* file, int line,
                              const std::string& detail);

template <typename A, typename B>
[[noreturn]] void assert_op_fail(const char* expr, const char* file, int line, const A& a,
                                 const B& b) {
    std::ostringstream os;
    os << "values: " << a << " vs " << b;
    assert_fail(expr, file, line, os.str());
}
}  // namespace zinf::detail

#define ZINF_ASSERT(cond)                                               \
    do {                                                                \
        if (!(cond)) [[unlikely]]                                       \
            ::zinf::detail::assert_fail(#cond, __FILE__, __LINE__, ""); \
    } while (0)

#define ZINF_ASSERT_MSG(cond, msg)                                         \
    do {                                                                   \
        if (!(cond)) [[unlikely]]                                          \
            ::zinf::detail::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
    } while (0)

#define ZINF_ASSERT_OP_(a, b, op)                                                          \
    do {                                                                                   \
        const auto& zinf_a_ = (a);                                                         \
        const auto& zinf_b_ = (b);                                                         \
        if (!(zinf_a_ op zinf_b_)) [[unlikely]]                                            \
            ::zinf::detail::assert_op_fail(#a " " #op " " #b, __FILE__, __LINE__, zinf_a_, \
                                           zinf_b_);                                       \
    } while (0)

#define ZINF_ASSERT_EQ(a, b) ZINF_ASSERT_OP_(a, b, ==)
#define ZINF_ASSERT_NE(a, b) ZINF_ASSERT_OP_(a, b, !=)
#define ZINF_ASSERT_LE(a, b) ZINF_ASSERT_OP_(a, b, <=)
#define ZINF_ASSERT_LT(a, b) ZINF_ASSERT_OP_(a, b, <)
#define ZINF_ASSERT_GE(a, b) ZINF_ASSERT_OP_(a, b, >=)
#define ZINF_ASSERT_GT(a, b) ZINF_ASSERT_OP_(a, b, >)

#ifdef NDEBUG
#define ZINF_DASSERT(cond) \
    do {                   \
    } while (0)
#else
#define ZINF_DASSERT(cond) ZINF_ASSERT(cond)
#endif
