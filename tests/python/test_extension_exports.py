"""The extension's dynamic symbol table: PyInit__mooncake_client and nothing else.

python/src/extension.map keeps everything else local. Without it a compiler
that links libstdc++ statically exports a second libstdc++ from the extension,
and imported before torch the extension then stood in for the system
libstdc++'s own symbols: "free(): invalid pointer" inside `import torch`
(issue 11). This checks the linked module, whichever compiler built it.
"""

from __future__ import annotations

import shutil
import subprocess
import unittest

import mooncake_client._mooncake_client as ext


class ExtensionExportsTest(unittest.TestCase):
    def test_exports_only_the_module_init_function(self):
        nm = shutil.which("nm")
        self.assertIsNotNone(nm, "nm (binutils) is needed to read the extension's symbols")
        out = subprocess.run([nm, "-D", "--defined-only", ext.__file__], capture_output=True,
                             text=True, check=True).stdout
        names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
        self.assertEqual(
            names, ["PyInit__mooncake_client"],
            f"{ext.__file__} exports more than its init function (python/src/extension.map "
            f"not applied?): {names[:20]}")


if __name__ == "__main__":
    unittest.main()
