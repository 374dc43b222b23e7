// zinfinity._C's training engine for a model driven from Python (the PyTorch front end,
// zinfinity/engine.py): the same Engine, plan, ZeRO coordinator, offload, optimizer and
// checkpoints as zinfinity-train, over a model::ExternalModel whose forward and backward torch
// runs. Parameters reach torch as buffers over the engine's memory (fetch), gradients come back
// by address (accumulate). Several ranks: the MPI communicator, as zinfinity-train's CPU ranks.
#include <cblas.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "python/binding.h"
#include "src/base/config.h"
#include "src/base/log.h"
#include "src/engine/engine.h"
#include "src/engine/stack.h"
#include "src/model/external_model.h"
#ifdef ZINF_PYTHON_HAVE_MPI
#include "zero/mpi_communicator.h"
#endif

namespace zinf::python {
namespace {

// The process's MPI session (one per process, kept until exit: MPI cannot be initialised twice).
struct Launched {
    int rank = 0;
    int world_size = 1;
#ifdef ZINF_PYTHON_HAVE_MPI
    std::unique_ptr<zero::MpiSession> session;
#endif
};

Launched& launch() {
    static Launched* launched = [] {
        auto* l = new Launched();  // NOLINT: lives until exit (MPI_Finalize must not run early)
#ifdef ZINF_PYTHON_HAVE_MPI
        auto info = take(zero::detect_launch());
        if (info.under_mpi) {
            l->session = take(zero::MpiSession::init(nullptr, nullptr));
            l->rank = l->session->rank();
            l->world_size = l->session->world_size();
        }
#else
        if (const char* ws = std::getenv("OMPI_COMM_WORLD_SIZE"); ws && std::atoi(ws) > 1) {
            raise(Status::not_supported(
                "several ranks: this zinfinity module was built without MPI"));
        }
#endif
        return l;
    }();
    return *launched;
}

CommunicatorFactory communicator_factory(const config::EngineConfig& config) {
    if (launch().world_size == 1) return {};
#ifdef ZINF_PYTHON_HAVE_MPI
    return [&config](Device& device) -> Result<std::unique_ptr<zero::Communicator>> {
        zero::MpiCommunicatorOptions o;
        o.deterministic = config.comm.deterministic;
        o.timeout = std::chrono::seconds(config.comm.timeout_s);
        ZINF_ASSIGN_OR_RETURN(auto c, zero::MpiCommunicator::create(device, o));
        return std::unique_ptr<zero::Communicator>(std::move(c));
    };
#else
    return {};
#endif
}

class TorchEngine;
// The engines not yet closed: finalize() closes them before MPI is finalized.
std::set<TorchEngine*>& live_engines() {
    static auto* live = new std::set<TorchEngine*>();  // NOLINT: until exit, as the session
    return *live;
}

// The engine of one torch model: its stack (device, compute, communicator, model, engine).
class TorchEngine {
public:
    TorchEngine(const std::string& config_text, const std::string& source,
                std::vector<std::string> names, std::vector<std::vector<std::size_t>> shapes,
                const std::vector<std::uintptr_t>& initial) {
        if (names.size() != shapes.size() || names.size() != initial.size()) {
            raise(Status::invalid_argument("names, shapes and initial values differ in length"));
        }
        config::LoadOptions lo;
        lo.world_size = launch().world_size;
        config_ = take(config::load_from_string(config_text, lo, source));
        if (config_.device.type != "cpu") {
            raise(Status::not_supported(
                str_cat(source, ": device.type \"", config_.device.type,
                        "\": the PyTorch front end trains on the CPU device (torch CPU tensors)")));
        }
        std::vector<model::ExternalModel::ParameterSpec> specs;
        for (std::size_t i = 0; i < names.size(); ++i) specs.push_back({names[i], shapes[i]});
        // Initial values: each parameter's fp32 contiguous values at `initial[i]`, valid while
        // the stack is made (the caller holds the tensors).
        auto values = [initial](const model::ParameterInfo& info, std::size_t offset,
                                std::span<float> out) {
            if (initial[info.id] == 0) {  // none given: zeros (a checkpoint's values follow)
                std::fill(out.begin(), out.end(), 0.0f);
                return;
            }
            const auto* from = address<const float>(initial[info.id]);
            std::memcpy(out.data(), from + offset, out.size_bytes());
        };
        const std::size_t rows = config_.batch.train_micro_batch_size_per_gpu;
        ModelFactory make_model = [&](const config::EngineConfig&,
                                      Device&) -> Result<std::unique_ptr<model::Model>> {
            ZINF_ASSIGN_OR_RETURN(auto m, model::ExternalModel::create(
                                              "torch model", std::move(specs), values, rows));
            return std::unique_ptr<model::Model>(std::move(m));
        };
        std::optional<Result<TrainingStack>> made;
        {
            py::gil_scoped_release unlocked;
            // The engine's Compute switches OpenBLAS's threads off process-wide (its own GEMM
            // tiles); torch, which runs this model's GEMMs through the same OpenBLAS, keeps its
            // thread count (its speed, and results bitwise those of torch alone).
            const int blas_threads = openblas_get_num_threads();
            made.emplace(
                TrainingStack::create(config_, {}, communicator_factory(config_), make_model));
            openblas_set_num_threads(blas_threads);
        }
        stack_ = take(std::move(*made));  // raises with the GIL held
        live_engines().insert(this);
    }
    ~TorchEngine() { live_engines().erase(this); }
    TorchEngine(const TorchEngine&) = delete;
    TorchEngine& operator=(const TorchEngine&) = delete;

