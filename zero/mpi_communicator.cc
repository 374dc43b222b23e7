// MpiCommunicator: MPI's collectives on CPU-device buffers, bounded by a watchdog.
#include "zero/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "kernels/cast.h"
#include "src/base/log.h"

namespace zinf::zero {
namespace {

Status mpi_error(int code, std::string_view what) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
    return Status::internal(str_cat("MPI ", what, ": error ", code, ": ", std::string(text, length)));
}

#define ZINF_MPI_TRY(call, what)                           \
    do {                                                   \
        if (const int rc_ = (call); rc_ != MPI_SUCCESS) {  \
            return mpi_error(rc_, what);                   \
        }                                                  \
    } while (0)

// A non-negative integer from an environment variable; nullopt when unset.
Result<std::optional<int>> env_int(const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::optional<int>();
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < 0 || n > 1'000'000) {
        return Status::invalid_argument(str_cat("environment variable ", name, "='", v,
                                                "': expected a non-negative integer"));
    }
    return std::optional<int>(static_cast<int>(n));
}

// fp32 reduction of 16-bit values: what MPI calls for MPI_Op_create.
template <float (*ToFloat)(std::uint16_t), std::uint16_t (*FromFloat)(float), bool kMax>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const std::uint16_t*>(in);
    auto* b = static_cast<std::uint16_t*>(inout);
    for (int i = 0; i < *len; ++i) {
        const float x = ToFloat(a[i]);
        const float y = ToFloat(b[i]);
        b[i] = FromFloat(kMax ? std::max(x, y) : x + y);
    }
}

float to_float(const void* base, std::size_t i, DType dtype) noexcept {
    switch (dtype) {
        case DType::kFloat32: return static_cast<const float*>(base)[i];
        case DType::kBFloat16: return kernels::bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
        case DType::kFloat16: return kernels::fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    }
    return 0.0f;
}

void from_float(void* base, std::size_t i, DType dtype, float v) noexcept {
    switch (dtype) {
        case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
        case DType::kBFloat16: static_cast<std::uint16_t*>(base)[i] = kernels::float_to_bf16(v); return;
        case DType::kFloat16: static_cast<std::uint16_t*>(base)[i] = kernels::float_to_fp16(v); return;
    }
}

// MPI counts are int: a collective larger than INT_MAX elements is refused by name.
Result<int> mpi_count(std::size_t n, std::string_view what) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
        return Status::invalid_argument(
            str_cat("MPI ", what, ": ", n, " elements exceed MPI's int count"));
    }
    return static_cast<int>(n);
}

}  // namespace

// ---- launch ------------------------------------------------------------------------------------

