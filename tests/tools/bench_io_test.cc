// Tests of `zinfinity-bench io`, `sweep` and `tune` through the built binary: --help, flag
// validation, tiny runs, file ownership (never overwrite, always remove) and the tune output.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/base/aligned.h"
#include "src/base/config.h"
#include "tests/support/test_seed.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

struct RunResult {
    int exit_code = -1;
    std::string out;
    std::string err;
};

// Starts the bench with `args`; `in_child` runs in the child just before exec (same pid).
pid_t spawn(const std::vector<std::string>& args, int out_fd, int err_fd,
            const std::function<void()>& in_child = {}) {
    std::vector<std::string> argv{ZINF_BENCH_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(out_fd, STDOUT_FILENO);
        ::dup2(err_fd, STDERR_FILENO);
        if (in_child) in_child();
        ::execv(cargv[0], cargv.data());
        ::_exit(127);
    }
    return pid;
}

RunResult collect(pid_t pid, int out_read, int err_read) {
    RunResult r;
    pollfd fds[2] = {{out_read, POLLIN, 0}, {err_read, POLLIN, 0}};
    std::string* sinks[2] = {&r.out, &r.err};
    int open_count = 2;
    char buf[4096];
    while (open_count > 0) {
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || fds[i].revents == 0) continue;
            const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
            if (n > 0) {
                sinks[i]->append(buf, static_cast<std::size_t>(n));
            } else {
                fds[i].fd = -1;
                --open_count;
            }
        }
    }
    ::close(out_read);
    ::close(err_read);
    int status = 0;
    ::waitpid(pid, &status, 0);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

RunResult run_bench(const std::vector<std::string>& args,
                    const std::function<void()>& in_child = {}) {
    int out_pipe[2];
    int err_pipe[2];
    EXPECT_EQ(::pipe(out_pipe), 0);
    EXPECT_EQ(::pipe(err_pipe), 0);
    const pid_t pid = spawn(args, out_pipe[1], err_pipe[1], in_child);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    return collect(pid, out_pipe[0], err_pipe[0]);
}

std::vector<std::string> bench_files_in(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("zinf-bench-", 0) == 0) names.push_back(name);
    }
    return names;
}

