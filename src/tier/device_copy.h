// The host ↔ device half of a tier::Mover, shared by EngineMover and StoreMover: a copy queued
// on the mover's stream and tracked by a device event.
#pragma once

#include "src/base/device.h"
#include "src/base/status.h"
#include "src/tier/mover.h"

namespace zinf::tier {

// Queues move (kToDevice or kToHost) on `stream` and records an event for it. If the copy is
// queued but the event cannot be recorded, waits for the stream before returning the error, so
// that no buffer is handed back while the device may still use it.
inline Result<EventId> start_device_copy(Device& device, StreamId stream, const Move& move) {
    ZINF_ASSERT(move.kind == MoveKind::kToDevice || move.kind == MoveKind::kToHost);
    ZINF_ASSERT(move.device != nullptr);
    ZINF_TRY(move.kind == MoveKind::kToDevice
                 ? device.copy_to_device(move.device, move.host, move.size_bytes, stream)
                 : device.copy_to_host(move.host, move.device, move.size_bytes, stream));
    Result<EventId> event = device.record_event(stream);
    if (!event.has_value()) (void)device.synchronize(stream);
    return event;
}

// false: still running. true or an error: done, and the event is released.
inline Result<bool> poll_device_copy(Device& device, EventId event) noexcept {
    Result<bool> done = device.event_done(event);
    if (done.has_value() && !*done) return false;
    device.release_event(event);
    if (!done.has_value()) return done.error();
    return true;
}

// Blocks until the copy is done; releases the event.
inline Status wait_device_copy(Device& device, EventId event) noexcept {
    Status status = device.synchronize_event(event);
    device.release_event(event);
    return status;
}

}  // namespace zinf::tier
