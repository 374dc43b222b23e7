// A small command-line parser for the zinfinity tools: declared flags with help text and
// defaults, `--flag value` and `--flag=value`, repeatable flags, and `--help` built from them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace zinf::cli {

class Args {
public:
    // `usage` is the first line of --help ("zinfinity-bench io [flags]"); `summary` follows it.
    Args(std::string usage, std::string summary);

    // Declares a flag taking a value. `default_value` is shown in --help and returned when absent.
    void add(const std::string& name, const std::string& default_value, const std::string& help);
    // Declares a flag that may be given several times (e.g. --path).
    void add_list(const std::string& name, const std::string& help);
    // Declares a boolean switch (`--vs-fio`).
    void add_switch(const std::string& name, const std::string& help);

    // Parses argv (without the program and subcommand names). Unknown flags are errors that
    // suggest the nearest declared one. Returns false with help_requested() when --help was given.
    Status parse(int argc, char** argv);
    bool help_requested() const { return help_requested_; }
    std::string help() const;
    // What every command does first: parses argv; on an error prints "<program>: <message>" to
    // stderr and returns 2, on --help prints the help and returns 0; otherwise returns nullopt
    // and the command goes on.
    std::optional<int> parse_or_exit(int argc, char** argv, std::string_view program);

    bool given(const std::string& name) const;
    std::string get(const std::string& name) const;
    std::vector<std::string> get_list(const std::string& name) const;
    bool get_switch(const std::string& name) const;
    // Typed getters: the error names the flag and the bad value.
    Result<std::uint64_t> get_size_bytes(const std::string& name) const;  // 4GiB, 1MiB
    Result<std::uint64_t> get_count(const std::string& name) const;       // 256M, 1e8
    Result<std::int64_t> get_int(const std::string& name, std::int64_t min, std::int64_t max) const;
    Result<double> get_double(const std::string& name, double min, double max) const;
    // on|off|true|false|1|0|yes|no
    Result<bool> get_bool(const std::string& name) const;
    // One of `choices`.
    Result<std::string> get_choice(const std::string& name,
                                   const std::vector<std::string_view>& choices) const;
    // A comma-separated list of sizes, counts or strings (for sweep grids).
    Result<std::vector<std::uint64_t>> get_size_list(const std::string& name) const;
    Result<std::vector<std::uint64_t>> get_int_list(const std::string& name) const;
    std::vector<std::string> get_string_list(const std::string& name) const;

private:
    struct Flag {
        std::string default_value;
        std::string help;
        bool is_list = false;
        bool is_switch = false;
    };
    std::string usage_;
    std::string summary_;
    std::vector<std::string> order_;
    std::map<std::string, Flag> flags_;
    std::map<std::string, std::vector<std::string>> values_;
    bool help_requested_ = false;
};

// Prints "<program>: <message of s>" to stderr and returns `exit_code` (2: bad usage, the
// default; 1: the command failed).
int report_error(std::string_view program, const Status& s, int exit_code = 2);

}  // namespace zinf::cli
