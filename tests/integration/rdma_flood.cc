#include "rdma_flood.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "mooncake/common/paths.h"
#include "mooncake/v1/rdma.grpc.pb.h"
#include "raw_session.h"

namespace mooncake::abuse {
namespace {

constexpr uint32_t kDepth = 4;
constexpr uint64_t kSlot = 2ull * kDepth * 64 + 64;  // SQ, CQ, doorbell records

void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
}

// Counts one call's status; keeps the last refusal's text (the last
// session's: the first sessions may meet a per-session limit first).
struct Tally {
  std::map<std::string, int> codes;
  std::string refusal;
  void Add(const grpc::Status& s) {
    codes[s.ok() ? "OK" : absl::StrCat(static_cast<int>(s.error_code()))] += 1;
    if (!s.ok()) {
      refusal = absl::StrCat("code=", static_cast<int>(s.error_code()), " ", s.error_message());
    }
  }
};

}  // namespace

int RdmaFlood(const std::string& socket, const RdmaFloodOptions& o) {
  const absl::Time start = absl::Now();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t control_bytes = (o.qps_per_call * kSlot + page - 1) / page * page;
  UniqueFd control = SealedMemfd(control_bytes);
  UniqueFd region = SealedMemfd(o.region_offset + o.region_bytes, !o.sparse_regions);
  absl::StatusOr<UniqueFd> fdconn = ConnectUnix(FdSocketPath(socket));
  if (!control.valid() || !region.valid() || !fdconn.ok()) {
    std::printf("result attack=rdma-flood error=setup\n");
    return 2;
  }
  std::vector<std::unique_ptr<RawSession>> sessions;
  Tally create, connect, reg, put;
  uint64_t qps = 0, mrs = 0, bytes = 0;
  int sessions_refused = 0;
  for (uint32_t i = 0; i < o.sessions; ++i) {
    std::unique_ptr<RawSession> s = OpenRawSession(socket);
    if (!s) {
      ++sessions_refused;
      continue;
    }
    std::unique_ptr<v1::Rdma::Stub> rdma = v1::Rdma::NewStub(s->channel);
    for (uint32_t mine = 0; mine < o.max_qps;) {
      absl::StatusOr<std::string> ticket = PutFd(fdconn->get(), s->opened, control.get());
      if (!ticket.ok()) {
        put.Add(grpc::Status(static_cast<grpc::StatusCode>(ticket.status().code()),
                             std::string(ticket.status().message())));
        break;
      }
      v1::CreateQueuePairsRequest req;
      req.set_fd_ticket(*ticket);
      req.set_control_bytes(control_bytes);
      const uint32_t n = std::min(o.qps_per_call, o.max_qps - mine);
      for (uint32_t q = 0; q < n; ++q) {
        v1::QueuePairLayout* l = req.add_qps();
        l->set_sq_offset(q * kSlot);
        l->set_sq_wqe_cnt(kDepth);
        l->set_cq_offset(q * kSlot + kDepth * 64);
        l->set_cq_cqe_cnt(kDepth);
        l->set_sq_dbrec_offset(q * kSlot + 2 * kDepth * 64);
        l->set_cq_dbrec_offset(q * kSlot + 2 * kDepth * 64 + 8);
      }
      grpc::ClientContext ctx;
      Deadline(&ctx);
      v1::CreateQueuePairsResponse resp;
      grpc::Status st = rdma->CreateQueuePairs(&ctx, req, &resp);
      create.Add(st);
      if (!st.ok()) break;
      mine += resp.qpns_size();
      qps += resp.qpns_size();
      if (o.connect) {
        v1::ConnectQueuePairsRequest c;
        for (uint32_t qpn : resp.qpns()) {
          v1::QueuePairConnection* pair = c.add_connections();
          pair->set_qpn(qpn);
          pair->set_remote_qpn(qpn);
        }
        grpc::ClientContext cctx;
        Deadline(&cctx);
        v1::ConnectQueuePairsResponse cresp;
        connect.Add(rdma->ConnectQueuePairs(&cctx, c, &cresp));
      }
    }
    for (uint32_t mine = 0; mine < o.max_mrs; ++mine) {
      absl::StatusOr<std::string> ticket = PutFd(fdconn->get(), s->opened, region.get());
      if (!ticket.ok()) {
        put.Add(grpc::Status(static_cast<grpc::StatusCode>(ticket.status().code()),
                             std::string(ticket.status().message())));
        break;
      }
      v1::RegisterMemoryRequest req;
      req.set_fd_ticket(*ticket);
      req.set_kind("memfd");
      req.set_iova(0x7f0000000000ull);
      req.set_length(o.region_bytes);
      req.set_offset(o.region_offset);
      req.set_remote_write(true);
      grpc::ClientContext ctx;
      Deadline(&ctx);
      v1::RegisterMemoryResponse resp;
      grpc::Status st = rdma->RegisterMemory(&ctx, req, &resp);
      reg.Add(st);
      if (!st.ok()) break;
      mrs += 1;
      bytes += o.region_bytes;
    }
    sessions.push_back(std::move(s));
  }
  std::printf("flooded sessions=%zu qps=%lu mrs=%lu\n", sessions.size(),
              static_cast<unsigned long>(qps), static_cast<unsigned long>(mrs));
  std::fflush(stdout);
  absl::SleepFor(absl::Milliseconds(o.hold_ms));
  if (!create.refusal.empty())
    std::printf("refused CreateQueuePairs: %s\n", create.refusal.c_str());
  if (!reg.refusal.empty()) std::printf("refused RegisterMemory: %s\n", reg.refusal.c_str());
  if (!put.refusal.empty()) std::printf("refused fd PUT: %s\n", put.refusal.c_str());
  std::printf(
      "result attack=rdma-flood sessions=%zu sessions_refused=%d qps=%lu mrs=%lu "
      "registered_bytes=%lu create=%s connect=%s register=%s put=%s elapsed_ms=%ld\n",
      sessions.size(), sessions_refused, static_cast<unsigned long>(qps),
      static_cast<unsigned long>(mrs), static_cast<unsigned long>(bytes),
      CodesText(create.codes).c_str(), CodesText(connect.codes).c_str(),
      CodesText(reg.codes).c_str(), CodesText(put.codes).c_str(),
      static_cast<long>(absl::ToInt64Milliseconds(absl::Now() - start)));
  std::fflush(stdout);
  return 0;
}

}  // namespace mooncake::abuse
