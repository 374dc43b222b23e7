// fio as the bench's reference: command line, child process, JSON report.
#include "tools/bench/fio_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "src/base/file.h"
#include "src/base/log.h"

namespace zinf::bench {
namespace {

using Json = nlohmann::json;

// fio reads ':' in --filename as a separator of several files; escape it.
std::string fio_escape_filename(const std::string& path) {
    std::string out;
    for (char ch : path) {
        if (ch == ':' || ch == '\\') out += '\\';
        out += ch;
    }
    return out;
}

std::string shell_quote(const std::string& arg) {
    const bool plain = std::all_of(arg.begin(), arg.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) != 0 ||
               std::string_view("-_=./:,+").find(ch) != std::string_view::npos;
    });
    if (plain && !arg.empty()) return arg;
    std::string out = "'";
    for (char ch : arg) {
        if (ch == '\'') {
            out += "'\\''";
        } else {
            out += ch;
        }
    }
    return out + "'";
}

}  // namespace

std::vector<std::string> fio_command(const FioJob& job) {
    ZINF_ASSERT_GT(job.jobs, 0);
    ZINF_ASSERT_GT(job.size_bytes, 0u);
    std::vector<std::string> argv{job.fio_binary, "--name=zinf-bench-fio"};
    argv.push_back("--filename=" + fio_escape_filename(job.file_path));
    argv.push_back(std::string("--rw=") + (job.op == IoOp::kRead ? "read" : "write"));
    argv.push_back(str_cat("--bs=", job.block_size_bytes));
    argv.push_back(str_cat("--iodepth=", job.queue_depth));
    argv.push_back("--ioengine=" + job.ioengine);
    argv.push_back(str_cat("--direct=", job.direct ? 1 : 0));
    // Each job takes one consecutive part of the file, as our workers together cover it once.
    const std::uint64_t part_bytes = job.size_bytes / static_cast<std::uint64_t>(job.jobs);
    argv.push_back(str_cat("--size=", part_bytes));
    if (job.jobs > 1) {
        argv.push_back(str_cat("--numjobs=", job.jobs));
        argv.push_back(str_cat("--offset_increment=", part_bytes));
    }
    if (job.ioengine == "io_uring") {
        if (job.register_buffers) {
            argv.push_back("--fixedbufs=1");
            argv.push_back("--registerfiles=1");
        }
        if (job.sqpoll) argv.push_back("--sqthread_poll=1");
    }
    if (job.runtime_seconds > 0) {
        argv.push_back("--time_based=1");
        argv.push_back(str_cat("--runtime=", static_cast<long>(job.runtime_seconds * 1000), "ms"));
    }
    // Never create, lay out, extend or remove a file: fio works on the bench's file only.
    argv.push_back("--allow_file_create=0");
    argv.push_back("--fallocate=none");
    argv.push_back("--unlink=0");
    // A buffered run (direct=0) should start cold, as ours does.
    argv.push_back("--invalidate=1");
    if (job.op == IoOp::kWrite && !job.direct) argv.push_back("--end_fsync=1");
    argv.push_back("--output-format=json");
    return argv;
}

std::string fio_command_line(const FioJob& job) {
    std::string line;
    for (const auto& arg : fio_command(job)) {
        if (!line.empty()) line += ' ';
        line += shell_quote(arg);
    }
    return line;
}

Result<FioFigures> parse_fio_json(std::string_view text, IoOp op) {
    const std::size_t brace = text.find('{');
    if (brace == std::string_view::npos)
        return Status::invalid_argument("fio printed no JSON report");
    try {
        const Json root = Json::parse(text.substr(brace));
        if (!root.contains("jobs") || !root["jobs"].is_array() || root["jobs"].empty()) {
            return Status::invalid_argument("fio's JSON report has no jobs");
        }
        const char* dir = op == IoOp::kRead ? "read" : "write";
        FioFigures f;
        bool first = true;
        for (const Json& job : root["jobs"]) {
            const int error = job.value("error", 0);
            if (error != 0) {
                return Status::io_error(str_cat("fio job ", job.value("jobname", std::string("?")),
                                                " failed with error ", error),
                                        error);
            }
            const Json& d = job.at(dir);
            const auto io_bytes = d.at("io_bytes").get<std::uint64_t>();
            const double runtime_s = d.at("runtime").get<double>() / 1000.0;  // ms
            f.bytes += io_bytes;
            f.seconds = std::max(f.seconds, runtime_s);
            f.iops += d.at("iops").get<double>();
            // usr_cpu and sys_cpu are percentages of the job's runtime (job_runtime, ms).
            const double job_runtime_s = job.at("job_runtime").get<double>() / 1000.0;
            f.cpu_seconds += (job.at("usr_cpu").get<double>() + job.at("sys_cpu").get<double>()) /
                             100.0 * job_runtime_s;
            if (first && d.contains("clat_ns") && d["clat_ns"].contains("percentile")) {
                const Json& p = d["clat_ns"]["percentile"];
                f.clat_us_p50 = p.value("50.000000", 0.0) / 1000.0;
                f.clat_us_p99 = p.value("99.000000", 0.0) / 1000.0;
            }
            first = false;
        }
        if (f.bytes == 0 || f.seconds <= 0) {
            return Status::invalid_argument(
                str_cat("fio moved no ", dir, " bytes (see its report)"));
        }
        f.gb_per_s = static_cast<double>(f.bytes) / kBytesPerGb / f.seconds;
        f.cpu_seconds_per_gb = f.cpu_seconds / (static_cast<double>(f.bytes) / kBytesPerGb);
        return f;
    } catch (const std::exception& e) {
        return Status::invalid_argument(str_cat("fio's JSON report: ", e.what()));
    }
}

