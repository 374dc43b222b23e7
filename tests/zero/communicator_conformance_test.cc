// One conformance suite for every zero::Communicator: the same test bodies run over the
// single-rank communicator (this binary without ZINF_TEST_MPI) and over the MPI communicator,
// default and deterministic (with ZINF_TEST_MPI, under mpiexec with 1, 2, 3 and 4 ranks; see
// tests/zero/CMakeLists.txt). Every rank computes what every other rank sent (the inputs are a
// function of rank and index), so each checks the exact expected result; sums use small
// integers, exact in fp32, bf16 and fp16, except where a test is about rounding.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "src/base/device_buffer.h"
#include "src/device/cpu_device.h"
#include "zero/communicator.h"
#include "zero/single_rank_communicator.h"
#ifdef ZINF_TEST_MPI
#include "zero/mpi_communicator.h"
#endif

namespace zinf::zero {
namespace {

struct Implementation {
    std::string name;
    std::function<std::unique_ptr<Communicator>(Device&)> make;
};

std::vector<Implementation> implementations() {
#ifdef ZINF_TEST_MPI
    auto mpi = [](bool deterministic) {
        return [deterministic](Device& d) -> std::unique_ptr<Communicator> {
            MpiCommunicatorOptions o;
            o.deterministic = deterministic;
            o.timeout = std::chrono::seconds(120);
            auto c = MpiCommunicator::create(d, o);
            if (!c.has_value()) {
                ADD_FAILURE() << c.error().to_string();
                return nullptr;
            }
            return std::move(*c);
        };
    };
    return {{"mpi", mpi(false)}, {"mpi_deterministic", mpi(true)}};
#else
    return {{"single_rank", [](Device& d) -> std::unique_ptr<Communicator> {
                 return std::make_unique<SingleRankCommunicator>(d);
             }}};
#endif
}

// A value of rank r at index i: a small integer, exact in every dtype.
float input(int rank, std::size_t i) {
    return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
}

std::uint16_t to16(float v, DType dt) {
    return dt == DType::kBFloat16 ? kernels::float_to_bf16(v) : kernels::float_to_fp16(v);
}
float from16(std::uint16_t v, DType dt) {
    return dt == DType::kBFloat16 ? kernels::bf16_to_float(v) : kernels::fp16_to_float(v);
}

class CommunicatorConformance : public ::testing::TestWithParam<Implementation> {
protected:
    void SetUp() override {
        device::CpuDeviceOptions o;
        o.budget_bytes = 64 << 20;
        auto d = device::CpuDevice::create(o);
        ASSERT_TRUE(d.has_value()) << d.error().to_string();
        device_ = std::move(*d);
        comm_ = GetParam().make(*device_);
        ASSERT_NE(comm_, nullptr);
        ws_ = comm_->world_size();
        rank_ = comm_->rank();
    }
    void TearDown() override {
        buffers_.clear();
        comm_.reset();
        device_.reset();
    }
    // A device buffer holding `values` in dtype dt.
    void* buffer(const std::vector<float>& values, DType dt) {
        const std::size_t eb = dtype_size_bytes(dt);
        auto b =
            DeviceBuffer::allocate(*device_, std::max<std::size_t>(values.size() * eb, 64), "test");
        EXPECT_TRUE(b.has_value());
        std::vector<std::byte> host(values.size() * eb);
        for (std::size_t i = 0; i < values.size(); ++i) {
            if (dt == DType::kFloat32) {
                std::memcpy(host.data() + i * 4, &values[i], 4);
            } else {
                const std::uint16_t v = to16(values[i], dt);
                std::memcpy(host.data() + i * 2, &v, 2);
            }
        }
        EXPECT_TRUE(device_->copy_to_device(b->data(), host.data(), host.size(), 0).is_ok());
        EXPECT_TRUE(device_->synchronize(0).is_ok());  // the copy reads `host`
        buffers_.push_back(std::move(*b));
        return buffers_.back().data();
    }
    std::vector<float> read(const void* p, std::size_t n, DType dt) {
        const std::size_t eb = dtype_size_bytes(dt);
        std::vector<std::byte> host(n * eb);
        EXPECT_TRUE(device_->copy_to_host(host.data(), p, host.size(), 0).is_ok());
        EXPECT_TRUE(device_->synchronize(0).is_ok());
        std::vector<float> out(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (dt == DType::kFloat32) {
                std::memcpy(&out[i], host.data() + i * 4, 4);
            } else {
                std::uint16_t v;
                std::memcpy(&v, host.data() + i * 2, 2);
                out[i] = from16(v, dt);
            }
        }
        return out;
    }

