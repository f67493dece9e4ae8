#include <endian.h>
#include <errno.h>
#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/transport/rdma/soft/fabric.h"
#include "engine/transport/rdma/soft/ops.h"

namespace kolo::transport::rdma::soft::ops {

namespace {

ibv_device* NewDevice(int index) {
  auto* d = new ibv_device{};
  d->node_type = IBV_NODE_CA;
  d->transport_type = IBV_TRANSPORT_IB;
  std::snprintf(d->name, sizeof d->name, "softverbs%d", index);
  std::snprintf(d->dev_name, sizeof d->dev_name, "softverbs%d", index);
  return d;
}

}  // namespace

ibv_device** GetDeviceList(int* num_devices) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  while (static_cast<int>(f.devices.size()) < f.device_count) {
    f.devices.push_back(NewDevice(static_cast<int>(f.devices.size())));
  }
  auto** list = static_cast<ibv_device**>(std::calloc(f.device_count + 1, sizeof(ibv_device*)));
  if (list == nullptr) return Fail<ibv_device*>(ENOMEM);
  for (int i = 0; i < f.device_count; ++i) list[i] = f.devices[i];
  if (num_devices != nullptr) *num_devices = f.device_count;
  return list;
}

void FreeDeviceList(ibv_device** list) { std::free(list); }

const char* GetDeviceName(ibv_device* device) { return device == nullptr ? nullptr : device->name; }

ibv_context* OpenDevice(ibv_device* device) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  bool listed = false;
  for (int i = 0; i < f.device_count && i < static_cast<int>(f.devices.size()); ++i) {
    listed = listed || f.devices[i] == device;
  }
  if (!listed) return Fail<ibv_context>(ENODEV);
  auto* c = new Context();
  c->lid = f.next_lid++;
  c->base.device = device;
  c->base.cmd_fd = -1;
  c->base.async_fd = -1;
  c->base.num_comp_vectors = 1;
  pthread_mutex_init(&c->base.mutex, nullptr);
  // The inline libibverbs calls (ibv_post_send, ibv_poll_cq, ...) go through these.
  c->base.ops.poll_cq = PollCq;
  c->base.ops.req_notify_cq = ReqNotifyCq;
  c->base.ops.post_send = PostSend;
  c->base.ops.post_recv = PostRecv;
  f.contexts[&c->base] = c;
  return &c->base;
}

int CloseDevice(ibv_context* context) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr) return EINVAL;
  for (auto& [p, pd] : f.pds) {
    if (pd->ctx == c) return EBUSY;
  }
  for (auto& [p, cq] : f.cqs) {
    if (cq->ctx == c) return EBUSY;
  }
  for (auto& [p, ch] : f.channels) {
    if (ch->ctx == c) return EBUSY;
  }
  f.contexts.erase(context);
  pthread_mutex_destroy(&c->base.mutex);
  delete c;
  return 0;
}

int QueryDevice(ibv_context* context, ibv_device_attr* attr) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr || attr == nullptr) return EINVAL;
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "software");
  attr->node_guid = htobe64(c->lid);
  attr->sys_image_guid = htobe64(1);
  attr->max_mr_size = 1ull << 40;
  attr->page_size_cap = 4096;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = kMaxQpWr;
  attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
  attr->max_sge = kMaxSge;
  attr->max_sge_rd = kMaxSge;
  attr->max_cq = 1 << 16;
  attr->max_cqe = kMaxCqe;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = kMaxRdAtomic;
  attr->max_qp_init_rd_atom = kMaxRdAtomic;
  attr->max_res_rd_atom = kMaxRdAtomic * (1 << 16);
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 1;
  attr->phys_port_cnt = 1;
  return 0;
}

int QueryPort(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr || attr == nullptr || port_num != 1) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = c->vanished ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  attr->phys_state = c->vanished ? 3 : 5;  // disabled, link up
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = 1;
  attr->max_msg_sz = kMaxMsgSize;
  attr->pkey_tbl_len = 1;
  attr->lid = c->lid;
  attr->sm_lid = 1;
  attr->max_vl_num = 1;
  attr->subnet_timeout = 18;
  attr->active_width = 2;   // 4x
  attr->active_speed = 32;  // EDR
  attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

int QueryGid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr || gid == nullptr || port_num != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  gid->global.subnet_prefix = htobe64(0xfe80000000000000ull);
  gid->global.interface_id = htobe64(c->lid);
  return 0;
}

ibv_pd* AllocPd(ibv_context* context) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr) return Fail<ibv_pd>(EINVAL);
  auto* pd = new Pd();
  pd->ctx = c;
  pd->base.context = context;
  pd->base.handle = f.next_key++;
  f.pds[&pd->base] = pd;
  return &pd->base;
}

int DeallocPd(ibv_pd* pd) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Pd* p = f.FindPd(pd);
  if (p == nullptr) return EINVAL;
  for (auto& [m, mr] : f.mrs) {
    if (mr->pd == p) return EBUSY;
  }
  for (auto& [q, qp] : f.qps) {
    if (qp->pd == p) return EBUSY;
  }
  f.pds.erase(pd);
  delete p;
  return 0;
}

ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Pd* p = f.FindPd(pd);
  if (p == nullptr) return Fail<ibv_mr>(EINVAL);
  // Optional flags a device may ignore are ignored, as libibverbs does for those it lacks.
  access &= ~IBV_ACCESS_OPTIONAL_RANGE;
  constexpr int kKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                         IBV_ACCESS_REMOTE_ATOMIC;
  if ((access & ~kKnown) != 0) return Fail<ibv_mr>(EINVAL);
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    return Fail<ibv_mr>(EINVAL);
  }
  if (length == 0) return Fail<ibv_mr>(EINVAL);
  if (addr == nullptr) return Fail<ibv_mr>(EFAULT);
  auto* mr = new Mr();
  mr->pd = p;
  mr->access = access;
  mr->base.context = pd->context;
  mr->base.pd = pd;
  mr->base.addr = addr;
  mr->base.length = length;
  mr->base.handle = f.next_key;
  mr->base.lkey = f.next_key;
  mr->base.rkey = f.next_key + 0x80;
  f.next_key += 0x100;
  f.mrs[&mr->base] = mr;
  f.mrs_by_lkey[mr->base.lkey] = mr;
  f.mrs_by_rkey[mr->base.rkey] = mr;
  return &mr->base;
}

int DeregMr(ibv_mr* mr) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  auto it = f.mrs.find(mr);
  if (it == f.mrs.end()) return EINVAL;
  if (f.MrInUse(mr->lkey)) return EBUSY;
  f.mrs_by_lkey.erase(mr->lkey);
  f.mrs_by_rkey.erase(mr->rkey);
  delete it->second;
  f.mrs.erase(it);
  return 0;
}

}  // namespace kolo::transport::rdma::soft::ops
