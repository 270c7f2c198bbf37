#include "common/power/default_pm.h"

#include <gtest/gtest.h>

#include <memory>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr int kLowPowerIdle = 1;
constexpr int kStandby = 2;
constexpr int kCam = 0;
constexpr int kPsm = 1;

class DefaultPmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    machine_ = *m;
    pm_ = std::make_unique<PowerManager>(clock_, machine_.base_power, 50);
  }
  void TearDown() override { pm_.reset(); }

  DefaultDiskPolicy* StartDisk(const DefaultDiskOptions& options = DefaultDiskOptions()) {
    device_ = std::make_unique<Device>(clock_, *machine_.FindDevice(DeviceKind::kDisk), nullptr, 0);
    auto policy = std::make_unique<DefaultDiskPolicy>(options);
    DefaultDiskPolicy* raw = policy.get();
    id_ = pm_->Register(device_.get(), std::move(policy));
    return raw;
  }

  DefaultNetworkPolicy* StartNetwork(
      const DefaultNetworkOptions& options = DefaultNetworkOptions()) {
    device_ = std::make_unique<Device>(clock_, *machine_.FindDevice(DeviceKind::kNetwork),
                                       &machine_.link, kPsm);
    auto policy = std::make_unique<DefaultNetworkPolicy>(options);
    DefaultNetworkPolicy* raw = policy.get();
    id_ = pm_->Register(device_.get(), std::move(policy));
    return raw;
  }

  // Submits an I/O and runs the clock until it completes; returns the completion time.
  TimePoint RunIo(Bytes size = 32 * 1024) {
    bool done = false;
    TimePoint end{};
    device_->Submit({size, false}, [&] {
      done = true;
      end = clock_.Now();
    });
    while (!done && clock_.RunNext()) {
    }
    EXPECT_TRUE(done);
    return end;
  }

  // A hinted transfer that begins and ends at once.
  void Transfer() {
    pm_->TransferBegin(id_);
    pm_->TransferEnd(id_);
  }

  VirtualClock clock_;
  MachineProfile machine_;
  std::unique_ptr<Device> device_;  // outlives pm_ (reset first in TearDown)
  std::unique_ptr<PowerManager> pm_;
  DeviceId id_ = -1;
};

TEST_F(DefaultPmTest, DefaultDiskStepsDownAtHalfSecondAndTenSeconds) {
  StartDisk();
  TimePoint end = RunIo();
  clock_.RunUntil(end + Millis(499));
  EXPECT_EQ(device_->target_mode(), 0);
  clock_.RunUntil(end + Millis(501));
  EXPECT_EQ(device_->target_mode(), kLowPowerIdle);
  clock_.RunUntil(end + Millis(661));  // the step down takes 160 ms
  EXPECT_EQ(device_->mode(), kLowPowerIdle);
  clock_.RunUntil(end + Millis(9999));
  EXPECT_EQ(device_->mode(), kLowPowerIdle);
  EXPECT_EQ(device_->target_mode(), kLowPowerIdle);
  clock_.RunUntil(end + Millis(10001));
  EXPECT_EQ(device_->target_mode(), kStandby);
  clock_.RunUntil(end + Millis(10161));
  EXPECT_EQ(device_->mode(), kStandby);
}

TEST_F(DefaultPmTest, DefaultDiskTimeoutsComeFromTheOptions) {
  StartDisk({Seconds(2), Seconds(5)});
  TimePoint end = RunIo();
  clock_.RunUntil(end + Millis(1999));
  EXPECT_EQ(device_->target_mode(), 0);
  clock_.RunUntil(end + Millis(2001));
  EXPECT_EQ(device_->target_mode(), kLowPowerIdle);
  clock_.RunUntil(end + Millis(4999));
  EXPECT_EQ(device_->target_mode(), kLowPowerIdle);
  clock_.RunUntil(end + Millis(5001));
  EXPECT_EQ(device_->target_mode(), kStandby);
}

TEST_F(DefaultPmTest, DefaultDiskIoCancelsTheTimeouts) {
  StartDisk();
  TimePoint end1 = RunIo();
  EXPECT_EQ(clock_.pending(), 2u);  // the 0.5 s and 10 s timeouts
  clock_.RunUntil(end1 + Millis(400));
  device_->Submit({1 << 20, false}, [] {});  // 1 MiB: ≈ 0.77 s, past the old 0.5 s
  ASSERT_TRUE(clock_.RunNext());             // the device starts the I/O
  ASSERT_TRUE(device_->busy());
  EXPECT_EQ(clock_.pending(), 1u);  // only the I/O's own completion: the timeouts are gone
  clock_.RunUntil(end1 + Millis(1000));
  EXPECT_EQ(device_->target_mode(), 0);
  TimePoint end2 = RunIo();
  clock_.RunUntil(end2 + Millis(499));
  EXPECT_EQ(device_->target_mode(), 0);
  clock_.RunUntil(end2 + Millis(501));
  EXPECT_EQ(device_->target_mode(), kLowPowerIdle);
}

TEST_F(DefaultPmTest, DefaultDiskAppliesADeeperStepThatFiresDuringTheStepDown) {
  // Standby is due 100 ms after low-power idle, while the 160 ms step down is under way.
  StartDisk({Millis(500), Millis(600)});
  TimePoint end = RunIo();
  clock_.RunUntil(end + Millis(650));
  EXPECT_TRUE(device_->transitioning());
  EXPECT_EQ(device_->target_mode(), kLowPowerIdle);
  clock_.RunUntil(end + Millis(661));
  EXPECT_EQ(device_->mode(), kLowPowerIdle);
  EXPECT_EQ(device_->target_mode(), kStandby);
  clock_.RunUntil(end + Millis(821));
  EXPECT_EQ(device_->mode(), kStandby);
}

