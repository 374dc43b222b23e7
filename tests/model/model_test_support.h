// Helpers shared by the model tests: a CPU device and compute, host <-> device copies, and a
// double-precision reference of an Mlp's forward pass (the oracle for gradient checks).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "src/device/cpu_compute.h"
#include "src/device/cpu_device.h"
#include "src/model/layers.h"
#include "src/model/mlp.h"
#include "src/model/parameter_store.h"

namespace zinf::model::test_support {

struct Machine {
    std::unique_ptr<device::CpuDevice> device;
    std::unique_ptr<device::CpuCompute> compute;
};

inline Machine make_machine(int threads = 2, bool worker_thread = true) {
    device::CpuDeviceOptions options;
    options.budget_bytes = std::size_t{512} << 20;
    options.worker_thread = worker_thread;
    auto device = device::CpuDevice::create(options);
    ZINF_ASSERT_MSG(device.has_value(), device.status().to_string());
    auto compute = device::CpuCompute::create(device->get(), device::CpuComputeOptions{threads});
    ZINF_ASSERT_MSG(compute.has_value(), compute.status().to_string());
    return Machine{std::move(device).value(), std::move(compute).value()};
}

// Device memory holding a copy of host values; freed with the Machine's device.
template <typename T>
DeviceBuffer to_device(Device& device, const std::vector<T>& values) {
    auto buffer = DeviceBuffer::allocate(device, values.size() * sizeof(T), "test");
    ZINF_ASSERT_MSG(buffer.has_value(), buffer.status().to_string());
    ZINF_ASSERT(device.copy_to_device(buffer->data(), values.data(), values.size() * sizeof(T), 0));
    ZINF_ASSERT(device.synchronize(0));
    return std::move(buffer).value();
}

template <typename T>
std::vector<T> to_host(Device& device, const T* device_ptr, std::size_t count) {
    std::vector<T> values(count);
    ZINF_ASSERT(device.copy_to_host(values.data(), device_ptr, count * sizeof(T), 0));
    ZINF_ASSERT(device.synchronize(0));
    return values;
}

// All parameters of a store, on the host, indexed by ParamId.
inline std::vector<std::vector<double>> host_parameters(Device& device,
                                                        const DeviceParameterStore& store) {
    std::vector<std::vector<double>> params;
    for (const ParameterInfo& info : store.registry().all()) {
        const auto values = to_host(device, store.parameter(info.id), info.numel);
        params.emplace_back(values.begin(), values.end());
    }
    return params;
}

// The Mlp's forward pass and mean cross-entropy loss in double, module by module, with the
// dropout masks the model drew (passed per module index; empty for other modules).
inline double reference_loss(const Mlp& mlp, const std::vector<std::vector<double>>& params,
                             const std::vector<std::vector<std::uint8_t>>& masks,
                             const std::vector<double>& x, const std::vector<std::int32_t>& labels,
                             std::size_t rows) {
    std::vector<double> act = x;
    std::size_t width = mlp.in_features();
    for (std::size_t m = 0; m < mlp.module_count(); ++m) {
        const Module& module = mlp.module(m);
        const std::size_t out = module.out_features();
        std::vector<double> next(rows * out);
        const auto kind = module.kind();
        if (kind == "linear") {
            const auto& w = params[module.parameter_ids()[0]];
            const auto& b = params[module.parameter_ids()[1]];
            for (std::size_t r = 0; r < rows; ++r) {
                for (std::size_t o = 0; o < out; ++o) {
                    double sum = b[o];
                    for (std::size_t i = 0; i < width; ++i)
                        sum += act[r * width + i] * w[o * width + i];
                    next[r * out + o] = sum;
                }
            }
        } else if (kind == "layer_norm") {
            const auto& gamma = params[module.parameter_ids()[0]];
            const auto& beta = params[module.parameter_ids()[1]];
            const double eps = mlp.config().layer_norm_eps;
            for (std::size_t r = 0; r < rows; ++r) {
                double mean = 0, var = 0;
                for (std::size_t c = 0; c < out; ++c) mean += act[r * out + c];
                mean /= static_cast<double>(out);
                for (std::size_t c = 0; c < out; ++c) var += std::pow(act[r * out + c] - mean, 2);
                var /= static_cast<double>(out);
                const double rstd = 1 / std::sqrt(var + eps);
                for (std::size_t c = 0; c < out; ++c) {
                    next[r * out + c] = (act[r * out + c] - mean) * rstd * gamma[c] + beta[c];
                }
            }
        } else if (kind == "relu") {
            for (std::size_t i = 0; i < next.size(); ++i) next[i] = std::max(act[i], 0.0);
        } else if (kind == "gelu") {
            for (std::size_t i = 0; i < next.size(); ++i) {
                const double v = act[i];
                next[i] =
                    0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
            }
        } else if (kind == "dropout") {
            const float p = static_cast<const Dropout&>(module).p();
            const double scale = 1.0f / (1.0f - p);
            for (std::size_t i = 0; i < next.size(); ++i)
                next[i] = masks[m][i] ? act[i] * scale : 0.0;
        } else {
            ADD_FAILURE() << "unknown module kind " << kind;
        }
        act = std::move(next);
        width = out;
    }
    const std::size_t classes = width;
    double total = 0;
    for (std::size_t r = 0; r < rows; ++r) {
        double max_logit = act[r * classes];
        for (std::size_t c = 1; c < classes; ++c)
            max_logit = std::max(max_logit, act[r * classes + c]);
        double sum = 0;
        for (std::size_t c = 0; c < classes; ++c) sum += std::exp(act[r * classes + c] - max_logit);
        total += std::log(sum) + max_logit - act[r * classes + labels[r]];
    }
    return total / static_cast<double>(rows);
}

}  // namespace zinf::model::test_support
