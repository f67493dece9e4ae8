// The software verbs device (engine/transport/rdma/soft/soft_verbs.h), an in-process stand-in for
// an RDMA NIC, driven through its Verbs table as the RDMA transport drives it: each rule its
// header states, one test or more, with the data checked byte for byte and every object torn down
// (the fixture checks that nothing is left alive in the fabric after each test).
// kolo-test-needs: IBVERBS
// kolo-test-links: kolo_transport
#include "engine/transport/rdma/soft/soft_verbs.h"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kolo::transport::rdma::soft {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const Verbs& V() { return *Table(); }

// One end: a context (its own port), a PD, a completion channel, one CQ for sends and receives,
// an RC QP, and a registered buffer.
struct End {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<uint8_t> buf;
  ibv_mr* mr = nullptr;
  uint16_t lid = 0;
};

struct QpOptions {
  uint32_t max_send_wr = 64, max_recv_wr = 64, max_inline = 64;
  int cqe = 256;
  int mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  int qp_access = IBV_ACCESS_REMOTE_WRITE;
  uint8_t timeout = 10, retry_cnt = 3;  // 4.096 us * 2^10 * 4 = 16.8 ms
  size_t buf_bytes = 4096;
};

End MakeEnd(const QpOptions& o = {}) {
  End e;
  int n = 0;
  ibv_device** list = V().get_device_list(&n);
  EXPECT_GE(n, 1);
  e.ctx = V().open_device(list[0]);
  V().free_device_list(list);
  EXPECT_NE(e.ctx, nullptr);
  ibv_port_attr port{};
  EXPECT_EQ(V().query_port(e.ctx, 1, &port), 0);
  e.lid = port.lid;
  e.pd = V().alloc_pd(e.ctx);
  e.channel = V().create_comp_channel(e.ctx);
  e.cq = V().create_cq(e.ctx, o.cqe, &e, e.channel, 0);
  ibv_qp_init_attr init{};
  init.send_cq = e.cq;
  init.recv_cq = e.cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = o.max_send_wr;
  init.cap.max_recv_wr = o.max_recv_wr;
  init.cap.max_send_sge = 4;
  init.cap.max_recv_sge = 4;
  init.cap.max_inline_data = o.max_inline;
  e.qp = V().create_qp(e.pd, &init);
  EXPECT_NE(e.qp, nullptr);
  e.buf.assign(o.buf_bytes, 0);
  e.mr = V().reg_mr(e.pd, e.buf.data(), e.buf.size(), o.mr_access);
  EXPECT_NE(e.mr, nullptr);
  return e;
}

void Destroy(End& e) {
  if (e.qp) {
    EXPECT_EQ(V().destroy_qp(e.qp), 0);
  }
  if (e.mr) {
    EXPECT_EQ(V().dereg_mr(e.mr), 0);
  }
  if (e.cq) {
    EXPECT_EQ(V().destroy_cq(e.cq), 0);
  }
  if (e.channel) {
    EXPECT_EQ(V().destroy_comp_channel(e.channel), 0);
  }
  if (e.pd) {
    EXPECT_EQ(V().dealloc_pd(e.pd), 0);
  }
  if (e.ctx) {
    EXPECT_EQ(V().close_device(e.ctx), 0);
  }
  e = End{};
}