std::string describe(const RunResult& r) {
    return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

bool io_uring_unavailable(const RunResult& r) {
    return r.exit_code != 0 && (r.err.find("io_uring") != std::string::npos) &&
           (r.err.find("not supported") != std::string::npos ||
            r.err.find("EPERM") != std::string::npos ||
            r.err.find("NotSupported") != std::string::npos ||
            r.err.find("unavailable") != std::string::npos);
}

TEST(BenchIoTest, HelpListsEveryFlag) {
    const RunResult io = run_bench({"io", "--help"});
    ASSERT_EQ(io.exit_code, 0) << describe(io);
    for (const char* flag : {"--path",
                             "--size",
                             "--op",
                             "--backend",
                             "--block-size",
                             "--queue-depth",
                             "--threads",
                             "--direct",
                             "--register-buffers",
                             "--sqpoll",
                             "--op-size",
                             "--buffer-limit",
                             "--loops",
                             "--json",
                             "--fault",
                             "--vs-fio",
                             "--fio-grid",
                             "--fio-grid-block-sizes",
                             "--fio-grid-queue-depths",
                             "--fio-grid-seconds",
                             "--vs-libaio",
                             "--pairs",
                             "--fio-binary",
                             "--progress",
                             "--help"}) {
        EXPECT_NE(io.out.find(flag), std::string::npos) << flag << " missing from io --help:\n"
                                                        << io.out;
    }
    EXPECT_NE(io.out.find("default: 1MiB"), std::string::npos) << io.out;
    EXPECT_NE(io.out.find("GB/s (decimal"), std::string::npos) << io.out;

    const RunResult sweep = run_bench({"sweep", "--help"});
    ASSERT_EQ(sweep.exit_code, 0) << describe(sweep);
    for (const char* flag :
         {"--backends", "--block-sizes", "--queue-depths", "--threads", "--op", "--loops",
          "--vs-fio", "--pairs", "--fio-binary", "--plot", "--tmpfs"}) {
        EXPECT_NE(sweep.out.find(flag), std::string::npos) << flag << " missing from sweep --help";
    }
    const RunResult tune = run_bench({"tune", "--help"});
    ASSERT_EQ(tune.exit_code, 0) << describe(tune);
    EXPECT_NE(tune.out.find("--write-config"), std::string::npos);
    EXPECT_NE(tune.out.find("harmonic mean"), std::string::npos)
        << "tune --help must state its rule";
}

TEST(BenchIoTest, BadInputNamesTheCulprit) {
    test::TempDir dir("bench-bad");
    const RunResult no_path = run_bench({"io", "--size", "8MiB"});
    EXPECT_EQ(no_path.exit_code, 2) << describe(no_path);
    EXPECT_NE(no_path.err.find("--path"), std::string::npos) << no_path.err;

    const RunResult zero = run_bench({"io", "--path", dir.path(), "--size", "0"});
    EXPECT_EQ(zero.exit_code, 2) << describe(zero);
    EXPECT_NE(zero.err.find("--size"), std::string::npos) << zero.err;

    const std::string file = dir.file("plain-file");
    std::ofstream(file) << "x";
    const RunResult not_dir = run_bench({"io", "--path", file, "--size", "8MiB"});
    EXPECT_NE(not_dir.exit_code, 0) << describe(not_dir);
    EXPECT_NE(not_dir.err.find(file), std::string::npos) << not_dir.err;
    EXPECT_NE(not_dir.err.find("not a directory"), std::string::npos) << not_dir.err;

    const RunResult missing = run_bench({"io", "--path", dir.file("nope"), "--size", "8MiB"});
    EXPECT_NE(missing.exit_code, 0) << describe(missing);
    EXPECT_NE(missing.err.find(dir.file("nope")), std::string::npos) << missing.err;

    const RunResult qd = run_bench({"io", "--path", dir.path(), "--queue-depth", "0"});
    EXPECT_EQ(qd.exit_code, 2) << describe(qd);
    EXPECT_NE(qd.err.find("--queue-depth"), std::string::npos) << qd.err;

    const RunResult bs = run_bench({"io", "--path", dir.path(), "--block-size", "1000"});
    EXPECT_EQ(bs.exit_code, 2) << describe(bs);
    EXPECT_NE(bs.err.find("--block-size"), std::string::npos) << bs.err;

    const RunResult huge = run_bench({"io", "--path", dir.path(), "--size", "1000TiB"});
    EXPECT_NE(huge.exit_code, 0) << describe(huge);
    EXPECT_NE(huge.err.find("free"), std::string::npos) << huge.err;
    EXPECT_NE(huge.err.find(dir.path()), std::string::npos) << huge.err;
    EXPECT_TRUE(bench_files_in(dir.path()).empty());
}

TEST(BenchIoTest, TinyWriteReadRunLeavesNothingBehind) {
    test::TempDir dir("bench-run");
    for (const std::string backend : {"posix", "io_uring"}) {
        const std::string json = dir.file("out-" + backend + ".json");
        const RunResult r =
            run_bench({"io", "--path", dir.path(), "--size", "8MiB", "--op", "write,read",
                       "--backend", backend, "--loops", "1", "--queue-depth", "4", "--json", json});
        if (backend == "io_uring" && io_uring_unavailable(r)) {
            std::cerr << "io_uring unavailable here; skipping its run: " << r.err << "\n";
            continue;
        }
        ASSERT_EQ(r.exit_code, 0) << backend << ": " << describe(r);
        EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("write"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("read"), std::string::npos) << r.out;
        EXPECT_TRUE(bench_files_in(dir.path()).empty()) << backend << " left a bench file behind";
        std::ifstream in(json);
        ASSERT_TRUE(in.good()) << json;
        const auto report = nlohmann::json::parse(in);
        EXPECT_GT(report["summary"]["write"]["gb_per_s"].get<double>(), 0);
        EXPECT_GT(report["summary"]["read"]["gb_per_s"].get<double>(), 0);
        EXPECT_EQ(report["summary"]["read"]["bytes"].get<std::uint64_t>(), 8u << 20);
    }
}

// With registered buffers on and io_uring here, every piece of every pass goes through a fixed
// buffer on a registered file; with them off, none does. The counts are what prove it.
TEST(BenchIoTest, FixedBufferCountsEqualThePiecesMovedOnlyWhenRegistered) {
    test::TempDir dir("bench-fixed");
    for (const bool registered : {true, false}) {
        SCOPED_TRACE(registered ? "--register-buffers on" : "--register-buffers off");
        const std::string json = dir.file(registered ? "on.json" : "off.json");
        const RunResult r =
            run_bench({"io", "--path", dir.path(), "--size", "8MiB", "--op", "write,read",
                       "--backend", "io_uring", "--loops", "1", "--queue-depth", "4",
                       "--register-buffers", registered ? "on" : "off", "--json", json});
        if (io_uring_unavailable(r)) GTEST_SKIP() << "io_uring unavailable here: " << r.err;
        ASSERT_EQ(r.exit_code, 0) << describe(r);
        EXPECT_NE(r.out.find("fixed buf"), std::string::npos) << r.out;
        EXPECT_EQ(r.out.find("fell back"), std::string::npos) << r.out;
        std::ifstream in(json);
        ASSERT_TRUE(in.good()) << json;
        const auto report = nlohmann::json::parse(in);
        ASSERT_EQ(report["passes"].size(), 2u) << report.dump(2);
        for (const auto& pass : report["passes"]) {
            const auto pieces = pass["pieces"].get<std::uint64_t>();
            EXPECT_EQ(pieces, 8u) << pass.dump();  // 8 MiB in pieces of 1 MiB
            EXPECT_EQ(pass["pieces_fixed_buffer"].get<std::uint64_t>(), registered ? pieces : 0u)
                << pass.dump();
            EXPECT_EQ(pass["pieces_fixed_file"].get<std::uint64_t>(), registered ? pieces : 0u)
                << pass.dump();
            EXPECT_EQ(pass["pieces_plain"].get<std::uint64_t>(), registered ? 0u : pieces)
                << pass.dump();
            // The buffers (5 ops of 1 MiB, aligned to a huge page) sit in transparent huge pages
            // where the kernel has them, registered or not.
            if (zinf::transparent_huge_pages_available()) {
                EXPECT_GE(pass["buffer_huge_page_bytes"].get<std::uint64_t>(), zinf::kHugePageBytes)
                    << pass.dump();
            }
        }
    }
    EXPECT_TRUE(bench_files_in(dir.path()).empty());
}

TEST(BenchIoTest, ExistingFileWithTheBenchNameIsNotOverwritten) {
    test::TempDir dir("bench-own");
    std::string victim;
    // The bench names its file after its pid; create that name in the child before exec.
    const std::string dir_path = dir.path();
    const RunResult r =
        run_bench({"io", "--path", dir_path, "--size", "8MiB", "--op", "write", "--backend",
                   "posix", "--loops", "1"},
                  [&dir_path] {
                      const std::string path =
                          dir_path + "/zinf-bench-" + std::to_string(::getpid()) + "-0.dat";
                      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
                      if (fd >= 0) {
                          [[maybe_unused]] auto n = ::write(fd, "precious", 8);
                          ::close(fd);
                      }
                  });
    EXPECT_NE(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
    const auto names = bench_files_in(dir.path());
    ASSERT_EQ(names.size(), 1u);
    std::ifstream in(dir.file(names.front()));
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(content, "precious");
}

TEST(BenchIoTest, InjectedFaultSurfacesWithContextAndCleansUp) {
    test::TempDir dir("bench-fault");
    const RunResult r =
        run_bench({"io", "--path", dir.path(), "--size", "8MiB", "--op", "write", "--backend",
                   "posix", "--loops", "1", "--fault", "fail_nth=3,errno=EIO"});
    EXPECT_EQ(r.exit_code, 1) << describe(r);
    EXPECT_NE(r.err.find("write"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("offset"), std::string::npos) << r.err;
    EXPECT_TRUE(bench_files_in(dir.path()).empty());
}

TEST(BenchIoTest, InterruptStopsAndRemovesTheFile) {
    test::TempDir dir("bench-int");
    int out_pipe[2];
    int err_pipe[2];
    ASSERT_EQ(::pipe(out_pipe), 0);
    ASSERT_EQ(::pipe(err_pipe), 0);
    const pid_t pid = spawn({"io", "--path", dir.path(), "--size", "64MiB", "--op", "write,read",
                             "--backend", "posix", "--loops", "1000", "--progress", "off"},
                            out_pipe[1], err_pipe[1]);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    // Wait (bounded) until the file exists and a pass is running, then interrupt.
    bool seen = false;
    for (int i = 0; i < 200 && !seen; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        seen = !bench_files_in(dir.path()).empty();
    }
    ASSERT_TRUE(seen) << "the bench file never appeared";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(pid, SIGINT);
    const RunResult r = collect(pid, out_pipe[0], err_pipe[0]);
    EXPECT_EQ(r.exit_code, 130) << describe(r);
    EXPECT_NE(r.err.find("interrupted"), std::string::npos) << r.err;
    EXPECT_TRUE(bench_files_in(dir.path()).empty());
}

TEST(BenchIoTest, TuneWritesAConfigThatLoads) {
    test::TempDir dir("bench-tune");
    const std::string config_path = dir.file("aio.json");
    const RunResult r = run_bench({"tune", "--path", dir.path(), "--size", "8MiB", "--backends",
                                   "posix", "--block-sizes", "512KiB,1MiB", "--queue-depths", "4",
                                   "--threads", "1", "--write-config", config_path});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    std::ifstream in(config_path);
    ASSERT_TRUE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    auto aio = config::load_aio_from_string(text.str(), config_path);
    ASSERT_TRUE(aio.has_value()) << aio.error().to_string() << "\n" << text.str();
    EXPECT_EQ(aio->backend, "posix");
    EXPECT_TRUE(aio->block_size_bytes == (512u << 10) || aio->block_size_bytes == (1u << 20));
    EXPECT_EQ(aio->queue_depth, 4);
    EXPECT_TRUE(bench_files_in(dir.path()).empty());

    // A second tune does not overwrite the config without --force.
    const RunResult again = run_bench({"tune", "--path", dir.path(), "--size", "8MiB", "--backends",
                                       "posix", "--block-sizes", "1MiB", "--queue-depths", "4",
                                       "--threads", "1", "--write-config", config_path});
    EXPECT_EQ(again.exit_code, 2) << describe(again);
    EXPECT_NE(again.err.find("--force"), std::string::npos) << again.err;
}

TEST(BenchIoTest, VsFioPrintsRatios) {
    if (std::system("fio --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "fio is not installed";
    test::TempDir dir("bench-fio");
    const std::string json = dir.file("vs-fio.json");
    const RunResult r =
        run_bench({"io", "--path", dir.path(), "--size", "8MiB", "--op", "read", "--backend",
                   "io_uring", "--queue-depth", "4", "--vs-fio", "--pairs", "2", "--json", json});
    if (io_uring_unavailable(r)) GTEST_SKIP() << "io_uring unavailable: " << r.err;
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("median ratio ours/fio"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("fio GB/s"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("context switches, whole process"), std::string::npos) << r.out;
    std::ifstream in(json);
    ASSERT_TRUE(in.good()) << json;
    const auto report = nlohmann::json::parse(in);
    ASSERT_EQ(report["vs_fio"]["read"]["pairs"].size(), 2u) << report.dump(2);
    const auto& read = report["vs_fio"]["read"];
    EXPECT_GT(read["ours_context_switches_per_gb"]["median"].get<double>(), 0);
    // An unresolved CPU ratio (fio's start-up varying by more than a fifth of its I/O's CPU, as
    // likely on an 8 MiB file) is said so, and only then.
    EXPECT_EQ(read["cpu_resolved"].get<bool>(),
              read["fio_io_cpu_seconds"].get<double>() >=
                  5 * read["fio_startup_cpu_spread_seconds"].get<double>());
    EXPECT_EQ(r.out.find("CPU ratio not resolved") == std::string::npos,
              read["cpu_resolved"].get<bool>())
        << r.out;
    EXPECT_EQ(report["vs_fio"]["read"]["fio_command"].get<std::string>().rfind("fio", 0), 0u)
        << report.dump(2);
    if (zinf::transparent_huge_pages_available()) {
        // Running fio does not take the huge pages from our registered buffers (5 ops of 1 MiB
        // aligned to a huge page): a fork would have split their mappings (pinned by io_uring)
        // into small pages at the first fio run.
        for (const auto& pair : report["vs_fio"]["read"]["pairs"]) {
            EXPECT_GE(pair["ours"]["buffer_huge_page_bytes"].get<std::uint64_t>(),
                      zinf::kHugePageBytes)
                << pair.dump();
        }
    }
    EXPECT_TRUE(bench_files_in(dir.path()).empty());
}

// A small XML well-formedness check (tags nest and close, attributes are quoted): enough to
// know that a viewer parses the file, without an XML library in the test.
testing::AssertionResult well_formed_xml(const std::string& text) {
    std::vector<std::string> open;
    std::size_t i = 0;
    int elements = 0;
    while ((i = text.find('<', i)) != std::string::npos) {
        const std::size_t end = text.find('>', i);
        if (end == std::string::npos) return testing::AssertionFailure() << "unclosed '<' at " << i;
        const std::string tag = text.substr(i + 1, end - i - 1);
        i = end + 1;
        if (tag.empty()) return testing::AssertionFailure() << "empty tag";
        if (tag[0] == '?' || tag[0] == '!') continue;
        if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) {
            return testing::AssertionFailure() << "unbalanced quotes in <" << tag << ">";
        }
        if (tag[0] == '/') {
            const std::string name = tag.substr(1);
            if (open.empty() || open.back() != name) {
                return testing::AssertionFailure()
                       << "</" << name << "> closes <" << (open.empty() ? "" : open.back()) << ">";
            }
            open.pop_back();
            continue;
        }
        ++elements;
        if (tag.back() == '/') continue;
        open.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
    }
    if (!open.empty()) return testing::AssertionFailure() << "<" << open.back() << "> never closed";
    if (elements == 0) return testing::AssertionFailure() << "no elements";
    return testing::AssertionSuccess();
}

// The values of attribute `name` of every <polyline ...> in `svg`, in order.
std::vector<std::string> polyline_attribute(const std::string& svg, const std::string& name) {
    std::vector<std::string> values;
    std::size_t i = 0;
    while ((i = svg.find("<polyline", i)) != std::string::npos) {
        const std::size_t end = svg.find('>', i);
        const std::string tag = svg.substr(i, end - i);
        const std::size_t at = tag.find(" " + name + "=\"");
        values.push_back(at == std::string::npos ? std::string()
                                                 : tag.substr(at + name.size() + 3,
                                                              tag.find('"', at + name.size() + 3) -
                                                                  (at + name.size() + 3)));
        i = end;
    }
    return values;
}

TEST(BenchIoTest, SweepVsFioMeasuresEveryPointAndPlotsIt) {
    if (std::system("fio --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "fio is not installed";
    test::TempDir dir("bench-sweep-fio");
    const std::string json = dir.file("sweep.json");
    const std::string svg = dir.file("sweep.svg");
    const RunResult r =
        run_bench({"sweep", "--vs-fio", "--path", dir.path(), "--size", "8MiB", "--backends",
                   "libaio", "--block-sizes", "512KiB,1MiB", "--queue-depths", "2,4", "--pairs",
                   "2", "--plot", svg, "--json", json});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_TRUE(bench_files_in(dir.path()).empty());
    EXPECT_NE(r.out.find("worst ratio ours/fio over the grid"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("switches/pc"), std::string::npos) << r.out;

    std::ifstream in(json);
    ASSERT_TRUE(in.good()) << json;
    const auto report = nlohmann::json::parse(in);
    ASSERT_EQ(report["grid"].size(), 4u);  // 2 block sizes x 2 queue depths, threads default to 1
    double worst = 1e9;
    double worst_cpu = 0;
    int unresolved = 0;
    for (const auto& point : report["grid"]) {
        EXPECT_EQ(point["threads"].get<int>(), 1);
        for (const char* op : {"write", "read"}) {
            const auto& v = point["vs_fio"][op];
            std::vector<double> cpu_ratios;
            std::vector<double> ours_switches_per_gb;
            ASSERT_EQ(v["pairs"].size(), 2u) << point.dump();
            for (std::size_t i = 0; i < v["pairs"].size(); ++i) {
                const auto& pair = v["pairs"][i];
                EXPECT_GT(pair["ours"]["gb_per_s"].get<double>(), 0) << pair.dump();
                for (const char* side : {"fio_before", "fio_after"}) {
                    EXPECT_GT(pair[side]["gb_per_s"].get<double>(), 0) << pair.dump();
                    // fio's CPU counts its whole process (wait4), as ours does, never less than
                    // its job figure.
                    EXPECT_GT(pair[side]["process_cpu_seconds"].get<double>(), 0) << pair.dump();
                    EXPECT_GE(pair[side]["cpu_seconds_per_gb"].get<double>(),
                              pair[side]["job_cpu_seconds_per_gb"].get<double>())
                        << pair.dump();
                }
                // Bracketed: fio, ours, fio, ours, fio. Our pass is divided by the geometric mean
                // of the two fio passes around it, and the pass after one of ours is the pass
                // before the next (each fio pass measured once, not a pair of its own).
                const double before = pair["fio_before"]["gb_per_s"].get<double>();
                const double after = pair["fio_after"]["gb_per_s"].get<double>();
                EXPECT_NEAR(pair["ratio"].get<double>(),
                            pair["ours"]["gb_per_s"].get<double>() / std::sqrt(before * after),
                            1e-9)
                    << pair.dump();
                if (i > 0) {
                    EXPECT_EQ(pair["fio_before"], v["pairs"][i - 1]["fio_after"])
                        << v["pairs"].dump();
                }
                // The CPU ratio is bracketed too: our pass's CPU over the mean of the two fio
                // passes' around it.
                const double fio_cpu = (pair["fio_before"]["cpu_seconds_per_gb"].get<double>() +
                                        pair["fio_after"]["cpu_seconds_per_gb"].get<double>()) /
                                       2;
                EXPECT_NEAR(pair["fio_cpu_seconds_per_gb"].get<double>(), fio_cpu, 1e-12)
                    << pair.dump();
                // fio's CPU is its process's less its start-up's: on these few MiB it can come to
                // nothing measurable, and then the bench reports no ratio (0), not infinity.
                if (fio_cpu > 0) {
                    EXPECT_NEAR(pair["cpu_ratio"].get<double>(),
                                pair["ours"]["cpu_seconds_per_gb"].get<double>() / fio_cpu, 1e-9)
                        << pair.dump();
                } else {
                    EXPECT_EQ(pair["cpu_ratio"].get<double>(), 0.0) << pair.dump();
                }
                cpu_ratios.push_back(pair["cpu_ratio"].get<double>());
                // Context switches, counted alike: our whole process over our pass; fio's whole
                // process less its start-up's, per GB, and the pair's figure is the mean of the
                // two fio passes around ours.
                const double ours_switches = pair["ours"]["context_switches"].get<double>();
                EXPECT_GT(ours_switches, 0) << pair.dump();  // the caller sleeps on its reads
                EXPECT_NEAR(pair["ours"]["context_switches_per_gb"].get<double>(),
                            ours_switches / (pair["ours"]["bytes"].get<double>() / 1e9), 1e-6)
                    << pair.dump();
                const double startup = v["fio_startup_context_switches"].get<double>();
                double fio_switches = 0;
                for (const char* side : {"fio_before", "fio_after"}) {
                    const auto& f = pair[side];
                    EXPECT_GT(f["process_context_switches"].get<double>(), 0) << pair.dump();
                    const double expected =
                        std::max(0.0, f["process_context_switches"].get<double>() - startup) /
                        (f["bytes"].get<double>() / 1e9);
                    EXPECT_NEAR(f["context_switches_per_gb"].get<double>(), expected, 1e-6)
                        << pair.dump();
                    fio_switches += expected / 2;
                }
                EXPECT_NEAR(pair["fio_context_switches_per_gb"].get<double>(), fio_switches, 1e-6)
                    << pair.dump();
                ours_switches_per_gb.push_back(
                    pair["ours"]["context_switches_per_gb"].get<double>());
            }
            // fio's start-up (parsing, buffers, its job process) switches too: a start-up of 0
            // would mean the median of its five small runs was never taken.
            EXPECT_GT(v["fio_startup_context_switches"].get<double>(), 0) << v.dump();
            ASSERT_EQ(ours_switches_per_gb.size(), 2u);
            EXPECT_NEAR(v["ours_context_switches_per_gb"]["median"].get<double>(),
                        (ours_switches_per_gb[0] + ours_switches_per_gb[1]) / 2, 1e-6);
            worst = std::min(worst, v["ratio"]["median"].get<double>());
            // Two pairs: the median is the mean of the two passes' ratios.
            ASSERT_EQ(cpu_ratios.size(), 2u);
            EXPECT_NEAR(v["cpu_ratio"]["median"].get<double>(), (cpu_ratios[0] + cpu_ratios[1]) / 2,
                        1e-9);
            // The CPU ratio counts only where fio's I/O costs well over its start-up's spread;
            // elsewhere it would measure fio's start-up, and the summary leaves it out.
            const bool resolved = v["fio_io_cpu_seconds"].get<double>() >=
                                  5 * v["fio_startup_cpu_spread_seconds"].get<double>();
            EXPECT_EQ(v["cpu_resolved"].get<bool>(), resolved) << v.dump();
            EXPECT_GE(v["fio_startup_cpu_spread_seconds"].get<double>(), 0) << v.dump();
            if (resolved) {
                worst_cpu = std::max(worst_cpu, v["cpu_ratio"]["median"].get<double>());
            } else {
                ++unresolved;
            }
        }
    }
    // The summary line is the least median ratio of the grid, not a fixed figure, and the
    // highest median CPU ratio.
    EXPECT_DOUBLE_EQ(report["worst_vs_fio"]["grid"]["ratio"].get<double>(), worst);
    EXPECT_DOUBLE_EQ(report["worst_vs_fio"]["grid"]["cpu_ratio"].get<double>(), worst_cpu);
    EXPECT_EQ(report["worst_vs_fio"]["grid"]["cpu_unresolved"].get<int>(), unresolved);
    EXPECT_EQ(r.out.find("CPU ratio not resolved") != std::string::npos, unresolved > 0) << r.out;

    std::ifstream svg_in(svg);
    ASSERT_TRUE(svg_in.good()) << svg;
    std::stringstream text;
    text << svg_in.rdbuf();
    const std::string plot = text.str();
    EXPECT_TRUE(well_formed_xml(plot));
    EXPECT_NE(plot.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
    // A panel per op (one backend, one storage); in each a line per queue depth for ours and fio,
    // each through both block sizes.
    const auto sources = polyline_attribute(plot, "data-source");
    ASSERT_EQ(sources.size(), 8u) << plot;
    EXPECT_EQ(std::count(sources.begin(), sources.end(), "ours"), 4);
    EXPECT_EQ(std::count(sources.begin(), sources.end(), "fio"), 4);
    const auto depths = polyline_attribute(plot, "data-queue-depth");
    EXPECT_EQ(std::count(depths.begin(), depths.end(), "2"), 4);
    EXPECT_EQ(std::count(depths.begin(), depths.end(), "4"), 4);
    for (const auto& points : polyline_attribute(plot, "points")) {
        EXPECT_EQ(std::count(points.begin(), points.end(), ','), 2)
            << "two block sizes per line: " << points;
    }
}

TEST(BenchIoTest, SweepVsFioRefusesWhatFioCannotMatch) {
    test::TempDir dir("bench-sweep-bad");
    const RunResult posix = run_bench(
        {"sweep", "--vs-fio", "--path", dir.path(), "--size", "8MiB", "--backends", "posix"});
    EXPECT_EQ(posix.exit_code, 2) << describe(posix);
    EXPECT_NE(posix.err.find("posix"), std::string::npos) << posix.err;
    const RunResult pairs =
        run_bench({"sweep", "--path", dir.path(), "--size", "8MiB", "--pairs", "3"});
    EXPECT_EQ(pairs.exit_code, 2) << describe(pairs);
    EXPECT_NE(pairs.err.find("--pairs"), std::string::npos) << pairs.err;
    const RunResult plot = run_bench(
        {"sweep", "--path", dir.path(), "--size", "8MiB", "--plot", dir.file("missing/plot.svg")});
    EXPECT_EQ(plot.exit_code, 2) << describe(plot);
    EXPECT_NE(plot.err.find("--plot"), std::string::npos) << plot.err;
    EXPECT_TRUE(bench_files_in(dir.path()).empty());
}

std::vector<std::string> bench_tmpfs_mounts() {
    std::vector<std::string> found;
    std::ifstream mounts("/proc/mounts");
    std::string line;
    while (std::getline(mounts, line)) {
        if (line.find("/tmp/zinf-bench-tmpfs-") != std::string::npos) found.push_back(line);
    }
    return found;
}

TEST(BenchIoTest, SweepTmpfsMeasuresOnItsOwnMountAndRemovesIt) {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
    test::TempDir dir("bench-sweep-tmpfs");
    const auto before = bench_tmpfs_mounts();
    const std::string json = dir.file("sweep.json");
    const RunResult r = run_bench({"sweep", "--tmpfs", "--path", dir.path(), "--size", "8MiB",
                                   "--backends", "posix", "--block-sizes", "1MiB", "--queue-depths",
                                   "4", "--threads", "1", "--op", "write", "--json", json});
    if (r.exit_code != 0 && r.err.find("mount") != std::string::npos &&
        r.err.find("EPERM") != std::string::npos) {
        GTEST_SKIP() << "mount refused here: " << r.err;
    }
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("tmpfs (/tmp/zinf-bench-tmpfs-"), std::string::npos) << r.out;
    std::ifstream in(json);
    ASSERT_TRUE(in.good());
    const auto report = nlohmann::json::parse(in);
    ASSERT_EQ(report["grid"].size(), 2u);
    EXPECT_EQ(report["grid"][0]["storage"], dir.path());
    EXPECT_EQ(report["grid"][1]["storage"], "tmpfs");
    EXPECT_GT(report["grid"][1]["write_gb_per_s"].get<double>(), 0);
    EXPECT_EQ(bench_tmpfs_mounts(), before) << "the tmpfs is still mounted";
    bool leftover = false;
    for (const auto& entry : fs::directory_iterator("/tmp")) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("zinf-bench-tmpfs-", 0) == 0 && r.out.find(name) != std::string::npos)
            leftover = true;
    }
    EXPECT_FALSE(leftover) << "the tmpfs mount point was not removed";
}

}  // namespace
}  // namespace zinf
