// The subcommands of zinfinity-bench. Each takes the arguments after its name and returns the
// process exit code (0 success, 1 failure, 2 bad usage). Errors are printed by the subcommand.
#pragma once

namespace zinf::bench {

struct Command {
    const char* name;
    const char* summary;
    int (*run)(int argc, char** argv);
};

int run_io(int argc, char** argv);
int run_swap(int argc, char** argv);
int run_sweep(int argc, char** argv);
int run_tune(int argc, char** argv);
int run_adam(int argc, char** argv);
int run_h2d(int argc, char** argv);
int run_optimizer(int argc, char** argv);
int run_comm(int argc, char** argv);
int run_gpt(int argc, char** argv);
int run_profile(int argc, char** argv);

}  // namespace zinf::bench