int ToInit(ibv_qp* qp, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = access;
  return V().modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int ToRtr(ibv_qp* qp, uint16_t dlid, uint32_t dest_qpn, uint32_t rq_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = dlid;
  a.ah_attr.port_num = 1;
  return V().modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int ToRts(ibv_qp* qp, uint32_t sq_psn, uint8_t timeout, uint8_t retry_cnt) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = timeout;
  a.retry_cnt = retry_cnt;
  a.rnr_retry = 7;
  a.sq_psn = sq_psn;
  a.max_rd_atomic = 1;
  return V().modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

// a and b connected RESET → INIT → RTR → RTS (PSNs a→b 100, b→a 200).
void Connect(End& a, End& b, const QpOptions& o = {}) {
  ASSERT_EQ(ToInit(a.qp, o.qp_access), 0);
  ASSERT_EQ(ToInit(b.qp, o.qp_access), 0);
  ASSERT_EQ(ToRtr(a.qp, b.lid, b.qp->qp_num, 200), 0);
  ASSERT_EQ(ToRtr(b.qp, a.lid, a.qp->qp_num, 100), 0);
  ASSERT_EQ(ToRts(a.qp, 100, o.timeout, o.retry_cnt), 0);
  ASSERT_EQ(ToRts(b.qp, 200, o.timeout, o.retry_cnt), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_RTS);
  EXPECT_EQ(b.qp->state, IBV_QPS_RTS);
}

int PostRecv(End& e, uint64_t wr_id, size_t offset, uint32_t len) {
  ibv_sge sge{reinterpret_cast<uint64_t>(e.buf.data() + offset), len, e.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return V().post_recv(e.qp, &wr, &bad);
}

int PostSend(End& e, ibv_wr_opcode op, uint64_t wr_id, size_t offset, uint32_t len,
             unsigned flags = IBV_SEND_SIGNALED, uint32_t imm = 0, uint64_t remote_addr = 0,
             uint32_t rkey = 0, uint32_t lkey = 0) {
  ibv_sge sge{reinterpret_cast<uint64_t>(e.buf.data() + offset), len, lkey ? lkey : e.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = flags;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return V().post_send(e.qp, &wr, &bad);
}

// The next completion of `cq`, waiting at most `timeout`.
std::optional<ibv_wc> Next(ibv_cq* cq, milliseconds timeout = milliseconds(5000)) {
  Clock::time_point end = Clock::now() + timeout;
  do {
    ibv_wc wc{};
    int n = V().poll_cq(cq, 1, &wc);
    EXPECT_GE(n, 0);
    if (n == 1) return wc;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  } while (Clock::now() < end);
  return std::nullopt;
}

// Every completion `cq` holds now (none waited for).
std::vector<ibv_wc> Drain(ibv_cq* cq) {
  std::vector<ibv_wc> out;
  ibv_wc wc[16];
  int n;
  while ((n = V().poll_cq(cq, 16, wc)) > 0) out.insert(out.end(), wc, wc + n);
  return out;
}

std::string Str(ibv_wc_status s) { return V().wc_status_str(s); }

class SoftVerbs : public ::testing::Test {
 protected:
  void TearDown() override {
    Live live = LiveObjects();
    EXPECT_EQ(live.contexts, 0);
    EXPECT_EQ(live.pds, 0);
    EXPECT_EQ(live.mrs, 0);
    EXPECT_EQ(live.cqs, 0);
    EXPECT_EQ(live.channels, 0);
    EXPECT_EQ(live.qps, 0);
  }
};

TEST_F(SoftVerbs, TableIsLabelledAsTheSoftwareStandIn) {
  EXPECT_TRUE(V().software);
  EXPECT_NE(std::string(V().label).find("software verbs device"), std::string::npos);
  EXPECT_NE(std::string(V().label).find("not RDMA hardware"), std::string::npos);
  int n = -1;
  ibv_device** list = V().get_device_list(&n);
  ASSERT_EQ(n, 1);
  EXPECT_STREQ(V().get_device_name(list[0]), "softverbs0");
  EXPECT_EQ(list[1], nullptr);
  V().free_device_list(list);

  SetDeviceCount(0);
  list = V().get_device_list(&n);
  EXPECT_EQ(n, 0);
  EXPECT_EQ(list[0], nullptr);
  V().free_device_list(list);
  SetDeviceCount(3);
  list = V().get_device_list(&n);
  ASSERT_EQ(n, 3);
  EXPECT_STREQ(V().get_device_name(list[2]), "softverbs2");
  ibv_device* third = list[2];
  V().free_device_list(list);
  SetDeviceCount(1);
  // A device no longer listed cannot be opened.
  errno = 0;
  EXPECT_EQ(V().open_device(third), nullptr);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(Str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_EQ(Str(IBV_WC_SUCCESS), "success");
}

TEST_F(SoftVerbs, EachContextIsAPortWithItsOwnLidAndGid) {
  End a = MakeEnd(), b = MakeEnd();
  EXPECT_NE(a.lid, 0);
  EXPECT_NE(a.lid, b.lid);
  ibv_port_attr port{};
  ASSERT_EQ(V().query_port(a.ctx, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_EQ(V().query_port(a.ctx, 2, &port), EINVAL);
  ibv_gid gid{};
  ASSERT_EQ(V().query_gid(b.ctx, 1, 0, &gid), 0);
  EXPECT_EQ(be64toh(gid.global.interface_id), b.lid);
  EXPECT_EQ(V().query_gid(b.ctx, 1, 1, &gid), -1);
  ibv_device_attr dev{};
  ASSERT_EQ(V().query_device(a.ctx, &dev), 0);
  EXPECT_EQ(dev.phys_port_cnt, 1);
  EXPECT_GT(dev.max_qp_wr, 0);
  EXPECT_NE(a.qp->qp_num, b.qp->qp_num);
  EXPECT_EQ(a.qp->state, IBV_QPS_RESET);
  EXPECT_EQ(a.cq->channel, a.channel);
  EXPECT_EQ(a.cq->cq_context, &a);
  EXPECT_EQ(a.mr->addr, a.buf.data());
  EXPECT_EQ(a.mr->length, a.buf.size());
  EXPECT_NE(a.mr->lkey, a.mr->rkey);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, StateMachineRefusesWrongTransitionsAndMissingAttributes) {
  End a = MakeEnd(), b = MakeEnd();
  // Posting before the QP may: a receive in RESET, a send before RTS.
  EXPECT_EQ(PostRecv(a, 1, 0, 16), EINVAL);
  EXPECT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 16), EINVAL);
  // RESET → RTR skips INIT.
  EXPECT_EQ(ToRtr(a.qp, b.lid, b.qp->qp_num, 0), EINVAL);
  // RESET → INIT without the access flags, and with an attribute it does not take.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  EXPECT_EQ(V().modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  EXPECT_EQ(V().modify_qp(a.qp, &attr,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                              IBV_QP_SQ_PSN),
            EINVAL);
  attr.port_num = 2;
  EXPECT_EQ(V().modify_qp(a.qp, &attr,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
            EINVAL);
  EXPECT_EQ(a.qp->state, IBV_QPS_RESET);
  ASSERT_EQ(ToInit(a.qp, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_INIT);
  EXPECT_EQ(PostRecv(a, 1, 0, 16), 0);  // a receive may be posted from INIT on
  EXPECT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 16), EINVAL);
  // INIT → RTS skips RTR; INIT → RTR to a LID no port has.
  EXPECT_EQ(ToRts(a.qp, 0, 14, 7), EINVAL);
  EXPECT_EQ(ToRtr(a.qp, 0xbeef, b.qp->qp_num, 0), EINVAL);
  EXPECT_EQ(a.qp->state, IBV_QPS_INIT);
  ASSERT_EQ(ToRtr(a.qp, b.lid, b.qp->qp_num, 0), 0);
  EXPECT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 16), EINVAL);
  // RTR → RTS without the retry count.
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(V().modify_qp(a.qp, &attr,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                              IBV_QP_MAX_QP_RD_ATOMIC),
            EINVAL);
  ASSERT_EQ(ToRts(a.qp, 7, 14, 7), 0);
  ibv_qp_attr got{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(V().query_qp(a.qp, &got, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(got.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(got.dest_qp_num, b.qp->qp_num);
  EXPECT_EQ(got.sq_psn, 7u);
  EXPECT_EQ(init.cap.max_send_wr, 64u);
  // Back to RESET discards the posted receive without a completion; any state → ERROR.
  attr = {};
  attr.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(V().modify_qp(a.qp, &attr, IBV_QP_STATE), 0);
  EXPECT_TRUE(Drain(a.cq).empty());
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(V().modify_qp(a.qp, &attr, IBV_QP_STATE), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
  // Only RC is modelled.
  ibv_qp_init_attr ud{};
  ud.send_cq = ud.recv_cq = a.cq;
  ud.qp_type = IBV_QPT_UD;
  ud.cap.max_send_wr = ud.cap.max_recv_wr = 1;
  errno = 0;
  EXPECT_EQ(V().create_qp(a.pd, &ud), nullptr);
  EXPECT_EQ(errno, EINVAL);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, SendReceiveDeliversDataInPostingOrder) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  constexpr int kN = 8;
  for (int i = 0; i < kN; ++i) ASSERT_EQ(PostRecv(b, 100 + i, 256 * i, 256), 0);
  for (int i = 0; i < kN; ++i) {
    std::memset(a.buf.data() + 64 * i, 'a' + i, 64);
    ASSERT_EQ(PostSend(a, i % 2 ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, i, 64 * i, 40 + i,
                       IBV_SEND_SIGNALED, 0x1000 + i),
              0);
  }
  for (int i = 0; i < kN; ++i) {
    std::optional<ibv_wc> r = Next(b.cq);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, IBV_WC_SUCCESS) << Str(r->status);
    EXPECT_EQ(r->opcode, IBV_WC_RECV);
    EXPECT_EQ(r->wr_id, 100u + i);
    EXPECT_EQ(r->byte_len, 40u + i);
    EXPECT_EQ(r->qp_num, b.qp->qp_num);
    EXPECT_EQ(r->src_qp, a.qp->qp_num);
    if (i % 2) {
      EXPECT_TRUE(r->wc_flags & IBV_WC_WITH_IMM);
      EXPECT_EQ(ntohl(r->imm_data), 0x1000u + i);
    } else {
      EXPECT_FALSE(r->wc_flags & IBV_WC_WITH_IMM);
    }
    for (int k = 0; k < 40 + i; ++k) ASSERT_EQ(b.buf[256 * i + k], 'a' + i) << i << " " << k;
    EXPECT_EQ(b.buf[256 * i + 40 + i], 0);  // nothing past the message
  }
  std::vector<ibv_wc> sent;
  for (int i = 0; i < kN; ++i) {
    std::optional<ibv_wc> s = Next(a.cq);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->status, IBV_WC_SUCCESS);
    EXPECT_EQ(s->opcode, IBV_WC_SEND);
    EXPECT_EQ(s->wr_id, static_cast<uint64_t>(i));
  }
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, WriteWithImmediatePlacesDataAndConsumesAReceive) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  for (int i = 0; i < 1000; ++i) a.buf[i] = static_cast<uint8_t>(i * 7);
  uint64_t remote = reinterpret_cast<uint64_t>(b.buf.data()) + 500;
  // A plain write completes at the requester only; the one with immediate also at the responder.
  ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, 1, 0, 400, IBV_SEND_SIGNALED, 0, remote, b.mr->rkey), 0);
  ASSERT_EQ(PostRecv(b, 77, 0, 0), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE_WITH_IMM, 2, 400, 600, IBV_SEND_SIGNALED, 0xabcdef,
                     remote + 400, b.mr->rkey),
            0);
  std::optional<ibv_wc> r = Next(b.cq);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, IBV_WC_SUCCESS);
  EXPECT_EQ(r->opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(r->wr_id, 77u);
  EXPECT_EQ(r->byte_len, 600u);
  EXPECT_TRUE(r->wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r->imm_data), 0xabcdefu);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(b.buf[500 + i], static_cast<uint8_t>(i * 7)) << i;
  EXPECT_EQ(b.buf[499], 0);
  EXPECT_EQ(b.buf[1500], 0);
  EXPECT_TRUE(Drain(b.cq).empty());
  std::optional<ibv_wc> s1 = Next(a.cq), s2 = Next(a.cq);
  ASSERT_TRUE(s1 && s2);
  EXPECT_EQ(s1->wr_id, 1u);
  EXPECT_EQ(s1->opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(s2->wr_id, 2u);
  EXPECT_EQ(s2->status, IBV_WC_SUCCESS);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, MessageWaitsForAReceiveThenArrivesInOrder) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  std::memcpy(a.buf.data(), "first", 5);
  std::memcpy(a.buf.data() + 8, "second", 6);
  uint64_t remote = reinterpret_cast<uint64_t>(b.buf.data()) + 2048;
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 5), 0);
  // A write behind the waiting send is not placed before it (RC executes in order).
  ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, 2, 8, 6, IBV_SEND_SIGNALED, 0, remote, b.mr->rkey), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 3, 8, 6), 0);
  EXPECT_FALSE(Next(a.cq, milliseconds(50)));
  EXPECT_FALSE(Next(b.cq, milliseconds(1)));
  EXPECT_EQ(b.buf[2048], 0);
  ASSERT_EQ(PostRecv(b, 10, 0, 64), 0);
  std::optional<ibv_wc> r = Next(b.cq);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->wr_id, 10u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b.buf.data()), 5), "first");
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b.buf.data()) + 2048, 6), "second");
  std::optional<ibv_wc> s = Next(a.cq), w = Next(a.cq);
  ASSERT_TRUE(s && w);
  EXPECT_EQ(s->wr_id, 1u);
  EXPECT_EQ(w->wr_id, 2u);
  EXPECT_FALSE(Next(a.cq, milliseconds(20)));  // the third still waits
  ASSERT_EQ(PostRecv(b, 11, 64, 64), 0);
  std::optional<ibv_wc> r2 = Next(b.cq), s3 = Next(a.cq);
  ASSERT_TRUE(r2 && s3);
  EXPECT_EQ(r2->wr_id, 11u);
  EXPECT_EQ(s3->wr_id, 3u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b.buf.data()) + 64, 6), "second");
  Destroy(a);
  Destroy(b);
}

