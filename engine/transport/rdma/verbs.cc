#include "engine/transport/rdma/verbs.h"

#include <dlfcn.h>

#include <mutex>

#include "engine/transport/rdma/soft/soft_verbs.h"

namespace kolo::transport::rdma {
namespace {

constexpr const char* kLibrary = "libibverbs.so.1";

// ibv_post_send, ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq are inline functions of
// rdma-core's header that call through the context's operations: the table's entries do the same.
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return qp->context->ops.post_send(qp, wr, bad_wr);
}
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return qp->context->ops.post_recv(qp, wr, bad_wr);
}
int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  return cq->context->ops.poll_cq(cq, num_entries, wc);
}
int ReqNotifyCq(ibv_cq* cq, int solicited_only) {
  return cq->context->ops.req_notify_cq(cq, solicited_only);
}

struct Loaded {
  Verbs verbs;
  Status status;
};

template <typename Fn>
bool Resolve(void* handle, const char* symbol, Fn* out, std::string* missing) {
  void* p = ::dlsym(handle, symbol);
  if (p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += symbol;
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

Loaded Load() {
  Loaded l;
  void* handle = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    l.status = Unavailable(
        "cannot load {} (rdma-core's verbs library; install rdma-core / libibverbs1): {}", kLibrary,
        why ? why : "unknown error");
    return l;
  }
  Verbs& v = l.verbs;
  v.label = "libibverbs";
  v.software = false;
  std::string missing;
  Resolve(handle, "ibv_get_device_list", &v.get_device_list, &missing);
  Resolve(handle, "ibv_free_device_list", &v.free_device_list, &missing);
  Resolve(handle, "ibv_get_device_name", &v.get_device_name, &missing);
  Resolve(handle, "ibv_open_device", &v.open_device, &missing);
  Resolve(handle, "ibv_close_device", &v.close_device, &missing);
  Resolve(handle, "ibv_query_device", &v.query_device, &missing);
  // ibv_query_port is a macro over a compatibility entry point of the same name.
  Resolve(handle, "ibv_query_port", &v.query_port, &missing);
  Resolve(handle, "ibv_query_gid", &v.query_gid, &missing);
  Resolve(handle, "ibv_alloc_pd", &v.alloc_pd, &missing);
  Resolve(handle, "ibv_dealloc_pd", &v.dealloc_pd, &missing);
  Resolve(handle, "ibv_reg_mr", &v.reg_mr, &missing);
  Resolve(handle, "ibv_dereg_mr", &v.dereg_mr, &missing);
  Resolve(handle, "ibv_create_comp_channel", &v.create_comp_channel, &missing);
  Resolve(handle, "ibv_destroy_comp_channel", &v.destroy_comp_channel, &missing);
  Resolve(handle, "ibv_create_cq", &v.create_cq, &missing);
  Resolve(handle, "ibv_destroy_cq", &v.destroy_cq, &missing);
  Resolve(handle, "ibv_get_cq_event", &v.get_cq_event, &missing);
  Resolve(handle, "ibv_ack_cq_events", &v.ack_cq_events, &missing);
  Resolve(handle, "ibv_create_qp", &v.create_qp, &missing);
  Resolve(handle, "ibv_modify_qp", &v.modify_qp, &missing);
  Resolve(handle, "ibv_query_qp", &v.query_qp, &missing);
  Resolve(handle, "ibv_destroy_qp", &v.destroy_qp, &missing);
  Resolve(handle, "ibv_wc_status_str", &v.wc_status_str, &missing);
  v.post_send = &PostSend;
  v.post_recv = &PostRecv;
  v.poll_cq = &PollCq;
  v.req_notify_cq = &ReqNotifyCq;
  if (!missing.empty()) {
    l.status = Unavailable("{} lacks symbols the RDMA transport needs: {}", kLibrary, missing);
    ::dlclose(handle);
    return l;
  }
  // The library stays loaded for the process: the table points into it.
  return l;
}

}  // namespace

StatusOr<const Verbs*> LoadLibibverbs() {
  static const Loaded* loaded = new Loaded(Load());
  if (!loaded->status.ok()) return loaded->status;
  return &loaded->verbs;
}

StatusOr<const Verbs*> OpenVerbs(const std::string& which) {
  if (which == "libibverbs") return LoadLibibverbs();
  if (which == "soft") return soft::Table();
  return InvalidArgument(
      "verbs table '{}' is unknown: allowed are libibverbs (rdma-core, the default) and soft (the "
      "in-process software verbs device, for tests)",
      which);
}

}  // namespace kolo::transport::rdma
