"""The sandbox child's tamper list covers every harness module the child runs: a candidate that
replaces a function of one (a gate helper ``calibrate`` calls, a wire encoder) is caught, the
same as one that replaces ``time.perf_counter``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter, as the sandbox starts it: import the child server, then replace one
# function of each kernelabd.harness module it loaded, in turn, and ask tampered() about it.
PROBE = '''
import json, sys
import kernelabd.harness.child.server as server

report = {}
for name in sorted(sys.modules):
    if name != "kernelabd.harness" and not name.startswith("kernelabd.harness."):
        continue
    mod = sys.modules[name]
    own = [k for k, v in vars(mod).items()
           if callable(v) and getattr(v, "__module__", None) == name and not k.startswith("__")]
    if mod is server or not own:       # the server watches itself; a bare package has nothing
        report[name] = "nothing to replace" if not own else "the server"
        continue
    original = getattr(mod, own[0])
    setattr(mod, own[0], lambda *a, **k: None)
    report[name] = [n for n in server.tampered() if n.endswith("." + own[0])]
    setattr(mod, own[0], original)
report["after"] = server.tampered()
print(json.dumps(report))
'''


def test_every_harness_module_the_child_imports_is_on_the_tamper_list() -> None:
    proc = subprocess.run([sys.executable, "-P", "-c", PROBE], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report.pop("after") == [], "restoring every function leaves nothing tampered"
    assert "kernelabd.harness.gate" in report and "kernelabd.harness.wire" in report
    missed = sorted(name for name, caught in report.items() if caught == [])
    assert not missed, f"harness modules the child imports but its tamper list does not cover: {missed}"
