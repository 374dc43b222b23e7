// Fetched: one parameter fetched through the Context's ParameterSource, released explicitly on
// the success path (so that its Status is checked) or by the destructor on an error path, where
// the first error is the one reported. Shared by the module library and the models.
#pragma once

#include "src/base/assert.h"
#include "src/base/status.h"
#include "src/model/module.h"

namespace zinf::model {

class Fetched {
public:
    Fetched(const Context& ctx, ParamId id) noexcept : ctx_(ctx), id_(id) {}
    ~Fetched() {
        if (ptr_ != nullptr) {
            const Status ignored = ctx_.params.release(id_, ctx_.stream);
            (void)ignored;
        }
    }
    Fetched(const Fetched&) = delete;
    Fetched& operator=(const Fetched&) = delete;

    Status fetch() {
        ZINF_ASSERT(ptr_ == nullptr);
        ZINF_ASSIGN_OR_RETURN(ptr_, ctx_.params.fetch(id_, ctx_.stream));
        ZINF_ASSERT(ptr_ != nullptr);
        return Status::ok();
    }
    Status release() {
        ZINF_ASSERT(ptr_ != nullptr);
        ptr_ = nullptr;
        return ctx_.params.release(id_, ctx_.stream);
    }
    const float* get() const noexcept { return ptr_; }

private:
    const Context& ctx_;
    ParamId id_;
    const float* ptr_ = nullptr;
};

}  // namespace zinf::model