Result<ProcessOutput> run_process(const std::vector<std::string>& argv) {
    ZINF_ASSERT(!argv.empty());
    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return Status::from_errno(errno, "pipe");
    FileDescriptor out_read(out_pipe[0]);
    FileDescriptor out_write(out_pipe[1]);
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) return Status::from_errno(errno, "pipe");
    FileDescriptor err_read(err_pipe[0]);
    FileDescriptor err_write(err_pipe[1]);

    std::vector<char*> cargv;
    cargv.reserve(argv.size() + 1);
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);

    // posix_spawn, not fork: glibc starts the child with CLONE_VM | CLONE_VFORK, so our page
    // tables are never copied. A fork copies them, and the kernel splits every huge-page mapping
    // that io_uring holds pinned (registered buffers) into 4 KiB ones while doing so: the bench's
    // buffers lost their huge-page mappings at the first fio run.
    posix_spawn_file_actions_t actions;
    if (const int rc = ::posix_spawn_file_actions_init(&actions); rc != 0) {
        return Status::from_errno(rc, "posix_spawn_file_actions_init");
    }
    ::posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
    ::posix_spawn_file_actions_adddup2(&actions, err_write.get(), STDERR_FILENO);
    pid_t pid = -1;
    const int spawn_rc = ::posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    if (spawn_rc != 0) {
        ProcessOutput failed;
        failed.exit_code = 127;  // as a shell reports a command it cannot run
        failed.err = str_cat("cannot run ", argv.front(), ": ", std::strerror(spawn_rc));
        return failed;
    }
    out_write.reset();
    err_write.reset();

    ProcessOutput result;
    pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {err_read.get(), POLLIN, 0}};
    std::string* sinks[2] = {&result.out, &result.err};
    int open_count = 2;
    char chunk[65536];
    // Bounded by the child's lifetime: each pipe ends at EOF when fio exits.
    while (open_count > 0) {
        const int rc = ::poll(fds, 2, -1);
        if (rc < 0) {
            if (errno == EINTR) continue;  // our SIGINT handler ran; fio got the signal too
            break;
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || fds[i].revents == 0) continue;
            const ssize_t n = ::read(fds[i].fd, chunk, sizeof(chunk));
            if (n > 0) {
                sinks[i]->append(chunk, static_cast<std::size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                fds[i].fd = -1;
                --open_count;
            }
        }
    }
    int wstatus = 0;
    struct rusage usage {};
    while (::wait4(pid, &wstatus, 0, &usage) < 0) {
        if (errno != EINTR) return Status::from_errno(errno, "wait4");
    }
    const auto secs = [](const timeval& tv) {
        return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
    };
    result.cpu_seconds = secs(usage.ru_utime) + secs(usage.ru_stime);
    result.context_switches =
        static_cast<std::uint64_t>(usage.ru_nvcsw) + static_cast<std::uint64_t>(usage.ru_nivcsw);
    if (WIFEXITED(wstatus)) {
        result.exit_code = WEXITSTATUS(wstatus);
    } else if (WIFSIGNALED(wstatus)) {
        result.exit_code = 128 + WTERMSIG(wstatus);
    }
    return result;
}

Status check_fio(const std::string& binary) {
    auto out = run_process({binary, "--version"});
    if (!out.has_value() || out->exit_code != 0) {
        return Status::not_supported(
            str_cat("fio ('", binary, "') does not run",
                    out.has_value() ? str_cat(": ", out->err) : std::string(),
                    "; install it (apt-get install fio) or name it with --fio-binary"));
    }
    return Status::ok();
}

Result<FioFigures> run_fio(const FioJob& job) {
    ZINF_ASSIGN_OR_RETURN(ProcessOutput out, run_process(fio_command(job)));
    if (interrupted()) return interrupted_status();
    if (out.exit_code != 0) {
        std::string err = out.err.empty() ? out.out : out.err;
        if (err.size() > 2000) err = err.substr(0, 2000) + "...";
        return Status::io_error(str_cat("fio exited with status ", out.exit_code, ": ", err,
                                        "\n  command: ", fio_command_line(job)),
                                EIO);
    }
    auto figures = parse_fio_json(out.out, job.op);
    if (!figures.has_value()) {
        return figures.error().with_context(str_cat("fio (", fio_command_line(job), ")"));
    }
    figures->process_cpu_seconds = out.cpu_seconds;
    figures->process_context_switches = out.context_switches;
    return figures;
}

}  // namespace zinf::bench