Result<LaunchInfo> detect_launch() {
    LaunchInfo info;
    // Open MPI's mpirun sets these; PMIx / PMI launchers (srun, MPICH's hydra) set the others.
    ZINF_ASSIGN_OR_RETURN(auto ompi_rank, env_int("OMPI_COMM_WORLD_RANK"));
    ZINF_ASSIGN_OR_RETURN(auto ompi_size, env_int("OMPI_COMM_WORLD_SIZE"));
    ZINF_ASSIGN_OR_RETURN(auto ompi_local, env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
    ZINF_ASSIGN_OR_RETURN(auto pmi_rank, env_int("PMI_RANK"));
    ZINF_ASSIGN_OR_RETURN(auto pmi_size, env_int("PMI_SIZE"));
    ZINF_ASSIGN_OR_RETURN(auto env_rank, env_int("RANK"));
    ZINF_ASSIGN_OR_RETURN(auto env_size, env_int("WORLD_SIZE"));
    ZINF_ASSIGN_OR_RETURN(auto env_local, env_int("LOCAL_RANK"));
    if (ompi_rank && ompi_size) {
        info = {*ompi_rank, *ompi_size, ompi_local.value_or(0), true, "mpirun"};
    } else if (pmi_rank && pmi_size) {
        info = {*pmi_rank, *pmi_size, env_local.value_or(0), true, "PMI"};
    } else if (env_rank || env_size) {
        if (!env_rank || !env_size) {
            return Status::invalid_argument(
                "environment: RANK and WORLD_SIZE must be set together (or neither)");
        }
        info = {*env_rank, *env_size, env_local.value_or(0), false, "environment"};
    } else {
        info.source = "single process";
    }
    if (info.world_size < 1 || info.rank >= info.world_size) {
        return Status::invalid_argument(str_cat("launch (", info.source, "): rank ", info.rank,
                                                " outside a world of ", info.world_size));
    }
    if (info.under_mpi) {
        // A launcher's RANK/WORLD_SIZE beside MPI's must agree with it.
        if (env_rank && *env_rank != info.rank) {
            return Status::invalid_argument(str_cat("environment: RANK=", *env_rank,
                                                    " but MPI says rank ", info.rank));
        }
        if (env_size && *env_size != info.world_size) {
            return Status::invalid_argument(str_cat("environment: WORLD_SIZE=", *env_size,
                                                    " but MPI says world size ",
                                                    info.world_size));
        }
    } else if (info.world_size > 1) {
        return Status::invalid_argument(str_cat(
            "environment: WORLD_SIZE=", info.world_size,
            " without an MPI launcher; zinfinity's ranks talk over MPI: launch with mpirun -np ",
            info.world_size, " (Open MPI)"));
    }
    return info;
}

Result<std::unique_ptr<MpiSession>> MpiSession::init(int* argc, char*** argv) {
    int initialized = 0;
    ZINF_MPI_TRY(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized != 0) return Status::internal("MPI_Init: MPI is already initialised");
    int provided = 0;
    ZINF_MPI_TRY(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::unique_ptr<MpiSession> s(new MpiSession());
    // Errors come back as codes, which become a Status naming the collective.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    ZINF_MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &s->rank_), "MPI_Comm_rank");
    ZINF_MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &s->world_size_), "MPI_Comm_size");
    return s;
}

MpiSession::~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Finalize();
}

void MpiSession::abort_job(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this is for an MPI that does
}

bool mpi_any_failed(bool failed) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0) return failed;
    int mine = failed ? 1 : 0, any = 0;
    if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) return true;
    return any != 0;
}

// ---- the communicator --------------------------------------------------------------------------

// A collective in progress, watched: past the deadline the watchdog thread reports it and ends
// the process (mpirun then stops the other ranks). One collective at a time.
struct MpiCommunicator::Impl {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Op sum_bf16 = MPI_OP_NULL, sum_fp16 = MPI_OP_NULL, max_bf16 = MPI_OP_NULL,
           max_fp16 = MPI_OP_NULL;
    std::mutex mu;
    std::condition_variable cv;
    std::uint64_t generation = 0;  // odd: a collective is in progress
    std::string what;
    bool stopping = false;
    std::chrono::milliseconds timeout{0};
    int rank = 0;
    std::thread thread;

    void watch() {
        std::unique_lock lock(mu);
        while (!stopping) {
            if (generation % 2 == 0) {
                cv.wait(lock);
                continue;
            }
            const std::uint64_t watched = generation;
            const auto deadline = std::chrono::steady_clock::now() + timeout;
            if (cv.wait_until(lock, deadline, [&] { return stopping || generation != watched; })) {
                continue;
            }
            std::fprintf(stderr,
                         "zinfinity: rank %d: MPI %s did not complete within %.0f s (another rank "
                         "failed, stopped or took another path); stopping (comm.timeout_s)\n",
                         rank, what.c_str(), static_cast<double>(timeout.count()) / 1e3);
            std::fflush(stderr);
            std::_Exit(3);
        }
    }
    void begin(std::string description) {
        std::lock_guard lock(mu);
        what = std::move(description);
        ++generation;
        cv.notify_all();
    }
    void end() {
        std::lock_guard lock(mu);
        ++generation;
        cv.notify_all();
    }
    MPI_Op op16(DType dtype, ReduceOp op) const {
        const bool bf = dtype == DType::kBFloat16;
        if (op == ReduceOp::kMax) return bf ? max_bf16 : max_fp16;
        return bf ? sum_bf16 : sum_fp16;
    }
};

