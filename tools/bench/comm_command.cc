// `zinfinity-bench comm` (under mpirun -np N): all-reduce, reduce-scatter and all-gather over
// zinfinity's MPI communicator against the plain MPI call of the same collective on the same
// bytes, in alternated rounds of the same run. Bandwidth by nccl-tests' convention: algbw =
// size / time, where size is the collective's whole buffer (all-reduce: the buffer; all-gather:
// what each rank receives; reduce-scatter: what each rank sends), and busbw = algbw x 2(N-1)/N
// for all-reduce, x (N-1)/N for the other two: the bytes each rank's link carries per second.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "src/base/device_buffer.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/device/cpu_device.h"
#include "tools/bench/commands.h"
#include "tools/bench/stats.h"
#include "tools/cli/args.h"
#include "zero/mpi_communicator.h"

namespace zinf::bench {
namespace {

enum class Op { kAllReduce, kReduceScatter, kAllGather };

const char* op_name(Op op) {
    switch (op) {
        case Op::kAllReduce: return "all_reduce";
        case Op::kReduceScatter: return "reduce_scatter";
        case Op::kAllGather: return "all_gather";
    }
    return "?";
}

double bus_factor(Op op, int n) {
    if (n <= 1) return 1.0;
    const double f = static_cast<double>(n - 1) / n;
    return op == Op::kAllReduce ? 2.0 * f : f;
}

struct CommOptions {
    std::vector<Op> ops;
    std::vector<std::uint64_t> sizes;
    DType dtype = DType::kFloat32;
    int iters = 20;
    int warmup = 3;
    int rounds = 5;
    bool deterministic = false;
    double min_ratio = 0;
};

void declare_flags(cli::Args& args) {
    args.add("op", "all", "all_reduce, reduce_scatter, all_gather, or all");
    args.add("sizes", "4KiB,64KiB,1MiB,4MiB,16MiB,64MiB",
             "message sizes (the collective's whole buffer, nccl-tests' convention)");
    args.add("dtype", "fp32", "fp32, bf16 or fp16 (16-bit sums: a user-defined MPI operation on\n"
                              "both sides)");
    args.add("iters", "20", "collectives per timed batch");
    args.add("warmup", "3", "untimed collectives before each batch");
    args.add("rounds", "5", "alternated (ours, MPI) batches per size; medians reported");
    args.add_switch("deterministic", "zinfinity's rank-order reduction (comm.deterministic)");
    args.add("min-ratio", "0",
             "exit with status 1 when a size >= 1 MiB has a median ours/MPI busbw ratio\n"
             "below this (0: report only)");
}

Result<CommOptions> parse_options(const cli::Args& args) {
    CommOptions o;
    ZINF_ASSIGN_OR_RETURN(
        const std::string op,
        args.get_choice("op", {"all", "all_reduce", "reduce_scatter", "all_gather"}));
    for (Op k : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
        if (op == "all" || op == op_name(k)) o.ops.push_back(k);
    }
    ZINF_ASSIGN_OR_RETURN(o.sizes, args.get_size_list("sizes"));
    if (o.sizes.empty()) return Status::invalid_argument("--sizes: expected at least one size");
    ZINF_ASSIGN_OR_RETURN(const std::string dtype,
                          args.get_choice("dtype", {"fp32", "bf16", "fp16"}));
    o.dtype = dtype == "fp32"   ? DType::kFloat32
              : dtype == "bf16" ? DType::kBFloat16
                                : DType::kFloat16;
    ZINF_ASSIGN_OR_RETURN(const std::int64_t iters, args.get_int("iters", 1, 100000));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t warmup, args.get_int("warmup", 0, 100000));
    ZINF_ASSIGN_OR_RETURN(const std::int64_t rounds, args.get_int("rounds", 1, 1000));
    o.iters = static_cast<int>(iters);
    o.warmup = static_cast<int>(warmup);
    o.rounds = static_cast<int>(rounds);
    o.deterministic = args.get_switch("deterministic");
    ZINF_ASSIGN_OR_RETURN(o.min_ratio, args.get_double("min-ratio", 0.0, 10.0));
    return o;
}

// The baseline's 16-bit sum: fp32 addition rounded back, the same arithmetic as the
// communicator's own MPI operation.
template <bool kBf16>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const std::uint16_t*>(in);
    auto* b = static_cast<std::uint16_t*>(inout);
    for (int i = 0; i < *len; ++i) {
        if constexpr (kBf16) {
            b[i] =
                kernels::float_to_bf16(kernels::bf16_to_float(a[i]) + kernels::bf16_to_float(b[i]));
        } else {
            b[i] =
                kernels::float_to_fp16(kernels::fp16_to_float(a[i]) + kernels::fp16_to_float(b[i]));
        }
    }
}

