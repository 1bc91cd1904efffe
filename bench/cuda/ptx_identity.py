#!/usr/bin/env python3
"""Per-kernel PTX of the current kernel modules against one single-file CUDA source (e.g. the sources of
an earlier revision concatenated): proves a refactor of the .cu files (moving kernels between modules,
headers) leaves every kernel's code as it was. Labels, call-sequence comments and the placement of
function-static shared declarations are normalised away. Needs only libnvrtc (no GPU).

  git show REV:crates/cuda/src/kernels.cu ... > /tmp/old.cu
  NVRTC=.venv-ci/lib/python3.*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 \
    python3 bench/cuda/ptx_identity.py crates/cuda/src /tmp/old.cu [sm_90a]
"""
import concurrent.futures as cf
import ctypes
import os
import re
import sys

lib = ctypes.CDLL(os.environ["NVRTC"])
ARCH = sys.argv[3] if len(sys.argv) > 3 else "sm_90a"


def ptx(src, name):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) == 0
    opts = [f"--gpu-architecture={ARCH}".encode(), b"--std=c++17", b"-default-device"]
    if lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)) != 0:
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{name}: {log.value.decode()}")
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, out)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return out.value.decode()


def entries(p):
    out = {}
    for m in re.finditer(r"\.entry (\w+)\((.*?)\n\}\n", p, re.S):
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", m.group(0))
        body = re.sub(r"__local_depot\d+", "__local_depot", body)
        keep = [l for l in body.splitlines() if not l.strip().startswith((".loc", "//", ".file", "{ // callseq", "} // callseq"))]
        out[m.group(1)] = [l for l in keep if not re.match(r"\s*\.shared .align \d+ \.b8 _ZZ", l)]
    return out


src_dir, old_file = sys.argv[1], sys.argv[2]
lib_rs = open(f"{src_dir}/lib.rs").read()
mods = re.findall(r'module!\("(\w+)", \[([^\]]*)\], "([\w.]+)"', lib_rs)


def module_ptx(m):
    files = ["common.cuh"] + re.findall(r'"([\w.]+)"', m[1]) + [m[2]]
    return ptx("".join(open(f"{src_dir}/{f}").read() for f in files), m[2])


new = {}
with cf.ThreadPoolExecutor(os.cpu_count()) as ex:
    for p in ex.map(module_ptx, mods):
        new.update(entries(p))
old = entries(ptx(open(old_file).read(), os.path.basename(old_file)))
same = [k for k in new if old.get(k) == new[k]]
diff = [k for k in new if k in old and old[k] != new[k]]
print(f"{len(new)} kernels: {len(same)} identical PTX, {len(diff)} different {diff}")
print(f"new only: {[k for k in new if k not in old]}; old only: {[k for k in old if k not in new]}")
sys.exit(1 if diff else 0)
