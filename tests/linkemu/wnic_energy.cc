// wnic_energy: prices one download's capture with the post-mortem WNIC model
// (common/power/wnic_trace.h), for scripts/bench-shaping.sh.
//
//   wnic_energy --pcap FILE --origin-port P [--card-log FILE] [--profile wavelan-2.4]
//               [--profile-dir DIR] [--rate-mbit 20]
//
// The capture (tcpdump -w on the client side of the emulated link) holds one download. Start:
// the first packet captured (the connection's SYN). Arrivals: every segment from the origin
// port with payload. Prints one JSON object: bytes, packets, and plain / psm / (with a card
// log written by ghostproxy's GHOST_SHAPER_CARD_LOG) shaped runs: delay_s, energy_j, ed
// (energy × delay), sleep_s, wakes, missed. Exit 0, 1 on a bad capture, 2 on bad arguments.
#include <pcap/pcap.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/power/profile.h"
#include "common/power/wnic_trace.h"

namespace {

using namespace ghost;

TimePoint FromNanos(long long ns) { return TimePoint(std::chrono::duration_cast<Duration>(std::chrono::nanoseconds(ns))); }

nlohmann::json RunJson(const WnicRun& r) {
  return {{"delay_s", ToSeconds(r.delay)}, {"energy_j", r.energy.joules()},
          {"ed", r.energy_delay()},        {"sleep_s", ToSeconds(r.sleep)},
          {"wakes", r.wakes},              {"missed", r.missed}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string pcap_path, card_log, profile = "wavelan-2.4", profile_dir = GHOST_PROFILE_DIR;
  int origin_port = 0;
  double rate_mbit = 20;
  CLI::App app{"Energy and delay of a captured download on a modelled WNIC."};
  app.add_option("--pcap", pcap_path, "capture of one download")->required();
  app.add_option("--origin-port", origin_port, "the origin's TCP port")->required();
  app.add_option("--card-log", card_log, "ghostproxy's GHOST_SHAPER_CARD_LOG of the download");
  app.add_option("--profile", profile, "network device profile (default wavelan-2.4)");
  app.add_option("--profile-dir", profile_dir, "where profiles are");
  app.add_option("--rate-mbit", rate_mbit, "air rate when the profile has none (default 20)");
  CLI11_PARSE(app, argc, argv);

  Result<DeviceProfile> dev = LoadDeviceProfile(profile, profile_dir);
  if (!dev.ok()) {
    std::fprintf(stderr, "wnic_energy: profile %s: %s\n", profile.c_str(), dev.status().ToString().c_str());
    return 2;
  }
  const WnicCard card = WnicCardFromProfile(*dev, Bandwidth::MegabitsPerSecond(rate_mbit));

  char err[PCAP_ERRBUF_SIZE] = "";
  pcap_t* p = pcap_open_offline_with_tstamp_precision(pcap_path.c_str(), PCAP_TSTAMP_PRECISION_NANO, err);
  if (p == nullptr) {
    std::fprintf(stderr, "wnic_energy: %s: %s\n", pcap_path.c_str(), err);
    return 1;
  }
  const int dlt = pcap_datalink(p);
  const int link = dlt == DLT_EN10MB ? 14 : dlt == DLT_LINUX_SLL ? 16 : dlt == DLT_LINUX_SLL2 ? 20 : -1;
  if (link < 0) {
    std::fprintf(stderr, "wnic_energy: %s: link type %d not supported\n", pcap_path.c_str(), dlt);
    pcap_close(p);
    return 1;
  }
  std::optional<TimePoint> start;
  std::vector<PacketArrival> packets;
  pcap_pkthdr* h;
  const unsigned char* b;
  while (pcap_next_ex(p, &h, &b) == 1) {
    const TimePoint at = FromNanos(static_cast<long long>(h->ts.tv_sec) * 1000000000LL + h->ts.tv_usec);
    if (!start) start = at;
    const unsigned char* ip = b + link;
    if (h->caplen < static_cast<unsigned>(link) + 40 || (ip[0] >> 4) != 4 || ip[9] != 6) continue;
    const unsigned ihl = (ip[0] & 0x0f) * 4u;
    const unsigned total = (ip[2] << 8) | ip[3];
    const unsigned char* tcp = ip + ihl;
    if (h->caplen < link + ihl + 20) continue;
    const int sport = (tcp[0] << 8) | tcp[1];
    const unsigned doff = (tcp[12] >> 4) * 4u;
    if (sport != origin_port || total <= ihl + doff) continue;
    packets.push_back({at, total - ihl - doff});
  }
  pcap_close(p);
  if (!start || packets.empty()) {
    std::fprintf(stderr, "wnic_energy: %s: no data from port %d\n", pcap_path.c_str(), origin_port);
    return 1;
  }
  Bytes bytes = 0;
  for (const auto& a : packets) bytes += a.bytes;
  nlohmann::json out = {{"bytes", bytes}, {"packets", packets.size()}, {"card", dev->name},
                        {"plain", RunJson(PlainRun(card, *start, packets))},
                        {"psm", RunJson(PsmRun(card, *start, packets))}};
  if (!card_log.empty()) {
    std::ifstream in(card_log);
    std::vector<CardSwitch> schedule;
    std::string what;
    long long ns;
    while (in >> what >> ns) {
      if (what == "sleep" || what == "wake") schedule.push_back({FromNanos(ns), what == "wake"});
    }
    out["shaped"] = RunJson(ScheduledRun(card, *start, packets, schedule));
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
