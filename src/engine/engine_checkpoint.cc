// zinf::Engine's checkpoints: one rank's states as files written chunk by chunk of the state
// store (states on NVMe never need to fit in memory), the shards of several ranks under one
// manifest committed only when every rank wrote its shard, and loading under another world size
// or stage by re-partitioning the saved layout element by element.
//
// Files of one rank (a whole checkpoint at world size 1, <tag>/rank<r> at N ranks):
// master.fp32 and <moment>.<state dtype> per moment the optimizer keeps (its descriptor's names:
// exp_avg.fp32, exp_avg_sq.fp32, max_exp_avg_sq.fp32 for Adam with amsgrad; exp_avg.bf16, or
// exp_avg.int8 with its block scales in exp_avg.int8_scales, under compressed states), and
// parameters.<dtype>, each the rank's optimizer domain in order: under stages 1-3 its partition
// (every parameter's slice r, padding included), under stage 0 the whole padded layout.
#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cast.h"
#include "kernels/state_codec.h"
#include "src/base/log.h"
#include "src/engine/checkpoint_files.h"
#include "src/engine/engine.h"

namespace zinf {
namespace {

// The state files of a layout: the master, then each kept moment by its descriptor's name.
constexpr std::size_t kMaxStateFiles = 1 + kMaxMoments;
// The manifest's int8_code: the version of kernels/state_codec.h's int8 code (2: the exponent
// and three mantissa bits; 1, written as no key, the logarithmic code before it).
constexpr int kInt8Code = 2;

std::string state_file_name(const engine::StateLayout& l, std::size_t i, StateDType dtype) {
    return i == 0 ? std::string("master.fp32")
                  : str_cat(l.moment(i - 1).name, ".", state_dtype_name(dtype));
}
std::string scales_file_name(const engine::StateLayout& l, std::size_t i) {
    return str_cat(l.moment(i - 1).name, ".int8_scales");
}

std::span<float> state_span(const engine::StateChunk& c, std::size_t i) {
    return i == 0 ? c.master : c.moments[i - 1];
}

std::string exact(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

std::string hex64(std::uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return buf;
}

std::string shard_name(int rank) {
    return "rank" + std::to_string(rank);
}

// Where a saved domain put each parameter: the layout of (world size, stage) on one rank.
struct SavedLayout {
    zero::Partitioning part;
    bool partitioned = false;  // stage >= 1: each shard is its partition
    int shards = 1;            // files to read: world size, or 1 for stage 0 (all equal)

    // Shard and element offset (in the shard's domain files) of element e of parameter p.
    std::pair<int, std::uint64_t> locate(std::size_t p, std::size_t e) const {
        const auto& s = part.slot(p);
        if (!partitioned) return {0, s.full_offset_numel + e};
        const auto shard = static_cast<int>(e / s.slice_numel);
        return {shard, s.partition_offset_numel + e % s.slice_numel};
    }
    // Elements of parameter p from e on that sit in one shard, contiguously.
    std::size_t run_length(std::size_t p, std::size_t e) const {
        const auto& s = part.slot(p);
        if (!partitioned) return s.numel - e;
        return std::min(s.numel, (e / s.slice_numel + 1) * s.slice_numel) - e;
    }
};

// One compressed moment of a chunk in its stored form (elements, int8 scales), for checkpoints.
struct CodedChunk {
    std::vector<std::byte> elements;
    std::vector<float> scales;
    CodedChunk(StateDType dtype, std::size_t chunk_numel)
        : elements(chunk_numel * state_element_size_bytes(dtype)),
          scales(state_scale_count(dtype, chunk_numel)) {}
    std::span<std::byte> elements_of(StateDType dtype, std::size_t n) {
        return std::span(elements).first(n * state_element_size_bytes(dtype));
    }
    std::span<float> scales_of(StateDType dtype, std::size_t n) {
        return std::span(scales).first(state_scale_count(dtype, n));
    }
};

// A file of one old shard read front to back at increasing offsets, skipping what this rank
// does not need, so that its checksum is verified over every byte.
class ShardCursor {
public:
    ShardCursor(engine::CheckpointFile file, std::uint64_t size_bytes)
        : file_(std::move(file)), size_(size_bytes) {}
    Status read_at(std::uint64_t offset, std::span<std::byte> out) {
        ZINF_ASSERT_GE(offset, pos_);
        ZINF_TRY(skip_to(offset));
        ZINF_TRY(file_.read(out));
        pos_ += out.size();
        return Status::ok();
    }
    Status finish(const engine::CheckpointReader& r) {
        ZINF_TRY(skip_to(size_));
        return r.end_file(file_);
    }

private:
    Status skip_to(std::uint64_t offset) {
        while (pos_ < offset) {
            const auto n =
                static_cast<std::size_t>(std::min<std::uint64_t>(offset - pos_, 1 << 20));
            if (scratch_.size() < n) scratch_.resize(n);
            ZINF_TRY(file_.read(std::span(scratch_).first(n)));
            pos_ += n;
        }
        return Status::ok();
    }
    engine::CheckpointFile file_;
    std::uint64_t size_ = 0;
    std::uint64_t pos_ = 0;
    std::vector<std::byte> scratch_;  // what is skipped, read and checksummed
};

}  // namespace

Status Engine::save_states(engine::CheckpointWriter& w) {
    ZINF_TRY(save_state_files(
        w, [&](std::size_t k, const engine::StateChunk& c) { return states_->read_chunk(k, c); },
        false));
    return save_parameters(w);
}

// The optimizer's state files, chunk by chunk as `read` gives them (the store's current states,
// or a pinned snapshot read from the background thread). With `parameters_from_master`, the
// parameters file too, from each chunk's master: the parameters are always the master rounded
// to their dtype (initialised from the values they were rounded from, and written from the
// stepped master after every step), so the file is bitwise what save_parameters reads.
Status Engine::save_state_files(
    engine::CheckpointWriter& w,
    const std::function<Status(std::size_t, const engine::StateChunk&)>& read,
    bool parameters_from_master) const {
    const engine::StateLayout layout = states_->layout();
    const StateDType sd = states_->state_dtype();
    engine::ChunkBuffers buffers(layout, states_->chunk_numel());
    CodedChunk coded(sd, states_->chunk_numel());
    const std::size_t n_files = layout.arrays();
    const bool int8 = sd == StateDType::kInt8;
    engine::CheckpointFile files[kMaxStateFiles];
    engine::CheckpointFile scale_files[kMaxStateFiles];
    for (std::size_t i = 0; i < n_files; ++i) {
        ZINF_ASSIGN_OR_RETURN(files[i], w.begin_file(state_file_name(layout, i, sd)));
        if (i > 0 && int8) {
            ZINF_ASSIGN_OR_RETURN(scale_files[i], w.begin_file(scales_file_name(layout, i)));
        }
    }
    engine::CheckpointFile param_file;
    std::vector<std::uint16_t> narrow(
        parameters_from_master && plan_.dtype != DType::kFloat32 ? states_->chunk_numel() : 0);
    if (parameters_from_master) {
        ZINF_ASSIGN_OR_RETURN(param_file,
                              w.begin_file("parameters." + std::string(dtype_name(plan_.dtype))));
    }
    for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
        const std::size_t n = states_->chunk_length(k);
        const engine::StateChunk c = buffers.chunk(n);
        ZINF_TRY(read(k, c));
        if (parameters_from_master) {
            if (plan_.dtype == DType::kFloat32) {
                ZINF_TRY(param_file.append(std::as_bytes(c.master)));
            } else {
                const std::span<std::uint16_t> to(narrow.data(), n);
                kernels::cast_from_fp32(kernel_.isa(), c.master, to, plan_.dtype);
                ZINF_TRY(param_file.append(std::as_bytes(to)));
            }
        }
        for (std::size_t i = 0; i < n_files; ++i) {
            if (i == 0 || sd == StateDType::kFp32) {
                ZINF_TRY(files[i].append(std::as_bytes(state_span(c, i))));
                continue;
            }
            // In the stored dtype: the values read back encode to the bits the store holds.
            kernels::encode_moment(sd, layout.moment(i - 1).non_negative, state_span(c, i),
                                   coded.elements_of(sd, n), coded.scales_of(sd, n));
            ZINF_TRY(files[i].append(coded.elements_of(sd, n)));
            if (int8) ZINF_TRY(scale_files[i].append(std::as_bytes(coded.scales_of(sd, n))));
        }
    }
    for (std::size_t i = 0; i < n_files; ++i) {
        ZINF_TRY(w.end_file(files[i]));
        if (i > 0 && int8) ZINF_TRY(w.end_file(scale_files[i]));
    }
    if (parameters_from_master) ZINF_TRY(w.end_file(param_file));
    return Status::ok();
}

// The parameters (the optimizer domain), in their dtype.
Status Engine::save_parameters(engine::CheckpointWriter& w) {
    const std::size_t eb = dtype_size_bytes(plan_.dtype);
    const std::size_t chunk = std::max<std::size_t>(1, states_->chunk_numel());
    std::vector<std::byte> params(chunk * eb);
    ZINF_ASSIGN_OR_RETURN(auto fp,
                          w.begin_file("parameters." + std::string(dtype_name(plan_.dtype))));
    for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
        const auto piece = std::span<std::byte>(params.data(), states_->chunk_length(k) * eb);
        ZINF_TRY(coordinator_->read_domain_parameters(k * chunk, piece, stream()));
        ZINF_TRY(fp.append(piece));
    }
    return w.end_file(fp);
}