// Expects `e`'s CQ to hold, now, completions with exactly these statuses in this order.
void ExpectStatuses(End& e, const std::vector<ibv_wc_status>& want) {
  std::vector<ibv_wc> got = Drain(e.cq);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].status, want[i]) << i << ": " << Str(got[i].status);
  }
}

TEST_F(SoftVerbs, WriteOutsideARegionIsRemoteAccessErrorAndFailsBothQps) {
  struct Case {
    const char* what;
    uint64_t offset;
    uint32_t len;
    bool use_lkey;
  };
  for (const Case& c :
       {Case{"past the end", 4000, 200, false}, Case{"before the start", 0, 8, false},
        Case{"the lkey as rkey", 0, 8, true}}) {
    SCOPED_TRACE(c.what);
    End a = MakeEnd(), b = MakeEnd();
    Connect(a, b);
    ASSERT_EQ(PostRecv(b, 5, 0, 16), 0);
    std::memset(a.buf.data(), 0x5a, 256);
    uint64_t remote = reinterpret_cast<uint64_t>(b.buf.data()) + c.offset;
    if (std::string(c.what) == "before the start") remote -= 8;
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, 1, 0, c.len, 0, 0, remote,
                       c.use_lkey ? b.mr->lkey : b.mr->rkey),
              0);
    ASSERT_EQ(PostSend(a, IBV_WR_SEND, 2, 0, 8), 0);
    // The error completes even though the write was unsignaled; the rest is flushed.
    ExpectStatuses(a, {IBV_WC_REM_ACCESS_ERR, IBV_WC_WR_FLUSH_ERR});
    ExpectStatuses(b, {IBV_WC_WR_FLUSH_ERR});
    EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
    EXPECT_EQ(b.qp->state, IBV_QPS_ERR);
    for (uint8_t x : b.buf) ASSERT_EQ(x, 0);
    Destroy(a);
    Destroy(b);
  }
}