namespace {

// Brackets one blocking MPI call with the watchdog.
class Watched {
public:
    Watched(MpiCommunicator::Impl* impl, std::string what) : impl_(impl) {
        if (impl_->timeout.count() > 0) impl_->begin(std::move(what));
    }
    ~Watched() {
        if (impl_->timeout.count() > 0) impl_->end();
    }

private:
    MpiCommunicator::Impl* impl_;
};

MPI_Datatype mpi_type(DType dtype) {
    return dtype == DType::kFloat32 ? MPI_FLOAT : MPI_UINT16_T;
}

const char* dtype_text(DType dtype) { return dtype_name(dtype).data(); }

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create(
    Device& device, const MpiCommunicatorOptions& options) {
    int initialized = 0;
    ZINF_MPI_TRY(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized == 0) {
        return Status::invalid_argument("MpiCommunicator: MPI is not initialised (MpiSession::init)");
    }
    if (device.kind() != DeviceKind::kCpu) {
        return Status::not_supported(
            "MpiCommunicator: CPU-device ranks only; GPU ranks use the NCCL communicator");
    }
    auto impl = std::make_unique<Impl>();
    ZINF_MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
    using kernels::bf16_to_float, kernels::float_to_bf16, kernels::fp16_to_float,
        kernels::float_to_fp16;
    MPI_Op_create(&reduce_16bit<bf16_to_float, float_to_bf16, false>, 1, &impl->sum_bf16);
    MPI_Op_create(&reduce_16bit<fp16_to_float, float_to_fp16, false>, 1, &impl->sum_fp16);
    MPI_Op_create(&reduce_16bit<bf16_to_float, float_to_bf16, true>, 1, &impl->max_bf16);
    MPI_Op_create(&reduce_16bit<fp16_to_float, float_to_fp16, true>, 1, &impl->max_fp16);
    int rank = 0, size = 1;
    ZINF_MPI_TRY(MPI_Comm_rank(impl->comm, &rank), "MPI_Comm_rank");
    ZINF_MPI_TRY(MPI_Comm_size(impl->comm, &size), "MPI_Comm_size");
    impl->timeout = options.timeout;
    impl->rank = rank;
    if (options.timeout.count() > 0) impl->thread = std::thread([p = impl.get()] { p->watch(); });
    return std::unique_ptr<MpiCommunicator>(
        new MpiCommunicator(device, options, std::move(impl), rank, size));
}

MpiCommunicator::MpiCommunicator(Device& device, const MpiCommunicatorOptions& options,
                                 std::unique_ptr<Impl> impl, int rank, int world_size)
    : device_(device),
      options_(options),
      impl_(std::move(impl)),
      rank_(rank),
      world_size_(world_size) {}

MpiCommunicator::~MpiCommunicator() {
    if (impl_->thread.joinable()) {
        {
            std::lock_guard lock(impl_->mu);
            impl_->stopping = true;
            impl_->cv.notify_all();
        }
        impl_->thread.join();
    }
    for (MPI_Op* op : {&impl_->sum_bf16, &impl_->sum_fp16, &impl_->max_bf16, &impl_->max_fp16}) {
        if (*op != MPI_OP_NULL) MPI_Op_free(op);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0 && impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
}

Status MpiCommunicator::all_gather(const void* send, void* recv, std::size_t send_numel,
                                   DType dtype, StreamId stream) {
    if (send_numel == 0) return Status::ok();
    ZINF_TRY(device_.synchronize(stream));
    ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(send_numel, "all_gather"));
    const std::size_t bytes = send_numel * dtype_size_bytes(dtype);
    // In place when the send buffer is this rank's slot of recv.
    const bool in_place = send == static_cast<const std::byte*>(recv) + rank_ * bytes;
    Watched w(impl_.get(), str_cat("all_gather of ", send_numel, " ", dtype_text(dtype), " per rank"));
    ZINF_MPI_TRY(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n,
                               mpi_type(dtype), impl_->comm),
                 "MPI_Allgather");
    return Status::ok();
}

