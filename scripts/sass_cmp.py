#!/usr/bin/env python3
"""sass_cmp.py - which kernels' machine code differs between two builds of a CUDA object (session 36: a kernel body
refactored into a stage function had to keep the decode GEMV's SASS byte for byte).

    python3 scripts/sass_cmp.py OLD.o NEW.o [NAME_SUBSTRING]

Disassembles both with cuobjdump -sass (CUOBJDUMP=path, else on PATH or in /usr/local/cuda/bin; the device image and
this machine may lack it: `pip download --no-deps nvidia-cuda-cuobjdump`, unzip, nvidia/cu13/bin/cuobjdump), strips
the addresses and encodings, and prints per function: same / DIFFERS (with the first differing instruction) / only in
one. Exit status 1 if any function present in both differs."""
import hashlib
import os
import re
import shutil
import subprocess
import sys


def cuobjdump():
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c and os.path.exists(c):
            return c
    sys.exit("sass_cmp: no cuobjdump (CUOBJDUMP=path; pip download --no-deps nvidia-cuda-cuobjdump, then unzip)")


def functions(obj):
    out = subprocess.run([cuobjdump(), "-sass", obj], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"sass_cmp: cuobjdump -sass {obj}: {out.stderr.strip()}")
    fns, cur = {}, None
    for line in out.stdout.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            fns[cur] = []
            continue
        if cur and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            ins = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)
            ins = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", ins).strip()
            if ins:
                fns[cur].append(ins)
    return fns


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    a, b = functions(sys.argv[1]), functions(sys.argv[2])
    sub = sys.argv[3] if len(sys.argv) > 3 else ""
    differ = 0
    for name in sorted(set(a) | set(b)):
        if sub not in name:
            continue
        if name not in a or name not in b:
            print(f"only in {'new' if name in b else 'old'}: {name}")
            continue
        if a[name] == b[name]:
            print(f"same     {name} ({len(a[name])} instructions, {hashlib.md5(chr(10).join(a[name]).encode()).hexdigest()[:8]})")
            continue
        differ += 1
        i = next((k for k, (x, y) in enumerate(zip(a[name], b[name])) if x != y), min(len(a[name]), len(b[name])))
        print(f"DIFFERS  {name} ({len(a[name])} -> {len(b[name])} instructions; first at {i}: "
              f"{a[name][i] if i < len(a[name]) else '-'} | {b[name][i] if i < len(b[name]) else '-'})")
    sys.exit(1 if differ else 0)


main()
