// grpc.health.v1.Health on mooncaked's socket: SERVING for the server ("")
// and for each service by name, NOT_FOUND for a service it does not have,
// and NOT_SERVING sent to watchers when the daemon shuts down. Requests
// are hand-encoded (HealthCheckRequest { string service = 1; }), as a probe
// without the health proto would send them.
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "daemon_process.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace mooncake::testing {
namespace {

constexpr char kCheck[] = "/grpc.health.v1.Health/Check";
constexpr char kWatch[] = "/grpc.health.v1.Health/Watch";
// HealthCheckResponse { ServingStatus status = 1; } as sent on the wire.
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

std::string HealthCheckRequest(const std::string& service) {
  if (service.empty()) return "";
  return std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
}

std::string ByteBufferString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

class HealthTest : public ::testing::Test {
 protected:
  TempDir dir_;
  DaemonProcess daemon_{dir_.path()};
};

TEST_F(HealthTest, EveryServiceAnswersServing) {
  auto channel = UnixChannel(daemon_.socket());
  for (const std::string service : {"", "mooncake.v1.Local", "mooncake.v1.Admin"}) {
    std::string response;
    grpc::Status s = RawUnaryCall(channel, kCheck, HealthCheckRequest(service), &response);
    ASSERT_TRUE(s.ok()) << "'" << service << "': " << s.error_code() << " " << s.error_message();
    EXPECT_EQ(response, kServing) << "'" << service << "'";
  }
}

TEST_F(HealthTest, UnknownServiceIsNotFound) {
  grpc::Status s =
      RawUnaryCall(UnixChannel(daemon_.socket()), kCheck, HealthCheckRequest("mooncake.v1.Nope"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HealthTest, WatchersSeeNotServingOnShutdown) {
  auto channel = UnixChannel(daemon_.socket());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  Deadline(&ctx, 20000);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](int id) {
    EXPECT_EQ(cq.Next(&tag, &ok), true);
    EXPECT_EQ(tag, reinterpret_cast<void*>(id));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, kWatch, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  grpc::Slice slice(HealthCheckRequest("mooncake.v1.Local"));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));

  grpc::ByteBuffer update;
  call->Read(&update, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));
  EXPECT_EQ(ByteBufferString(update), kServing);

  daemon_.child().Kill(SIGTERM);
  std::vector<std::string> updates;
  for (;;) {
    call->Read(&update, reinterpret_cast<void*>(5));
    if (!step(5)) break;  // the stream ended
    updates.push_back(ByteBufferString(update));
  }
  ASSERT_FALSE(updates.empty()) << "the stream ended without a NOT_SERVING update";
  EXPECT_EQ(updates.back(), kNotServing);

  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(6));
  step(6);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace mooncake::testing