Status Engine::load_states(const engine::CheckpointReader& r, const SavedShape& saved) {
    const engine::StateLayout layout = states_->layout();
    const StateDType sd = saved.state_dtype;
    engine::ChunkBuffers buffers(layout, states_->chunk_numel());
    CodedChunk coded(sd, states_->chunk_numel());
    const auto numel = static_cast<std::uint64_t>(states_->numel());
    const std::size_t n_files = layout.arrays();
    const bool int8 = sd == StateDType::kInt8;
    engine::CheckpointFile files[kMaxStateFiles];
    engine::CheckpointFile scale_files[kMaxStateFiles];
    for (std::size_t i = 0; i < n_files; ++i) {
        const std::uint64_t bytes = i == 0 ? numel * 4 : numel * state_element_size_bytes(sd);
        ZINF_ASSIGN_OR_RETURN(files[i], r.open_file(state_file_name(layout, i, sd), bytes));
        if (i > 0 && int8) {
            ZINF_ASSIGN_OR_RETURN(scale_files[i],
                                  r.open_file(scales_file_name(layout, i),
                                              state_scale_count(sd, states_->numel()) * 4));
        }
    }
    for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
        const std::size_t n = states_->chunk_length(k);
        const engine::StateChunk c = buffers.chunk(n);
        for (std::size_t i = 0; i < n_files; ++i) {
            if (i == 0 || sd == StateDType::kFp32) {
                ZINF_TRY(files[i].read(std::as_writable_bytes(state_span(c, i))));
                continue;
            }
            ZINF_TRY(files[i].read(coded.elements_of(sd, n)));
            if (int8) ZINF_TRY(scale_files[i].read(std::as_writable_bytes(coded.scales_of(sd, n))));
            kernels::decode_moment(sd, layout.moment(i - 1).non_negative, coded.elements_of(sd, n),
                                   coded.scales_of(sd, n), state_span(c, i));
        }
        ZINF_TRY(states_->write_chunk(k, engine::as_const(c)));
    }
    for (std::size_t i = 0; i < n_files; ++i) {
        ZINF_TRY(r.end_file(files[i]));
        if (i > 0 && int8) ZINF_TRY(r.end_file(scale_files[i]));
    }
    const std::size_t eb = dtype_size_bytes(plan_.dtype);
    const std::size_t chunk = std::max<std::size_t>(1, states_->chunk_numel());
    std::vector<std::byte> params(chunk * eb);
    ZINF_ASSIGN_OR_RETURN(auto fp, r.open_file("parameters." + std::string(dtype_name(plan_.dtype)),
                                               static_cast<std::uint64_t>(states_->numel()) * eb));
    for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
        const auto piece = std::span<std::byte>(params.data(), states_->chunk_length(k) * eb);
        ZINF_TRY(fp.read(piece));
        ZINF_TRY(coordinator_->write_domain_parameters(k * chunk, piece, stream()));
    }
    return r.end_file(fp);
}