// Seconds per collective of `batch`, the slowest rank's.
template <typename Fn>
Result<double> timed(const CommOptions& o, MPI_Comm comm, Fn batch) {
    for (int i = 0; i < o.warmup; ++i) ZINF_TRY(batch());
    MPI_Barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) ZINF_TRY(batch());
    double mine =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
    double slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    return slowest;
}

Status run(const CommOptions& o) {
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    int rank = 0, n = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &n);
    const std::uint64_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
    device::CpuDeviceOptions dopt;
    dopt.budget_bytes = 4 * max_size + (64 << 20) + static_cast<std::size_t>(n) * 64;
    ZINF_ASSIGN_OR_RETURN(auto device, device::CpuDevice::create(dopt));
    zero::MpiCommunicatorOptions co;
    co.deterministic = o.deterministic;
    ZINF_ASSIGN_OR_RETURN(auto ours, zero::MpiCommunicator::create(*device, co));
    const std::size_t eb = dtype_size_bytes(o.dtype);
    // Sizes round up to a multiple of the ranks' elements: room for that.
    const std::size_t capacity = max_size + static_cast<std::size_t>(n) * 4 + 64;
    ZINF_ASSIGN_OR_RETURN(auto send, DeviceBuffer::allocate(*device, capacity, "send"));
    ZINF_ASSIGN_OR_RETURN(auto recv, DeviceBuffer::allocate(*device, capacity, "recv"));
    // Both sides run on the same buffers (the CPU device's memory is host memory): the
    // comparison is of the calls, not of where the bytes sit.
    std::vector<std::byte> initial(capacity);
    // Small values (1.0 in every dtype): sums stay finite at any world size.
    for (std::size_t i = 0; i + eb <= capacity; i += eb) {
        const std::uint16_t one16 = o.dtype == DType::kBFloat16 ? 0x3F80 : 0x3C00;
        const float one = 1.0f;
        std::memcpy(initial.data() + i, o.dtype == DType::kFloat32 ? static_cast<const void*>(&one)
                                                                      : static_cast<const void*>(&one16),
                    eb);
    }
    std::memcpy(send.data(), initial.data(), capacity);
    MPI_Op op16 = MPI_OP_NULL;
    if (o.dtype == DType::kBFloat16) MPI_Op_create(&sum16<true>, 1, &op16);
    if (o.dtype == DType::kFloat16) MPI_Op_create(&sum16<false>, 1, &op16);
    const MPI_Datatype type = o.dtype == DType::kFloat32 ? MPI_FLOAT : MPI_UINT16_T;
    const MPI_Op sum = o.dtype == DType::kFloat32 ? MPI_SUM : op16;

    if (rank == 0) {
        std::printf("zinfinity-bench comm: %d rank(s), %s, communicator %s; %d iterations x %d "
                    "alternated rounds, medians; busbw by nccl-tests' convention\n",
                    n, dtype_name(o.dtype).data(), std::string(ours->name()).c_str(), o.iters,
                    o.rounds);
        std::printf("%-15s %10s %12s %12s %12s %12s %9s\n", "op", "size", "ours time",
                    "ours busbw", "MPI time", "MPI busbw", "ours/MPI");
    }
    double worst = 1e9;
    std::string worst_at;
    for (Op op : o.ops) {
        for (std::uint64_t size : o.sizes) {
            // Elements divisible by the ranks, rounded up so that the bytes are at least `size`.
            const std::size_t count = std::max<std::size_t>(1, (size / eb + n - 1) / n) * n;
            const std::size_t per_rank = count / n;
            auto ours_once = [&]() -> Status {
                switch (op) {
                    case Op::kAllReduce:
                        return ours->all_reduce(send.data(), send.data(), count, o.dtype,
                                                zero::ReduceOp::kSum, 0);
                    case Op::kReduceScatter:
                        return ours->reduce_scatter(send.data(), recv.data(), per_rank, o.dtype,
                                                    zero::ReduceOp::kSum, 0);
                    case Op::kAllGather:
                        return ours->all_gather(send.data(), recv.data(), per_rank, o.dtype, 0);
                }
                return Status::ok();
            };
            auto plain_once = [&]() -> Status {
                int rc = MPI_SUCCESS;
                const int c = static_cast<int>(count), pr = static_cast<int>(per_rank);
                switch (op) {
                    case Op::kAllReduce:
                        rc = MPI_Allreduce(MPI_IN_PLACE, send.data(), c, type, sum, comm);
                        break;
                    case Op::kReduceScatter:
                        rc = MPI_Reduce_scatter_block(send.data(), recv.data(), pr, type, sum, comm);
                        break;
                    case Op::kAllGather:
                        rc = MPI_Allgather(send.data(), pr, type, recv.data(), pr, type, comm);
                        break;
                }
                return rc == MPI_SUCCESS ? Status::ok() : Status::internal("MPI collective failed");
            };
            std::vector<double> t_ours, t_plain, ratios;
            for (int r = 0; r < o.rounds; ++r) {
                double a = 0, b = 0;
                if (r % 2 == 0) {
                    ZINF_ASSIGN_OR_RETURN(a, timed(o, comm, ours_once));
                    ZINF_ASSIGN_OR_RETURN(b, timed(o, comm, plain_once));
                } else {
                    ZINF_ASSIGN_OR_RETURN(b, timed(o, comm, plain_once));
                    ZINF_ASSIGN_OR_RETURN(a, timed(o, comm, ours_once));
                }
                t_ours.push_back(a);
                t_plain.push_back(b);
                ratios.push_back(b / a);  // busbw ratio = inverse time ratio
                // The sums grow each iteration: start each round from the same values.
                std::memcpy(send.data(), initial.data(), capacity);
            }
            const double bytes = static_cast<double>(count * eb);
            const double to = median(t_ours), tp = median(t_plain), ratio = median(ratios);
            const double f = bus_factor(op, n);
            if (rank == 0) {
                std::printf("%-15s %10s %9.1f us %7.2f GB/s %9.1f us %7.2f GB/s %9.3f\n",
                            op_name(op), format_bytes(count * eb).c_str(), to * 1e6,
                            bytes / to * f / 1e9, tp * 1e6, bytes / tp * f / 1e9, ratio);
            }
            if (count * eb >= (1u << 20) && ratio < worst) {
                worst = ratio;
                worst_at = str_cat(op_name(op), " ", format_bytes(count * eb));
            }
        }
    }
    if (rank == 0 && !worst_at.empty()) {
        std::printf("worst ours/MPI busbw ratio at >= 1 MiB: %.3f (%s)%s\n", worst, worst_at.c_str(),
                    o.min_ratio > 0 ? (worst >= o.min_ratio ? "; --min-ratio met" : "; --min-ratio NOT met") : "");
    }
    std::fflush(stdout);
    if (op16 != MPI_OP_NULL) MPI_Op_free(&op16);
    MPI_Comm_free(&comm);
    if (o.min_ratio > 0 && !worst_at.empty() && worst < o.min_ratio) {
        return Status::internal(str_cat("ours/MPI ratio ", worst, " below --min-ratio ", o.min_ratio));
    }
    return Status::ok();
}

}  // namespace

int run_comm(int argc, char** argv) {
    cli::Args args(
        "mpirun -np N zinfinity-bench comm [flags]",
        "Bus bandwidth of all-reduce, reduce-scatter and all-gather over zinfinity's MPI\n"
        "communicator against the plain MPI call of the same collective, per message size.");
    declare_flags(args);
    if (auto exit_code = args.parse_or_exit(argc, argv, "zinfinity-bench comm")) return *exit_code;
    auto options = parse_options(args);
    if (!options.has_value()) {
        std::fprintf(stderr, "zinfinity-bench comm: %s\n", options.error().to_string().c_str());
        return 2;
    }
    auto session = zero::MpiSession::init(&argc, &argv);
    if (!session.has_value()) {
        std::fprintf(stderr, "zinfinity-bench comm: %s\n", session.error().to_string().c_str());
        return 1;
    }
    const Status s = run(*options);
    if (!s.is_ok()) {
        std::fprintf(stderr, "zinfinity-bench comm: rank %d: %s\n", (*session)->rank(),
                     s.to_string().c_str());
        if ((*session)->world_size() > 1) zero::MpiSession::abort_job(1);
        return 1;
    }
    return 0;
}

}  // namespace zinf::bench