TEST_F(SoftVerbs, WriteWithoutRemoteWritePermissionIsRemoteAccessError) {
  QpOptions no_mr_access;
  no_mr_access.mr_access = IBV_ACCESS_LOCAL_WRITE;
  QpOptions no_qp_access;
  no_qp_access.qp_access = 0;
  for (const QpOptions& o : {no_mr_access, no_qp_access}) {
    End a = MakeEnd(o), b = MakeEnd(o);
    Connect(a, b, o);
    uint64_t remote = reinterpret_cast<uint64_t>(b.buf.data());
    ASSERT_EQ(
        PostSend(a, IBV_WR_RDMA_WRITE_WITH_IMM, 1, 0, 8, IBV_SEND_SIGNALED, 1, remote, b.mr->rkey),
        0);
    ExpectStatuses(a, {IBV_WC_REM_ACCESS_ERR});
    EXPECT_EQ(b.qp->state, IBV_QPS_ERR);
    Destroy(a);
    Destroy(b);
  }
  // REMOTE_WRITE without LOCAL_WRITE is refused at registration, as by libibverbs.
  End a = MakeEnd();
  errno = 0;
  EXPECT_EQ(V().reg_mr(a.pd, a.buf.data(), 16, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  Destroy(a);
}

TEST_F(SoftVerbs, BadLkeyIsLocalProtectionError) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  ASSERT_EQ(PostRecv(b, 5, 0, 64), 0);
  // An lkey no MR has, then a range past the MR with the right lkey.
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8, IBV_SEND_SIGNALED, 0, 0, 0, a.mr->lkey + 1), 0);
  ExpectStatuses(a, {IBV_WC_LOC_PROT_ERR});
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
  EXPECT_TRUE(Drain(b.cq).empty());  // nothing arrived
  Destroy(a);
  Destroy(b);

  a = MakeEnd();
  b = MakeEnd();
  Connect(a, b);
  ASSERT_EQ(PostRecv(b, 5, 0, 64), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 4090, 8), 0);
  ExpectStatuses(a, {IBV_WC_LOC_PROT_ERR});
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, MessageLongerThanTheReceiveIsLengthErrorAtBothEnds) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  ASSERT_EQ(PostRecv(b, 5, 0, 16), 0);
  ASSERT_EQ(PostRecv(b, 6, 16, 16), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 17), 0);
  ExpectStatuses(b, {IBV_WC_LOC_LEN_ERR, IBV_WC_WR_FLUSH_ERR});
  ExpectStatuses(a, {IBV_WC_REM_INV_REQ_ERR});
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
  EXPECT_EQ(b.qp->state, IBV_QPS_ERR);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, ForceErrorFlushesOutstandingAndLaterWorkRequests) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostRecv(b, 10 + i, 0, 16), 0);
  ForceError(b.qp);
  EXPECT_EQ(b.qp->state, IBV_QPS_ERR);
  std::vector<ibv_wc> got = Drain(b.cq);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(got[i].wr_id, 10u + i);
  }
  ASSERT_EQ(PostRecv(b, 20, 0, 16), 0);
  ASSERT_EQ(PostSend(b, IBV_WR_SEND, 21, 0, 16, 0), 0);  // unsignaled, still flushed
  got = Drain(b.cq);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 20u);
  EXPECT_EQ(got[1].wr_id, 21u);
  EXPECT_EQ(got[1].status, IBV_WC_WR_FLUSH_ERR);
  // The peer's message to a QP in ERROR goes unanswered: retry exceeded, in bounded time.
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8), 0);
  std::optional<ibv_wc> s = Next(a.cq, milliseconds(3000));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, IBV_WC_RETRY_EXC_ERR) << Str(s->status);
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, FailNextCompletionInjectsTheStatusOnce) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  ASSERT_EQ(PostRecv(b, 5, 0, 64), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8), 0);
  ASSERT_TRUE(Next(a.cq));
  ASSERT_TRUE(Next(b.cq));
  FailNextCompletion(a.qp, IBV_WC_GENERAL_ERR);
  ASSERT_EQ(PostRecv(b, 6, 0, 64), 0);
  ASSERT_EQ(PostRecv(b, 7, 0, 64), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 2, 0, 8, 0), 0);  // unsignaled: the error still completes
  std::optional<ibv_wc> s = Next(a.cq);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->wr_id, 2u);
  EXPECT_EQ(s->status, IBV_WC_GENERAL_ERR);
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
  // Receive side: the next receive completion of b carries the status.
  End c = MakeEnd(), d = MakeEnd();
  Connect(c, d);
  FailNextCompletion(d.qp, IBV_WC_LOC_QP_OP_ERR);
  ASSERT_EQ(PostRecv(d, 8, 0, 64), 0);
  ASSERT_EQ(PostRecv(d, 9, 0, 64), 0);
  ASSERT_EQ(PostSend(c, IBV_WR_SEND, 3, 0, 8), 0);
  ExpectStatuses(d, {IBV_WC_LOC_QP_OP_ERR, IBV_WC_WR_FLUSH_ERR});
  EXPECT_EQ(d.qp->state, IBV_QPS_ERR);
  Destroy(a);
  Destroy(b);
  Destroy(c);
  Destroy(d);
}

