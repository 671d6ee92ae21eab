// The bearer token (serve_auth.cc): file modes, the compare, the API guarded end to end.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

using namespace serve_test;  // NOLINT(google-build-using-namespace): the serve tests' helpers

// Issue 27 (low): the token file writable by others is refused; readable by them, a warning.
TEST(ServeAuth, TokenFileModes) {
  TempDir dir;
  const std::string path = dir.path() + "/token";
  std::ofstream(path) << "a-token-of-thirty-two-bytes-0123";
  ServeConfig c;
  c.model = "tiny-mla";
  c.capacity_blocks = 32;
  c.max_requests = 8;
  c.events_enabled = false;
  c.http_token_file = path;
  for (const auto& [mode, outcome] : std::vector<std::pair<mode_t, std::string>>{
           {0666, "refused"}, {0620, "refused"}, {0644, "warned"}, {0640, "warned"}, {0600, "quiet"}}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    std::vector<std::string> warnings;
    Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
    const std::string got = !made.ok() ? "refused" : warnings.empty() ? "quiet" : "warned";
    EXPECT_EQ(got, outcome) << std::oct << mode;
    if (!made.ok()) {
      EXPECT_EQ(made.status().field(), "http.token_file");
    }
  }
}

TEST(ServeAuth, TokenComparison) {
  TempDir dir;
  ServeConfig c = EngineConfig();
  c.http_token_file = dir.Write("token", "0123456789abcdef\n");
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> core = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(core.ok()) << core.status().ToString();
  EXPECT_TRUE((*core)->Authorized("Bearer 0123456789abcdef"));
  EXPECT_FALSE((*core)->Authorized(nullptr));
  EXPECT_FALSE((*core)->Authorized(""));
  EXPECT_FALSE((*core)->Authorized("Bearer "));
  EXPECT_FALSE((*core)->Authorized("Bearer 0123456789abcde"));
  EXPECT_FALSE((*core)->Authorized("Bearer 0123456789abcdef0"));
  EXPECT_FALSE((*core)->Authorized("Bearer 0123456789abcdeF"));
  EXPECT_FALSE((*core)->Authorized("bearer 0123456789abcdef"));
  c.http_token_file.clear();
  Result<std::unique_ptr<ServeCore>> open = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE((*open)->Authorized(nullptr));
}

// ---- Authentication ------------------------------------------------------------------------

TEST(ServeEndToEnd, BearerTokenGuardsTheApiNotHealthOrMetrics) {
  TempDir dir;
  const std::string token = "s3cr3t-t0ken-0123456789";
  const std::string token_file = dir.Write("token", token + "\n");
  const std::string config = WriteConfig(dir,
                                         "model: tiny-mla\ncapacity_blocks: 16\nhttp:\n  listen: 127.0.0.1:0\n"
                                         "  token_file: " +
                                             token_file + "\nevents:\n  enabled: false\n");
  Server s(config);
  ASSERT_TRUE(s.Ready()) << s.Stderr();
  const std::string admit = "{\"tokens\":" + Tokens(1, 10) + "}";
  EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", admit).status, 401);
  EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", admit, "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", admit, "Authorization: Bearer " + token + "x\r\n").status, 401);
  EXPECT_EQ(Http(s.port(), "POST", "/v1/admit", admit, "Authorization: Basic " + token + "\r\n").status, 401);
  EXPECT_EQ(Http(s.port(), "GET", "/v1/layout").status, 401);
  HttpReply denied = Http(s.port(), "POST", "/v1/admit", admit);
  EXPECT_EQ(nlohmann::json::parse(denied.body)["field"], "authorization");
  HttpReply ok = Http(s.port(), "POST", "/v1/admit", admit, "Authorization: Bearer " + token + "\r\n");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Http(s.port(), "GET", "/v1/layout", "", "Authorization: Bearer " + token + "\r\n").status, 200);
  EXPECT_EQ(Http(s.port(), "GET", "/health").status, 200);
  const std::string metrics = Http(s.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("tessera_requests_admitted_total 1\n"), std::string::npos) << metrics;
  EXPECT_EQ(s.Stop(), 0) << s.Stderr();
}

TEST(ServeEndToEnd, BadTokenFileExitsTwoNamingIt) {
  TempDir dir;
  const std::string target = dir.Write("real", "0123456789abcdef0123\n");
  const std::string link = dir.path() + "/link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  const std::string short_file = dir.Write("short", "abc\n");
  for (const std::string& file : {link, short_file, dir.path() + "/missing"}) {
    Server s(WriteConfig(
        dir, "model: tiny-mla\nhttp:\n  listen: 127.0.0.1:0\n  token_file: " + file + "\nevents:\n  enabled: false\n"));
    EXPECT_FALSE(s.Ready());
    EXPECT_EQ(s.Stop(false), 2) << file;
    EXPECT_NE(s.Stderr().find("http.token_file"), std::string::npos) << file;
  }
}

}  // namespace
}  // namespace tessera
