// fp16's dynamic loss-scaling policy (models/compute/cudnn/loss_scale.h), on the host: the rule the
// device kernel applies at the end of every step. Expected sequences are written out by hand from
// torch.cuda.amp.GradScaler's documented behaviour; no GPU is needed.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "models/compute/cudnn/loss_scale.h"

namespace kolo::models::compute::cudnn {
namespace {

// Runs one step: `overflow` says whether its gradients held an inf or NaN.
void Step(const LossScaleOptions& o, LossScaleState* s, bool overflow) {
  if (overflow) s->found_inf = 1;
  AdvanceLossScale(o, s);
  EXPECT_EQ(s->found_inf, 0) << "the flag is cleared for the next step";
}

TEST(LossScaleTest, DefaultsAreGradScalers) {
  const LossScaleOptions o;
  EXPECT_EQ(o.init_scale, 65536.0f);
  EXPECT_EQ(o.growth_factor, 2.0f);
  EXPECT_EQ(o.backoff_factor, 0.5f);
  EXPECT_EQ(o.growth_interval, 2000);
  const LossScaleState s = InitialLossScale(o);
  EXPECT_EQ(s.scale, 65536.0f);
  EXPECT_EQ(s.good_steps, 0);
  EXPECT_EQ(s.found_inf, 0);
  EXPECT_EQ(s.skipped_steps, 0);
}

TEST(LossScaleTest, OverflowHalvesAndCountsASkippedStep) {
  const LossScaleOptions o;
  LossScaleState s = InitialLossScale(o);
  Step(o, &s, false);
  Step(o, &s, false);
  EXPECT_EQ(s.good_steps, 2);
  Step(o, &s, true);
  EXPECT_EQ(s.scale, 32768.0f);
  EXPECT_EQ(s.good_steps, 0) << "a backoff restarts the count of good steps";
  EXPECT_EQ(s.skipped_steps, 1);
  Step(o, &s, true);
  EXPECT_EQ(s.scale, 16384.0f);
  EXPECT_EQ(s.skipped_steps, 2);
}

TEST(LossScaleTest, GrowsOnTheIntervalsLastGoodStep) {
  LossScaleOptions o;
  o.init_scale = 8;
  o.growth_interval = 3;
  LossScaleState s = InitialLossScale(o);
  // good, good, good -> 16; good, overflow -> 8 (count restarts); good x3 -> 16.
  const bool overflow[] = {false, false, false, false, true, false, false, false};
  const float want_scale[] = {8, 8, 16, 16, 8, 8, 8, 16};
  const int want_good[] = {1, 2, 0, 1, 0, 1, 2, 0};
  for (int i = 0; i < 8; ++i) {
    Step(o, &s, overflow[i]);
    EXPECT_EQ(s.scale, want_scale[i]) << "after step " << i;
    EXPECT_EQ(s.good_steps, want_good[i]) << "after step " << i;
  }
  EXPECT_EQ(s.skipped_steps, 1);
}

TEST(LossScaleTest, ThousandsOfGoodStepsGrowOncePerInterval) {
  const LossScaleOptions o;
  LossScaleState s = InitialLossScale(o);
  for (int i = 0; i < 1999; ++i) Step(o, &s, false);
  EXPECT_EQ(s.scale, 65536.0f);
  Step(o, &s, false);
  EXPECT_EQ(s.scale, 131072.0f);
  for (int i = 0; i < 4000; ++i) Step(o, &s, false);
  EXPECT_EQ(s.scale, 524288.0f);
  EXPECT_EQ(s.skipped_steps, 0);
}

TEST(LossScaleTest, ScaleNeverGrowsPastFloat) {
  LossScaleOptions o;
  o.init_scale = std::ldexp(1.0f, 127);  // the largest power of two in float
  o.growth_interval = 1;
  LossScaleState s = InitialLossScale(o);
  Step(o, &s, false);
  EXPECT_EQ(s.scale, std::ldexp(1.0f, 127)) << "2^128 is not a float: the scale stays";
  EXPECT_TRUE(std::isfinite(s.scale));
  EXPECT_EQ(s.good_steps, 0);
}

TEST(LossScaleTest, RepeatedOverflowsBackOffGeometrically) {
  LossScaleOptions o;
  o.init_scale = std::ldexp(1.0f, 40);
  LossScaleState s = InitialLossScale(o);
  for (int i = 1; i <= 24; ++i) {
    Step(o, &s, true);
    EXPECT_EQ(s.scale, std::ldexp(1.0f, 40 - i));
  }
  EXPECT_EQ(s.skipped_steps, 24);
}

TEST(LossScaleTest, OptionsAreValidated) {
  const char* why = nullptr;
  EXPECT_TRUE(LossScaleOptionsValid(LossScaleOptions{}, &why));
  EXPECT_EQ(why, nullptr);
  struct Case {
    LossScaleOptions o;
    std::string field;
  };
  Case cases[4];
  cases[0].o.init_scale = 0.5f;
  cases[0].field = "init_scale";
  cases[1].o.growth_factor = 1.0f;
  cases[1].field = "growth_factor";
  cases[2].o.backoff_factor = 1.0f;
  cases[2].field = "backoff_factor";
  cases[3].o.growth_interval = 0;
  cases[3].field = "growth_interval";
  for (const Case& c : cases) {
    EXPECT_FALSE(LossScaleOptionsValid(c.o, &why)) << c.field;
    ASSERT_NE(why, nullptr) << c.field;
    EXPECT_NE(std::string(why).find(c.field), std::string::npos) << why;
  }
  LossScaleOptions nan;
  nan.init_scale = std::nanf("");
  EXPECT_FALSE(LossScaleOptionsValid(nan));
}

}  // namespace
}  // namespace kolo::models::compute::cudnn