TEST_F(SoftVerbs, VanishedPeerGivesRetryExceededAfterTheConfiguredTime) {
  struct Case {
    uint8_t timeout, retry_cnt;
    double min_s, max_s;
  };
  // 4.096 us * 2^14 * 8 = 0.537 s; timeout 0 (infinite on hardware) is capped at 1 s.
  for (const Case& c : {Case{14, 7, 0.5, 0.9}, Case{0, 7, 0.95, 1.6}}) {
    QpOptions o;
    o.timeout = c.timeout;
    o.retry_cnt = c.retry_cnt;
    End a = MakeEnd(o), b = MakeEnd(o);
    Connect(a, b, o);
    ASSERT_EQ(PostRecv(b, 5, 0, 64), 0);
    ASSERT_EQ(PostRecv(a, 6, 0, 64), 0);
    Vanish(b.ctx);
    ibv_port_attr port{};
    ASSERT_EQ(V().query_port(b.ctx, 1, &port), 0);
    EXPECT_EQ(port.state, IBV_PORT_DOWN);
    Clock::time_point start = Clock::now();
    ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8), 0);
    std::optional<ibv_wc> s = Next(a.cq, milliseconds(3000));
    double took = std::chrono::duration<double>(Clock::now() - start).count();
    ASSERT_TRUE(s);
    EXPECT_EQ(s->wr_id, 1u);
    EXPECT_EQ(s->status, IBV_WC_RETRY_EXC_ERR) << Str(s->status);
    EXPECT_GE(took, c.min_s);
    EXPECT_LE(took, c.max_s);
    std::optional<ibv_wc> flushed = Next(a.cq, milliseconds(100));
    ASSERT_TRUE(flushed);
    EXPECT_EQ(flushed->wr_id, 6u);
    EXPECT_EQ(flushed->status, IBV_WC_WR_FLUSH_ERR);
    // Nothing completes on the vanished side, whatever is posted there.
    ASSERT_EQ(PostSend(b, IBV_WR_SEND, 2, 0, 8), 0);
    EXPECT_FALSE(Next(b.cq, milliseconds(50)));
    Destroy(a);
    Destroy(b);
  }
}