    Engine& engine() {
        if (!stack_.engine) raise(Status::invalid_argument("the engine was closed"));
        return *stack_.engine;
    }
    const config::EngineConfig& config() const noexcept { return config_; }

    // Parameter `id` as a writable buffer of its fp32 values (the engine's memory, valid until
    // the matching release).
    py::memoryview fetch(std::uint32_t id) {
        auto& e = engine();
        check_id(id);
        std::optional<Result<const float*>> got;
        {
            py::gil_scoped_release unlocked;
            got.emplace(e.parameter_source().fetch(id, 0));
            // Torch reads it at once, on this thread: the gather or copy the fetch enqueued on
            // the device's stream must be done.
            if (got->has_value()) {
                if (Status s = stack_.device->synchronize(0); !s.is_ok()) got.emplace(s);
            }
        }
        const float* p = take(std::move(*got));
        const auto numel = e.model().parameters().info(id).numel;
        return py::memoryview::from_memory(const_cast<float*>(p),  // NOLINT: torch's view
                                           static_cast<py::ssize_t>(numel * sizeof(float)), false);
    }
    void release(std::uint32_t id) {
        check_id(id);
        check(engine().parameter_source().release(id, 0));
    }
    // Hands a gradient to the engine. The device's stream may still read it after this returns
    // (wait false): the caller keeps the tensor alive until synchronize() returns.
    void accumulate(std::uint32_t id, std::uintptr_t grad, bool wait) {
        auto& e = engine();
        check_id(id);
        Status s = Status::ok();
        {
            py::gil_scoped_release unlocked;
            s = e.gradient_sink().accumulate(id, address<const float>(grad), 0);
            if (s.is_ok() && wait) s = stack_.device->synchronize(0);
        }
        check(s);
    }
    // Waits for everything enqueued on the device's stream (the gradients handed over).
    void synchronize() {
        auto& d = *stack_.device;
        Status s = Status::ok();
        {
            py::gil_scoped_release unlocked;
            s = d.synchronize(0);
        }
        check(s);
    }
    void close() {
        live_engines().erase(this);
        py::gil_scoped_release unlocked;
        stack_ = TrainingStack();
    }

private:
    void check_id(std::uint32_t id) {
        if (id >= engine().model().parameters().size()) {
            raise(Status::invalid_argument(str_cat("parameter id ", id, " out of range")));
        }
    }
    config::EngineConfig config_;
    TrainingStack stack_;
};

template <typename F>
auto unlocked(TorchEngine& t, F f) {
    Engine& e = t.engine();
    py::gil_scoped_release released;
    return f(e);
}

py::dict config_facts(const config::EngineConfig& c) {
    py::dict d;
    d["stage"] = c.zero.stage;
    d["fp16"] = c.fp16.enabled;
    d["bf16"] = c.bf16.enabled;
    d["gradient_clipping"] = c.gradient_clipping;
    d["steps_per_print"] = c.steps_per_print;
    d["train_batch_size"] = c.batch.train_batch_size;
    d["train_micro_batch_size_per_gpu"] = c.batch.train_micro_batch_size_per_gpu;
    d["gradient_accumulation_steps"] = c.batch.gradient_accumulation_steps;
    d["seed"] = c.seed;
    d["warnings"] = c.warnings;
    d["canonical_json"] = c.canonical_json;
    d["csv_monitor"] = c.csv_monitor.enabled;
    return d;
}

py::dict step_report(const Engine& e) {
    const StepReport& r = e.last_step();
    py::dict d;
    d["boundary"] = r.boundary;
    d["overflow"] = r.overflow;
    d["grad_norm"] = r.grad_norm;
    d["lr"] = r.lr;
    d["loss_scale"] = r.loss_scale;
    d["optimizer_seconds"] = r.optimizer_seconds;
    return d;
}

py::dict figures(const Engine& e) {
    const IoFigures io = e.io_figures();
    const EngineTimes& t = e.times();
    py::dict d;
    d["bytes_read"] = io.bytes_read;
    d["bytes_written"] = io.bytes_written;
    d["stall_seconds"] = io.stall_seconds;
    d["forward_seconds"] = t.forward_seconds;
    d["backward_seconds"] = t.backward_seconds;
    d["optimizer_seconds"] = t.optimizer_seconds;
    d["checkpoint_seconds"] = t.checkpoint_seconds;
    d["fetch_count"] = e.coordinator().fetch_count();
    d["pinned_bytes"] = e.pinned_bytes();
    d["parameters"] = std::string(engine::home_name(e.plan().parameters));
    d["gradients"] = std::string(engine::home_name(e.plan().gradients));
    d["optimizer_states"] = std::string(engine::home_name(e.plan().optimizer_states));
    d["residency"] = e.residency_summary();
    if (const engine::OverlapCounts* o = e.overlap_counts(); o != nullptr) {
        // swap.overlap_step: what the speculated steps beside backward became.
        py::dict v;
        v["recorded"] = o->recorded;
        v["committed"] = o->committed;
        v["redone"] = o->redone;
        v["skipped"] = o->skipped;
        v["abandoned"] = o->abandoned;
        v["not_speculated"] = o->not_speculated;
        d["overlap_step"] = v;
    }
    return d;
}

void bind_counters(py::class_<TorchEngine>& c) {
    c.def_property_readonly("global_steps",
                            [](TorchEngine& t) { return t.engine().global_steps(); })
        .def_property_readonly("micro_steps",
                               [](TorchEngine& t) { return t.engine().micro_steps(); })
        .def_property_readonly("skipped_steps",
                               [](TorchEngine& t) { return t.engine().skipped_steps(); })
        .def_property_readonly("global_samples",
                               [](TorchEngine& t) { return t.engine().global_samples(); })
        .def("is_gradient_accumulation_boundary",
             [](TorchEngine& t) { return t.engine().is_gradient_accumulation_boundary(); })
        .def("current_lr", [](TorchEngine& t) { return t.engine().current_lr(); })
        .def("set_lr_override",
             [](TorchEngine& t, std::optional<double> lr) { t.engine().set_lr_override(lr); })
        .def("loss_scale", [](TorchEngine& t) { return t.engine().loss_scale(); })
        .def("last_step", [](TorchEngine& t) { return step_report(t.engine()); })
        .def("figures", [](TorchEngine& t) { return figures(t.engine()); })
        .def("summary", [](TorchEngine& t) { return t.engine().summary(); })
        .def("config", [](TorchEngine& t) { return config_facts(t.config()); })
        .def_property_readonly("rank", [](TorchEngine& t) { return t.engine().rank(); })
        .def_property_readonly("world_size", [](TorchEngine& t) { return t.engine().world_size(); })
        .def("master_parameters", [](TorchEngine& t) {
            return take(unlocked(t, [](Engine& e) { return e.master_parameters(); }));
        });
}

void bind_checkpoints(py::class_<TorchEngine>& c) {
    c.def("save_checkpoint",
          [](TorchEngine& t, const std::string& dir, const std::string& tag,
             const std::vector<std::pair<std::string, py::bytes>>& extras) {
              std::vector<std::pair<std::string, std::string>> files;
              files.reserve(extras.size());
              for (const auto& [name, bytes] : extras) files.emplace_back(name, std::string(bytes));
              check(unlocked(t, [&](Engine& e) {
                  e.set_checkpoint_extras(std::move(files));
                  return e.save_checkpoint(dir, tag);
              }));
          })
        .def("load_checkpoint",
             [](TorchEngine& t, const std::string& dir, const std::string& tag) {
                 check(unlocked(t, [&](Engine& e) { return e.load_checkpoint(dir, tag); }));
             })
        .def("read_checkpoint_extra",
             [](TorchEngine& t, const std::string& dir, const std::string& tag,
                const std::string& name) -> py::object {
                 auto got = unlocked(
                     t, [&](Engine& e) { return e.read_checkpoint_extra(dir, tag, name); });
                 if (!got.has_value() && got.error().code() == StatusCode::kNotFound) {
                     return py::none();
                 }
                 return py::bytes(take(std::move(got)));
             });
}

}  // namespace

void bind_engine(py::module_& m) {
    py::class_<TorchEngine> c(m, "TorchEngine");
    c.def(py::init<const std::string&, const std::string&, std::vector<std::string>,
                   std::vector<std::vector<std::size_t>>, const std::vector<std::uintptr_t>&>(),
          py::arg("config_text"), py::arg("source"), py::arg("names"), py::arg("shapes"),
          py::arg("initial"))
        .def("begin_forward",
             [](TorchEngine& t, bool training) {
                 check(unlocked(t, [&](Engine& e) { return e.begin_forward(training); }));
             })
        .def("end_forward",
             [](TorchEngine& t, bool ok) {
                 check(unlocked(t, [&](Engine& e) { return e.end_forward(ok); }));
             })
        .def("begin_backward",
             [](TorchEngine& t) {
                 return take(unlocked(t, [](Engine& e) { return e.begin_backward(); }));
             })
        .def("end_backward",
             [](TorchEngine& t, bool ok) {
                 check(unlocked(t, [&](Engine& e) { return e.end_backward(ok); }));
             })
        .def("step", [](TorchEngine& t) { check(unlocked(t, [](Engine& e) { return e.step(); })); })
        .def("fetch", &TorchEngine::fetch)
        .def("release", &TorchEngine::release)
        .def("accumulate", &TorchEngine::accumulate, py::arg("id"), py::arg("grad"),
             py::arg("wait") = true)
        .def("synchronize", &TorchEngine::synchronize)
        .def("close", &TorchEngine::close);
    bind_counters(c);
    bind_checkpoints(c);
    // At interpreter exit (zinfinity registers it with atexit): closes the engines still open,
    // then finalizes MPI, so that mpirun sees every rank end cleanly.
    m.def("finalize", [] {
        while (!live_engines().empty()) (*live_engines().begin())->close();
#ifdef ZINF_PYTHON_HAVE_MPI
        launch().session.reset();
#endif
    });
    m.def("launch", [] {
        const Launched& l = launch();
        return py::make_tuple(l.rank, l.world_size);
    });
}

}  // namespace zinf::python
