// zinfinity._C's NVMe optimizer: torch parameter groups' fp32 masters and moments on NVMe,
// through the same optimizer stack as the engine's (swap/optimizer_stack.h).
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "io/engine.h"
#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "python/binding.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "swap/optimizer_stack.h"
#include "swap/optimizer_swapper.h"
#include "swap/pinned_pool.h"
#include "swap/swap_store.h"

namespace zinf::python {
namespace {

// One tensor of a parameter group: the torch parameter (fp32, or bf16/fp16 with the master in
// the swap store) and its gradient, for one step.
struct Piece {
    std::uintptr_t param = 0;
    DType param_dtype = DType::kFloat32;
    std::uintptr_t grad = 0;
    DType grad_dtype = DType::kFloat32;
    std::uint64_t numel = 0;
};

std::vector<Piece> pieces_from(const py::list& list) {
    std::vector<Piece> out;
    out.reserve(list.size());
    for (const py::handle item : list) {
        const auto t = item.cast<py::tuple>();
        if (t.size() != 5)
            raise(Status::invalid_argument("piece: (param, dtype, grad, dtype, numel)"));
        Piece p;
        p.param = t[0].cast<std::uintptr_t>();
        p.param_dtype = dtype_from(t[1].cast<std::string>());
        p.grad = t[2].cast<std::uintptr_t>();
        p.grad_dtype = t[3].is_none() ? DType::kFloat32 : dtype_from(t[3].cast<std::string>());
        p.numel = t[4].cast<std::uint64_t>();
        out.push_back(p);
    }
    return out;
}

std::size_t dsize(DType d) {
    return dtype_size_bytes(d);
}

// Walks the tensors covering [offset, offset + numel) of a group's flat layout (anything with a
// `numel`: the pieces of a step, the state targets of read_states / write_states).
template <typename T, typename Fn>
void for_range(const std::vector<T>& pieces, std::uint64_t offset, std::uint64_t numel, Fn fn) {
    std::uint64_t start = 0;
    for (const T& p : pieces) {
        const std::uint64_t end = start + p.numel;
        if (p.numel > 0 && end > offset && start < offset + numel) {
            const std::uint64_t from = std::max(offset, start);
            const std::uint64_t to = std::min(offset + numel, end);
            fn(p, from - start, from - offset, to - from);  // piece offset, range offset, count
        }
        start = end;
        if (start >= offset + numel) break;
    }
}

// Gradients and parameter write-back of one group for OptimizerSwapper::step. A sub-group that
// lies in one tensor is read and written in place; one that spans tensors is gathered into (and
// scattered from) the optimizer's staging buffers.
class TorchGradients final : public swap::GradientSource {
public:
    // `grads` and `copy` are the optimizer's staging buffers, grown here on first need.
    TorchGradients(const std::vector<Piece>& pieces, DType grad_dtype, DType param_dtype,
                   std::uint64_t sub_group_numel, std::vector<std::byte>& grads,
                   std::vector<std::uint16_t>& copy)
        : pieces_(pieces),
          grad_dtype_(grad_dtype),
          param_dtype_(param_dtype),
          grads_(grads),
          copy_(copy) {
        if (grads_.size() < sub_group_numel * dsize(grad_dtype)) {
            grads_.resize(sub_group_numel * dsize(grad_dtype));
        }
        if (param_dtype != DType::kFloat32 && copy_.size() < sub_group_numel) {
            copy_.resize(sub_group_numel);
        }
    }

    Result<kernels::GradView> gradients(std::size_t, std::uint64_t offset,
                                        std::uint64_t numel) override {
        const Piece* one = single(offset, numel);
        if (one != nullptr) {
            const std::uint64_t at = offset - start_of(one);
            return kernels::GradView{address<const std::byte>(one->grad) + at * dsize(grad_dtype_),
                                     numel, grad_dtype_};
        }
        const std::size_t es = dsize(grad_dtype_);
        for_range(pieces_, offset, numel,
                  [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                      std::memcpy(grads_.data() + ro * es,
                                  address<const std::byte>(p.grad) + po * es, n * es);
                  });
        return kernels::GradView{grads_.data(), numel, grad_dtype_};
    }

