// Args: flag parsing and --help for the zinfinity tools.
#include "tools/cli/args.h"

#include <cstdio>
#include <limits>
#include <sstream>

#include "src/base/config.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::cli {

Args::Args(std::string usage, std::string summary)
    : usage_(std::move(usage)), summary_(std::move(summary)) {}

void Args::add(const std::string& name, const std::string& default_value, const std::string& help) {
    order_.push_back(name);
    flags_[name] = Flag{default_value, help, false, false};
}

void Args::add_list(const std::string& name, const std::string& help) {
    order_.push_back(name);
    flags_[name] = Flag{"", help, true, false};
}

void Args::add_switch(const std::string& name, const std::string& help) {
    order_.push_back(name);
    flags_[name] = Flag{"", help, false, true};
}

std::optional<int> Args::parse_or_exit(int argc, char** argv, std::string_view program) {
    if (Status s = parse(argc, argv); !s.is_ok()) return report_error(program, s);
    if (help_requested_) {
        std::printf("%s", help().c_str());
        return 0;
    }
    return std::nullopt;
}

int report_error(std::string_view program, const Status& s, int exit_code) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(),
                 s.message().c_str());
    return exit_code;
}

Status Args::parse(int argc, char** argv) {
    for (int i = 0; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            help_requested_ = true;
            return Status::ok();
        }
        if (arg.rfind("--", 0) != 0) {
            return Status::invalid_argument(
                str_cat("unexpected argument '", arg, "' (flags start with --; see --help)"));
        }
        std::string name = arg.substr(2);
        std::string value;
        bool has_value = false;
        if (const auto eq = name.find('='); eq != std::string::npos) {
            value = name.substr(eq + 1);
            name = name.substr(0, eq);
            has_value = true;
        }
        auto it = flags_.find(name);
        if (it == flags_.end()) {
            std::string best;
            std::size_t best_d = std::numeric_limits<std::size_t>::max();
            for (const auto& [n, f] : flags_) {
                const auto d = config::edit_distance(name, n);
                if (d < best_d) {
                    best_d = d;
                    best = n;
                }
            }
            std::string message = str_cat("unknown flag --", name);
            if (!best.empty() && best_d <= 3) message += str_cat("; did you mean --", best, "?");
            return Status::invalid_argument(message + " (see --help)");
        }
        if (it->second.is_switch) {
            values_[name].push_back(has_value ? value : "true");
            continue;
        }
        if (!has_value) {
            if (i + 1 >= argc)
                return Status::invalid_argument(str_cat("--", name, " needs a value"));
            value = argv[++i];
        }
        if (!it->second.is_list && values_.contains(name)) {
            return Status::invalid_argument(str_cat("--", name, " given twice"));
        }
        values_[name].push_back(value);
    }
    return Status::ok();
}

std::string Args::help() const {
    std::ostringstream os;
    os << "usage: " << usage_ << "\n\n" << summary_ << "\n\nflags:\n";
    for (const auto& name : order_) {
        const Flag& f = flags_.at(name);
        std::string left = "  --" + name;
        if (!f.is_switch) left += f.is_list ? " VALUE (repeatable)" : " VALUE";
        os << left;
        if (left.size() < 30) {
            os << std::string(30 - left.size(), ' ');
        } else {
            os << "\n" << std::string(30, ' ');
        }
        // Indent continuation lines of the help text.
        for (char ch : f.help) {
            os << ch;
            if (ch == '\n') os << std::string(30, ' ');
        }
        if (!f.is_switch && !f.is_list && !f.default_value.empty())
            os << " (default: " << f.default_value << ")";
        os << "\n";
    }
    os << "  --help                      show this help\n";
    return os.str();
}

bool Args::given(const std::string& name) const {
    return values_.contains(name);
}

std::string Args::get(const std::string& name) const {
    auto it = values_.find(name);
    if (it != values_.end() && !it->second.empty()) return it->second.back();
    auto f = flags_.find(name);
    ZINF_ASSERT_MSG(f != flags_.end(), "undeclared flag " + name);
    return f->second.default_value;
}

std::vector<std::string> Args::get_list(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return {};
    return it->second;
}

bool Args::get_switch(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return false;
    const auto& v = it->second.back();
    return v == "true" || v == "1" || v == "on" || v == "yes";
}

Result<std::uint64_t> Args::get_size_bytes(const std::string& name) const {
    auto r = parse_size_bytes(get(name));
    if (!r.has_value()) return r.error().with_context("--" + name);
    return r;
}

Result<std::uint64_t> Args::get_count(const std::string& name) const {
    auto r = parse_count(get(name));
    if (!r.has_value()) return r.error().with_context("--" + name);
    return r;
}

Result<std::int64_t> Args::get_int(const std::string& name, std::int64_t min,
                                   std::int64_t max) const {
    const std::string text = get(name);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || end != text.c_str() + text.size() || errno != 0) {
        return Status::invalid_argument(
            str_cat("--", name, ": expected an integer, got '", text, "'"));
    }
    if (v < min || v > max) {
        return Status::invalid_argument(
            str_cat("--", name, ": expected an integer in [", min, ", ", max, "], got ", v));
    }
    return static_cast<std::int64_t>(v);
}

Result<double> Args::get_double(const std::string& name, double min, double max) const {
    const std::string text = get(name);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size()) {
        return Status::invalid_argument(
            str_cat("--", name, ": expected a number, got '", text, "'"));
    }
    if (!(v >= min && v <= max)) {
        return Status::invalid_argument(
            str_cat("--", name, ": expected a number in [", min, ", ", max, "], got ", v));
    }
    return v;
}

Result<bool> Args::get_bool(const std::string& name) const {
    const std::string v = get(name);
    if (v == "on" || v == "true" || v == "1" || v == "yes") return true;
    if (v == "off" || v == "false" || v == "0" || v == "no") return false;
    return Status::invalid_argument(str_cat("--", name, ": expected on or off, got '", v, "'"));
}

Result<std::string> Args::get_choice(const std::string& name,
                                     const std::vector<std::string_view>& choices) const {
    std::string v = get(name);
    std::string list;
    for (const auto& c : choices) {
        if (c == v) return v;
        list += str_cat(list.empty() ? "" : "|", c);
    }
    return Status::invalid_argument(str_cat("--", name, ": expected ", list, ", got '", v, "'"));
}

std::vector<std::string> Args::get_string_list(const std::string& name) const {
    std::vector<std::string> out;
    std::string item;
    std::istringstream in(get(name));
    while (std::getline(in, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

Result<std::vector<std::uint64_t>> Args::get_size_list(const std::string& name) const {
    std::vector<std::uint64_t> out;
    for (const auto& item : get_string_list(name)) {
        auto r = parse_size_bytes(item);
        if (!r.has_value()) return r.error().with_context("--" + name);
        out.push_back(*r);
    }
    if (out.empty()) return Status::invalid_argument(str_cat("--", name, ": empty list"));
    return out;
}

Result<std::vector<std::uint64_t>> Args::get_int_list(const std::string& name) const {
    std::vector<std::uint64_t> out;
    for (const auto& item : get_string_list(name)) {
        auto r = parse_count(item);
        if (!r.has_value()) return r.error().with_context("--" + name);
        out.push_back(*r);
    }
    if (out.empty()) return Status::invalid_argument(str_cat("--", name, ": empty list"));
    return out;
}

}  // namespace zinf::cli