// The states saved by `shards` (one reader per old rank, or one for a stage-0 save) laid out
// for this rank: for every chunk of this rank's domain, each parameter's elements are read from
// the shard and offset where the saving layout put them; padding stays zero.
Status Engine::load_repartitioned(const std::vector<engine::CheckpointReader>& shards,
                                  const SavedShape& shape) {
    const auto& part = coordinator_->partitioning();
    std::vector<std::size_t> numels;
    for (std::size_t p = 0; p < part.parameter_count(); ++p) numels.push_back(part.slot(p).numel);
    ZINF_ASSIGN_OR_RETURN(auto saved_part,
                          zero::Partitioning::create(numels, shape.world, 0, shape.align_numel));
    SavedLayout saved{std::move(saved_part), shape.stage >= 1, shape.stage >= 1 ? shape.world : 1};
    const std::uint64_t saved_domain =
        saved.partitioned ? saved.part.partition_numel() : saved.part.full_numel();
    const engine::StateLayout layout = states_->layout();
    const StateDType sd = shape.state_dtype;
    const std::size_t sb = state_element_size_bytes(sd);
    const bool int8 = sd == StateDType::kInt8;
    const std::size_t eb = dtype_size_bytes(plan_.dtype);
    const std::string param_file = "parameters." + std::string(dtype_name(plan_.dtype));
    // cursors[file][shard]: files [0, n_states) the states, n_states the parameters; the int8
    // moments' scales in scale_cursors[file][shard].
    const std::size_t n_states = layout.arrays();
    // Bytes per element of file f as saved.
    auto element_bytes = [&](std::size_t f) -> std::size_t {
        return f == 0 ? 4 : f < n_states ? sb : eb;
    };
    std::vector<std::vector<ShardCursor>> cursors(n_states + 1);
    std::vector<std::vector<ShardCursor>> scale_cursors(n_states);
    for (std::size_t f = 0; f <= n_states; ++f) {
        const std::string name = f < n_states ? state_file_name(layout, f, sd) : param_file;
        const std::uint64_t bytes = saved_domain * element_bytes(f);
        for (int k = 0; k < saved.shards; ++k) {
            ZINF_ASSIGN_OR_RETURN(auto file, shards[k].open_file(name, bytes));
            cursors[f].emplace_back(std::move(file), bytes);
            if (f > 0 && f < n_states && int8) {
                const std::uint64_t scale_bytes =
                    state_scale_count(sd, static_cast<std::size_t>(saved_domain)) * 4;
                ZINF_ASSIGN_OR_RETURN(
                    auto sf, shards[k].open_file(scales_file_name(layout, f), scale_bytes));
                scale_cursors[f].emplace_back(std::move(sf), scale_bytes);
            }
        }
    }
    // The int8 scale last read per (moment file, shard): runs of one block may come in pieces
    // (this rank's chunks need not end on the saved blocks), and a cursor only moves forward.
    std::vector<std::vector<std::pair<std::uint64_t, float>>> last_scale(
        n_states, std::vector<std::pair<std::uint64_t, float>>(
                      static_cast<std::size_t>(saved.shards), {~std::uint64_t{0}, 0.0f}));
    std::vector<std::byte> coded;
    // Elements [offset, offset + out.size()) of compressed moment file f of `shard`, decoded.
    auto read_coded = [&](std::size_t f, int shard, std::uint64_t offset,
                          std::span<float> out) -> Status {
        coded.resize(out.size() * sb);
        ZINF_TRY(cursors[f][shard].read_at(offset * sb, coded));
        const bool non_negative = layout.moment(f - 1).non_negative;
        for (std::size_t j = 0; j < out.size(); ++j) {
            if (sd == StateDType::kBf16) {
                std::uint16_t bits = 0;
                std::memcpy(&bits, coded.data() + j * 2, 2);
                out[j] = kernels::bf16_to_float(bits);
                continue;
            }
            const std::uint64_t block = (offset + j) / kStateBlockNumel;
            auto& [at, scale] = last_scale[f][static_cast<std::size_t>(shard)];
            if (at != block) {
                ZINF_TRY(scale_cursors[f][shard].read_at(
                    block * 4, std::as_writable_bytes(std::span<float>(&scale, 1))));
                at = block;
            }
            out[j] = kernels::decode_int8(static_cast<std::uint8_t>(coded[j]), scale, non_negative);
        }
        return Status::ok();
    };
    const bool partitioned = coordinator_->plan().optimizer_partitioned;
    const auto rank = static_cast<std::size_t>(part.rank());
    engine::ChunkBuffers buffers(layout, states_->chunk_numel());
    std::vector<std::byte> params(std::max<std::size_t>(1, states_->chunk_numel()) * eb);
    for (std::size_t k = 0; k < states_->chunk_count(); ++k) {
        const std::size_t begin = k * states_->chunk_numel();
        const std::size_t len = states_->chunk_length(k);
        const engine::StateChunk c = buffers.chunk(len);
        for (std::size_t i = 0; i < n_states; ++i) {
            std::fill(state_span(c, i).begin(), state_span(c, i).end(), 0.0f);
        }
        std::fill(params.begin(), params.begin() + static_cast<std::ptrdiff_t>(len * eb),
                  std::byte{0});
        for (std::size_t p = 0; p < part.parameter_count(); ++p) {
            // This rank's real elements of p: [first, first + count) at domain offset `at`.
            const auto& s = part.slot(p);
            const std::size_t first = partitioned ? rank * s.slice_numel : 0;
            const std::size_t count = coordinator_->domain_valid_numel(p);
            const std::size_t at = coordinator_->domain_offset_numel(p);
            const std::size_t lo = std::max(begin, at), hi = std::min(begin + len, at + count);
            for (std::size_t d = lo; d < hi;) {
                const std::size_t e = first + (d - at);
                const std::size_t n = std::min(hi - d, saved.run_length(p, e));
                const auto [shard, offset] = saved.locate(p, e);
                for (std::size_t f = 0; f <= n_states; ++f) {
                    if (f > 0 && f < n_states && sd != StateDType::kFp32) {
                        ZINF_TRY(
                            read_coded(f, shard, offset, state_span(c, f).subspan(d - begin, n)));
                        continue;
                    }
                    std::span<std::byte> out =
                        f < n_states
                            ? std::as_writable_bytes(state_span(c, f).subspan(d - begin, n))
                            : std::span<std::byte>(params.data() + (d - begin) * eb, n * eb);
                    ZINF_TRY(cursors[f][shard].read_at(offset * element_bytes(f), out));
                }
                d += n;
            }
        }
        ZINF_TRY(states_->write_chunk(k, engine::as_const(c)));
        ZINF_TRY(coordinator_->write_domain_parameters(
            begin, std::span<const std::byte>(params.data(), len * eb), stream()));
    }
    for (std::size_t f = 0; f <= n_states; ++f) {
        for (std::size_t k = 0; k < cursors[f].size(); ++k)
            ZINF_TRY(cursors[f][k].finish(shards[k]));
        if (f < n_states) {
            for (std::size_t k = 0; k < scale_cursors[f].size(); ++k)
                ZINF_TRY(scale_cursors[f][k].finish(shards[k]));
        }
    }
    return Status::ok();
}

