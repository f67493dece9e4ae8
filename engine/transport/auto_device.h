// The auto transport: one Device whose pairs come from several devices of one rank, each
// connected to a part of the job — in practice a shm device for the peers on this rank's host and
// a TCP device for the others (registry.cc connects them). pair(p) is the pair of the device that
// has p; name() is "auto" and pair_transport(p) says which transport carries p.
//
// One thread, one sleep: the device is a PollCore (poll_core.h) whose steps are its parts' steps.
// Poll and WaitForArrival sleep in an epoll set of their own that holds each part's wait_fd (an
// epoll set is itself pollable) and an eventfd for Wake, after every part has arranged to make its
// wait_fd readable when it can progress (PollableDevice::PrepareToSleep: the shm part asks for
// doorbells; TCP's sockets need nothing). Between sleeps each part takes its steps without
// blocking: only the parts whose wait_fd was readable read their events, every part moves bytes
// and sends its keepalives. A job whose peers are all of one kind has one part, and
// then every call goes straight to it.
//
// Errors are sticky across the parts: the first part to fail fails the device. Abort aborts every
// part; destruction says GOODBYE through each.
#pragma once

#include <memory>
#include <vector>

#include "engine/common/status.h"
#include "engine/transport/pollable.h"

namespace kolo::transport {

// Combines `parts` (at least one; each of the same rank and size, their peers disjoint) into one
// device for `rank` of `size`. REQUIRES: every rank other than `rank` is a peer of at most one
// part; a rank of no part is not connected (pair() gives a stand-in that fails each use).
StatusOr<std::unique_ptr<Device>> CombineDevices(int rank, int size,
                                                 std::vector<std::unique_ptr<PollableDevice>> parts,
                                                 bool busy_poll);

}  // namespace kolo::transport