    std::unique_ptr<Device> device_;
    std::unique_ptr<Communicator> comm_;
    std::vector<DeviceBuffer> buffers_;
    int ws_ = 1;
    int rank_ = 0;
};

constexpr DType kDtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr std::size_t kSizes[] = {1, 7, 1000, 4099};

TEST_P(CommunicatorConformance, AllGatherPlacesEachRanksSliceAtItsOffset) {
    for (DType dt : kDtypes) {
        for (std::size_t n : kSizes) {
            std::vector<float> mine(n);
            for (std::size_t i = 0; i < n; ++i) mine[i] = input(rank_, i);
            void* send = buffer(mine, dt);
            void* recv = buffer(std::vector<float>(n * ws_, -1.0f), dt);
            ASSERT_TRUE(comm_->all_gather(send, recv, n, dt, 0).is_ok());
            const auto got = read(recv, n * ws_, dt);
            for (int r = 0; r < ws_; ++r) {
                for (std::size_t i = 0; i < n; ++i) {
                    ASSERT_EQ(got[r * n + i], input(r, i)) << dtype_name(dt) << " n " << n;
                }
            }
        }
    }
}

TEST_P(CommunicatorConformance, AllGatherInPlaceFromOwnSlot) {
    const std::size_t n = 333;
    std::vector<float> full(n * ws_, -1.0f);
    for (std::size_t i = 0; i < n; ++i) full[rank_ * n + i] = input(rank_, i);
    void* recv = buffer(full, DType::kFloat32);
    ASSERT_TRUE(
        comm_->all_gather(static_cast<float*>(recv) + rank_ * n, recv, n, DType::kFloat32, 0)
            .is_ok());
    const auto got = read(recv, n * ws_, DType::kFloat32);
    for (int r = 0; r < ws_; ++r) {
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[r * n + i], input(r, i));
    }
}

TEST_P(CommunicatorConformance, ReduceScatterGivesRankRTheReductionOfSliceR) {
    for (DType dt : kDtypes) {
        for (std::size_t n : kSizes) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
                std::vector<float> mine(n * ws_);
                for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = input(rank_, j);
                void* send = buffer(mine, dt);
                void* recv = buffer(std::vector<float>(n, -1.0f), dt);
                ASSERT_TRUE(comm_->reduce_scatter(send, recv, n, dt, op, 0).is_ok());
                const auto got = read(recv, n, dt);
                for (std::size_t i = 0; i < n; ++i) {
                    const std::size_t j = rank_ * n + i;
                    float want = 0;
                    for (int r = 0; r < ws_; ++r) {
                        want =
                            op == ReduceOp::kMax ? std::max(want, input(r, j)) : want + input(r, j);
                    }
                    if (op == ReduceOp::kAvg) want /= static_cast<float>(ws_);
                    if (dt != DType::kFloat32) want = from16(to16(want, dt), dt);
                    ASSERT_EQ(got[i], want) << dtype_name(dt) << " n " << n << " op "
                                            << static_cast<int>(op) << " i " << i;
                }
            }
        }
    }
}

TEST_P(CommunicatorConformance, AllReduceInAndOutOfPlaceForOddSizes) {
    for (DType dt : kDtypes) {
        for (std::size_t n : kSizes) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
                for (bool in_place : {false, true}) {
                    std::vector<float> mine(n);
                    for (std::size_t i = 0; i < n; ++i) mine[i] = input(rank_, i);
                    void* send = buffer(mine, dt);
                    void* recv = in_place ? send : buffer(std::vector<float>(n, -1.0f), dt);
                    ASSERT_TRUE(comm_->all_reduce(send, recv, n, dt, op, 0).is_ok());
                    const auto got = read(recv, n, dt);
                    for (std::size_t i = 0; i < n; ++i) {
                        float want = 0;
                        for (int r = 0; r < ws_; ++r) {
                            want = op == ReduceOp::kMax ? std::max(want, input(r, i))
                                                        : want + input(r, i);
                        }
                        if (op == ReduceOp::kAvg) want /= static_cast<float>(ws_);
                        if (dt != DType::kFloat32) want = from16(to16(want, dt), dt);
                        ASSERT_EQ(got[i], want) << dtype_name(dt) << " n " << n << " op "
                                                << static_cast<int>(op) << " in place " << in_place;
                    }
                }
            }
        }
    }
}