// The manifest keys of one rank's states.
void Engine::describe_states(engine::CheckpointWriter& w) const {
    const auto& part = coordinator_->partitioning();
    w.set("step", std::to_string(global_steps_));
    w.set("micro_steps", std::to_string(micro_steps_));
    w.set("skipped_steps", std::to_string(skipped_steps_));
    w.set("optimizer_updates", std::to_string(optimizer_updates_));
    w.set("global_samples", std::to_string(global_samples_));
    const auto& ss = scaler_.state();
    w.set("loss_scale", exact(ss.scale));
    w.set("loss_scale_iteration", std::to_string(ss.iteration));
    w.set("loss_scale_last_overflow", std::to_string(ss.last_overflow_iteration));
    w.set("loss_scale_hysteresis_left", std::to_string(ss.hysteresis_left));
    w.set("config_digest", hex64(engine::checksum(std::as_bytes(std::span<const char>(
                               config_.canonical_json.data(), config_.canonical_json.size())))));
    w.set("world_size", std::to_string(part.world_size()));
    w.set("rank", std::to_string(part.rank()));
    w.set("zero_stage", std::to_string(plan_.stage));
    w.set("dtype", std::string(dtype_name(plan_.dtype)));
    w.set("master_dtype", "fp32");
    w.set("state_dtype", std::string(state_dtype_name(plan_.state_dtype)));
    // Which int8 code the states use (kernels/state_codec.h: 2, the exponent-and-mantissa
    // code); the earlier logarithmic code wrote none, and its bytes read as this one's would be
    // wrong values, so a checkpoint without it is refused.
    if (plan_.state_dtype == StateDType::kInt8) w.set("int8_code", std::to_string(kInt8Code));
    w.set("partition_align", std::to_string(plan_.partition_align_numel));
    w.set("optimizer", std::string(optimizer_kind_name(plan_.optimizer.kind)));
    w.set("amsgrad", plan_.optimizer.amsgrad ? "1" : "0");
    w.set("domain_numel", std::to_string(plan_.domain_numel));
    w.set("model_numel", std::to_string(part.model_numel()));
}

