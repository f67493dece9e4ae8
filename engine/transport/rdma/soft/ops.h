// The software device's verbs, one function per entry of the Verbs table (verbs.h), each with the
// signature and return convention of the libibverbs function of the same name. Internal to soft/:
// callers reach them through Table() (soft_verbs.h).
#pragma once

#include <infiniband/verbs.h>

namespace kolo::transport::rdma::soft::ops {

// device.cc: devices, contexts, PDs, MRs.
ibv_device** GetDeviceList(int* num_devices);
void FreeDeviceList(ibv_device** list);
const char* GetDeviceName(ibv_device* device);
ibv_context* OpenDevice(ibv_device* device);
int CloseDevice(ibv_context* context);
int QueryDevice(ibv_context* context, ibv_device_attr* attr);
int QueryPort(ibv_context* context, uint8_t port_num, ibv_port_attr* attr);
int QueryGid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid);
ibv_pd* AllocPd(ibv_context* context);
int DeallocPd(ibv_pd* pd);
ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access);
int DeregMr(ibv_mr* mr);

// cq.cc: completion channels and queues.
ibv_comp_channel* CreateCompChannel(ibv_context* context);
int DestroyCompChannel(ibv_comp_channel* channel);
ibv_cq* CreateCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                 int comp_vector);
int DestroyCq(ibv_cq* cq);
int ReqNotifyCq(ibv_cq* cq, int solicited_only);
int GetCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context);
void AckCqEvents(ibv_cq* cq, unsigned int nevents);
int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc);

// qp.cc: queue pairs.
ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr);
int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);
int QueryQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init);
int DestroyQp(ibv_qp* qp);
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

// table.cc
const char* WcStatusStr(ibv_wc_status status);

}  // namespace kolo::transport::rdma::soft::ops
