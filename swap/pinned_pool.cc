// PinnedPool: hwloc placement, mlock, and a mutex-guarded free stack with holder tracking.
#include "swap/pinned_pool.h"

#include <hwloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "io/engine.h"
#include "src/base/aligned.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::swap {

struct PinnedPool::Memory {
    hwloc_topology_t topology = nullptr;
    void* base = nullptr;
    std::size_t size_bytes = 0;
    bool locked = false;

    ~Memory() {
        if (base != nullptr) {
            if (locked) ::munlock(base, size_bytes);
            (void)advise_dont_fork({static_cast<std::byte*>(base), size_bytes}, false);
            hwloc_free(topology, base, size_bytes);
        }
        if (topology != nullptr) hwloc_topology_destroy(topology);
    }

    // PinnedPool::create's steps, in order; `pool` names the pool in messages.
    Status load_topology(const std::string& pool, const std::string& bus_id);
    int nearest_node(const std::string& pool, const std::string& bus_id) const;
    int allocate(const std::string& pool, int node, std::size_t total);
    void touch_pages() const;
    Status lock(const PinnedPoolOptions& options);
};

namespace {

// The NUMA node of the first non-I/O ancestor of the PCI device `bus_id`; -1 if unknown.
int pci_device_node(hwloc_topology_t topology, const std::string& bus_id) {
    hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topology, bus_id.c_str());
    if (pci == nullptr) return -1;
    hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, pci);
    if (ancestor == nullptr || ancestor->nodeset == nullptr) return -1;
    return hwloc_bitmap_first(ancestor->nodeset);
}

// The NUMA node of the CPU the calling thread last ran on; -1 when hwloc cannot tell.
int calling_thread_node(hwloc_topology_t topology) {
    hwloc_bitmap_t cpuset = hwloc_bitmap_alloc();
    hwloc_bitmap_t nodeset = hwloc_bitmap_alloc();
    int node = -1;
    if (cpuset != nullptr && nodeset != nullptr &&
        hwloc_get_last_cpu_location(topology, cpuset, HWLOC_CPUBIND_THREAD) == 0) {
        hwloc_cpuset_to_nodeset(topology, cpuset, nodeset);
        node = hwloc_bitmap_first(nodeset);
    }
    hwloc_bitmap_free(cpuset);
    hwloc_bitmap_free(nodeset);
    return node;
}

}  // namespace

// PCI objects are loaded only for a device with a bus id (a GPU): I/O discovery loads plugins,
// which the CPU path does not need.
Status PinnedPool::Memory::load_topology(const std::string& pool, const std::string& bus_id) {
    if (hwloc_topology_init(&topology) != 0 ||
        (!bus_id.empty() &&
         hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) ||
        hwloc_topology_load(topology) != 0) {
        return Status::internal(
            str_cat("pinned pool '", pool, "': hwloc topology: ", std::strerror(errno)));
    }
    return Status::ok();
}

// The node closest to the device's PCI bus where it has one (a GPU), else the node the calling
// thread runs on; -1 when neither is known.
int PinnedPool::Memory::nearest_node(const std::string& pool, const std::string& bus_id) const {
    const int node = bus_id.empty() ? -1 : pci_device_node(topology, bus_id);
    if (node >= 0) return node;
    if (!bus_id.empty()) {
        log::debug("pinned pool '", pool, "': no NUMA node known for PCI device ", bus_id,
                   "; using the calling thread's");
    }
    return calling_thread_node(topology);
}

// Allocates `total` page-aligned bytes bound to `node` where binding works, else unbound.
// Returns the node the memory is bound to, or -1; base stays null (errno set by hwloc) when
// even the unbound allocation failed.
int PinnedPool::Memory::allocate(const std::string& pool, int node, std::size_t total) {
    int bound_node = -1;
    hwloc_bitmap_t nodeset = hwloc_bitmap_alloc();
    if (node >= 0 && nodeset != nullptr) {
        hwloc_bitmap_only(nodeset, static_cast<unsigned>(node));
        base = hwloc_alloc_membind(topology, total, nodeset, HWLOC_MEMBIND_BIND,
                                   HWLOC_MEMBIND_BYNODESET);
        if (base != nullptr) bound_node = node;
    }
    hwloc_bitmap_free(nodeset);
    if (base == nullptr) {
        // Binding unsupported (no NUMA, seccomp'ed mbind): plain page-aligned memory.
        log::debug("pinned pool '", pool, "': NUMA binding unavailable (", std::strerror(errno),
                   "); allocating unbound");
        base = hwloc_alloc(topology, total);
    }
    return bound_node;
}

