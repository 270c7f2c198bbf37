// flash_flush_bench: the live flush of one flash-log content with algorithm 1 and with
// algorithm 4 (DESIGN §3.5), as a ratio beside ghostsim's
// prediction for the same content (PredictFlushTime).
//
//   flash_flush_bench DIR [--records N] [--file-mib M] [--seed S] [--profile DEVICE]
//                         [--buffer-kib K]  (the DRAM flush buffer, default 256)
//
// Writes N random overwrites (512 B - 8 KiB, 512-aligned, in a file of M MiB) into a flash log
// under DIR/flash, keeps a copy of the log, then flushes the same log once per algorithm to
// DIR/disk/data, opened with O_DSYNC so every write reaches the device (page-cache writes
// would hide the seeks the algorithms save). The log file's cached pages are dropped before
// each flush (posix_fadvise DONTNEED) so its reads come from the device. I/O goes through
// io_uring (UringFileIo) when the kernel allows it. Prints one JSON object.
#include <event2/event.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/file_io.h"
#include "common/base/uring_file_io.h"
#include "common/cache/flash_log.h"
#include "common/power/profile.h"
#include "common/sim/flash_sim.h"

namespace fs = std::filesystem;
using namespace ghost;

namespace {

class DsyncTarget final : public FlushTarget {
 public:
  explicit DsyncTarget(std::string path) : path_(std::move(path)) {}
  Result<int> OpenForFlush(LogRecordKind, const std::string&) override {
    fd_.reset(open(path_.c_str(), O_RDWR | O_CREAT | O_DSYNC | O_CLOEXEC, 0644));
    if (!fd_.valid()) return Status::FromErrno(errno, "open " + path_);
    return fd_.get();
  }
  Status ApplyMeta(MetaOp, const std::string&, Bytes, const std::string&) override {
    return Status::Ok();
  }
  void EndFlush() override { fd_.reset(); }

 private:
  std::string path_;
  UniqueFd fd_;
};

int Die(const std::string& msg) {
  std::cerr << "flash_flush_bench: " << msg << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flash_flush_bench: the live flush of one flash-log content, algorithm 1 against 4"};
  std::string dir_arg;
  int records = 2000;
  Bytes file_mib = 64;
  unsigned seed = 1;
  std::string profile = "nvme-ssd";
  Bytes buffer_kib = 256;
  app.add_option("DIR", dir_arg, "scratch directory: the log goes to DIR/flash, the data file to DIR/disk")
      ->required();
  app.add_option("--records", records, "random overwrites written into the log")->check(CLI::Range(1, 10'000'000));
  app.add_option("--file-mib", file_mib, "size of the data file the log is flushed to")
      ->check(CLI::Range(Bytes{1}, Bytes{1} << 20));
  app.add_option("--seed", seed, "seed of the overwrites");
  app.add_option("--profile", profile, "device profile of ghostsim's prediction");
  app.add_option("--buffer-kib", buffer_kib, "the DRAM flush buffer")->check(CLI::Range(Bytes{4}, Bytes{1} << 20));
  CLI11_PARSE(app, argc, argv);
  const fs::path dir = dir_arg;
  const Bytes buffer = buffer_kib << 10;
  fs::create_directories(dir / "flash");
  fs::create_directories(dir / "disk");
  const std::string data_path = (dir / "disk" / "data").string();
  {
    // The target file exists at full size before the flushes, so both write in place.
    UniqueFd f(open(data_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!f.valid() || ftruncate(f.get(), static_cast<off_t>(file_mib << 20)) != 0) {
      return Die("cannot create " + data_path);
    }
  }
  event_base* base = event_base_new();
  std::unique_ptr<FileIo> io;
  bool uring = false;
  if (auto u = UringFileIo::Create(base); u.ok()) {
    io = std::move(u).value();
    uring = true;
  } else {
    io = std::make_unique<SyncFileIo>(base);
  }
  DsyncTarget target(data_path);
  FlashLogOptions o;
  o.dir = (dir / "flash").string();
  o.capacity = 256 << 20;
  o.buffer = buffer;
  auto run_until = [&](const bool& done) {
    while (!done) event_base_loop(base, EVLOOP_ONCE);
  };
  std::vector<PlanRecord> plan_records;
  {
    fs::remove(dir / "flash" / "flash.log");
    auto log = FlashLog::Open(o, *io, target, nullptr);
    if (!log.ok()) return Die(log.status().ToString());
    std::mt19937 rng(seed);
    const Bytes sectors = (file_mib << 20) / 512;
    for (int i = 0; i < records; ++i) {
      Bytes off = (rng() % (sectors - 16)) * 512;
      std::string data((1 + rng() % 16) * 512, static_cast<char>('a' + i % 26));
      bool done = false;
      bool ok = true;
      (*log)->AppendWrite(LogRecordKind::kBlock, "data", off, std::move(data),
                          [&](Result<std::uint64_t> r) { ok = r.ok(); done = true; });
      run_until(done);
      if (!ok) return Die("append failed");
    }
    for (const LogRecordInfo& r : (*log)->records()) {
      plan_records.push_back({r.seq, r.kind, r.path, r.offset, r.length, r.log_offset,
                              r.log_length, FlashLog::kHeaderSize + r.path.size()});
    }
  }
  fs::copy_file(dir / "flash" / "flash.log", dir / "flash.log.saved",
                fs::copy_options::overwrite_existing);
  nlohmann::json out;
  out["records"] = records;
  out["io"] = uring ? "io_uring" : "sync";
  double secs[5] = {0};
  for (int alg : {1, 4}) {
    fs::copy_file(dir / "flash.log.saved", dir / "flash" / "flash.log",
                  fs::copy_options::overwrite_existing);
    o.algorithm = static_cast<FlushAlgorithm>(alg);
    auto log = FlashLog::Open(o, *io, target, nullptr);
    if (!log.ok()) return Die(log.status().ToString());
    {
      UniqueFd lf(open((dir / "flash" / "flash.log").c_str(), O_RDONLY | O_CLOEXEC));
      fdatasync(lf.get());
      posix_fadvise(lf.get(), 0, 0, POSIX_FADV_DONTNEED);
    }
    bool done = false;
    FlushReport rep;
    auto t0 = std::chrono::steady_clock::now();
    (*log)->Flush(LogFlushReason::kExplicit, [&](const FlushReport& r) { rep = r; done = true; });
    run_until(done);
    secs[alg] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!rep.errors.empty()) return Die("flush failed: " + rep.errors.front());
    out["alg" + std::to_string(alg)] = {{"seconds", secs[alg]}, {"writes", rep.writes},
                                        {"bytes_written", rep.bytes_written},
                                        {"bytes_merged_away", rep.bytes_merged_away}};
  }
  out["measured_ratio_alg4_over_alg1"] = secs[4] / secs[1];
  auto dev = LoadDeviceProfile(profile);
  if (dev.ok()) {
    FlashSimOptions so;
    so.dram_buffer = o.buffer;
    so.algorithm = FlushAlgorithm::kOneRecord;
    Duration p1 = PredictFlushTime(plan_records, so, *dev, *dev, file_mib << 20);
    so.algorithm = FlushAlgorithm::kSortMerge;
    Duration p4 = PredictFlushTime(plan_records, so, *dev, *dev, file_mib << 20);
    out["predicted_profile"] = profile;
    out["predicted_ratio_alg4_over_alg1"] = ToSeconds(p4) / ToSeconds(p1);
  }
  std::cout << out.dump() << "\n";
  io.reset();
  event_base_free(base);
  fs::remove(dir / "flash.log.saved");
  return 0;
}
