#include "proxy/address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

namespace ghost {
namespace {

IpAddress Ip(const char* text) {
  Result<IpAddress> ip = IpAddress::Parse(text);
  EXPECT_TRUE(ip.ok()) << text;
  return ip.ok() ? *ip : IpAddress{};
}

TEST(AddressTest, CidrContainsItsPrefixOnly) {
  Result<Cidr> lan = Cidr::Parse("192.168.1.0/24");
  ASSERT_TRUE(lan.ok()) << lan.status().ToString();
  EXPECT_TRUE(lan->Contains(Ip("192.168.1.0")));
  EXPECT_TRUE(lan->Contains(Ip("192.168.1.255")));
  EXPECT_FALSE(lan->Contains(Ip("192.168.2.1")));
  EXPECT_FALSE(lan->Contains(Ip("::1")));

  Result<Cidr> odd = Cidr::Parse("10.0.0.0/9");
  ASSERT_TRUE(odd.ok());
  EXPECT_TRUE(odd->Contains(Ip("10.127.255.255")));
  EXPECT_FALSE(odd->Contains(Ip("10.128.0.0")));

  Result<Cidr> v6 = Cidr::Parse("fd00::/8");
  ASSERT_TRUE(v6.ok());
  EXPECT_TRUE(v6->Contains(Ip("fd12:3456::1")));
  EXPECT_FALSE(v6->Contains(Ip("fe80::1")));
  EXPECT_FALSE(v6->Contains(Ip("10.0.0.1")));

  Result<Cidr> all = Cidr::Parse("0.0.0.0/0");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->Contains(Ip("8.8.8.8")));
  EXPECT_FALSE(all->Contains(Ip("::2")));  // IPv4 prefixes hold IPv4 addresses only
}

TEST(AddressTest, BareAddressIsAHostPrefix) {
  Result<Cidr> host = Cidr::Parse("127.0.0.2");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->bits, 32);
  EXPECT_TRUE(host->Contains(Ip("127.0.0.2")));
  EXPECT_FALSE(host->Contains(Ip("127.0.0.1")));
  EXPECT_EQ(host->ToString(), "127.0.0.2/32");
}

TEST(AddressTest, BadPrefixesAreRefusedWithTheReason) {
  for (const char* bad :
       {"", "/8", "10.0.0.0/33", "::/129", "10.0.0.0/x", "300.1.1.1/8", "host/8", "10.0.0.0/"}) {
    Result<Cidr> c = Cidr::Parse(bad);
    EXPECT_FALSE(c.ok()) << bad;
  }
  Result<Cidr> typo = Cidr::Parse("10.1.0.0/8");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("bits set past the /8"), std::string::npos)
      << typo.status().message();
}

TEST(AddressTest, MappedIpv4ClientsMatchIpv4Prefixes) {
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &sa.sin6_addr);
  Result<IpAddress> ip = IpAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  ASSERT_TRUE(ip.ok());
  EXPECT_TRUE(ip->v4);
  EXPECT_EQ(ip->ToString(), "127.0.0.1");
  EXPECT_TRUE(IsAllowed(DefaultAllowList(), *ip));
}

TEST(AddressTest, DefaultAllowListIsTheLoopbackHostsOnly) {
  const std::vector<Cidr> allow = DefaultAllowList();
  EXPECT_TRUE(IsAllowed(allow, Ip("127.0.0.1")));
  EXPECT_TRUE(IsAllowed(allow, Ip("::1")));
  EXPECT_FALSE(IsAllowed(allow, Ip("127.0.0.2")));
  EXPECT_FALSE(IsAllowed(allow, Ip("192.168.1.10")));
}

TEST(AddressTest, ListenAddressParses) {
  Result<ListenAddress> v4 = ListenAddress::Parse("127.0.0.1:3128");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->port, 3128);
  EXPECT_EQ(v4->ToString(), "127.0.0.1:3128");
  Result<ListenAddress> v6 = ListenAddress::Parse("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->port, 0);
  EXPECT_EQ(v6->ToString(), "[::1]:0");
  Result<ListenAddress> local = ListenAddress::Parse("localhost:8080");
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->host.ToString(), "127.0.0.1");
  for (const char* bad :
       {"127.0.0.1", "::1:80", "[::1]", "example.com:80", "127.0.0.1:65536", "127.0.0.1:x"}) {
    Result<ListenAddress> l = ListenAddress::Parse(bad);
    EXPECT_FALSE(l.ok()) << bad;
    if (!l.ok()) {
      EXPECT_NE(l.status().message().find("HOST:PORT"), std::string::npos);
    }
  }
}

TEST(AddressTest, PortListParses) {
  Result<std::vector<std::uint16_t>> ports = ParsePortList("443, 8443,563");
  ASSERT_TRUE(ports.ok());
  EXPECT_EQ(*ports, (std::vector<std::uint16_t>{443, 8443, 563}));
  EXPECT_FALSE(ParsePortList("").ok());
  EXPECT_FALSE(ParsePortList("443,,80").ok());
  EXPECT_FALSE(ParsePortList("0").ok());
  EXPECT_FALSE(ParsePortList("70000").ok());
}

}  // namespace
}  // namespace ghost