TEST_F(DefaultPmTest, DefaultDiskIgnoresTheKnobAndWritesAtOnce) {
  DefaultDiskPolicy* policy = StartDisk();
  EXPECT_FALSE(policy->DefersBackgroundWrites());
  pm_->SetKnob(100);
  TimePoint end = RunIo();
  clock_.RunUntil(end + Millis(501));
  EXPECT_EQ(device_->target_mode(), kLowPowerIdle);
  EXPECT_EQ(policy->Describe(), "default-disk: low-power-idle after 0.50 s, standby after 10.00 s");
}

TEST_F(DefaultPmTest, DefaultNetworkGoesToCamForBurstAndBackToPsm) {
  StartNetwork();
  ASSERT_EQ(device_->mode(), kPsm);
  Transfer();  // the first transfer: nothing to compare with
  EXPECT_EQ(device_->target_mode(), kPsm);
  clock_.AdvanceBy(Millis(100));
  Transfer();  // began 100 ms after the previous one: a burst
  EXPECT_EQ(device_->target_mode(), kCam);
  const TimePoint last_end = clock_.Now();
  clock_.RunUntil(last_end + Millis(401));  // PSM→CAM takes 400 ms
  EXPECT_EQ(device_->mode(), kCam);
  clock_.RunUntil(last_end + Millis(799));
  EXPECT_EQ(device_->target_mode(), kCam);
  clock_.RunUntil(last_end + Millis(801));  // 800 ms with no transfer
  EXPECT_EQ(device_->target_mode(), kPsm);
  clock_.RunUntil(last_end + Millis(800 + 411));  // CAM→PSM takes 410 ms
  EXPECT_EQ(device_->mode(), kPsm);
}

TEST_F(DefaultPmTest, DefaultNetworkStaysInPsmForSpacedTransfers) {
  StartNetwork();
  for (int i = 0; i < 10; ++i) {
    Transfer();
    clock_.AdvanceBy(Millis(300));
  }
  EXPECT_EQ(device_->mode(), kPsm);
  EXPECT_EQ(device_->target_mode(), kPsm);
  EXPECT_EQ(pm_->meter().Read().devices[0].transitions, 0);
}

TEST_F(DefaultPmTest, DefaultNetworkStaysInCamWhileTransfersContinue) {
  StartNetwork();
  Transfer();
  clock_.AdvanceBy(Millis(50));
  Transfer();
  ASSERT_EQ(device_->target_mode(), kCam);
  // One transfer every 500 ms: never 800 ms quiet.
  for (int i = 0; i < 10; ++i) {
    clock_.AdvanceBy(Millis(500));
    EXPECT_EQ(device_->target_mode(), kCam);
    Transfer();
  }
  EXPECT_EQ(device_->mode(), kCam);
  clock_.AdvanceBy(Millis(801));
  EXPECT_EQ(device_->target_mode(), kPsm);
}

TEST_F(DefaultPmTest, DefaultNetworkWaitsForOpenTransfersBeforePsm) {
  StartNetwork();
  Transfer();
  clock_.AdvanceBy(Millis(50));
  pm_->TransferBegin(id_);  // a long transfer
  clock_.AdvanceBy(Seconds(5));
  EXPECT_EQ(device_->mode(), kCam);
  EXPECT_EQ(device_->target_mode(), kCam);
  pm_->TransferEnd(id_);
  clock_.AdvanceBy(Millis(799));
  EXPECT_EQ(device_->target_mode(), kCam);
  clock_.AdvanceBy(Millis(2));
  EXPECT_EQ(device_->target_mode(), kPsm);
}

TEST_F(DefaultPmTest, DefaultNetworkIoInsideAHintedTransferIsNotASecondTransfer) {
  DefaultNetworkPolicy* policy = StartNetwork();
  pm_->TransferBegin(id_);
  RunIo();  // begins at once: part of the hinted transfer
  EXPECT_EQ(policy->open_transfers(), 1);
  pm_->TransferEnd(id_);
  EXPECT_EQ(policy->open_transfers(), 0);
  EXPECT_EQ(device_->target_mode(), kPsm);
  EXPECT_EQ(device_->mode(), kPsm);
}

TEST_F(DefaultPmTest, DefaultNetworkCountsDeviceIoAsTransfers) {
  // In PSM each round trip waits for a beacon, so one I/O takes ≥ 400 ms; with a 2 s burst
  // gap two I/Os in a row are a burst.
  StartNetwork({Seconds(2), Millis(800)});
  RunIo(1000);
  EXPECT_EQ(device_->target_mode(), kPsm);
  RunIo(1000);  // began less than 2 s after the previous one
  EXPECT_EQ(device_->target_mode(), kCam);
}

TEST_F(DefaultPmTest, DefaultNetworkReturnsToPsmWhenAttachedInCam) {
  device_ = std::make_unique<Device>(clock_, *machine_.FindDevice(DeviceKind::kNetwork),
                                     &machine_.link, kCam);
  auto policy = std::make_unique<DefaultNetworkPolicy>();
  EXPECT_FALSE(policy->DefersBackgroundWrites());
  EXPECT_EQ(policy->Describe(),
            "default-network: CAM while transfers begin < 200 ms apart, PSM after 800 ms idle");
  id_ = pm_->Register(device_.get(), std::move(policy));
  clock_.AdvanceBy(Millis(799));
  EXPECT_EQ(device_->target_mode(), kCam);
  clock_.AdvanceBy(Millis(2));
  EXPECT_EQ(device_->target_mode(), kPsm);
}

}  // namespace
}  // namespace ghost
