// ArrivalTap: the arrival time of every segment a peer sends to one TCP socket, from a packet
// capture (libpcap on Linux's AF_PACKET, filtered in the kernel to the socket's 4-tuple).
//
// Why a capture: download shaping (proxy/shaper.h, DESIGN §3.6) judges a burst's end from the
// interarrival times of its packets. Everything the socket itself offers is coarser: a read
// or a SO_RCVLOWAT wake-up sees a batch, SO_RCVLOWAT is capped at half the buffer (so the
// second half of each window was only seen when a timer looked), socket timestamps stamp the
// last byte of a read, and TCP_INFO's tcpi_last_data_recv has millisecond resolution and only
// the latest segment. A packet socket gets each segment as the interface receives it, with the
// kernel's receive timestamp, before TCP queues it; its TCP header also says which segments
// were out of order or retransmitted (a hole, or a sequence number already seen), so loss is
// seen per burst without TCP_INFO counters.
//
// Needs CAP_NET_RAW. Open returns nullptr (and why) when the capture cannot be opened; the
// shaper then falls back to what the socket offers.
//
// Thread-safety: none; one tap belongs to one UpstreamShaper on the event-loop thread.
#ifndef GHOST_PROXY_ARRIVAL_TAP_H_
#define GHOST_PROXY_ARRIVAL_TAP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/base/clock.h"
#include "common/base/units.h"

struct pcap;
struct pcap_pkthdr;

namespace ghost {

// One captured segment from the peer.
struct TappedSegment {
  TimePoint at{};        // when the interface received it, on the tap's Clock
  Bytes payload = 0;     // TCP payload bytes (0 for a pure ACK, FIN or RST)
  std::uint32_t offset = 0;  // its first payload byte's offset in the stream, counted from the
                             // first payload byte the tap saw (mod 2^32, as TCP's sequence)
  bool missing = false;  // out of order (a hole before it) or a retransmission
  bool closing = false;  // FIN or RST: the peer is ending the stream
};

class ArrivalTap {
 public:
  // Captures what the peer of the connected TCP socket `fd` sends to it. `clock` is borrowed
  // (must outlive the tap). Returns nullptr with the reason in *why on failure (no CAP_NET_RAW,
  // libpcap cannot open the "any" device, the socket is not connected TCP/IP).
  static std::unique_ptr<ArrivalTap> Open(int fd, Clock* clock, std::string* why);
  ~ArrivalTap();
  ArrivalTap(const ArrivalTap&) = delete;
  ArrivalTap& operator=(const ArrivalTap&) = delete;

  // Readable when segments are waiting (for the event loop).
  int fd() const { return fd_; }
  // Hands every segment captured so far to `fn`, in arrival order; their times never go
  // backwards. Returns how many.
  int Drain(const std::function<void(const TappedSegment&)>& fn);

 private:
  ArrivalTap(pcap* handle, Clock* clock, std::uint16_t src_port, std::uint16_t dst_port);
  static void OnPacket(unsigned char* user, const pcap_pkthdr* header,
                       const unsigned char* bytes);

  pcap* handle_;
  Clock* clock_;
  int fd_ = -1;
  int link_header_ = 16;  // DLT_LINUX_SLL (the "any" device); 20 for SLL2
  std::uint16_t src_port_, dst_port_;
  bool have_seq_ = false;
  std::uint32_t first_seq_ = 0;  // the first payload byte seen
  std::uint32_t next_seq_ = 0;   // one past the highest payload byte seen
  TimePoint last_{};
  const std::function<void(const TappedSegment&)>* sink_ = nullptr;
  Duration offset_{};  // clock time = realtime − offset_, set per Drain
};

}  // namespace ghost

#endif  // GHOST_PROXY_ARRIVAL_TAP_H_