// Several ranks: rank 0 opens the checkpoint's temporary directory and tells the others its
// name; every rank writes its shard there as <tmp>/rank<r> (committed inside it, without
// `latest`); only when every rank succeeded does rank 0 write the manifest naming them all and
// rename the directory into place and point `latest` at it. Any rank's failure leaves the
// previous checkpoints and `latest` as they were (rank 0 removes the temporary directory).
Status Engine::save_sharded(const std::string& dir, const std::string& tag) {
    const int rank = communicator_.rank();
    const int world = communicator_.world_size();
    std::optional<engine::CheckpointWriter> top;
    // Rank 0's temporary name and a nonce that ties the shards to this save, to every rank.
    std::array<char, 256> shared{};
    Status status = rank == 0 ? open_sharded_save(dir, tag, top, shared) : Status::ok();
    std::vector<std::array<char, 256>> all(static_cast<std::size_t>(world));
    ZINF_TRY(communicator_.all_gather_host(std::as_bytes(std::span(shared)),
                                           std::as_writable_bytes(std::span(all))));
    const std::string line(all[0].data(), strnlen(all[0].data(), all[0].size()));
    const auto space = line.find(' ');
    if (space == std::string::npos) {
        return rank == 0 ? status
                         : Status::io_error("checkpoint " + dir + "/" + tag +
                                                ": rank 0 could not create it; not saved",
                                            EIO);
    }
    ZINF_ASSERT(status.is_ok());
    const std::string temp = line.substr(0, space);
    const std::string nonce = line.substr(space + 1);
    status = save_shard(dir + "/" + temp, nonce);
    if (!status.is_ok()) {
        log::error("checkpoint ", dir, "/", tag, ": this rank's shard: ", status.to_string());
    }
    // Every shard is written (or failed) before rank 0 commits or removes the directory.
    ZINF_ASSIGN_OR_RETURN(auto failed,
                          zero::gather_over_ranks(communicator_, status.is_ok() ? 0 : 1));
    if (!status.is_ok()) return status;
    for (int r = 0; r < world; ++r) {
        if (failed[r] == 0) continue;
        return Status::io_error(str_cat("checkpoint ", dir, "/", tag, ": rank ", r,
                                        " could not write its shard; not saved (latest unchanged)"),
                                EIO);
    }
    if (rank == 0) status = commit_sharded_save(*top, dir, tag, temp, nonce);
    ZINF_ASSIGN_OR_RETURN(auto committed,
                          zero::gather_over_ranks(communicator_, status.is_ok() ? 0 : 1));
    if (committed[0] != 0) {
        return rank == 0 ? status
                         : Status::io_error("checkpoint " + dir + "/" + tag +
                                                ": rank 0 could not commit it; not saved",
                                            EIO);
    }
    return Status::ok();
}

// Rank 0: opens the checkpoint's writer into `top` and writes "<temporary name> <nonce>" into
// `shared` (left all zeros on failure, which tells the other ranks).
Status Engine::open_sharded_save(const std::string& dir, const std::string& tag,
                                 std::optional<engine::CheckpointWriter>& top,
                                 std::span<char> shared) {
    auto w = engine::CheckpointWriter::create(file_system(), dir, tag);
    if (!w.has_value()) return w.error();
    top.emplace(std::move(*w));
    const std::uint64_t nonce = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ micro_steps_;
    const int len = std::snprintf(shared.data(), shared.size(), "%s %016" PRIx64,
                                  top->temp_name().c_str(), nonce);
    if (len < 0 || static_cast<std::size_t>(len) >= shared.size()) {
        std::fill(shared.begin(), shared.end(), '\0');
        return Status::invalid_argument("checkpoint " + dir + "/" + tag +
                                        ": the tag is too long for a sharded checkpoint");
    }
    return Status::ok();
}

// This rank's states as <shard_dir>/rank<r>, committed there without touching `latest`.
Status Engine::save_shard(const std::string& shard_dir, const std::string& nonce) {
    auto w = engine::CheckpointWriter::create(file_system(), shard_dir,
                                              shard_name(communicator_.rank()));
    if (!w.has_value()) return w.error();
    w->set_update_latest(false);
    Status status = save_states(*w);
    describe_states(*w);
    w->set("checkpoint_nonce", nonce);
    if (!status.is_ok()) return status;
    return w->commit();
}

// Rank 0, once every rank wrote its shard: checks that each is in its directory, then writes
// the manifest naming them and commits the checkpoint (when the check passed).
Status Engine::commit_sharded_save(engine::CheckpointWriter& top, const std::string& dir,
                                   const std::string& tag, const std::string& temp,
                                   const std::string& nonce) {
    const int world = communicator_.world_size();
    Status status = find_shards(dir, tag, temp, nonce);
    describe_states(top);
    if (status.is_ok()) status = write_checkpoint_extras(top);
    top.set("shards", std::to_string(world));
    top.set("checkpoint_nonce", nonce);
    if (status.is_ok()) status = top.commit();
    return status;
}

// Every shard must be where rank 0 commits (a rank writing to storage rank 0 does not see
// would otherwise leave a checkpoint without its shard): the first missing one, or one of
// another save (its nonce differs), is an error.
Status Engine::find_shards(const std::string& dir, const std::string& tag, const std::string& temp,
                           const std::string& nonce) const {
    for (int r = 0; r < communicator_.world_size(); ++r) {
        auto shard =
            engine::CheckpointReader::open(file_system(), str_cat(dir, "/", temp), shard_name(r));
        Result<std::string> got =
            shard.has_value() ? shard->get("checkpoint_nonce") : Result<std::string>(shard.error());
        if (got.has_value() && *got == nonce) continue;
        return Status::io_error(
            str_cat("checkpoint ", dir, "/", tag, ": the shard of rank ", r, " is not in rank 0's",
                    " directory (", got.has_value() ? "another save's" : got.error().to_string(),
                    "); the checkpoint directory must be storage every rank shares"),
            EIO);
    }
    return Status::ok();
}