// Huge pages where the kernel has them (one block-layer segment per O_DIRECT piece: see
// advise_huge_pages), asked for before the first touch. Then touch every page now so that no
// page fault lands on the hot path (mlock would too).
void PinnedPool::Memory::touch_pages() const {
    ZINF_ASSERT(is_aligned(base, kPageBytes));
    (void)advise_huge_pages({static_cast<std::byte*>(base), size_bytes});
    // A forked child (a DataLoader worker) neither shares nor copies the pool.
    (void)advise_dont_fork({static_cast<std::byte*>(base), size_bytes}, true);
    std::memset(base, 0, size_bytes);
}

// mlock failing is kNotSupported unless options.allow_unlocked, which only logs a warning;
// options.lock false leaves the memory pageable by request.
Status PinnedPool::Memory::lock(const PinnedPoolOptions& options) {
    if (!options.lock) return Status::ok();
    if (::mlock(base, size_bytes) == 0) {
        locked = true;
        return Status::ok();
    }
    const int err = errno;
    const std::string what =
        str_cat("pinned pool '", options.name, "': mlock of ", format_bytes(size_bytes),
                " failed: ", std::strerror(err), " (raise `ulimit -l` or run with CAP_IPC_LOCK)");
    if (!options.allow_unlocked) return Status::not_supported(what, err);
    log::warning(what, "; continuing with unlocked memory");
    return Status::ok();
}

Result<std::unique_ptr<PinnedPool>> PinnedPool::create(const PinnedPoolOptions& options) {
    if (options.buffer_count == 0 || options.buffer_size_bytes == 0) {
        return Status::invalid_argument(str_cat("pinned pool '", options.name, "': buffer_count (",
                                                options.buffer_count, ") and buffer_size (",
                                                options.buffer_size_bytes, " B) must be positive"));
    }
    std::unique_ptr<PinnedPool> pool(new PinnedPool());
    pool->name_ = options.name;
    pool->buffer_count_ = options.buffer_count;
    pool->buffer_size_bytes_ = align_up(options.buffer_size_bytes, kPageBytes);
    const std::size_t total = pool->buffer_count_ * pool->buffer_size_bytes_;

    auto memory = std::make_unique<Memory>();
    const std::string bus_id =
        options.near_device != nullptr ? options.near_device->pci_bus_id() : std::string();
    ZINF_TRY(memory->load_topology(options.name, bus_id));
    const int node = memory->nearest_node(options.name, bus_id);
    pool->numa_node_ = memory->allocate(options.name, node, total);
    if (memory->base == nullptr) {
        return Status::no_space(
            str_cat("pinned pool '", options.name, "': cannot allocate ", format_bytes(total), " (",
                    options.buffer_count, " x ", format_bytes(pool->buffer_size_bytes_), ")"),
            errno);
    }
    memory->size_bytes = total;
    memory->touch_pages();
    ZINF_TRY(memory->lock(options));

    pool->locked_ = memory->locked;
    pool->region_ = {static_cast<std::byte*>(memory->base), total};
    pool->memory_ = std::move(memory);
    pool->free_.reserve(pool->buffer_count_);
    // Stack order: buffer 0 is handed out first.
    for (std::size_t i = pool->buffer_count_; i > 0; --i) pool->free_.push_back(i - 1);
    pool->holders_.assign(pool->buffer_count_, std::thread::id());
    log::debug("pinned pool '", pool->name_, "': ", pool->buffer_count_, " x ",
               format_bytes(pool->buffer_size_bytes_), ", NUMA node ", pool->numa_node_,
               pool->locked_ ? ", locked" : ", not locked");
    return pool;
}