TEST_F(SoftVerbs, MismatchedPsnsGoUnanswered) {
  QpOptions o;
  End a = MakeEnd(o), b = MakeEnd(o);
  ASSERT_EQ(ToInit(a.qp, IBV_ACCESS_REMOTE_WRITE), 0);
  ASSERT_EQ(ToInit(b.qp, IBV_ACCESS_REMOTE_WRITE), 0);
  ASSERT_EQ(ToRtr(a.qp, b.lid, b.qp->qp_num, 0), 0);
  ASSERT_EQ(ToRtr(b.qp, a.lid, a.qp->qp_num, 100), 0);     // expects 100
  ASSERT_EQ(ToRts(a.qp, 101, o.timeout, o.retry_cnt), 0);  // sends from 101
  ASSERT_EQ(PostRecv(b, 5, 0, 64), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8), 0);
  std::optional<ibv_wc> s = Next(a.cq, milliseconds(3000));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_TRUE(Drain(b.cq).empty());
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, CompletionChannelFdIsReadableAfterAnArmedCompletion) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  int fd = b.channel->fd;
  ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
  auto readable = [fd](int ms) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, ms) == 1;
  };
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  EXPECT_EQ(V().get_cq_event(b.channel, &cq, &context), -1);
  EXPECT_EQ(errno, EAGAIN);
  // Not armed: a completion raises no event.
  ASSERT_EQ(PostRecv(b, 1, 0, 64), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8), 0);
  ASSERT_TRUE(Next(b.cq));
  EXPECT_FALSE(readable(20));
  // Armed: one event for the next completion, then disarmed.
  ASSERT_EQ(V().req_notify_cq(b.cq, 0), 0);
  EXPECT_FALSE(readable(0));
  ASSERT_EQ(PostRecv(b, 2, 0, 64), 0);
  ASSERT_EQ(PostRecv(b, 3, 0, 64), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 2, 0, 8), 0);
  EXPECT_TRUE(readable(1000));
  ASSERT_EQ(V().get_cq_event(b.channel, &cq, &context), 0);
  EXPECT_EQ(cq, b.cq);
  EXPECT_EQ(context, &b);
  EXPECT_FALSE(readable(0));
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 3, 0, 8), 0);
  EXPECT_FALSE(readable(20));
  EXPECT_EQ(V().get_cq_event(b.channel, &cq, &context), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(Drain(b.cq).size(), 2u);
  // A blocking get_cq_event is woken by a completion another thread causes.
  ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK), 0);
  ASSERT_EQ(V().req_notify_cq(b.cq, 0), 0);
  ASSERT_EQ(PostRecv(b, 4, 0, 64), 0);
  std::thread poster([&] {
    std::this_thread::sleep_for(milliseconds(30));
    EXPECT_EQ(PostSend(a, IBV_WR_SEND, 4, 0, 8), 0);
  });
  ASSERT_EQ(V().get_cq_event(b.channel, &cq, &context), 0);
  poster.join();
  EXPECT_EQ(cq, b.cq);
  // Unacknowledged events keep the CQ from being destroyed.
  ASSERT_EQ(V().destroy_qp(b.qp), 0);
  b.qp = nullptr;
  EXPECT_EQ(V().destroy_cq(b.cq), EBUSY);
  V().ack_cq_events(b.cq, 2);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, DestroyingObjectsInUseIsBusy) {
  End a = MakeEnd();
  EXPECT_EQ(V().close_device(a.ctx), EBUSY);
  EXPECT_EQ(V().dealloc_pd(a.pd), EBUSY);                 // the MR and the QP are in it
  EXPECT_EQ(V().destroy_cq(a.cq), EBUSY);                 // the QP uses it
  EXPECT_EQ(V().destroy_comp_channel(a.channel), EBUSY);  // the CQ uses it
  ASSERT_EQ(ToInit(a.qp, 0), 0);
  ASSERT_EQ(PostRecv(a, 1, 0, 64), 0);
  EXPECT_EQ(V().dereg_mr(a.mr), EBUSY);  // a posted receive names it
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(V().modify_qp(a.qp, &attr, IBV_QP_STATE), 0);
  ASSERT_EQ(Drain(a.cq).size(), 1u);
  EXPECT_EQ(V().dereg_mr(a.mr), 0);
  a.mr = nullptr;
  EXPECT_EQ(V().dealloc_pd(a.pd), EBUSY);  // the QP still is
  Destroy(a);
}

