#include "softnic/types.h"

namespace mooncake::softnic {

const char* QpStateName(QpState s) {
  switch (s) {
    case QpState::kReset: return "RESET";
    case QpState::kRts: return "RTS";
    case QpState::kError: return "ERROR";
  }
  return "UNKNOWN";
}

}  // namespace mooncake::softnic