// Values that round: every rank must still hold the same bits afterwards (a rank whose sum
// differed by an ulp would drift from the others), and the deterministic variant must give
// exactly the rank-order fp32 sum.
TEST_P(CommunicatorConformance, AllReduceOfRoundingValuesIsTheSameBitsOnEveryRank) {
    const std::size_t n = 5000;
    auto value = [](int r, std::size_t i) {
        return 1.0f / static_cast<float>(3 + r * 7 + static_cast<int>(i % 97)) *
               (i % 2 == 0 ? 1.0f : -1e3f);
    };
    std::vector<float> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = value(rank_, i);
    void* buf = buffer(mine, DType::kFloat32);
    ASSERT_TRUE(comm_->all_reduce(buf, buf, n, DType::kFloat32, ReduceOp::kSum, 0).is_ok());
    const auto got = read(buf, n, DType::kFloat32);
    std::vector<std::uint64_t> sums(1, 0);
    for (float v : got) {
        std::uint32_t bits;
        std::memcpy(&bits, &v, 4);
        sums[0] = sums[0] * 1099511628211ULL + bits;
    }
    auto all = gather_over_ranks(*comm_, sums[0]);
    ASSERT_TRUE(all.has_value());
    for (std::uint64_t h : *all) EXPECT_EQ(h, sums[0]);
    if (GetParam().name.find("deterministic") != std::string::npos || ws_ == 1) {
        for (std::size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int r = 0; r < ws_; ++r) want += value(r, i);
            ASSERT_EQ(got[i], want) << "i " << i;
        }
    }
}

TEST_P(CommunicatorConformance, BroadcastFromEveryRoot) {
    for (int root = 0; root < ws_; ++root) {
        for (DType dt : kDtypes) {
            const std::size_t n = 515;
            std::vector<float> mine(n);
            for (std::size_t i = 0; i < n; ++i) mine[i] = input(rank_, i);
            void* buf = buffer(mine, dt);
            ASSERT_TRUE(comm_->broadcast(buf, n, dt, root, 0).is_ok());
            const auto got = read(buf, n, dt);
            for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], input(root, i));
        }
    }
}

TEST_P(CommunicatorConformance, HostReductionsAgreeInRankOrder) {
    ASSERT_TRUE(comm_->barrier().is_ok());
    std::vector<double> v = {0.1 * (rank_ + 1), 1.0 / (rank_ + 3), 1e16 * (rank_ % 2 ? -1 : 1)};
    ASSERT_TRUE(sum_over_ranks(*comm_, v).is_ok());
    std::vector<double> want(3, 0.0);
    for (int r = 0; r < ws_; ++r) {
        want[0] += 0.1 * (r + 1);
        want[1] += 1.0 / (r + 3);
        want[2] += 1e16 * (r % 2 ? -1 : 1);
    }
    EXPECT_EQ(v, want);
    auto any = any_over_ranks(*comm_, rank_ == ws_ - 1);
    ASSERT_TRUE(any.has_value());
    EXPECT_TRUE(*any);
    auto none = any_over_ranks(*comm_, false);
    ASSERT_TRUE(none.has_value());
    EXPECT_FALSE(*none);
    auto ranks = gather_over_ranks(*comm_, static_cast<std::uint64_t>(rank_) * 10);
    ASSERT_TRUE(ranks.has_value());
    ASSERT_EQ(ranks->size(), static_cast<std::size_t>(ws_));
    for (int r = 0; r < ws_; ++r) EXPECT_EQ((*ranks)[r], static_cast<std::uint64_t>(r) * 10);
}

INSTANTIATE_TEST_SUITE_P(Every, CommunicatorConformance, ::testing::ValuesIn(implementations()),
                         [](const auto& p) { return p.param.name; });

}  // namespace
}  // namespace zinf::zero
