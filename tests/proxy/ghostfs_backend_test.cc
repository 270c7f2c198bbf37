// The stored-head format GhostfsBackend keeps in the daemon's index (proxy/ghostfs_backend.h).
// The backend's traffic with a real daemon is tested end to end by the proxy's integration
// test (tests/integration/ghostproxy_test.py).
#include "proxy/ghostfs_backend.h"

#include <event2/event.h>
#include <gtest/gtest.h>

namespace ghost {
namespace {

TEST(StoredResponseTest, RoundTripsEveryField) {
  StoredResponse r;
  r.status = 203;
  r.headers = {{"Content-Type", "text/html; charset=utf-8"}, {"Vary", "Accept-Encoding"},
               {"X-Odd", "quote \" backslash \\ tab\t, unicode \xc3\xa9"}, {"Set-Cookie", "a=1"},
               {"Set-Cookie", "b=2"}};
  r.stored_unix = 1795380000;
  r.expires_unix = 1795383600;
  Result<StoredResponse> back = ParseStoredResponse(SerializeStoredResponse(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->status, 203);
  EXPECT_EQ(back->headers, r.headers);  // order and repeats kept
  EXPECT_EQ(back->stored_unix, r.stored_unix);
  EXPECT_EQ(back->expires_unix, r.expires_unix);

  r.expires_unix.reset();
  back = ParseStoredResponse(SerializeStoredResponse(r));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->expires_unix.has_value());
}

TEST(StoredResponseTest, RefusesWhatIsNotAStoredHead) {
  for (const char* bad : {"", "not json", "[]", "{}", R"({"status":"200","headers":[]})",
                          R"({"status":42,"headers":[]})", R"({"status":200})",
                          R"({"status":200,"headers":{"a":"b"}})", R"({"status":200,"headers":[["a"]]})",
                          R"({"status":200,"headers":[["a",1]]})", "{\"status\":200,\"headers\":[[\"a\",\"b\"]"}) {
    Result<StoredResponse> r = ParseStoredResponse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("stored head"), std::string::npos) << r.status().ToString();
    }
  }
}

TEST(MakeGhostfsBackendTest, ExplainsAMountThatIsNotGhostfs) {
  event_base* base = event_base_new();
  Result<std::unique_ptr<CacheBackend>> b = MakeGhostfsBackend(base, "/tmp", "/nonexistent/control.sock");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not a ghostfs mount"), std::string::npos) << b.status().ToString();
  event_base_free(base);
}

}  // namespace
}  // namespace ghost
