#include "engine/transport/rdma/soft/ops.h"
#include "engine/transport/rdma/soft/soft_verbs.h"

namespace kolo::transport::rdma::soft {

namespace ops {

const char* WcStatusStr(ibv_wc_status status) {
  // The strings libibverbs' ibv_wc_status_str returns, so that messages read the same on both.
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_LOC_LEN_ERR:
      return "local length error";
    case IBV_WC_LOC_QP_OP_ERR:
      return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR:
      return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR:
      return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR:
      return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR:
      return "local access error";
    case IBV_WC_REM_INV_REQ_ERR:
      return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_REM_OP_ERR:
      return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR:
      return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR:
      return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR:
      return "aborted error";
    case IBV_WC_INV_EECN_ERR:
      return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR:
      return "invalid EE context state";
    case IBV_WC_FATAL_ERR:
      return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR:
      return "response timeout error";
    case IBV_WC_GENERAL_ERR:
      return "general error";
    case IBV_WC_TM_ERR:
      return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE:
      return "TM software rendezvous";
  }
  return "unknown";
}

}  // namespace ops

const Verbs* Table() {
  static const Verbs table = [] {
    Verbs v;
    v.label = "software verbs device (in-process test stand-in, not RDMA hardware)";
    v.software = true;
    v.get_device_list = ops::GetDeviceList;
    v.free_device_list = ops::FreeDeviceList;
    v.get_device_name = ops::GetDeviceName;
    v.open_device = ops::OpenDevice;
    v.close_device = ops::CloseDevice;
    v.query_device = ops::QueryDevice;
    v.query_port = ops::QueryPort;
    v.query_gid = ops::QueryGid;
    v.alloc_pd = ops::AllocPd;
    v.dealloc_pd = ops::DeallocPd;
    v.reg_mr = ops::RegMr;
    v.dereg_mr = ops::DeregMr;
    v.create_comp_channel = ops::CreateCompChannel;
    v.destroy_comp_channel = ops::DestroyCompChannel;
    v.create_cq = ops::CreateCq;
    v.destroy_cq = ops::DestroyCq;
    v.req_notify_cq = ops::ReqNotifyCq;
    v.get_cq_event = ops::GetCqEvent;
    v.ack_cq_events = ops::AckCqEvents;
    v.poll_cq = ops::PollCq;
    v.create_qp = ops::CreateQp;
    v.modify_qp = ops::ModifyQp;
    v.query_qp = ops::QueryQp;
    v.destroy_qp = ops::DestroyQp;
    v.post_send = ops::PostSend;
    v.post_recv = ops::PostRecv;
    v.wc_status_str = ops::WcStatusStr;
    return v;
  }();
  return &table;
}

}  // namespace kolo::transport::rdma::soft