Status MpiCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_numel,
                                       DType dtype, ReduceOp op, StreamId stream) {
    if (recv_numel == 0) return Status::ok();
    ZINF_TRY(device_.synchronize(stream));
    ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(recv_numel * world_size_, "reduce_scatter"));
    if (options_.deterministic && op != ReduceOp::kMax) {
        return rank_order_reduce_scatter(send, recv, recv_numel, dtype, op);
    }
    {
        Watched w(impl_.get(), str_cat("reduce_scatter of ", recv_numel, " ", dtype_text(dtype),
                                       " per rank"));
        const MPI_Op mop = dtype == DType::kFloat32 ? (op == ReduceOp::kMax ? MPI_MAX : MPI_SUM)
                                                    : impl_->op16(dtype, op);
        ZINF_MPI_TRY(MPI_Reduce_scatter_block(send, recv, n / world_size_, mpi_type(dtype), mop,
                                              impl_->comm),
                     "MPI_Reduce_scatter_block");
    }
    if (op == ReduceOp::kAvg) {
        for (std::size_t i = 0; i < recv_numel; ++i) {
            from_float(recv, i, dtype, to_float(recv, i, dtype) / static_cast<float>(world_size_));
        }
    }
    return Status::ok();
}

Status MpiCommunicator::all_reduce(const void* send, void* recv, std::size_t numel, DType dtype,
                                   ReduceOp op, StreamId stream) {
    if (numel == 0) return Status::ok();
    ZINF_TRY(device_.synchronize(stream));
    ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(numel, "all_reduce"));
    if (options_.deterministic && op != ReduceOp::kMax) {
        return rank_order_all_reduce(send, recv, numel, dtype, op);
    }
    {
        Watched w(impl_.get(), str_cat("all_reduce of ", numel, " ", dtype_text(dtype)));
        const MPI_Op mop = dtype == DType::kFloat32 ? (op == ReduceOp::kMax ? MPI_MAX : MPI_SUM)
                                                    : impl_->op16(dtype, op);
        ZINF_MPI_TRY(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_type(dtype),
                                   mop, impl_->comm),
                     "MPI_Allreduce");
    }
    if (op == ReduceOp::kAvg) {
        for (std::size_t i = 0; i < numel; ++i) {
            from_float(recv, i, dtype, to_float(recv, i, dtype) / static_cast<float>(world_size_));
        }
    }
    return Status::ok();
}

// Each rank receives every rank's copy of its slice and sums them in rank order in fp32.
Status MpiCommunicator::rank_order_reduce_scatter(const void* send, void* recv,
                                                  std::size_t recv_numel, DType dtype,
                                                  ReduceOp op) {
    const std::size_t eb = dtype_size_bytes(dtype);
    exchange_.resize(recv_numel * eb * world_size_);
    {
        Watched w(impl_.get(), str_cat("reduce_scatter (deterministic) of ", recv_numel, " ",
                                       dtype_text(dtype), " per rank"));
        ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(recv_numel * eb, "reduce_scatter"));
        ZINF_MPI_TRY(MPI_Alltoall(send, n, MPI_BYTE, exchange_.data(), n, MPI_BYTE, impl_->comm),
                     "MPI_Alltoall");
    }
    scratch_.assign(recv_numel, 0.0f);
    for (int r = 0; r < world_size_; ++r) {
        const std::byte* piece = exchange_.data() + static_cast<std::size_t>(r) * recv_numel * eb;
        for (std::size_t i = 0; i < recv_numel; ++i) scratch_[i] += to_float(piece, i, dtype);
    }
    const float div = op == ReduceOp::kAvg ? static_cast<float>(world_size_) : 1.0f;
    for (std::size_t i = 0; i < recv_numel; ++i) {
        from_float(recv, i, dtype, op == ReduceOp::kAvg ? scratch_[i] / div : scratch_[i]);
    }
    return Status::ok();
}

