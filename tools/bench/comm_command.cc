// `zinfinity-bench comm` (under mpirun -np N): all-reduce, reduce-scatter and all-gather over
// zinfinity's MPI communicator against the plain MPI call of the same collective on the same
// bytes, in alternated rounds of the same run. Bandwidth by nccl-tests' convention: algbw =
// size / time, where size is the collective's whole buffer (all-reduce: the buffer; all-gather:
// what each rank receives; reduce-scatter: what each rank sends), and busbw = algbw x 2(N-1)/N
// for all-reduce, x (N-1)/N for the other two: the bytes each rank's link carries per second.
// With --profile FILE the times of ours (fp32) go into a machine profile that `zinfinity-bench
// profile` wrote, for the planner's step time over that many ranks.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cast.h"
#include "src/base/device_buffer.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/device/cpu_device.h"
#include "src/engine/step_prediction.h"
#include "tools/bench/commands.h"
#include "tools/bench/stats.h"
#include "tools/cli/args.h"
#include "zero/mpi_communicator.h"

namespace zinf::bench {
namespace {

enum class Op { kAllReduce, kReduceScatter, kAllGather };

const char* op_name(Op op) {
    switch (op) {
        case Op::kAllReduce:
            return "all_reduce";
        case Op::kReduceScatter:
            return "reduce_scatter";
        case Op::kAllGather:
            return "all_gather";
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
    std::string profile;  // a machine profile to add the collectives to ("": none)
};

void declare_flags(cli::Args& args) {
    args.add("op", "all", "all_reduce, reduce_scatter, all_gather, or all");
    args.add("sizes", "4KiB,64KiB,1MiB,4MiB,16MiB,64MiB",
             "message sizes (the collective's whole buffer, nccl-tests' convention)");
    args.add("dtype", "fp32",
             "fp32, bf16 or fp16 (16-bit sums: a user-defined MPI operation on\n"
             "both sides)");
    args.add("iters", "20", "collectives per timed batch");
    args.add("warmup", "3", "untimed collectives before each batch");
    args.add("rounds", "5", "alternated (ours, MPI) batches per size; medians reported");
    args.add_switch("deterministic", "zinfinity's rank-order reduction (comm.deterministic)");
    args.add("min-ratio", "0",
             "exit with status 1 when a size >= 1 MiB has a median ours/MPI busbw ratio\n"
             "below this (0: report only)");
    args.add("profile", "",
             "a machine profile (zinfinity-bench profile --out FILE): rank 0 adds ours'\n"
             "seconds per call at each size for this many ranks (fp32), replacing earlier\n"
             "figures of the same collective and rank count; zinfinity-plan --ranks N\n"
             "--profile FILE then counts the collectives in the step time");
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
    o.profile = args.get("profile");
    if (!o.profile.empty() && o.dtype != DType::kFloat32) {
        return Status::invalid_argument(
            "--profile records fp32 collectives (the planner's figures); drop --dtype");
    }
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

// What both sides run on: the duplicated world communicator, the CPU device and zinfinity's
// communicator over it, the buffers, and the baseline's datatype and sum. The MPI handles are
// freed by free_mpi_handles() at the end of a run that measured every size (after a failure
// the job ends).
struct CommRig {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0;
    int n = 1;  // ranks
    std::unique_ptr<device::CpuDevice> device;
    std::unique_ptr<zero::MpiCommunicator> ours;
    std::size_t element_bytes = 0;
    std::size_t capacity = 0;  // bytes of each buffer
    DeviceBuffer send;
    DeviceBuffer recv;
    std::vector<std::byte> initial;  // what `send` holds at the start of each round
    MPI_Op op16 = MPI_OP_NULL;       // the 16-bit sum, for bf16 and fp16
    MPI_Datatype type = MPI_FLOAT;
    MPI_Op sum = MPI_SUM;

    void free_mpi_handles() {
        if (op16 != MPI_OP_NULL) MPI_Op_free(&op16);
        MPI_Comm_free(&comm);
    }
};

// Set up: the communicators, the device and its buffers, filled with ones.
Result<CommRig> set_up(const CommOptions& o) {
    CommRig r;
    MPI_Comm_dup(MPI_COMM_WORLD, &r.comm);
    MPI_Comm_rank(r.comm, &r.rank);
    MPI_Comm_size(r.comm, &r.n);
    const std::uint64_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
    device::CpuDeviceOptions dopt;
    dopt.budget_bytes = 4 * max_size + (64 << 20) + static_cast<std::size_t>(r.n) * 64;
    ZINF_ASSIGN_OR_RETURN(r.device, device::CpuDevice::create(dopt));
    zero::MpiCommunicatorOptions co;
    co.deterministic = o.deterministic;
    ZINF_ASSIGN_OR_RETURN(r.ours, zero::MpiCommunicator::create(*r.device, co));
    const std::size_t eb = dtype_size_bytes(o.dtype);
    r.element_bytes = eb;
    // Sizes round up to a multiple of the ranks' elements: room for that.
    r.capacity = max_size + static_cast<std::size_t>(r.n) * 4 + 64;
    ZINF_ASSIGN_OR_RETURN(r.send, DeviceBuffer::allocate(*r.device, r.capacity, "send"));
    ZINF_ASSIGN_OR_RETURN(r.recv, DeviceBuffer::allocate(*r.device, r.capacity, "recv"));
    // Both sides run on the same buffers (the CPU device's memory is host memory): the
    // comparison is of the calls, not of where the bytes sit.
    r.initial.resize(r.capacity);
    // Small values (1.0 in every dtype): sums stay finite at any world size.
    for (std::size_t i = 0; i + eb <= r.capacity; i += eb) {
        const std::uint16_t one16 = o.dtype == DType::kBFloat16 ? 0x3F80 : 0x3C00;
        const float one = 1.0f;
        std::memcpy(r.initial.data() + i,
                    o.dtype == DType::kFloat32 ? static_cast<const void*>(&one)
                                               : static_cast<const void*>(&one16),
                    eb);
    }
    std::memcpy(r.send.data(), r.initial.data(), r.capacity);
    if (o.dtype == DType::kBFloat16) MPI_Op_create(&sum16<true>, 1, &r.op16);
    if (o.dtype == DType::kFloat16) MPI_Op_create(&sum16<false>, 1, &r.op16);
    r.type = o.dtype == DType::kFloat32 ? MPI_FLOAT : MPI_UINT16_T;
    r.sum = o.dtype == DType::kFloat32 ? MPI_SUM : r.op16;
    return r;
}

// One collective of `count` elements (per_rank of them each rank's share) through ours.
Status ours_once(const CommOptions& o, CommRig& r, Op op, std::size_t count, std::size_t per_rank) {
    switch (op) {
        case Op::kAllReduce:
            return r.ours->all_reduce(r.send.data(), r.send.data(), count, o.dtype,
                                      zero::ReduceOp::kSum, 0);
        case Op::kReduceScatter:
            return r.ours->reduce_scatter(r.send.data(), r.recv.data(), per_rank, o.dtype,
                                          zero::ReduceOp::kSum, 0);
        case Op::kAllGather:
            return r.ours->all_gather(r.send.data(), r.recv.data(), per_rank, o.dtype, 0);
    }
    return Status::ok();
}

// The same collective through plain MPI.
Status plain_once(CommRig& r, Op op, std::size_t count, std::size_t per_rank) {
    int rc = MPI_SUCCESS;
    const int c = static_cast<int>(count), pr = static_cast<int>(per_rank);
    switch (op) {
        case Op::kAllReduce:
            rc = MPI_Allreduce(MPI_IN_PLACE, r.send.data(), c, r.type, r.sum, r.comm);
            break;
        case Op::kReduceScatter:
            rc = MPI_Reduce_scatter_block(r.send.data(), r.recv.data(), pr, r.type, r.sum, r.comm);
            break;
        case Op::kAllGather:
            rc = MPI_Allgather(r.send.data(), pr, r.type, r.recv.data(), pr, r.type, r.comm);
            break;
    }
    return rc == MPI_SUCCESS ? Status::ok() : Status::internal("MPI collective failed");
}

// The medians of one collective at one size.
struct SizeFigures {
    std::size_t bytes = 0;  // count x element bytes: the size rounded up to whole ranks' shares
    double ours_s = 0;      // per collective
    double plain_s = 0;
    double ratio = 0;  // ours/MPI busbw (the inverse time ratio)
};

// Measure: --rounds alternated (ours, MPI) batches of one collective at one size.
Result<SizeFigures> measure_size(const CommOptions& o, CommRig& r, Op op, std::uint64_t size) {
    const std::size_t eb = r.element_bytes;
    // Elements divisible by the ranks, rounded up so that the bytes are at least `size`.
    const std::size_t count = std::max<std::size_t>(1, (size / eb + r.n - 1) / r.n) * r.n;
    const std::size_t per_rank = count / r.n;
    const auto ours = [&] { return ours_once(o, r, op, count, per_rank); };
    const auto plain = [&] { return plain_once(r, op, count, per_rank); };
    std::vector<double> t_ours, t_plain, ratios;
    for (int round = 0; round < o.rounds; ++round) {
        double a = 0, b = 0;
        if (round % 2 == 0) {
            ZINF_ASSIGN_OR_RETURN(a, timed(o, r.comm, ours));
            ZINF_ASSIGN_OR_RETURN(b, timed(o, r.comm, plain));
        } else {
            ZINF_ASSIGN_OR_RETURN(b, timed(o, r.comm, plain));
            ZINF_ASSIGN_OR_RETURN(a, timed(o, r.comm, ours));
        }
        t_ours.push_back(a);
        t_plain.push_back(b);
        ratios.push_back(b / a);  // busbw ratio = inverse time ratio
        // The sums grow each iteration: start each round from the same values.
        std::memcpy(r.send.data(), r.initial.data(), r.capacity);
    }
    return SizeFigures{count * eb, median(t_ours), median(t_plain), median(ratios)};
}

// Report, rank 0: one row per collective and size.
void print_row(const CommRig& r, Op op, const SizeFigures& f) {
    if (r.rank != 0) return;
    const double bytes = static_cast<double>(f.bytes);
    const double bus = bus_factor(op, r.n);
    std::printf("%-15s %10s %9.1f us %7.2f GB/s %9.1f us %7.2f GB/s %9.3f\n", op_name(op),
                format_bytes(f.bytes).c_str(), f.ours_s * 1e6, bytes / f.ours_s * bus / 1e9,
                f.plain_s * 1e6, bytes / f.plain_s * bus / 1e9, f.ratio);
}

// Rank 0: `figures` (per op, per size) into the profile at o.profile, written to a temporary
// name and renamed over it.
Status add_to_profile(const CommOptions& o, engine::MachineProfile profile, int ranks,
                      const std::vector<std::pair<Op, SizeFigures>>& figures) {
    std::erase_if(profile.collectives, [&](const engine::MachineProfile::Collective& c) {
        if (c.ranks != ranks) return false;
        return std::any_of(o.ops.begin(), o.ops.end(), [&](Op op) { return c.op == op_name(op); });
    });
    for (const auto& [op, f] : figures) {
        profile.collectives.push_back({op_name(op), ranks, f.bytes, f.ours_s});
    }
    ZINF_TRY(engine::save_profile(profile, o.profile));
    std::printf("collectives of %d ranks (%zu figures) added to %s\n", ranks, figures.size(),
                o.profile.c_str());
    return Status::ok();
}

Status run(const CommOptions& o) {
    // The profile is read before anything is measured: a bad path fails at once, on every rank.
    std::optional<engine::MachineProfile> profile;
    if (!o.profile.empty()) {
        auto loaded = engine::load_profile(o.profile);
        if (!loaded.has_value()) return loaded.error().with_context("--profile");
        profile = std::move(loaded).value();
    }
    ZINF_ASSIGN_OR_RETURN(CommRig rig, set_up(o));
    if (rig.rank == 0) {
        std::printf(
            "zinfinity-bench comm: %d rank(s), %s, communicator %s; %d iterations x %d "
            "alternated rounds, medians; busbw by nccl-tests' convention\n",
            rig.n, dtype_name(o.dtype).data(), std::string(rig.ours->name()).c_str(), o.iters,
            o.rounds);
        std::printf("%-15s %10s %12s %12s %12s %12s %9s\n", "op", "size", "ours time", "ours busbw",
                    "MPI time", "MPI busbw", "ours/MPI");
    }
    double worst = 1e9;
    std::string worst_at;
    std::vector<std::pair<Op, SizeFigures>> figures;
    for (Op op : o.ops) {
        for (std::uint64_t size : o.sizes) {
            ZINF_ASSIGN_OR_RETURN(const SizeFigures f, measure_size(o, rig, op, size));
            print_row(rig, op, f);
            figures.emplace_back(op, f);
            if (f.bytes >= (1u << 20) && f.ratio < worst) {
                worst = f.ratio;
                worst_at = str_cat(op_name(op), " ", format_bytes(f.bytes));
            }
        }
    }
    if (rig.rank == 0 && !worst_at.empty()) {
        std::printf(
            "worst ours/MPI busbw ratio at >= 1 MiB: %.3f (%s)%s\n", worst, worst_at.c_str(),
            o.min_ratio > 0 ? (worst >= o.min_ratio ? "; --min-ratio met" : "; --min-ratio NOT met")
                            : "");
    }
    if (profile.has_value() && rig.rank == 0) {
        ZINF_TRY(add_to_profile(o, std::move(*profile), rig.n, figures));
    }
    std::fflush(stdout);
    rig.free_mpi_handles();
    if (o.min_ratio > 0 && !worst_at.empty() && worst < o.min_ratio) {
        return Status::internal(
            str_cat("ours/MPI ratio ", worst, " below --min-ratio ", o.min_ratio));
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