    kernels::ParamCopy param_copy(std::size_t, std::uint64_t offset, std::uint64_t numel) override {
        if (param_dtype_ == DType::kFloat32) return kernels::ParamCopy::none();
        const Piece* one = single(offset, numel);
        std::uint16_t* dst = one != nullptr
                                 ? address<std::uint16_t>(one->param) + (offset - start_of(one))
                                 : copy_.data();
        return {dst, numel, param_dtype_};
    }

    Status updated(std::size_t, std::uint64_t offset, std::span<const float> params) override {
        const std::uint64_t numel = params.size();
        if (param_dtype_ != DType::kFloat32) {
            if (single(offset, numel) != nullptr) return Status::ok();  // written in place
            for_range(pieces_, offset, numel,
                      [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                          std::memcpy(address<std::uint16_t>(p.param) + po, copy_.data() + ro,
                                      n * 2);
                      });
            return Status::ok();
        }
        for_range(pieces_, offset, numel,
                  [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                      std::memcpy(address<float>(p.param) + po, params.data() + ro,
                                  n * sizeof(float));
                  });
        return Status::ok();
    }

private:
    std::uint64_t start_of(const Piece* piece) const {
        std::uint64_t start = 0;
        for (const Piece& p : pieces_) {
            if (&p == piece) return start;
            start += p.numel;
        }
        return start;
    }
    const Piece* single(std::uint64_t offset, std::uint64_t numel) const {
        std::uint64_t start = 0;
        for (const Piece& p : pieces_) {
            if (offset >= start && offset + numel <= start + p.numel) return &p;
            start += p.numel;
            if (start > offset) return nullptr;
        }
        return nullptr;
    }

    const std::vector<Piece>& pieces_;
    DType grad_dtype_;
    DType param_dtype_;
    std::vector<std::byte>& grads_;
    std::vector<std::uint16_t>& copy_;
};

// Fills the initial fp32 masters from the torch parameters.
class TorchParams final : public swap::ParamSource {
public:
    TorchParams(const std::vector<Piece>& pieces, kernels::Isa isa) : pieces_(pieces), isa_(isa) {}
    Status fill(std::size_t, std::uint64_t offset, std::span<float> params) override {
        for_range(pieces_, offset, params.size(),
                  [&](const Piece& p, std::uint64_t po, std::uint64_t ro, std::uint64_t n) {
                      if (p.param_dtype == DType::kFloat32) {
                          std::memcpy(params.data() + ro, address<const float>(p.param) + po,
                                      n * sizeof(float));
                      } else {
                          kernels::cast_to_fp32(isa_,
                                                {address<const std::uint16_t>(p.param) + po, n},
                                                p.param_dtype, params.subspan(ro, n));
                      }
                  });
        return Status::ok();
    }

private:
    const std::vector<Piece>& pieces_;
    kernels::Isa isa_;
};

// The fp32 masters and optimizer states of several parameter groups in one swap store on NVMe:
// one OptimizerSwapper per group (its own sub-groups and partitions), one pinned pool and one
// I/O engine for all.
class NvmeOptimizer {
public:
    NvmeOptimizer(const std::vector<std::uint64_t>& group_numels, const std::string& kind,
                  bool amsgrad, const std::vector<std::string>& nvme_paths,
                  std::uint64_t sub_group_size, std::uint64_t block_size, int queue_depth,
                  bool single_submit, bool overlap_events, int intra_op_parallelism,
                  const std::string& backend, bool pipeline_read, bool pipeline_write,
                  bool verify_checksums, int threads, const std::string& state_dtype) {
        if (group_numels.empty() || sub_group_size == 0 || nvme_paths.empty()) {
            raise(Status::invalid_argument(
                "NVMeOptimizer: needs parameters, a positive sub_group_size and an nvme_path"));
        }
        kind_ = kind_from(kind);
        amsgrad_ = amsgrad;
        const std::optional<StateDType> dtype = find_state_dtype(state_dtype);
        if (!dtype.has_value()) {
            raise(Status::invalid_argument(str_cat("NVMeOptimizer: state_dtype \"", state_dtype,
                                                   "\"; expected fp32, bf16 or int8")));
        }
        // Compressed states: sub-groups of whole blocks of 2048 elements.
        if (*dtype != StateDType::kFp32)
            sub_group_size = align_up(sub_group_size, kStateBlockNumel);
        isa_ = take(kernels::resolve_isa("auto"));
        kernel_ = std::make_unique<kernels::OptimizerKernel>(
            take(kernels::OptimizerKernel::create(std::string_view("auto"), threads)));
        io::EngineOptions eo;
        eo.aio = aio_from(block_size, queue_depth, single_submit, overlap_events,
                          intra_op_parallelism, backend, true);
        engine_ = take(io::Engine::create(eo));
        swap::SwapStoreOptions so;
        so.paths = nvme_paths;
        so.verify_checksums = verify_checksums;
        so.name = "optimizer";
        store_ = take(swap::SwapStore::create(*engine_, so));

        // Sized and wired as the engine's NVMe optimizer is (swap/optimizer_stack.h).
        swap::OptimizerStackOptions stack;
        stack.group_numels = group_numels;
        stack.sub_group_numel = sub_group_size;
        stack.kind = kind_;
        stack.amsgrad = amsgrad;
        stack.pipeline_read = pipeline_read;
        stack.pipeline_write = pipeline_write;
        stack.pool_name = "optimizer";
        stack.state_dtype = *dtype;
        stack.rounding_seed = 0x7a696e66;  // one key for every run: results are reproducible
        swap::OptimizerStackLayout layout = take(swap::layout_optimizer_stack(stack));
        // Each group's elements get their own run of global indices (its own rounding words),
        // from a block boundary.
        std::uint64_t global = 0;
        for (swap::OptimizerSwapperOptions& o : layout.swappers) {
            if (*dtype != StateDType::kFp32) o.segments = {{0, o.numel, global}};
            global += align_up(o.numel, kStateBlockNumel);
        }
        pool_ = take(swap::create_optimizer_pool(layout, *engine_, nullptr, false));
        swappers_ = take(swap::create_optimizer_swappers(layout, *store_, *pool_, *kernel_));
        check(store_->commit());
    }

