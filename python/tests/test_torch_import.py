"""`import dualpipe_rs.torch` where torch cannot be imported: an ImportError saying how to install it.

Runs with or without torch installed: a subprocess hides torch behind an import hook.
"""

from __future__ import annotations

import os
import subprocess
import sys



def test_import_without_torch_says_how_to_install(tmp_path):
    blocker = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('No module named ' + repr(name))\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import dualpipe_rs\n"
        "try:\n"
        "    import dualpipe_rs.torch\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    p = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=""))
    assert p.returncode == 0, p.stderr
    assert "dualpipe_rs.torch needs PyTorch" in p.stdout
    assert "pip install torch" in p.stdout
