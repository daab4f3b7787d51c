import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import tools  # noqa: E402

print("build:", tools.describe_build(tools.native_build(Path("../lmcache_adp").resolve())))