    ~NvmeOptimizer() {
        // The swappers, the store (it removes its run directory), then the pool and engine.
        swappers_.clear();
        store_.reset();
        pool_.reset();
        engine_.reset();
    }

    void initialize(std::size_t group, const py::list& list) {
        const std::vector<Piece> pieces = pieces_from(list);
        swap::OptimizerSwapper& s = swapper(group, pieces);
        TorchParams source(pieces, isa_);
        Status status;
        {
            py::gil_scoped_release release;
            status = s.initialize(source);
        }
        check(status);
    }

    py::dict step(std::size_t group, const py::list& list, std::uint64_t step, double lr,
                  double beta1, double beta2, double eps, double weight_decay, bool bias_correction,
                  double grad_scale, bool torch_rounding) {
        const std::vector<Piece> pieces = pieces_from(list);
        swap::OptimizerSwapper& s = swapper(group, pieces);
        const kernels::OptimizerParams p =
            hyper_from(std::string(optimizer_kind_name(kind_)), step, lr, beta1, beta2, eps,
                       weight_decay, bias_correction, amsgrad_, grad_scale, torch_rounding);
        // The dtypes of the group's first non-empty parameter (an empty one has no gradient
        // storage and takes no part).
        const Piece* first = &pieces.front();
        for (const Piece& piece : pieces) {
            if (piece.numel > 0) {
                first = &piece;
                break;
            }
        }
        const DType gd = first->grad_dtype;
        const DType pd = first->param_dtype;
        for (std::size_t i = 0; i < pieces.size(); ++i) {
            if (pieces[i].numel == 0) continue;
            if (pieces[i].grad == 0) {
                raise(Status::invalid_argument(
                    str_cat("NVMeOptimizer: parameter ", i, " of group ", group,
                            " has no gradient; a group steps all its parameters together")));
            }
            if (pieces[i].grad_dtype != gd || pieces[i].param_dtype != pd) {
                raise(Status::invalid_argument(
                    str_cat("NVMeOptimizer: parameter ", i, " of group ", group,
                            " differs in dtype from the group's first; one dtype per group")));
            }
        }
        TorchGradients grads(pieces, gd, pd, s.options().sub_group_numel, grad_stage_, copy_stage_);
        Status status;
        {
            py::gil_scoped_release release;
            status = s.step(p, grads);
        }
        check(status);
        const swap::OptimizerStepStats& st = s.last_step_stats();
        py::dict d;
        d["seconds"] = st.seconds;
        d["compute_seconds"] = st.compute_seconds;
        d["read_wait_seconds"] = st.read_wait_seconds;
        d["write_wait_seconds"] = st.write_wait_seconds;
        d["bytes_read"] = st.bytes_read;
        d["bytes_written"] = st.bytes_written;
        return d;
    }

