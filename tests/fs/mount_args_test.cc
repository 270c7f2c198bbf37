#include "fs/mount_args.h"

#include <gtest/gtest.h>

namespace ghost {
namespace {

using Args = std::vector<std::string>;
const Args kValueOptions = {"--cache", "--origin", "--profile", "--config", "--knob"};

TEST(MountArgsTest, OrdinaryCommandLineIsUnchanged) {
  const Args in = {"ghostfs", "--cache", "/c", "--origin", "www=http://h/", "-f", "/mnt"};
  EXPECT_EQ(RewriteMountArgs(in, kValueOptions), in);
}

TEST(MountArgsTest, FstabOptionsBecomeGhostOptionsAndFuseOptions) {
  const Args in = {"ghostfs", "ghost", "/mnt",
                   "-o",
                   "rw,nodev,nosuid,cache=/var/cache/ghost,origin=www=http://127.0.0.1:8080/,"
                   "profile=ipaq-2004,no_passthrough,allow_other"};
  const Args want = {"ghostfs", "--cache", "/var/cache/ghost", "--origin",
                     "www=http://127.0.0.1:8080/", "--profile", "ipaq-2004", "--no-passthrough",
                     "-o", "rw,nodev,nosuid,allow_other", "/mnt"};
  EXPECT_EQ(RewriteMountArgs(in, kValueOptions), want);
}

TEST(MountArgsTest, MountOnlyOptionsAreDropped) {
  const Args in = {"ghostfs", "ghost", "/mnt", "-o",
                   "noauto,user,_netdev,nofail,defaults,x-systemd.automount,comment=x,"
                   "cache_size=1G"};
  const Args want = {"ghostfs", "--cache-size", "1G", "/mnt"};
  EXPECT_EQ(RewriteMountArgs(in, kValueOptions), want);
}

TEST(MountArgsTest, SourceWithASlashIsTheConfigFile) {
  const Args in = {"ghostfs", "/etc/ghost/ghostfs.toml", "/mnt", "-o", "rw"};
  const Args want = {"ghostfs", "--config", "/etc/ghost/ghostfs.toml", "-o", "rw", "/mnt"};
  EXPECT_EQ(RewriteMountArgs(in, kValueOptions), want);
}

TEST(MountArgsTest, ValueOfAnOptionIsNotTakenForTheSource) {
  const Args in = {"ghostfs", "--cache", "/c", "/mnt", "-o", "ro"};
  const Args want = {"ghostfs", "--cache", "/c", "-o", "ro", "/mnt"};
  EXPECT_EQ(RewriteMountArgs(in, kValueOptions), want);
}

}  // namespace
TEST(UnknownLongOptionTest, MisspeltOptionIsBlamedAloneWithTheNearName) {
  const std::vector<std::string> known = {"--origin", "--cache", "--help", "--profile"};
  EXPECT_EQ(UnknownLongOption({"ghostfs", "--cache", "/c", "--orgin", "www=http://h/", "/mnt"}, known),
            "unknown option --orgin (did you mean --origin?)");
  EXPECT_EQ(UnknownLongOption({"ghostfs", "--orgin=www=http://h/", "/mnt"}, known),
            "unknown option --orgin (did you mean --origin?)");
  EXPECT_EQ(UnknownLongOption({"ghostfs", "--frobnicate", "/mnt"}, known), "unknown option --frobnicate");
}

TEST(UnknownLongOptionTest, KnownOptionsValuesAndAfterDoubleDashPass) {
  const std::vector<std::string> known = {"--origin", "--cache"};
  EXPECT_EQ(UnknownLongOption({"ghostfs", "--origin=www=http://h/", "--cache", "/c", "-f", "/mnt"}, known), "");
  EXPECT_EQ(UnknownLongOption({"ghostfs", "--", "--not-an-option"}, known), "");
}

}  // namespace ghost
