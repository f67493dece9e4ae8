// The verbs the RDMA transport calls, as one table of function pointers (rdma/device.h uses
// nothing else of libibverbs): filled from libibverbs loaded at run time (dlopen), so that a kolo
// built with rdma-core's headers runs on a host without rdma-core (every other transport works
// there; `--transport rdma` fails at start-up saying libibverbs could not be loaded), or from the
// software verbs device (soft/soft_verbs.h), an in-process stand-in that lets tests drive the
// transport's protocol logic on hosts with no RDMA device.
//
// Each entry has the signature of the libibverbs function of the same name (ibv_<name>), the
// inline ones (post_send, post_recv, poll_cq, req_notify_cq) included, and the same contract:
// pointers returned by the table are released through the same table.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "engine/common/status.h"

namespace kolo::transport::rdma {

struct Verbs {
  // What this table drives, for messages and run records: "libibverbs" or "software verbs device
  // (in-process test stand-in, not RDMA hardware)".
  const char* label = nullptr;
  // Whether the table is the software device (soft_verbs.h).
  bool software = false;

  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*query_port)(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) = nullptr;

  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;

  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc) = nullptr;

  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*query_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = nullptr;
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) = nullptr;

  const char* (*wc_status_str)(ibv_wc_status status) = nullptr;
};

// libibverbs, loaded once per process (dlopen "libibverbs.so.1"); the table lives until the
// process exits. Unavailable naming the library and dlerror() when it cannot be loaded or lacks a
// symbol.
StatusOr<const Verbs*> LoadLibibverbs();

// The table named by `which`: "libibverbs" (LoadLibibverbs) or "soft" (the software verbs device,
// soft/soft_verbs.h). InvalidArgument naming the value and the allowed ones otherwise.
StatusOr<const Verbs*> OpenVerbs(const std::string& which);

}  // namespace kolo::transport::rdma