bool Engine::background_checkpoints() const noexcept {
    return config_.swap.background_checkpoint && communicator_.world_size() == 1 &&
           states_ != nullptr && states_->snapshots();
}

Status Engine::wait_checkpoint() {
    if (!background_) return Status::ok();
    background_->thread.join();
    const std::unique_ptr<BackgroundCheckpoint> done = std::move(background_);
    times_.checkpoint_background_seconds += done->copy_seconds;
    if (!done->status.is_ok()) {
        return done->status.with_context(str_cat("checkpoint ", done->name,
                                                 " (written in the background; not saved, latest "
                                                 "unchanged)"));
    }
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.2f", done->copy_seconds);
    log::info("checkpoint saved: ", done->name, " (step ", done->step,
              "; optimizer states copied in the background in ", seconds, " s)");
    return Status::ok();
}

Status Engine::start_background_save(const std::string& dir, const std::string& tag) {
    ZINF_ASSIGN_OR_RETURN(auto w, engine::CheckpointWriter::create(file_system(), dir, tag));
    describe_states(w);
    ZINF_TRY(write_checkpoint_extras(w));
    ZINF_TRY(states_->pin_snapshot());
    background_ =
        std::make_unique<BackgroundCheckpoint>(std::move(w), dir + "/" + tag, global_steps_);
    BackgroundCheckpoint* bg = background_.get();
    bg->thread = std::thread([this, bg] {
        const auto t0 = std::chrono::steady_clock::now();
        AlignedBuffer scratch;
        std::size_t released = 0;  // chunks [0, released) are let go
        bg->status = save_state_files(
            bg->writer,
            [&](std::size_t k, const engine::StateChunk& c) {
                Status s = states_->read_snapshot_chunk(k, c, scratch);
                states_->release_snapshot_chunk(k);
                released = k + 1;
                return s;
            },
            true);
        // After an error, every chunk still pinned is released: the steps waiting go on.
        for (std::size_t k = released; k < states_->chunk_count(); ++k) {
            states_->release_snapshot_chunk(k);
        }
        if (bg->status.is_ok()) bg->status = bg->writer.commit();
        bg->copy_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    return Status::ok();
}

Status Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
    if (micro_steps_ % gradient_accumulation_steps() != 0 || forward_done_ || backward_done_) {
        return Status::invalid_argument(
            "save_checkpoint: only at a gradient accumulation boundary (after step())");
    }
    ZINF_TRY(check_usable());
    if (io_discard_) {
        return Status::invalid_argument(
            "save_checkpoint: the engine's I/O is being discarded (set_io_discard)");
    }
    settle_overlap();
    TraceScope span(trace_, "save_checkpoint", "io", 1);
    // One checkpoint at a time: the previous one (if still being copied) completes first.
    ZINF_TRY(wait_checkpoint());
    ZINF_TRY(device_.synchronize(stream()));
    if (background_checkpoints()) {
        ZINF_TRY(start_background_save(dir, tag));
        times_.checkpoint_seconds += span.end();
        log::info("checkpoint ", dir, "/", tag, " (step ", global_steps_,
                  "): optimizer states being copied in the background");
        return Status::ok();
    }
    if (communicator_.world_size() > 1) {
        ZINF_TRY(save_sharded(dir, tag));
    } else {
        ZINF_ASSIGN_OR_RETURN(auto w, engine::CheckpointWriter::create(file_system(), dir, tag));
        ZINF_TRY(save_states(w));
        describe_states(w);
        ZINF_TRY(write_checkpoint_extras(w));
        ZINF_TRY(w.commit());
    }
    times_.checkpoint_seconds += span.end();
    log::info("checkpoint saved: ", dir, "/", tag, " (step ", global_steps_, ")");
    return Status::ok();
}

Status Engine::write_checkpoint_extras(engine::CheckpointWriter& w) const {
    for (const auto& [name, bytes] : checkpoint_extras_) {
        ZINF_TRY(
            w.write_file("extra." + name, std::as_bytes(std::span(bytes.data(), bytes.size()))));
    }
    return Status::ok();
}

Result<std::string> Engine::read_checkpoint_extra(const std::string& dir, const std::string& tag,
                                                  const std::string& name) const {
    ZINF_ASSIGN_OR_RETURN(auto r, engine::CheckpointReader::open(file_system(), dir, tag));
    const std::string file = "extra." + name;
    auto size = r.file_size(file);
    if (!size.has_value()) {
        return Status::not_found("checkpoint " + dir + "/" + tag + " has no " + file);
    }
    std::string bytes(*size, '\0');
    ZINF_TRY(r.read_file(file, std::as_writable_bytes(std::span(bytes.data(), bytes.size()))));
    return bytes;
}

// The checkpoint fits this engine: the same model, dtype and optimizer; with `same` (layout),
// also the same world size and domain. A different config digest is only a warning (a
// learning-rate change is a legitimate resume).
Status Engine::check_loadable(const engine::CheckpointReader& r, bool same) const {
    const auto& part = coordinator_->partitioning();
    auto expect = [&](const char* key, const std::string& want) -> Status {
        ZINF_ASSIGN_OR_RETURN(auto got, r.get(key));
        if (got != want) {
            return Status::invalid_argument("checkpoint " + r.path() + ": " + key + " is " + got +
                                            ", this engine has " + want);
        }
        return Status::ok();
    };
    ZINF_TRY(expect("model_numel", std::to_string(part.model_numel())));
    if (same) {
        ZINF_TRY(expect("world_size", std::to_string(part.world_size())));
        ZINF_TRY(expect("domain_numel", std::to_string(plan_.domain_numel)));
    }
    ZINF_TRY(expect("dtype", std::string(dtype_name(plan_.dtype))));
    ZINF_TRY(expect("optimizer", std::string(optimizer_kind_name(plan_.optimizer.kind))));
    // Checkpoints from before amsgrad existed have no such key: they had none.
    if (r.get("amsgrad").has_value())
        ZINF_TRY(expect("amsgrad", plan_.optimizer.amsgrad ? "1" : "0"));
    ZINF_ASSIGN_OR_RETURN(auto digest, r.get("config_digest"));
    const auto own = hex64(engine::checksum(std::as_bytes(
        std::span<const char>(config_.canonical_json.data(), config_.canonical_json.size()))));
    if (digest != own && communicator_.rank() == 0) {
        log::warning("checkpoint ", r.path(), ": saved with a different config (digest ", digest,
                     ", now ", own, "); continuing");
    }
    return Status::ok();
}

Status Engine::restore_counters(const engine::CheckpointReader& r) {
    ZINF_ASSIGN_OR_RETURN(global_steps_, r.get_u64("step"));
    ZINF_ASSIGN_OR_RETURN(micro_steps_, r.get_u64("micro_steps"));
    ZINF_ASSIGN_OR_RETURN(skipped_steps_, r.get_u64("skipped_steps"));
    ZINF_ASSIGN_OR_RETURN(optimizer_updates_, r.get_u64("optimizer_updates"));
    ZINF_ASSIGN_OR_RETURN(global_samples_, r.get_u64("global_samples"));
    engine::LossScaler::State ss;
    ZINF_ASSIGN_OR_RETURN(ss.scale, r.get_double("loss_scale"));
    ZINF_ASSIGN_OR_RETURN(ss.iteration, r.get_u64("loss_scale_iteration"));
    ZINF_ASSIGN_OR_RETURN(auto last, r.get("loss_scale_last_overflow"));
    ss.last_overflow_iteration = std::strtoll(last.c_str(), nullptr, 10);
    ZINF_ASSIGN_OR_RETURN(auto hyst, r.get_u64("loss_scale_hysteresis_left"));
    ss.hysteresis_left = static_cast<int>(hyst);
    scaler_.restore(ss);
    // Saved at a boundary: micro_steps = steps x the saver's accumulation. Under another world
    // size the accumulation may differ: the run continues at the start of the next step.
    const std::uint64_t gas = gradient_accumulation_steps();
    if (micro_steps_ != global_steps_ * gas) {
        log::info("checkpoint ", r.path(), ": ", micro_steps_, " micro-steps for ", global_steps_,
                  " steps; continuing at micro-step ", global_steps_ * gas,
                  " (gradient_accumulation_steps ", gas, ")");
        micro_steps_ = global_steps_ * gas;
    }
    if (global_steps_ > 0 && global_samples_ != global_steps_ * train_batch_size() &&
        communicator_.rank() == 0) {
        log::warning("checkpoint ", r.path(), ": ", global_samples_, " samples in ", global_steps_,
                     " steps, not train_batch_size ", train_batch_size(),
                     " each: the data order continues by step, not by sample");
    }
    return Status::ok();
}

// A checkpoint whose domain files are this rank's domain element for element.
bool Engine::same_layout(const SavedShape& saved) const noexcept {
    return saved.world == communicator_.world_size() &&
           (saved.stage >= 1) == coordinator_->plan().optimizer_partitioned &&
           saved.align_numel == plan_.partition_align_numel;
}

// Opens what this rank reads of <dir>/<tag>: the checkpoint itself (one rank saved it), or its
// shards, checked against the manifest's nonce. Sets `saved` from its manifest.

Result<std::vector<engine::CheckpointReader>> Engine::open_shards(const std::string& dir,
                                                                  const std::string& tag,
                                                                  SavedShape& saved) const {
    ZINF_ASSIGN_OR_RETURN(auto top, engine::CheckpointReader::open(file_system(), dir, tag));
    ZINF_ASSIGN_OR_RETURN(auto world, top.get_u64("world_size"));
    ZINF_ASSIGN_OR_RETURN(auto stage, top.get_u64("zero_stage"));
    if (world < 1 || world > (1u << 20) || stage > 3) {
        return Status::corruption(str_cat("checkpoint ", top.path(), ": world_size ", world,
                                          ", zero_stage ", stage, " in its manifest"));
    }
    saved.world = static_cast<int>(world);
    saved.stage = static_cast<int>(stage);
    // Checkpoints from before compressed states have neither key: fp32 states, 16-element
    // alignment.
    if (top.get("state_dtype").has_value()) {
        ZINF_ASSIGN_OR_RETURN(auto name, top.get("state_dtype"));
        const auto dtype = find_state_dtype(name);
        if (!dtype.has_value()) {
            return Status::corruption(
                str_cat("checkpoint ", top.path(), ": state_dtype \"", name, "\" in its manifest"));
        }
        saved.state_dtype = *dtype;
    }
    if (saved.state_dtype == StateDType::kInt8) {
        const auto code = top.get("int8_code");
        if (!code.has_value() || code.value() != std::to_string(kInt8Code)) {
            return Status::not_supported(str_cat(
                "checkpoint ", top.path(), ": its int8 optimizer states are in ",
                code.has_value() ? str_cat("int8 code ", code.value())
                                 : std::string("an earlier version's code"),
                ", which this version does not read (it reads int8 code ", kInt8Code,
                "); resume with the version that wrote it, or from a checkpoint with fp32 or bf16 "
                "states"));
        }
    }
    if (top.get("partition_align").has_value()) {
        ZINF_ASSIGN_OR_RETURN(auto align, top.get_u64("partition_align"));
        if (align == 0 || align % zero::Partitioning::kAlignNumel != 0 || align > (1u << 20)) {
            return Status::corruption(str_cat("checkpoint ", top.path(), ": partition_align ",
                                              align, " in its manifest"));
        }
        saved.align_numel = static_cast<std::size_t>(align);
    }
    std::vector<engine::CheckpointReader> out;
    if (world == 1) {
        out.push_back(std::move(top));
        return out;
    }
    ZINF_ASSIGN_OR_RETURN(auto shards, top.get_u64("shards"));
    ZINF_ASSIGN_OR_RETURN(auto nonce, top.get("checkpoint_nonce"));
    if (shards != world) {
        return Status::corruption(
            str_cat("checkpoint ", top.path(), ": ", shards, " shards for world size ", world));
    }
    // The same layout needs only this rank's shard; any other all of them (stage 0: one).
    const bool same = same_layout(saved);
    const int from = same ? communicator_.rank() : 0;
    const int to = same ? from + 1 : (saved.stage >= 1 ? saved.world : 1);
    for (int r = from; r < to; ++r) {
        ZINF_ASSIGN_OR_RETURN(
            auto shard, engine::CheckpointReader::open(file_system(), top.path(), shard_name(r)));
        ZINF_ASSIGN_OR_RETURN(auto got, shard.get("checkpoint_nonce"));
        if (got != nonce) {
            return Status::corruption(str_cat("checkpoint ", shard.path(),
                                              ": a shard of another save (nonce ", got,
                                              ", manifest ", nonce, ")"));
        }
        out.push_back(std::move(shard));
    }
    return out;
}

Status Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
    ZINF_ASSERT(!forward_done_);
    ZINF_ASSERT(!backward_done_);
    TraceScope span(trace_, "load_checkpoint", "io", 1);
    ZINF_TRY(wait_checkpoint());
    // The parameters change: io_only_step's copy is stale.
    ZINF_TRY(drop_io_only_params());
    settle_overlap();
    SavedShape saved;
    auto shards = open_shards(dir, tag, saved);
    const bool same = shards.has_value() && same_layout(saved);
    Status checked = shards.has_value() ? check_loadable(shards->front(), same) : shards.error();
    // Every rank loads, or none does: a rank that cannot read its shard stops them all here,
    // before any state changes.
    ZINF_ASSIGN_OR_RETURN(auto refused,
                          zero::gather_over_ranks(communicator_, checked.is_ok() ? 0 : 1));
    if (!checked.is_ok()) return checked;
    for (int r = 0; r < communicator_.world_size(); ++r) {
        if (refused[r] == 0) continue;
        return Status::invalid_argument(
            str_cat("checkpoint ", dir, "/", tag, ": rank ", r,
                    " cannot load it (its error names why); not loaded"));
    }
    // From here on a failure leaves states half-restored.
    if (saved.state_dtype != plan_.state_dtype && communicator_.rank() == 0) {
        log::warning("checkpoint ", dir, "/", tag, ": optimizer states saved as ",
                     state_dtype_name(saved.state_dtype), ", offload_optimizer.state_dtype is ",
                     state_dtype_name(plan_.state_dtype), ": converted while loading (",
                     plan_.state_dtype == StateDType::kFp32
                         ? std::string("decoded exactly")
                         : str_cat("the moments rounded to ", state_dtype_name(plan_.state_dtype)),
                     ")");
    }
    Status s = same ? load_states(shards->front(), saved) : load_repartitioned(*shards, saved);
    // publish_parameters is a collective: every rank enters it, or none does.
    ZINF_ASSIGN_OR_RETURN(const bool any_failed, zero::any_over_ranks(communicator_, !s.is_ok()));
    if (s.is_ok() && any_failed) {
        s = zero::peer_failure("checkpoint " + dir + "/" + tag + ": loading the states");
    }
    if (s.is_ok()) s = coordinator_->publish_parameters(stream());
    if (s.is_ok()) s = device_.synchronize(stream());
    if (s.is_ok()) s = restore_counters(shards->front());
    if (!s.is_ok()) {
        broken_ =
            "loading checkpoint " + dir + "/" + tag + " failed part-way (" + s.to_string() + ")";
        return s;
    }
    broken_.clear();
    times_.checkpoint_seconds += span.end();
    if (!same) {
        log::info("checkpoint ", dir, "/", tag, ": saved by ", saved.world, " rank(s) at stage ",
                  saved.stage, ", re-partitioned for ", communicator_.world_size(),
                  " rank(s) at stage ", plan_.stage);
    }
    log::info("checkpoint loaded: ", dir, "/", tag, " (step ", global_steps_, ")");
    return Status::ok();
}

}  // namespace zinf