PinnedPool::~PinnedPool() {
    {
        std::lock_guard lock(mutex_);
        ZINF_ASSERT_MSG(free_.size() == buffer_count_,
                        str_cat("pinned pool '", name_, "' destroyed with ",
                                buffer_count_ - free_.size(), " buffer(s) still held"));
    }
    if (registered_device_ != nullptr) {
        const Status s = registered_device_->unregister_host_memory(region_.data());
        if (!s.is_ok()) log::warning("pinned pool '", name_, "': ", s.to_string());
    }
}

Status PinnedPool::register_with(io::Engine& engine) {
    return engine.register_buffers(region_).with_context(str_cat("pinned pool '", name_, "'"));
}

Status PinnedPool::register_with_device(Device& device) {
    ZINF_ASSERT(registered_device_ == nullptr);
    ZINF_TRY(device.register_host_memory(region_).with_context(
        str_cat("pinned pool '", name_, "' on ", device.name())));
    registered_device_ = &device;
    return Status::ok();
}

PinnedBuffer PinnedPool::take_locked(std::size_t index) noexcept {
    ZINF_ASSERT_LT(index, buffer_count_);
    ZINF_ASSERT(holders_[index] == std::thread::id());
    holders_[index] = std::this_thread::get_id();
    return PinnedBuffer(this, index,
                        region_.subspan(index * buffer_size_bytes_, buffer_size_bytes_));
}

Status PinnedPool::exhausted_error(StatusCode code, std::chrono::milliseconds timeout) const {
    const std::string size = str_cat("pinned pool '", name_, "' (", buffer_count_, " buffers of ",
                                     format_bytes(buffer_size_bytes_), ")");
    if (code == StatusCode::kBusy) {
        return Status(code, str_cat(size,
                                    " is exhausted and all its buffers are held by the "
                                    "calling thread: waiting would deadlock"));
    }
    return Status(code, str_cat(size, ": no buffer was returned within ", timeout.count(),
                                " ms; all ", buffer_count_, " are held"));
}

Result<PinnedBuffer> PinnedPool::acquire(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (free_.empty()) {
        const auto self = std::this_thread::get_id();
        const auto held_by_self =
            static_cast<std::size_t>(std::count(holders_.begin(), holders_.end(), self));
        if (held_by_self == buffer_count_) return exhausted_error(StatusCode::kBusy, timeout);
        if (!freed_cv_.wait_for(lock, timeout, [&] { return !free_.empty(); })) {
            return exhausted_error(StatusCode::kTimeout, timeout);
        }
    }
    const std::size_t index = free_.back();
    free_.pop_back();
    return take_locked(index);
}

Result<PinnedBuffer> PinnedPool::try_acquire() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) {
        return Status::busy(str_cat("pinned pool '", name_, "' (", buffer_count_, " buffers of ",
                                    format_bytes(buffer_size_bytes_), ") has no free buffer"));
    }
    const std::size_t index = free_.back();
    free_.pop_back();
    return take_locked(index);
}

std::size_t PinnedPool::free_count() const {
    std::lock_guard lock(mutex_);
    return free_.size();
}

void PinnedPool::release(std::size_t index) noexcept {
    {
        std::lock_guard lock(mutex_);
        ZINF_ASSERT_LT(index, buffer_count_);
        // Returning a buffer that is already free is a double release.
        ZINF_ASSERT(holders_[index] != std::thread::id());
        ZINF_ASSERT_LT(free_.size(), buffer_count_);
        holders_[index] = std::thread::id();
        free_.push_back(index);  // within reserved capacity: never allocates
    }
    freed_cv_.notify_one();
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), index_(other.index_), span_(other.span_) {
    other.span_ = {};
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
        reset();
        pool_ = std::exchange(other.pool_, nullptr);
        index_ = other.index_;
        span_ = std::exchange(other.span_, {});
    }
    return *this;
}

void PinnedBuffer::reset() noexcept {
    if (pool_ != nullptr) {
        std::exchange(pool_, nullptr)->release(index_);
        span_ = {};
    }
}

}  // namespace zinf::swap
