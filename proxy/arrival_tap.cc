#include "proxy/arrival_tap.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pcap/pcap.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cstring>

namespace ghost {
namespace {

// Only headers are needed: link (≤ 20) + IPv6 (40) + TCP with options (≤ 60).
constexpr int kSnapLen = 128;
// Kernel buffer of the capture: ~1400 headers-only frames, several windows of segments.
constexpr int kBufferBytes = 512 * 1024;

std::string AddressText(const sockaddr_storage& a, std::uint16_t* port) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    *port = ntohs(v6->sin6_port);
  }
  return text;
}

// a − b in sequence space (RFC 793 arithmetic).
std::int32_t SeqDiff(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b); }

}  // namespace

std::unique_ptr<ArrivalTap> ArrivalTap::Open(int fd, Clock* clock, std::string* why) {
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof local, plen = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 ||
      (local.ss_family != AF_INET && local.ss_family != AF_INET6)) {
    *why = "the socket is not a connected TCP/IP socket";
    return nullptr;
  }
  std::uint16_t lport = 0, pport = 0;
  const std::string laddr = AddressText(local, &lport);
  const std::string paddr = AddressText(peer, &pport);

  char err[PCAP_ERRBUF_SIZE] = "";
  pcap_t* p = pcap_create("any", err);
  if (p == nullptr) {
    *why = std::string("pcap_create: ") + err;
    return nullptr;
  }
  auto fail = [&](const std::string& what) -> std::unique_ptr<ArrivalTap> {
    *why = what + ": " + pcap_geterr(p);
    pcap_close(p);
    return nullptr;
  };
  pcap_set_snaplen(p, kSnapLen);
  pcap_set_buffer_size(p, kBufferBytes);
  // Each packet as it comes (TPACKET_V2), not when a ring block fills or times out.
  pcap_set_immediate_mode(p, 1);
  pcap_set_tstamp_precision(p, PCAP_TSTAMP_PRECISION_NANO);
  if (const int rc = pcap_activate(p); rc < 0) {
    return fail(rc == PCAP_ERROR_PERM_DENIED ? "capturing needs CAP_NET_RAW" : "pcap_activate");
  }
  const int dlt = pcap_datalink(p);
  if (dlt != DLT_LINUX_SLL && dlt != DLT_LINUX_SLL2) return fail("unexpected link type");
  // "inbound": on loopback each segment passes twice (sent and received); count it once.
  const std::string filter = "inbound and tcp and src host " + paddr + " and src port " +
                             std::to_string(pport) + " and dst host " + laddr +
                             " and dst port " + std::to_string(lport);
  bpf_program prog{};
  if (pcap_compile(p, &prog, filter.c_str(), 1, PCAP_NETMASK_UNKNOWN) != 0)
    return fail("pcap_compile " + filter);
  const int rc = pcap_setfilter(p, &prog);
  pcap_freecode(&prog);
  if (rc != 0) return fail("pcap_setfilter");
  if (pcap_setnonblock(p, 1, err) != 0) return fail("pcap_setnonblock");
  std::unique_ptr<ArrivalTap> tap(new ArrivalTap(p, clock, pport, lport));
  tap->link_header_ = dlt == DLT_LINUX_SLL2 ? 20 : 16;
  tap->fd_ = pcap_get_selectable_fd(p);
  if (tap->fd_ < 0) {
    *why = "no selectable descriptor";
    return nullptr;
  }
  return tap;
}

ArrivalTap::ArrivalTap(pcap* handle, Clock* clock, std::uint16_t src_port,
                       std::uint16_t dst_port)
    : handle_(handle), clock_(clock), src_port_(src_port), dst_port_(dst_port) {}

ArrivalTap::~ArrivalTap() { pcap_close(handle_); }

int ArrivalTap::Drain(const std::function<void(const TappedSegment&)>& fn) {
  // The capture stamps with CLOCK_REALTIME; the shaper runs on clock_. Both read now.
  timespec real{};
  clock_gettime(CLOCK_REALTIME, &real);
  const Duration real_now =
      std::chrono::duration_cast<Duration>(std::chrono::seconds(real.tv_sec) +
                                           std::chrono::nanoseconds(real.tv_nsec));
  offset_ = real_now - clock_->Now().time_since_epoch();
  sink_ = &fn;
  const int n = pcap_dispatch(handle_, -1, &ArrivalTap::OnPacket,
                              reinterpret_cast<unsigned char*>(this));
  sink_ = nullptr;
  return std::max(n, 0);
}

void ArrivalTap::OnPacket(unsigned char* user, const pcap_pkthdr* header,
                          const unsigned char* bytes) {
  auto* self = reinterpret_cast<ArrivalTap*>(user);
  const unsigned char* end = bytes + header->caplen;
  const unsigned char* ip = bytes + self->link_header_;
  if (ip >= end) return;
  const unsigned char* tcp = nullptr;
  std::size_t ip_payload = 0;  // bytes after the IP header, from the IP length field
  if ((ip[0] >> 4) == 4) {
    if (ip + 20 > end) return;
    const std::size_t ihl = (ip[0] & 0x0f) * 4u;
    const std::size_t total = (std::size_t{ip[2]} << 8) | ip[3];
    if (ip[9] != IPPROTO_TCP || total < ihl) return;
    tcp = ip + ihl;
    ip_payload = total - ihl;
  } else if ((ip[0] >> 4) == 6) {
    if (ip + 40 > end || ip[6] != IPPROTO_TCP) return;  // no extension headers on our links
    tcp = ip + 40;
    ip_payload = (std::size_t{ip[4]} << 8) | ip[5];
  } else {
    return;
  }
  if (tcp + 20 > end) return;
  const std::uint16_t sport = static_cast<std::uint16_t>((tcp[0] << 8) | tcp[1]);
  const std::uint16_t dport = static_cast<std::uint16_t>((tcp[2] << 8) | tcp[3]);
  if (sport != self->src_port_ || dport != self->dst_port_) return;  // before the filter
  const std::uint32_t seq = (std::uint32_t{tcp[4]} << 24) | (std::uint32_t{tcp[5]} << 16) |
                            (std::uint32_t{tcp[6]} << 8) | tcp[7];
  const std::size_t doff = (tcp[12] >> 4) * 4u;
  const unsigned flags = tcp[13];
  if (ip_payload < doff) return;

  TappedSegment s;
  s.payload = ip_payload - doff;
  s.closing = (flags & 0x05) != 0;  // FIN or RST
  const TimePoint real{std::chrono::duration_cast<Duration>(
      std::chrono::seconds(header->ts.tv_sec) + std::chrono::nanoseconds(header->ts.tv_usec))};
  s.at = std::max(real - self->offset_, self->last_);
  self->last_ = s.at;
  if (s.payload > 0) {
    const std::uint32_t seg_end = seq + static_cast<std::uint32_t>(s.payload);
    if (!self->have_seq_) {
      self->have_seq_ = true;
      self->first_seq_ = seq;
      self->next_seq_ = seg_end;
    } else {
      // A hole before it (a segment was lost) or bytes already seen (a retransmission).
      s.missing = seq != self->next_seq_;
      if (SeqDiff(seg_end, self->next_seq_) > 0) self->next_seq_ = seg_end;
    }
    s.offset = seq - self->first_seq_;
  }
  (*self->sink_)(s);
}

}  // namespace ghost
