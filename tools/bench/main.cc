// zinfinity-bench: dispatches to its subcommands.
#include <cstdio>
#include <cstring>

#include "tools/bench/commands.h"

namespace {

using zinf::bench::Command;

int run_version(int, char**) {
    std::printf("zinfinity-bench %s\n", ZINF_VERSION);
    return 0;
}

const Command kCommands[] = {
    {"version", "print the version", run_version},
#ifdef ZINF_BENCH_HAVE_IO
    {"io", "measure read or write GB/s of one configuration (optionally against fio)",
     zinf::bench::run_io},
    {"sweep", "grid over backends x block sizes x queue depths x threads; prints a table",
     zinf::bench::run_sweep},
    {"tune", "find the best aio settings and write them as a config snippet",
     zinf::bench::run_tune},
#endif
#ifdef ZINF_BENCH_HAVE_SWAP
    {"swap", "stream a partitioned model NVMe -> pinned -> device through the residency manager",
     zinf::bench::run_swap},
#endif
#ifdef ZINF_BENCH_HAVE_OPTIMIZER
    {"optimizer", "NVMe-offloaded optimizer step against its I/O-bound limit",
     zinf::bench::run_optimizer},
#endif
#ifdef ZINF_BENCH_HAVE_CUDA
    {"h2d", "host<->device GB/s from the pinned pool against cudaMemcpy from cudaHostAlloc",
     zinf::bench::run_h2d},
#endif
#ifdef ZINF_BENCH_HAVE_COMM
    {"comm",
     "collectives' bus bandwidth over the MPI communicator against plain MPI (mpirun -np N)",
     zinf::bench::run_comm},
#endif
#ifdef ZINF_BENCH_HAVE_GPT
    {"gpt",
     "GPT training step's GEMM FLOP/s against OpenBLAS on the same shapes; checkpointing cost",
     zinf::bench::run_gpt},
#endif
#ifdef ZINF_BENCH_HAVE_PROFILE
    {"profile", "the machine profile zinfinity-plan --profile predicts step times from (JSON)",
     zinf::bench::run_profile},
#endif
#ifdef ZINF_BENCH_HAVE_ADAM
    {"adam", "CPU optimizer step throughput against the memory-bandwidth bound",
     zinf::bench::run_adam},
#endif
};

void usage(std::FILE* out) {
    std::fprintf(
        out,
        "usage: zinfinity-bench <command> [flags]\n\n"
        "Measures what the storage, the swap pipeline and the CPU optimizer deliver on this\n"
        "machine. Each command prints its figures beside a baseline measured in the same run.\n\n"
        "commands:\n");
    for (const auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
    std::fprintf(out,
                 "\n`zinfinity-bench <command> --help` lists each command's flags and defaults.\n");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
        std::strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (const auto& c : kCommands) {
        if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 2, argv + 2);
    }
    std::fprintf(stderr, "zinfinity-bench: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
