// The engine's handle table (execution/operation_table.h): submission, draining, completion by
// the executor and by handle (parameter servers), waiting, the sticky fatal error and shutdown.
// kolo-test-links: kolo_execution
#include "engine/execution/operation_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace kolo::execution {
namespace {

using std::chrono::milliseconds;

Operation Op(const std::string& name) {
  Operation op;
  op.request.name = name;
  op.request.type = coordinator::CollectiveType::kAllreduce;
  op.request.shape = {4};
  return op;
}

struct Table {
  ExecutionStats counted;
  OperationTable table{3,
                       [this](const ExecutionStats& d) { counted.collectives += d.collectives; }};
};

StatusOr<int64_t> Submit(OperationTable& t, const std::string& name) {
  bool was_idle = false;
  return t.Submit(Op(name), &was_idle, nullptr);
}

TEST(OperationTable, SubmitDrainCompleteWait) {
  Table t;
  std::vector<std::string> queued;
  bool was_idle = true;
  auto a = t.table.Submit(Op("a"), &was_idle, [&](const std::string& n) { queued.push_back(n); });
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(was_idle);
  auto b = Submit(t.table, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(queued, std::vector<std::string>{"a"});
  EXPECT_EQ(t.table.Find("a"), nullptr) << "queued, not yet pending";

  const std::vector<Operation*> drained = t.table.Drain();
  ASSERT_EQ(drained.size(), 2u);
  EXPECT_EQ(drained[0]->request.name, "a");
  EXPECT_EQ(drained[1]->request.name, "b");
  EXPECT_EQ(t.table.Find("a"), drained[0]);
  EXPECT_FALSE(*t.table.Poll(*a));

  auto gathered = std::make_unique<GatheredTensor>();
  gathered->first_dims = {1, 2};
  t.table.Complete(drained[0], Status::OK(), std::move(gathered));
  EXPECT_EQ(t.table.Find("a"), nullptr);
  EXPECT_TRUE(*t.table.Poll(*a));
  auto state = t.table.Wait(*a, milliseconds(100));
  ASSERT_TRUE(state.ok());
  EXPECT_TRUE(state->status.ok());
  ASSERT_NE(state->gathered, nullptr);
  EXPECT_EQ(state->gathered->first_dims, (std::vector<int64_t>{1, 2}));
  // Waited on once: then unknown.
  EXPECT_EQ(t.table.Wait(*a, milliseconds(1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.table.completed(), 1);

  // The name is free again once completed; "b" is still in flight.
  EXPECT_TRUE(Submit(t.table, "a").ok());
  auto dup = Submit(t.table, "b");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("already in flight on rank 3"), std::string::npos)
      << dup.status().ToString();
}

TEST(OperationTable, WaitTimesOutAndAnotherThreadCompletes) {
  Table t;
  auto id = Submit(t.table, "x");
  ASSERT_TRUE(id.ok());
  auto timed_out = t.table.Wait(*id, milliseconds(20));
  EXPECT_EQ(timed_out.status().code(), StatusCode::kDeadlineExceeded);
  Operation* op = t.table.Drain()[0];
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(30));
    t.table.Complete(op, InvalidArgument("shapes differ"), nullptr);
  });
  auto state = t.table.Wait(*id, milliseconds(5000));
  completer.join();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->status.code(), StatusCode::kInvalidArgument);
}

TEST(OperationTable, IssuedHandlesCompleteByIdAndCanBeForgotten) {
  Table t;
  auto id = t.table.Issue("pushpull 'w'");
  ASSERT_TRUE(id.ok());
  t.table.CompleteHandle(*id, Status::OK());
  EXPECT_TRUE(t.table.Wait(*id, milliseconds(10))->status.ok());
  auto dropped = t.table.Issue("pushpull 'v'");
  ASSERT_TRUE(dropped.ok());
  t.table.Forget(*dropped);
  EXPECT_EQ(t.table.Poll(*dropped).status().code(), StatusCode::kInvalidArgument);
  t.table.CompleteHandle(*dropped, Status::OK());  // ignored: nobody waits for it
  EXPECT_EQ(t.table.completed(), 1);
}

TEST(OperationTable, FailAllCompletesQueuedAndPendingAndTheFatalErrorSticks) {
  Table t;
  auto pending = Submit(t.table, "p");
  ASSERT_TRUE(pending.ok());
  t.table.Drain();
  auto queued = Submit(t.table, "q");
  ASSERT_TRUE(queued.ok());
  t.table.FailAll(Unavailable("rank 2 has sent nothing for 30 s"), /*fatal_error=*/true);
  for (int64_t id : {*pending, *queued}) {
    auto state = t.table.Wait(id, milliseconds(10));
    ASSERT_TRUE(state.ok());
    EXPECT_EQ(state->status.code(), StatusCode::kUnavailable);
    EXPECT_NE(state->status.message().find("rank 2"), std::string::npos);
  }
  EXPECT_NE(t.table.Wait(*queued, milliseconds(1)).status().code(), StatusCode::kOk);
  EXPECT_TRUE(t.table.failed_at().has_value());
  // Sticky: later submissions and issues fail with it; a second error does not replace it.
  t.table.SetFatal(Internal("later"));
  EXPECT_EQ(Submit(t.table, "r").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(t.table.Issue("pushpull 'w'").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(t.table.fatal().code(), StatusCode::kUnavailable);
}

TEST(OperationTable, ShutdownRefusesSubmissionsAndAStoppedTableRefusesToo) {
  Table t;
  t.table.RequestShutdown();
  EXPECT_TRUE(t.table.shutdown_requested());
  auto s = Submit(t.table, "a");
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("shut down"), std::string::npos);
  EXPECT_EQ(t.table.Issue("pushpull 'w'").status().code(), StatusCode::kFailedPrecondition);

  // Stopped because the peers' engine stopped (not fatal): collectives refused, pushes allowed.
  Table u;
  u.table.FailAll(FailedPrecondition("the engine has shut down"), /*fatal_error=*/false);
  EXPECT_TRUE(u.table.fatal().ok());
  EXPECT_EQ(Submit(u.table, "a").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(u.table.Issue("pushpull 'w'").ok());
}

TEST(OperationTable, IdleIsReportedToTheNextSubmitterOnly) {
  Table t;
  EXPECT_TRUE(t.table.RequestIdle());
  bool was_idle = false;
  ASSERT_TRUE(t.table.Submit(Op("a"), &was_idle, nullptr).ok());
  EXPECT_TRUE(was_idle) << "the first submission after idling wakes the thread";
  ASSERT_TRUE(t.table.Submit(Op("b"), &was_idle, nullptr).ok());
  EXPECT_FALSE(was_idle);
  EXPECT_FALSE(t.table.RequestIdle()) << "something is queued";
  t.table.Drain();
  EXPECT_TRUE(t.table.RequestIdle());
  t.table.RequestShutdown();
  EXPECT_FALSE(t.table.RequestIdle()) << "a shutdown is news";
}

TEST(OperationTable, CountGoesToTheSink) {
  Table t;
  t.table.Count({2, 0, 0, 0, 0});
  EXPECT_EQ(t.counted.collectives, 2);
}

}  // namespace
}  // namespace kolo::execution