    // Streams one group's masters and states into (read) or out of (write) per-tensor fp32
    // arrays, one sub-group at a time. `targets` holds, per tensor, (numel, master, exp_avg,
    // exp_avg_sq, max_exp_avg_sq) addresses, 0 for a state the optimizer does not keep.
    void transfer(std::size_t group, const py::list& targets, bool write) {
        std::vector<Target> ts;
        for (const py::handle item : targets) {
            const auto t = item.cast<py::tuple>();
            if (t.size() < 2 || t.size() > 2 + kMaxMoments) {
                raise(Status::invalid_argument(
                    "NVMeOptimizer: a target is (numel, master, moments...)"));
            }
            Target target{t[0].cast<std::uint64_t>(), {}};
            for (std::size_t k = 1; k < t.size(); ++k) {
                target.arrays[k - 1] = t[k].cast<std::uintptr_t>();
            }
            ts.push_back(target);
        }
        if (group >= swappers_.size())
            raise(Status::invalid_argument("NVMeOptimizer: no such group"));
        swap::OptimizerSwapper& s = *swappers_[group];
        std::uint64_t total = 0;
        for (const Target& t : ts) total += t.numel;
        if (total != s.options().numel) {
            raise(Status::invalid_argument(str_cat("NVMeOptimizer: group ", group, " holds ",
                                                   s.options().numel, " elements; given ", total)));
        }
        // State slots in the swapper's order: master, exp_avg, exp_avg_sq, max_exp_avg_sq.
        Status status;
        {
            py::gil_scoped_release release;
            status = stream(s, ts, write);
        }
        check(status);
    }

    std::vector<std::string> swap_files() const { return store_->data_file_paths(); }
    std::size_t sub_group_count(std::size_t group) const {
        return group < swappers_.size() ? swappers_[group]->sub_group_count() : 0;
    }
    std::string backend() const { return std::string(engine_->backend_name()); }
    std::string state_dtype() const {
        return swappers_.empty()
                   ? std::string("fp32")
                   : std::string(state_dtype_name(swappers_[0]->options().state_dtype));
    }
    std::uint64_t bytes_on_disk() const { return store_->data_bytes(); }

private:
    // One tensor's arrays: the master, then the kept moments in the descriptor's order (0: the
    // caller has none, e.g. to skip a moment when reading).
    struct Target {
        std::uint64_t numel;
        std::uintptr_t arrays[1 + kMaxMoments];
    };

    // Target arrays and the swapper's partitions are in the same order: the master, then the
    // kept moments in the descriptor's order.
    Status stream(swap::OptimizerSwapper& s, const std::vector<Target>& ts, bool write) {
        const std::size_t kept = optimizer_descriptor(kind_).kept_moment_count(amsgrad_);
        Status status;
        const std::uint64_t n = s.options().sub_group_numel;
        std::vector<float> buf[1 + kMaxMoments];
        for (std::size_t k = 0; k <= kept; ++k) buf[k].resize(n);
        for (std::size_t g = 0; g < s.sub_group_count() && status.is_ok(); ++g) {
            const std::uint64_t numel = s.sub_group_numel(g);
            const std::uint64_t offset = s.sub_group_offset_numel(g);
            std::span<float> spans[1 + kMaxMoments];
            for (std::size_t k = 0; k <= kept; ++k) spans[k] = {buf[k].data(), numel};
            auto walk = [&](bool into_targets) {
                for_range(
                    ts, offset, numel,
                    [&](const Target& t, std::uint64_t po, std::uint64_t ro, std::uint64_t n_copy) {
                        for (std::size_t k = 0; k <= kept; ++k) {
                            const std::uintptr_t theirs_at = t.arrays[k];
                            if (theirs_at == 0) continue;
                            float* mine = spans[k].data() + ro;
                            float* theirs = address<float>(theirs_at) + po;
                            if (into_targets)
                                std::memcpy(theirs, mine, n_copy * sizeof(float));
                            else
                                std::memcpy(mine, theirs, n_copy * sizeof(float));
                        }
                    });
            };
            if (write) {
                for (std::size_t k = 1; k <= kept; ++k) {
                    std::fill(spans[k].begin(), spans[k].end(), 0.0f);
                }
                walk(false);
                std::span<const float> moments[kMaxMoments];
                for (std::size_t k = 0; k < kept; ++k) moments[k] = spans[k + 1];
                status = s.write_sub_group(g, spans[0], {moments, kept});
            } else {
                status = s.read_sub_group(g, spans[0], {spans + 1, kept});
                if (status.is_ok()) walk(true);
            }
        }
        return status;
    }

