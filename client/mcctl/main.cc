// mcctl: queries the local mooncaked. Everything lives in mooncake_mcctl_lib.
#include <iostream>
#include <string>
#include <vector>

#include "mooncake/mcctl/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return mooncake::mcctl::RunMcctl(args, std::cout, std::cerr);
}