// Rank r owns piece r of the buffer (near-equal pieces): it receives every rank's copy of it
// (MPI_Alltoallv), sums them in rank order, and every rank gathers the sums (MPI_Allgatherv).
Status MpiCommunicator::rank_order_all_reduce(const void* send, void* recv, std::size_t numel,
                                              DType dtype, ReduceOp op) {
    const std::size_t eb = dtype_size_bytes(dtype);
    const auto ws = static_cast<std::size_t>(world_size_);
    std::vector<int> counts(ws), displs(ws), recv_counts(ws), recv_displs(ws);
    const std::size_t base = numel / ws, extra = numel % ws;
    std::size_t at = 0;
    for (std::size_t r = 0; r < ws; ++r) {
        const std::size_t n = base + (r < extra ? 1 : 0);
        ZINF_ASSIGN_OR_RETURN(counts[r], mpi_count(n * eb, "all_reduce"));
        ZINF_ASSIGN_OR_RETURN(displs[r], mpi_count(at * eb, "all_reduce"));
        at += n;
    }
    const std::size_t mine = static_cast<std::size_t>(counts[rank_]) / eb;
    for (std::size_t r = 0; r < ws; ++r) {
        recv_counts[r] = counts[rank_];
        recv_displs[r] = static_cast<int>(r * mine * eb);
    }
    exchange_.resize(std::max<std::size_t>(mine * eb * ws, 1));
    const std::string what =
        str_cat("all_reduce (deterministic) of ", numel, " ", dtype_text(dtype));
    {
        Watched w(impl_.get(), what);
        ZINF_MPI_TRY(MPI_Alltoallv(send, counts.data(), displs.data(), MPI_BYTE, exchange_.data(),
                                   recv_counts.data(), recv_displs.data(), MPI_BYTE, impl_->comm),
                     "MPI_Alltoallv");
    }
    scratch_.assign(mine, 0.0f);
    for (std::size_t r = 0; r < ws; ++r) {
        const std::byte* piece = exchange_.data() + r * mine * eb;
        for (std::size_t i = 0; i < mine; ++i) scratch_[i] += to_float(piece, i, dtype);
    }
    // The summed piece goes straight to its place in recv; MPI_IN_PLACE gathers the others.
    std::byte* out = static_cast<std::byte*>(recv);
    std::byte* own = out + static_cast<std::size_t>(displs[rank_]);
    const float div = static_cast<float>(world_size_);
    for (std::size_t i = 0; i < mine; ++i) {
        from_float(own, i, dtype, op == ReduceOp::kAvg ? scratch_[i] / div : scratch_[i]);
    }
    Watched w(impl_.get(), what);
    ZINF_MPI_TRY(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, out, counts.data(), displs.data(),
                                MPI_BYTE, impl_->comm),
                 "MPI_Allgatherv");
    return Status::ok();
}

Status MpiCommunicator::broadcast(void* buffer, std::size_t numel, DType dtype, int root,
                                  StreamId stream) {
    ZINF_ASSERT_GE(root, 0);
    ZINF_ASSERT_LT(root, world_size_);
    if (numel == 0) return Status::ok();
    ZINF_TRY(device_.synchronize(stream));
    ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(numel, "broadcast"));
    Watched w(impl_.get(), str_cat("broadcast of ", numel, " ", dtype_text(dtype)));
    ZINF_MPI_TRY(MPI_Bcast(buffer, n, mpi_type(dtype), root, impl_->comm), "MPI_Bcast");
    return Status::ok();
}

Status MpiCommunicator::barrier() {
    Watched w(impl_.get(), "barrier");
    ZINF_MPI_TRY(MPI_Barrier(impl_->comm), "MPI_Barrier");
    return Status::ok();
}

Status MpiCommunicator::all_gather_host(std::span<const std::byte> send, std::span<std::byte> recv) {
    ZINF_ASSERT_EQ(recv.size(), send.size() * static_cast<std::size_t>(world_size_));
    if (send.empty()) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(send.size(), "all_gather_host"));
    Watched w(impl_.get(), str_cat("all_gather of ", send.size(), " host bytes per rank"));
    ZINF_MPI_TRY(MPI_Allgather(send.data(), n, MPI_BYTE, recv.data(), n, MPI_BYTE, impl_->comm),
                 "MPI_Allgather");
    return Status::ok();
}

}  // namespace zinf::zero