    swap::OptimizerSwapper& swapper(std::size_t group, const std::vector<Piece>& pieces) {
        if (group >= swappers_.size()) {
            raise(Status::invalid_argument(
                str_cat("NVMeOptimizer: group ", group, " of ", swappers_.size())));
        }
        std::uint64_t total = 0;
        for (const Piece& p : pieces) total += p.numel;
        if (pieces.empty() || total != swappers_[group]->options().numel) {
            raise(Status::invalid_argument(
                str_cat("NVMeOptimizer: group ", group, " was built for ",
                        swappers_[group]->options().numel, " elements; given ", total)));
        }
        return *swappers_[group];
    }

    OptimizerKind kind_ = OptimizerKind::kAdamW;
    bool amsgrad_ = false;
    kernels::Isa isa_ = kernels::Isa::kScalar;
    std::unique_ptr<kernels::OptimizerKernel> kernel_;
    std::unique_ptr<io::Engine> engine_;
    std::unique_ptr<swap::SwapStore> store_;
    std::unique_ptr<swap::PinnedPool> pool_;
    std::vector<std::unique_ptr<swap::OptimizerSwapper>> swappers_;
    // Staging for sub-groups that span tensors: kept across steps, grown on first need.
    std::vector<std::byte> grad_stage_;
    std::vector<std::uint16_t> copy_stage_;
};

}  // namespace

void bind_offload(py::module_& m) {
    py::class_<NvmeOptimizer>(m, "NvmeOptimizer")
        .def(py::init<const std::vector<std::uint64_t>&, const std::string&, bool,
                      const std::vector<std::string>&, std::uint64_t, std::uint64_t, int, bool,
                      bool, int, const std::string&, bool, bool, bool, int, const std::string&>(),
             py::arg("group_numels"), py::arg("kind"), py::arg("amsgrad"), py::arg("nvme_paths"),
             py::arg("sub_group_size"), py::arg("block_size"), py::arg("queue_depth"),
             py::arg("single_submit"), py::arg("overlap_events"), py::arg("intra_op_parallelism"),
             py::arg("backend"), py::arg("pipeline_read"), py::arg("pipeline_write"),
             py::arg("verify_checksums"), py::arg("threads"), py::arg("state_dtype") = "fp32")
        .def("initialize", &NvmeOptimizer::initialize, py::arg("group"), py::arg("pieces"))
        .def("step", &NvmeOptimizer::step, py::arg("group"), py::arg("pieces"), py::arg("step"),
             py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
             py::arg("weight_decay"), py::arg("bias_correction"), py::arg("grad_scale") = 1.0,
             py::arg("torch_rounding") = false)
        .def(
            "read_states",
            [](NvmeOptimizer& o, std::size_t g, const py::list& t) { o.transfer(g, t, false); },
            py::arg("group"), py::arg("targets"))
        .def(
            "write_states",
            [](NvmeOptimizer& o, std::size_t g, const py::list& t) { o.transfer(g, t, true); },
            py::arg("group"), py::arg("targets"))
        .def("swap_files", &NvmeOptimizer::swap_files)
        .def("sub_group_count", &NvmeOptimizer::sub_group_count, py::arg("group"))
        .def_property_readonly("backend", &NvmeOptimizer::backend)
        .def_property_readonly("state_dtype", &NvmeOptimizer::state_dtype)
        .def_property_readonly("bytes_on_disk", &NvmeOptimizer::bytes_on_disk);
}

}  // namespace zinf::python
