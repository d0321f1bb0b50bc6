// Request and response of a callback RPC on one protobuf Arena: a formed
// 256-rank group sends 256 views of 256 members, and building them on an
// arena replaces ~1 malloc/free per string field with a bump allocation.
#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

namespace mooncake::daemon {

template <class Request, class Response>
class ArenaMessageAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override { return new Holder(); }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    google::protobuf::Arena arena_;
  };
};

}  // namespace mooncake::daemon
