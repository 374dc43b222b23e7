// MpiCommunicator: MPI's collectives on CPU-device buffers, bounded by a watchdog.
#include "zero/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "kernels/cast.h"
#include "kernels/cpu_features.h"
#include "src/base/log.h"

namespace zinf::zero {
namespace {

Status mpi_error(int code, std::string_view what) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
    return Status::internal(
        str_cat("MPI ", what, ": error ", code, ": ", std::string(text, length)));
}

#define ZINF_MPI_TRY(call, what)                          \
    do {                                                  \
        if (const int rc_ = (call); rc_ != MPI_SUCCESS) { \
            return mpi_error(rc_, what);                  \
        }                                                 \
    } while (0)

// A non-negative integer from an environment variable; nullopt when unset.
Result<std::optional<int>> env_int(const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::optional<int>();
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < 0 || n > 1'000'000) {
        return Status::invalid_argument(
            str_cat("environment variable ", name, "='", v, "': expected a non-negative integer"));
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
        case DType::kFloat32:
            return static_cast<const float*>(base)[i];
        case DType::kBFloat16:
            return kernels::bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
        case DType::kFloat16:
            return kernels::fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    }
    return 0.0f;
}

void from_float(void* base, std::size_t i, DType dtype, float v) noexcept {
    switch (dtype) {
        case DType::kFloat32:
            static_cast<float*>(base)[i] = v;
            return;
        case DType::kBFloat16:
            static_cast<std::uint16_t*>(base)[i] = kernels::float_to_bf16(v);
            return;
        case DType::kFloat16:
            static_cast<std::uint16_t*>(base)[i] = kernels::float_to_fp16(v);
            return;
    }
}

// acc = piece 0 + piece 1 + ... in that order, in fp32 (16-bit pieces converted exactly first);
// piece r is `n` values of dtype at pieces + r * stride_bytes. Vectorisable loops.
void sum_in_rank_order(const std::byte* pieces, std::size_t stride_bytes, int count, std::size_t n,
                       DType dtype, std::vector<float>& acc, std::vector<float>& tmp) {
    acc.resize(n);
    const kernels::Isa isa = kernels::best_isa();
    const DType kd = dtype == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
    for (int r = 0; r < count; ++r) {
        const std::byte* piece = pieces + static_cast<std::size_t>(r) * stride_bytes;
        const float* values = nullptr;
        if (dtype == DType::kFloat32) {
            values = reinterpret_cast<const float*>(piece);
        } else {
            tmp.resize(n);
            kernels::cast_to_fp32(isa, std::span(reinterpret_cast<const std::uint16_t*>(piece), n),
                                  kd, std::span(tmp));
            values = tmp.data();
        }
        if (r == 0) {
            std::copy(values, values + n, acc.data());  // a copy, as accumulation's first term
        } else {
            float* a = acc.data();
            for (std::size_t i = 0; i < n; ++i) a[i] += values[i];
        }
    }
}

