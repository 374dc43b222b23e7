// io::Storage as the engine's one seam for where files live: the simulated device passed in
// through EngineOptions::storage runs the engine as EngineOptions::sim does; every file call of
// the engine (open, preallocate, sync, removal after a failed open) and every worker's backend
// goes through the storage; the operating system's storage passed in works as the default does.
#include "io/storage.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/engine.h"
#include "io/file_system.h"
#include "io/sim_storage.h"
#include "src/base/aligned.h"
#include "tests/io/io_test_util.h"
#include "tests/support/test_seed.h"

namespace zinf::io::test {
namespace {

std::unique_ptr<SimStorage> must_make_sim_storage() {
    SimOptions sim;
    sim.seed = zinf::test::seed();
    sim.latency_us_max = 50;
    auto storage = SimStorage::create(sim);
    EXPECT_TRUE(storage.has_value()) << storage.status().to_string();
    return storage.has_value() ? std::move(storage).value() : nullptr;
}

std::unique_ptr<Engine> must_create(const EngineOptions& options) {
    auto engine = Engine::create(options);
    EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
    return engine.has_value() ? std::move(engine).value() : nullptr;
}

TEST(Storage, AnEngineRunsOnASimulatedDevicePassedInThroughItsOptions) {
    auto storage = must_make_sim_storage();
    ASSERT_NE(storage, nullptr);
    EngineOptions options;
    options.aio = small_aio("auto", DirectMode::kAuto);
    options.storage = storage.get();
    constexpr std::size_t kBytes = (1 << 20) + 4096;
    AlignedBuffer out = must_allocate(kBytes);
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(out.span(), rng);
    {
        auto engine = must_create(options);
        ASSERT_NE(engine, nullptr);
        EXPECT_EQ(engine->backend_name(), "sim");
        FileOptions fo;
        fo.create = true;
        auto file = engine->open("kept", fo);
        ASSERT_TRUE(file.has_value()) << file.status().to_string();
        EXPECT_TRUE(engine->is_direct(*file));
        EXPECT_EQ(engine->alignment_bytes(*file), storage->device().options().logical_block_bytes);
        ASSERT_TRUE(engine->write(*file, 0, out.span()).is_ok());
        ASSERT_TRUE(engine->sync(*file).is_ok());
        EXPECT_TRUE(engine->close(*file).is_ok());
    }
    // The bytes went to the device passed in, which outlives the engine: a second engine on it
    // finds the file.
    EXPECT_GE(storage->device().used_bytes(), kBytes);
    auto engine = must_create(options);
    ASSERT_NE(engine, nullptr);
    auto file = engine->open("kept", FileOptions{});
    ASSERT_TRUE(file.has_value()) << file.status().to_string();
    AlignedBuffer in = must_allocate(kBytes);
    ASSERT_TRUE(engine->read(*file, 0, in.span()).is_ok());
    EXPECT_EQ(std::memcmp(in.data(), out.data(), kBytes), 0);
}

TEST(Storage, StorageAndSimTogetherAreRefused) {
    auto storage = must_make_sim_storage();
    ASSERT_NE(storage, nullptr);
    EngineOptions options;
    options.storage = storage.get();
    options.sim = SimOptions{};
    auto engine = Engine::create(options);
    ASSERT_FALSE(engine.has_value());
    EXPECT_EQ(engine.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(engine.error().message().find("storage"), std::string::npos)
        << engine.error().to_string();
}

// A storage that forwards to another and records what the engine asked of it; it can make an
// open fail at a chosen path, and mark the files it opens as created (as the operating system's
// storage does for a file that did not exist), so that the engine's removal shows.
class RecordingStorage final : public Storage {
public:
    explicit RecordingStorage(Storage& inner) : inner_(inner) {}

    Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options,
                                                  std::size_t worker_index) override {
        backend_kinds.push_back(options.kind);
        backend_workers.push_back(worker_index);
        return inner_.make_backend(options, worker_index);
    }
    bool registers_buffers() const noexcept override { return inner_.registers_buffers(); }
    Status open(const FileOptions& options, DirectMode direct, StorageFile& file) override {
        opened.push_back(file.path);
        if (file.path == fail_open_of) return Status::io_error("open refused by the test", EIO);
        ZINF_TRY(inner_.open(options, direct, file));
        file.created = true;
        return Status::ok();
    }
    Status preallocate(StorageFile& file, std::uint64_t length_bytes) override {
        preallocated_bytes.push_back(length_bytes);
        return inner_.preallocate(file, length_bytes);
    }
    Status sync(const StorageFile& file) override {
        synced.push_back(file.path);
        return inner_.sync(file);
    }
    Status remove(const StorageFile& file) override {
        removed.push_back(file.path);
        return inner_.remove(file);
    }

    std::string fail_open_of;
    std::vector<std::string> backend_kinds;
    std::vector<std::size_t> backend_workers;
    std::vector<std::string> opened;
    std::vector<std::uint64_t> preallocated_bytes;
    std::vector<std::string> synced;
    std::vector<std::string> removed;

private:
    Storage& inner_;
};

TEST(Storage, EveryFileCallAndEveryBackendOfTheEngineGoThroughItsStorage) {
    auto sim = must_make_sim_storage();
    ASSERT_NE(sim, nullptr);
    RecordingStorage storage(*sim);
    EngineOptions options;
    options.aio = small_aio("auto", DirectMode::kAuto);  // two workers
    options.storage = &storage;
    auto engine = must_create(options);
    ASSERT_NE(engine, nullptr);
    // The first worker gets aio.backend, the second what the first one settled on.
    EXPECT_EQ(storage.backend_kinds, (std::vector<std::string>{"auto", "sim"}));
    EXPECT_EQ(storage.backend_workers, (std::vector<std::size_t>{0, 1}));

    const std::vector<std::string> paths = {"a", "b", "c"};
    FileOptions fo;
    fo.create = true;
    fo.stripe_chunk_bytes = 4096;
    fo.preallocate_bytes = 7 * 4096 + 100;  // stripes get 3 chunks, 2 chunks + 100, 2 chunks
    auto file = engine->open(paths, fo);
    ASSERT_TRUE(file.has_value()) << file.status().to_string();
    EXPECT_EQ(storage.opened, paths);
    EXPECT_EQ(storage.preallocated_bytes,
              (std::vector<std::uint64_t>{3 * 4096, 2 * 4096 + 100, 2 * 4096}));
    ASSERT_TRUE(engine->sync(*file).is_ok());
    EXPECT_EQ(storage.synced, paths);
    // The simulated device takes no registered buffers: nothing to do, and no error.
    AlignedBuffer region = must_allocate(1 << 20);
    EXPECT_TRUE(engine->register_buffers(region.span()).is_ok());
    EXPECT_TRUE(engine->close(*file).is_ok());
    EXPECT_TRUE(storage.removed.empty());

    // An open that fails at its third path removes, through the storage, the two files it made.
    storage.opened.clear();
    storage.fail_open_of = "z";
    auto failed = engine->open(std::vector<std::string>{"x", "y", "z"}, fo);
    ASSERT_FALSE(failed.has_value());
    EXPECT_NE(failed.error().message().find("refused by the test"), std::string::npos);
    EXPECT_EQ(storage.opened, (std::vector<std::string>{"x", "y", "z"}));
    EXPECT_EQ(storage.removed, (std::vector<std::string>{"x", "y"}));
}

TEST(Storage, TheOperatingSystemsStoragePassedInWorksAsTheDefaultDoes) {
    zinf::test::TempDir dir("storage");
    auto storage = make_os_storage(posix_file_system(), "posix");
    EngineOptions options;
    options.aio = small_aio("posix", DirectMode::kAuto);
    options.storage = storage.get();
    auto engine = must_create(options);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->backend_name(), "posix");
    FileOptions fo;
    fo.create = true;
    fo.exclusive = true;
    fo.preallocate_bytes = 256 * 1024;
    auto file = engine->open(dir.file("f"), fo);
    ASSERT_TRUE(file.has_value()) << file.status().to_string();
    AlignedBuffer out = must_allocate(256 * 1024);
    std::mt19937_64 rng(zinf::test::seed());
    fill_random(out.span(), rng);
    ASSERT_TRUE(engine->write(*file, 0, out.span()).is_ok());
    ASSERT_TRUE(engine->sync(*file).is_ok());
    AlignedBuffer in = must_allocate(256 * 1024);
    ASSERT_TRUE(engine->read(*file, 0, in.span()).is_ok());
    EXPECT_EQ(std::memcmp(in.data(), out.data(), in.size()), 0);
    EXPECT_TRUE(engine->close(*file).is_ok());
    // O_EXCL refuses the file now that it exists; the failed open leaves it in place.
    auto again = engine->open(dir.file("f"), fo);
    ASSERT_FALSE(again.has_value());
    EXPECT_EQ(again.error().errno_value(), EEXIST) << again.error().to_string();
    EXPECT_TRUE(std::filesystem::exists(dir.file("f")));
}

}  // namespace
}  // namespace zinf::io::test
