// CsvMonitor: DeepSpeed's csv_monitor layout (deepspeed/monitor/csv_monitor.py), the events of
// its engine, and Python's number formatting.
#include "src/engine/csv_monitor.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "src/base/file.h"
#include "src/engine/trainer.h"

namespace zinf {
namespace {

// os.path.join(output_path, job_name): an absolute job name replaces the base.
std::string join_path(const std::string& base, const std::string& name) {
    if (base.empty() || (!name.empty() && name.front() == '/')) return name;
    if (base.back() == '/') return base + name;
    return base + "/" + name;
}

// Python's csv.writer writes an int as str(int) and a float as repr(float); its lines end in
// "\r\n" (the excel dialect), which a text-mode file on Linux keeps.
constexpr std::string_view kLineEnd = "\r\n";

}  // namespace

std::string csv_event_file_name(std::string_view event) {
    std::string name(event);
    for (char& c : name) {
        if (c == '/' || c == ' ') c = '_';
    }
    return name + ".csv";
}

std::string csv_event_header(std::string_view event) {
    const auto slash = event.rfind('/');
    return std::string(slash == std::string_view::npos ? event : event.substr(slash + 1));
}

std::string python_float_repr(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
    if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
    // The shortest round-trip digits, as d.ddde[+-]XX.
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
    ZINF_ASSERT(r.ec == std::errc());
    const std::string_view sci(buf, static_cast<std::size_t>(r.ptr - buf));
    const auto e_at = sci.find('e');
    ZINF_ASSERT(e_at != std::string_view::npos);
    const bool negative = sci.front() == '-';
    std::string digits;
    for (const char c : sci.substr(negative ? 1 : 0, e_at - (negative ? 1 : 0))) {
        if (c != '.') digits += c;
    }
    const int exponent = std::atoi(std::string(sci.substr(e_at + 1)).c_str());
    std::string out = negative ? "-" : "";
    if (exponent < -4 || exponent >= 16) {
        out += digits[0];
        if (digits.size() > 1) {
            out += '.';
            out += std::string_view(digits).substr(1);
        }
        char e[16];
        std::snprintf(e, sizeof e, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
        return out + e;
    }
    if (exponent < 0) {
        out += "0.";
        out.append(static_cast<std::size_t>(-exponent - 1), '0');
        return out + digits;
    }
    const auto int_digits = static_cast<std::size_t>(exponent) + 1;
    if (digits.size() <= int_digits) {
        out += digits;
        out.append(int_digits - digits.size(), '0');
        return out + ".0";
    }
    out.append(digits, 0, int_digits);
    out += '.';
    out += std::string_view(digits).substr(int_digits);
    return out;
}

CsvMonitor::CsvMonitor(std::string directory, std::uint64_t train_batch_size, std::uint64_t gas,
                       bool fp16)
    : directory_(std::move(directory)),
      train_batch_size_(train_batch_size),
      gas_(gas),
      fp16_(fp16) {}

Result<std::unique_ptr<CsvMonitor>> CsvMonitor::create(const config::CsvMonitorConfig& config,
                                                       std::uint64_t train_batch_size,
                                                       std::uint64_t gas, bool fp16) {
    ZINF_ASSERT(config.enabled);
    ZINF_ASSERT(train_batch_size > 0);
    ZINF_ASSERT(gas > 0);
    const std::string dir = join_path(config.output_path, config.job_name);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // os.makedirs(log_dir, exist_ok=True)
    if (ec) {
        return Status::from_errno(ec.value(), "csv_monitor.output_path: create directory " + dir);
    }
    ZINF_TRY(check_writable_directory(dir).with_context("csv_monitor.output_path"));
    return std::unique_ptr<CsvMonitor>(new CsvMonitor(dir, train_batch_size, gas, fp16));
}

void CsvMonitor::add_micro_loss(float loss) {
    // DeepSpeed divides by gas (in fp32) only when gas > 1, then sums the window in fp32.
    const float scaled = gas_ > 1 ? loss / static_cast<float>(gas_) : loss;
    window_loss_ = window_started_ ? window_loss_ + scaled : scaled;
    window_started_ = true;
}

Status CsvMonitor::write_step(const StepFigures& f) {
    ZINF_ASSERT(window_started_);
    ZINF_ASSERT(f.global_samples >= train_batch_size_);
    window_started_ = false;
    ZINF_TRY(write(kCsvTrainLoss, f.global_samples - train_batch_size_,
                   python_float_repr(static_cast<double>(window_loss_))));
    ZINF_TRY(write(kCsvLr, f.global_samples, python_float_repr(f.next_lr)));
    if (fp16_) {
        if (!loss_scale_seen_) first_loss_scale_ = f.loss_scale;
        loss_scale_seen_ = true;
        loss_scale_changed_ = loss_scale_changed_ || f.loss_scale != first_loss_scale_;
        const bool as_int =
            !loss_scale_changed_ && std::floor(f.loss_scale) == f.loss_scale && f.loss_scale < 9e15;
        const std::string value = as_int ? std::to_string(static_cast<std::uint64_t>(f.loss_scale))
                                         : python_float_repr(f.loss_scale);
        ZINF_TRY(write(kCsvLossScale, f.global_samples, value));
    }
    return flush();
}

Status CsvMonitor::write_evaluation(double loss, std::uint64_t global_samples) {
    ZINF_TRY(write(kCsvEvalLoss, global_samples, python_float_repr(loss)));
    return flush();
}

Status CsvMonitor::write(std::string_view event, std::uint64_t x, const std::string& value) {
    const std::string name = csv_event_file_name(event);
    auto it = files_.find(name);
    if (it == files_.end()) {
        const std::string path = directory_ + "/" + name;
        std::FILE* f = std::fopen(path.c_str(), "a");  // DeepSpeed appends ('a+')
        if (f == nullptr) return Status::from_errno(errno, "csv_monitor: open " + path);
        it = files_.emplace(name, std::unique_ptr<std::FILE, FileCloser>(f)).first;
        const std::string header = "step," + csv_event_header(event) + std::string(kLineEnd);
        if (std::fputs(header.c_str(), f) < 0) {
            return Status::io_error("csv_monitor: write " + path, EIO);
        }
    }
    const std::string row = std::to_string(x) + "," + value + std::string(kLineEnd);
    if (std::fputs(row.c_str(), it->second.get()) < 0) {
        return Status::io_error("csv_monitor: write " + directory_ + "/" + name, EIO);
    }
    return Status::ok();
}

// Each step's rows reach the file before the next step, as DeepSpeed's (it closes the file after
// every event), so that a reader following the files sees whole rows.
Status CsvMonitor::flush() {
    for (auto& [name, file] : files_) {
        if (std::fflush(file.get()) != 0) {
            return Status::from_errno(errno, "csv_monitor: write " + directory_ + "/" + name);
        }
    }
    return Status::ok();
}

}  // namespace zinf