// Writes acc (divided by `div` unless it is 1) to out in dtype.
void store_sum(std::vector<float>& acc, float div, DType dtype, void* out) {
    if (div != 1.0f) {
        for (float& v : acc) v /= div;
    }
    if (dtype == DType::kFloat32) {
        std::copy(acc.begin(), acc.end(), static_cast<float*>(out));
        return;
    }
    kernels::cast_from_fp32(kernels::best_isa(), std::span<const float>(acc),
                            std::span(static_cast<std::uint16_t*>(out), acc.size()),
                            dtype == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat16);
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
    ZINF_ASSIGN_OR_RETURN(auto pmix_rank, env_int("PMIX_RANK"));
    ZINF_ASSIGN_OR_RETURN(auto slurm_rank, env_int("SLURM_PROCID"));
    ZINF_ASSIGN_OR_RETURN(auto slurm_size, env_int("SLURM_NTASKS"));
    if (ompi_rank && ompi_size) {
        info = {*ompi_rank, *ompi_size, ompi_local.value_or(0), true, "mpirun"};
    } else if (pmi_rank && pmi_size) {
        info = {*pmi_rank, *pmi_size, env_local.value_or(0), true, "PMI"};
    } else if (slurm_rank && slurm_size && *slurm_size > 1) {
        info = {*slurm_rank, *slurm_size, env_local.value_or(0), true, "srun"};
    } else if (pmix_rank) {
        // PMIx gives the rank but no size variable: MPI_Init tells.
        info = {*pmix_rank, *pmix_rank + 1, env_local.value_or(0), true, "PMIx"};
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
            return Status::invalid_argument(
                str_cat("environment: RANK=", *env_rank, " but MPI says rank ", info.rank));
        }
        if (env_size && *env_size != info.world_size) {
            return Status::invalid_argument(str_cat("environment: WORLD_SIZE=", *env_size,
                                                    " but MPI says world size ", info.world_size));
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
    // The local rank: this rank's place among the ranks that share its node's memory.
    MPI_Comm node = MPI_COMM_NULL;
    ZINF_MPI_TRY(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s->rank_, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
    const int rc = MPI_Comm_rank(node, &s->local_rank_);
    MPI_Comm_free(&node);
    ZINF_MPI_TRY(rc, "MPI_Comm_rank(node)");
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
// A collective in progress, watched: past the deadline the watchdog thread reports it and ends
// the process (mpirun then stops the other ranks). The hot path (begin/end) only stores atomics;
// the watchdog looks every poll interval, so a hang is caught between timeout and timeout plus
// one interval, and no collective pays for a wake-up.
struct MpiCommunicator::Impl {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Op sum_bf16 = MPI_OP_NULL, sum_fp16 = MPI_OP_NULL, max_bf16 = MPI_OP_NULL,
           max_fp16 = MPI_OP_NULL;
    std::atomic<std::uint64_t> generation{0};  // odd: a collective is in progress
    std::atomic<std::int64_t> started_ns{0};
    std::atomic<const char*> what{""};  // a string literal naming the collective
    std::atomic<std::size_t> numel{0};  // its size (elements per rank, or bytes)
    std::mutex mu;
    std::condition_variable cv;
    bool stopping = false;
    std::chrono::milliseconds timeout{0};
    int rank = 0;
    std::thread thread;

    static std::int64_t now_ns() {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }
    void watch() {
        const auto poll = std::clamp<std::chrono::milliseconds>(
            timeout / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
        std::unique_lock lock(mu);
        std::uint64_t seen = 0;
        while (!cv.wait_for(lock, poll, [&] { return stopping; })) {
            const std::uint64_t g = generation.load(std::memory_order_acquire);
            if (g % 2 == 0 || g != seen) {
                seen = g;  // idle, or a collective began since the last look: look again later
                if (g % 2 == 0) continue;
            }
            const std::int64_t waited = now_ns() - started_ns.load(std::memory_order_relaxed);
            if (waited < std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count())
                continue;
            if (generation.load(std::memory_order_acquire) != g) continue;
            std::fprintf(stderr,
                         "zinfinity: rank %d: MPI %s of %zu did not complete within %.0f s "
                         "(another rank failed, stopped or took another path); stopping "
                         "(comm.timeout_s)\n",
                         rank, what.load(), numel.load(),
                         static_cast<double>(timeout.count()) / 1e3);
            std::fflush(stderr);
            std::_Exit(3);
        }
    }
    void begin(const char* description, std::size_t count) {
        what.store(description, std::memory_order_relaxed);
        numel.store(count, std::memory_order_relaxed);
        started_ns.store(now_ns(), std::memory_order_relaxed);
        generation.fetch_add(1, std::memory_order_release);
    }
    void end() { generation.fetch_add(1, std::memory_order_release); }
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
    Watched(MpiCommunicator::Impl* impl, const char* what, std::size_t numel) : impl_(impl) {
        if (impl_->timeout.count() > 0) impl_->begin(what, numel);
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

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create(
    Device& device, const MpiCommunicatorOptions& options) {
    int initialized = 0;
    ZINF_MPI_TRY(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized == 0) {
        return Status::invalid_argument(
            "MpiCommunicator: MPI is not initialised (MpiSession::init)");
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
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) return;  // MPI freed everything already
    for (MPI_Op* op : {&impl_->sum_bf16, &impl_->sum_fp16, &impl_->max_bf16, &impl_->max_fp16}) {
        if (*op != MPI_OP_NULL) MPI_Op_free(op);
    }
    if (impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
}

Status MpiCommunicator::all_gather(const void* send, void* recv, std::size_t send_numel,
                                   DType dtype, StreamId stream) {
    if (send_numel == 0) return Status::ok();
    ZINF_TRY(device_.synchronize(stream));
    ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(send_numel, "all_gather"));
    const std::size_t bytes = send_numel * dtype_size_bytes(dtype);
    // In place when the send buffer is this rank's slot of recv.
    const bool in_place = send == static_cast<const std::byte*>(recv) + rank_ * bytes;
    Watched w(impl_.get(), "all_gather", send_numel);
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
    // Sums always go through the exchange and a rank-order sum: deterministic, and faster than
    // Open MPI 4.1's MPI_Reduce_scatter_block here (2.7x at 1 MiB, 40x at 4 MiB on 2 ranks:
    // docs/PERFORMANCE.md), whose large-message algorithm stalls.
    if (op != ReduceOp::kMax) return rank_order_reduce_scatter(send, recv, recv_numel, dtype, op);
    Watched w(impl_.get(), "reduce_scatter (max)", recv_numel);
    const MPI_Op mop = dtype == DType::kFloat32 ? MPI_MAX : impl_->op16(dtype, op);
    ZINF_MPI_TRY(
        MPI_Reduce_scatter_block(send, recv, n / world_size_, mpi_type(dtype), mop, impl_->comm),
        "MPI_Reduce_scatter_block");
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
        Watched w(impl_.get(), "all_reduce", numel);
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
        Watched w(impl_.get(), "reduce_scatter (rank order)", recv_numel);
        ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(recv_numel, "reduce_scatter"));
        ZINF_MPI_TRY(MPI_Alltoall(send, n, mpi_type(dtype), exchange_.data(), n, mpi_type(dtype),
                                  impl_->comm),
                     "MPI_Alltoall");
    }
    sum_in_rank_order(exchange_.data(), recv_numel * eb, world_size_, recv_numel, dtype, scratch_,
                      convert_);
    store_sum(scratch_, op == ReduceOp::kAvg ? static_cast<float>(world_size_) : 1.0f, dtype, recv);
    return Status::ok();
}

// Rank r owns piece r of the buffer (near-equal pieces): it receives every rank's copy of it
// (MPI_Alltoallv), sums them in rank order, and every rank gathers the sums (MPI_Allgatherv).
Status MpiCommunicator::rank_order_all_reduce(const void* send, void* recv, std::size_t numel,
                                              DType dtype, ReduceOp op) {
    const std::size_t eb = dtype_size_bytes(dtype);
    const auto ws = static_cast<std::size_t>(world_size_);
    // Counts and offsets in elements (of MPI_FLOAT or MPI_UINT16_T): int-sized like MPI's own.
    std::vector<int> counts(ws), displs(ws), recv_counts(ws), recv_displs(ws);
    const std::size_t base = numel / ws, extra = numel % ws;
    std::size_t at = 0;
    for (std::size_t r = 0; r < ws; ++r) {
        const std::size_t n = base + (r < extra ? 1 : 0);
        ZINF_ASSIGN_OR_RETURN(counts[r], mpi_count(n, "all_reduce"));
        ZINF_ASSIGN_OR_RETURN(displs[r], mpi_count(at, "all_reduce"));
        at += n;
    }
    const auto mine = static_cast<std::size_t>(counts[rank_]);
    for (std::size_t r = 0; r < ws; ++r) {
        recv_counts[r] = counts[rank_];
        ZINF_ASSIGN_OR_RETURN(recv_displs[r], mpi_count(r * mine, "all_reduce"));
    }
    exchange_.resize(std::max<std::size_t>(mine * eb * ws, 1));
    const MPI_Datatype type = mpi_type(dtype);
    {
        Watched w(impl_.get(), "all_reduce (deterministic)", numel);
        ZINF_MPI_TRY(MPI_Alltoallv(send, counts.data(), displs.data(), type, exchange_.data(),
                                   recv_counts.data(), recv_displs.data(), type, impl_->comm),
                     "MPI_Alltoallv");
    }
    sum_in_rank_order(exchange_.data(), mine * eb, world_size_, mine, dtype, scratch_, convert_);
    // The summed piece goes straight to its place in recv; MPI_IN_PLACE gathers the others.
    std::byte* out = static_cast<std::byte*>(recv);
    store_sum(scratch_, op == ReduceOp::kAvg ? static_cast<float>(world_size_) : 1.0f, dtype,
              out + static_cast<std::size_t>(displs[rank_]) * eb);
    Watched w(impl_.get(), "all_reduce (deterministic)", numel);
    ZINF_MPI_TRY(
        MPI_Allgatherv(MPI_IN_PLACE, 0, type, out, counts.data(), displs.data(), type, impl_->comm),
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
    Watched w(impl_.get(), "broadcast", numel);
    ZINF_MPI_TRY(MPI_Bcast(buffer, n, mpi_type(dtype), root, impl_->comm), "MPI_Bcast");
    return Status::ok();
}

Status MpiCommunicator::barrier() {
    Watched w(impl_.get(), "barrier", 0);
    ZINF_MPI_TRY(MPI_Barrier(impl_->comm), "MPI_Barrier");
    return Status::ok();
}

Status MpiCommunicator::all_gather_host(std::span<const std::byte> send,
                                        std::span<std::byte> recv) {
    ZINF_ASSERT_EQ(recv.size(), send.size() * static_cast<std::size_t>(world_size_));
    if (send.empty()) return Status::ok();
    ZINF_ASSIGN_OR_RETURN(const int n, mpi_count(send.size(), "all_gather_host"));
    Watched w(impl_.get(), "all_gather (host bytes)", send.size());
    ZINF_MPI_TRY(MPI_Allgather(send.data(), n, MPI_BYTE, recv.data(), n, MPI_BYTE, impl_->comm),
                 "MPI_Allgather");
    return Status::ok();
}

}  // namespace zinf::zero
