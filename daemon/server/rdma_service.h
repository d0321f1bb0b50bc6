// The Rdma gRPC service (proto/mooncake/v1/rdma.proto): memory registration
// and queue pairs for the caller's session. A thin layer: it finds the
// caller's session, takes the fds a request names from the FdBroker (after
// validating what needs no fds, so a bad request does not burn its ticket),
// and makes one call on RdmaResources. Unary callback methods; none blocks.
//
// Each RPC is its gRPC method (which only finds the caller's session and
// finishes the call) over a Handle* method that does the rest for a given
// session. The fuzzer drives the Handle* methods with arbitrary requests
// (fuzz/request_fuzzer.cc): every line that reads a request runs there.
#pragma once

#include "fdchannel/fd_broker.h"
#include "mooncake/v1/rdma.grpc.pb.h"
#include "rdma/rdma_resources.h"
#include "server/connection_table.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class RdmaService final : public v1::Rdma::CallbackService {
 public:
  RdmaService(const ConnectionTable* connections, const SessionRegistry* sessions, FdBroker* fds,
              RdmaResources* rdma)
      : connections_(connections), sessions_(sessions), fds_(fds), rdma_(rdma) {}

  grpc::ServerUnaryReactor* GetRdmaInfo(grpc::CallbackServerContext* ctx,
                                        const v1::GetRdmaInfoRequest* req,
                                        v1::RdmaInfo* resp) override;
  grpc::ServerUnaryReactor* RegisterMemory(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterMemoryRequest* req,
                                           v1::RegisterMemoryResponse* resp) override;
  grpc::ServerUnaryReactor* DeregisterMemory(grpc::CallbackServerContext* ctx,
                                             const v1::DeregisterMemoryRequest* req,
                                             v1::DeregisterMemoryResponse* resp) override;
  grpc::ServerUnaryReactor* CreateQueuePairs(grpc::CallbackServerContext* ctx,
                                             const v1::CreateQueuePairsRequest* req,
                                             v1::CreateQueuePairsResponse* resp) override;
  grpc::ServerUnaryReactor* ConnectQueuePairs(grpc::CallbackServerContext* ctx,
                                              const v1::ConnectQueuePairsRequest* req,
                                              v1::ConnectQueuePairsResponse* resp) override;
  grpc::ServerUnaryReactor* DestroyQueuePairs(grpc::CallbackServerContext* ctx,
                                              const v1::DestroyQueuePairsRequest* req,
                                              v1::DestroyQueuePairsResponse* resp) override;

  grpc::ServerUnaryReactor* SelectNic(grpc::CallbackServerContext* ctx,
                                      const v1::SelectNicRequest* req,
                                      v1::SelectNicResponse* resp) override;
  grpc::ServerUnaryReactor* GetDoorbellAccess(grpc::CallbackServerContext* ctx,
                                              const v1::GetDoorbellAccessRequest* req,
                                              v1::DoorbellAccess* resp) override;
  grpc::ServerUnaryReactor* AttachCopyAgent(grpc::CallbackServerContext* ctx,
                                            const v1::AttachCopyAgentRequest* req,
                                            v1::AttachCopyAgentResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseDoorbellAccess(grpc::CallbackServerContext* ctx,
                                                  const v1::ReleaseDoorbellAccessRequest* req,
                                                  v1::ReleaseDoorbellAccessResponse* resp) override;

  // The RPCs for `caller`, an open session. GetRdmaInfo needs none
  // (null: the default NIC); with one, it reports the session's NIC and
  // link (is_roce, gid_index), and fails with the NIC's error when that
  // link cannot be queried.
  absl::Status HandleGetRdmaInfo(const SessionInfo* caller, v1::RdmaInfo* resp);
  absl::Status HandleRegisterMemory(const SessionInfo& caller, const v1::RegisterMemoryRequest& req,
                                    v1::RegisterMemoryResponse* resp);
  absl::Status HandleDeregisterMemory(const SessionInfo& caller,
                                      const v1::DeregisterMemoryRequest& req);
  absl::Status HandleCreateQueuePairs(const SessionInfo& caller,
                                      const v1::CreateQueuePairsRequest& req,
                                      v1::CreateQueuePairsResponse* resp);
  absl::Status HandleConnectQueuePairs(const SessionInfo& caller,
                                       const v1::ConnectQueuePairsRequest& req);
  absl::Status HandleDestroyQueuePairs(const SessionInfo& caller,
                                       const v1::DestroyQueuePairsRequest& req);
  absl::Status HandleSelectNic(const SessionInfo& caller, const v1::SelectNicRequest& req,
                               v1::SelectNicResponse* resp);
  // The command fd goes out on an fd-channel ticket only this session can
  // redeem.
  absl::Status HandleGetDoorbellAccess(const SessionInfo& caller, v1::DoorbellAccess* resp);
  absl::Status HandleAttachCopyAgent(const SessionInfo& caller,
                                     const v1::AttachCopyAgentRequest& req);

  // Most QPs one CreateQueuePairs call may ask for, and most entries of
  // one ConnectQueuePairs or DestroyQueuePairs call.
  static constexpr int kMaxQpsPerCall = 4096;

 private:
  absl::StatusOr<SessionInfo> CallerSession(const grpc::ServerContextBase* ctx) const;

  const ConnectionTable* const connections_;
  const SessionRegistry* const sessions_;
  FdBroker* const fds_;
  RdmaResources* const rdma_;
};

}  // namespace mooncake::daemon
