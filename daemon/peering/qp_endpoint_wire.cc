#include "peering/qp_endpoint_wire.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "mooncake/common/escape.h"

namespace mooncake::daemon::peering {

v1::QpEndpoint ToWire(const QpEndpoint& e) {
  v1::QpEndpoint w;
  w.set_provider(e.provider);
  w.set_is_roce(e.is_roce);
  w.set_lid(e.lid);
  if (e.provider != "softnic") w.set_gid(std::string(e.gid.begin(), e.gid.end()));
  w.set_gid_index(e.gid_index);
  w.set_gid_type(e.gid_type);
  w.set_mtu(e.mtu);
  w.set_psn(e.psn);
  return w;
}

absl::StatusOr<QpEndpoint> FromWire(const v1::QpEndpoint& w, const std::string& whose) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(whose, " came with ", what));
  };
  QpEndpoint e;
  e.provider = w.provider().empty() ? "softnic" : w.provider();
  if (e.provider.size() > 16 || !std::all_of(e.provider.begin(), e.provider.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c));
      })) {
    return bad(absl::StrCat("provider '", EscapeForDisplay(e.provider, 16), "'"));
  }
  if (!w.gid().empty() && w.gid().size() != e.gid.size()) {
    return bad(absl::StrCat("a GID of ", w.gid().size(), " bytes (16 expected)"));
  }
  std::copy(w.gid().begin(), w.gid().end(), e.gid.begin());
  if (w.lid() > 0xffff) return bad(absl::StrCat("LID ", w.lid(), " (16 bits)"));
  if (w.psn() > 0xffffff) return bad(absl::StrCat("PSN ", w.psn(), " (24 bits)"));
  if (w.mtu() > 5) return bad(absl::StrCat("MTU code ", w.mtu(), " (ibv_mtu 1..5)"));
  if (w.gid_index() > 0xffff) return bad(absl::StrCat("GID index ", w.gid_index()));
  if (w.gid_type().size() > 16) return bad("a GID type longer than 16 bytes");
  e.is_roce = w.is_roce();
  e.lid = w.lid();
  e.gid_index = w.gid_index();
  e.gid_type = w.gid_type();
  e.mtu = w.mtu();
  e.psn = w.psn();
  return e;
}

}  // namespace mooncake::daemon::peering