TEST_F(SoftVerbs, InlineDataIsCopiedAtPostTime) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  std::memcpy(a.buf.data(), "inline!", 7);
  // No receive yet: the message waits, and its buffer is overwritten meanwhile.
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 7, IBV_SEND_SIGNALED | IBV_SEND_INLINE), 0);
  std::memcpy(a.buf.data(), "changed", 7);
  ASSERT_EQ(PostRecv(b, 1, 0, 64), 0);
  ASSERT_TRUE(Next(b.cq));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b.buf.data()), 7), "inline!");
  ASSERT_TRUE(Next(a.cq));
  EXPECT_EQ(PostSend(a, IBV_WR_SEND, 2, 0, 65, IBV_SEND_SIGNALED | IBV_SEND_INLINE), EINVAL);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, QueueDepthsAreBoundedAndUnsignaledRequestsHoldTheirSlots) {
  QpOptions o;
  o.max_send_wr = 4;
  o.max_recv_wr = 2;
  End a = MakeEnd(o), b = MakeEnd(o);
  Connect(a, b, o);
  ASSERT_EQ(PostRecv(b, 1, 0, 8), 0);
  ASSERT_EQ(PostRecv(b, 2, 0, 8), 0);
  EXPECT_EQ(PostRecv(b, 3, 0, 8), ENOMEM);
  uint64_t remote = reinterpret_cast<uint64_t>(b.buf.data());
  // Four unsignaled writes complete, but hold the send queue until a signaled one completes.
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, i, 0, 8, 0, 0, remote, b.mr->rkey), 0);
  }
  EXPECT_TRUE(Drain(a.cq).empty());
  EXPECT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, 9, 0, 8, IBV_SEND_SIGNALED, 0, remote, b.mr->rkey),
            ENOMEM);
  Destroy(a);
  Destroy(b);

  a = MakeEnd(o);
  b = MakeEnd(o);
  Connect(a, b, o);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, i, 0, 8, i == 2 ? IBV_SEND_SIGNALED : 0, 0,
                       reinterpret_cast<uint64_t>(b.buf.data()), b.mr->rkey),
              0);
  }
  ASSERT_EQ(Drain(a.cq).size(), 1u);
  for (int i = 0; i < 4; ++i) {  // the signaled completion freed every slot
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, i, 0, 8, IBV_SEND_SIGNALED, 0,
                       reinterpret_cast<uint64_t>(b.buf.data()), b.mr->rkey),
              0);
  }
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, CqOverflowMovesItsQpsToError) {
  QpOptions o;
  o.cqe = 2;
  End a = MakeEnd(o), b = MakeEnd(o);
  Connect(a, b, o);
  uint64_t remote = reinterpret_cast<uint64_t>(b.buf.data());
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, i, 0, 8, IBV_SEND_SIGNALED, 0, remote, b.mr->rkey), 0);
  }
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
  ibv_wc wc[4];
  EXPECT_EQ(V().poll_cq(a.cq, 4, wc), 2);
  EXPECT_LT(V().poll_cq(a.cq, 4, wc), 0);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, ThreadsPostingConcurrentlyKeepEachQpsOrder) {
  constexpr int kPairs = 4;
  constexpr int kMessages = 2000;
  QpOptions o;
  o.max_send_wr = 32;
  o.max_recv_wr = 32;
  o.cqe = 128;
  std::vector<End> senders, receivers;
  for (int p = 0; p < kPairs; ++p) {
    senders.push_back(MakeEnd(o));
    receivers.push_back(MakeEnd(o));
  }
  for (int p = 0; p < kPairs; ++p) Connect(senders[p], receivers[p], o);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kPairs; ++p) {
    // Sender: message i carries i in its 4 bytes (from a slot of its own, reused once completed).
    threads.emplace_back([&, p] {
      End& e = senders[p];
      int posted = 0, done = 0;
      Clock::time_point end = Clock::now() + std::chrono::seconds(30);
      while (done < kMessages && Clock::now() < end) {
        while (posted < kMessages && posted - done < 16) {
          size_t slot = static_cast<size_t>(posted % 16) * 4;
          std::memcpy(e.buf.data() + slot, &posted, 4);
          if (PostSend(e, IBV_WR_SEND_WITH_IMM, posted, slot, 4, IBV_SEND_SIGNALED, posted) != 0) {
            ++failures;
            return;
          }
          ++posted;
        }
        ibv_wc wc[8];
        int n = V().poll_cq(e.cq, 8, wc);
        for (int i = 0; i < n; ++i) {
          if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != static_cast<uint64_t>(done)) {
            ++failures;
            return;
          }
          ++done;
        }
      }
      if (done != kMessages) ++failures;
    });
    threads.emplace_back([&, p] {
      End& e = receivers[p];
      int posted = 0, got = 0;
      Clock::time_point end = Clock::now() + std::chrono::seconds(30);
      while (got < kMessages && Clock::now() < end) {
        while (posted < kMessages && posted - got < 16) {
          if (PostRecv(e, posted, static_cast<size_t>(posted % 16) * 4, 4) != 0) {
            ++failures;
            return;
          }
          ++posted;
        }
        ibv_wc wc[8];
        int n = V().poll_cq(e.cq, 8, wc);
        for (int i = 0; i < n; ++i) {
          int value = -1;
          std::memcpy(&value, e.buf.data() + (wc[i].wr_id % 16) * 4, 4);
          if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != static_cast<uint64_t>(got) ||
              value != got || static_cast<int>(ntohl(wc[i].imm_data)) != got) {
            ++failures;
            return;
          }
          ++got;
        }
      }
      if (got != kMessages) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int p = 0; p < kPairs; ++p) {
    Destroy(senders[p]);
    Destroy(receivers[p]);
  }
}

TEST_F(SoftVerbs, RoutesByGidAndThroughLibibverbsInlineCalls) {
  End a = MakeEnd(), b = MakeEnd();
  ASSERT_EQ(ToInit(a.qp, IBV_ACCESS_REMOTE_WRITE), 0);
  ASSERT_EQ(ToInit(b.qp, IBV_ACCESS_REMOTE_WRITE), 0);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_1024;
  attr.dest_qp_num = b.qp->qp_num;
  attr.max_dest_rd_atomic = 1;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  attr.ah_attr.grh.dgid.global.subnet_prefix = htobe64(0xfe80000000000000ull);
  attr.ah_attr.grh.dgid.global.interface_id = htobe64(0x7777);  // no such port
  EXPECT_EQ(V().modify_qp(a.qp, &attr, mask), EINVAL);
  ASSERT_EQ(V().query_gid(b.ctx, 1, 0, &attr.ah_attr.grh.dgid), 0);
  ASSERT_EQ(V().modify_qp(a.qp, &attr, mask), 0);
  ASSERT_EQ(V().query_gid(a.ctx, 1, 0, &attr.ah_attr.grh.dgid), 0);
  attr.dest_qp_num = a.qp->qp_num;
  ASSERT_EQ(V().modify_qp(b.qp, &attr, mask), 0);
  ASSERT_EQ(ToRts(a.qp, 0, 10, 3), 0);
  ASSERT_EQ(ToRts(b.qp, 0, 10, 3), 0);
  ASSERT_EQ(PostRecv(b, 1, 0, 64), 0);
  std::memcpy(a.buf.data(), "gid", 3);
  ibv_sge sge{reinterpret_cast<uint64_t>(a.buf.data()), 3, a.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);  // libibverbs' inline call, through ctx->ops
  ibv_wc wc{};
  ASSERT_EQ(ibv_poll_cq(b.cq, 1, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b.buf.data()), 3), "gid");
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, SolicitedOnlyNotifyWaitsForASolicitedCompletion) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  int fd = b.channel->fd;
  auto readable = [fd](int ms) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, ms) == 1;
  };
  ASSERT_EQ(V().req_notify_cq(b.cq, 1), 0);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(PostRecv(b, i, 0, 64), 0);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8), 0);
  EXPECT_FALSE(readable(20));
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 2, 0, 8, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED), 0);
  EXPECT_TRUE(readable(1000));
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  ASSERT_EQ(V().get_cq_event(b.channel, &cq, &context), 0);
  V().ack_cq_events(cq, 1);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, DestroyedPeerQpGoesUnanswered) {
  End a = MakeEnd(), b = MakeEnd();
  Connect(a, b);
  ASSERT_EQ(PostSend(a, IBV_WR_SEND, 1, 0, 8), 0);  // waits for a receive
  ASSERT_EQ(V().destroy_qp(b.qp), 0);
  b.qp = nullptr;
  std::optional<ibv_wc> s = Next(a.cq, milliseconds(3000));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, IBV_WC_RETRY_EXC_ERR) << Str(s->status);
  Destroy(a);
  Destroy(b);
}

TEST_F(SoftVerbs, ForeignPointersAreRefused) {
  ibv_qp bogus{};
  EXPECT_EQ(V().modify_qp(&bogus, nullptr, 0), EINVAL);
  ibv_cq bogus_cq{};
  ibv_wc wc{};
  EXPECT_LT(V().poll_cq(&bogus_cq, 1, &wc), 0);
  ibv_pd bogus_pd{};
  EXPECT_EQ(V().dealloc_pd(&bogus_pd), EINVAL);
}

}  // namespace
}  // namespace kolo::transport::rdma::soft
