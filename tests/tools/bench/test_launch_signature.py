"""compile_kernels.launch_signature: what Triton compiles a launch for, as its JIT decides it
(1 and None as constants, divisibility by 16), do_not_specialize and do_not_specialize_on_alignment
honoured. In a subprocess: compile_kernels takes the process off the interpreter."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

KERNEL = '''
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["y_ptr"])
def k(x_ptr, y_ptr, n, m, B: tl.constexpr):
    pass
'''

SCRIPT = '''
import json, sys, torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from tools.bench.compile_kernels import launch_signature
from kernel_under_test import k
x = torch.zeros(64)
out = []
for n, m in ((1, 1), (32, 32), (17, 17)):
    signature, constexprs, attrs, options = launch_signature(k, dict(x_ptr=x, y_ptr=x, n=n, m=m, B=4, num_warps=2))
    out.append([signature, constexprs, sorted(i for (i,) in attrs), options])
print(json.dumps(out))
'''


def test_specialisation_follows_the_jit_and_its_do_not_specialize(tmp_path):
    (tmp_path / "kernel_under_test.py").write_text(textwrap.dedent(KERNEL))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ones, sixteens, others = json.loads(run.stdout.strip().splitlines()[-1])
    pointers = {"x_ptr": "*fp32", "y_ptr": "*fp32"}
    assert ones == [{**pointers, "n": "i32", "m": "constexpr", "B": "constexpr"}, {"m": 1, "B": 4}, [0],
                    {"num_warps": 2}]
    assert sixteens == [{**pointers, "n": "i32", "m": "i32", "B": "constexpr"}, {"B": 4}, [0, 3], {"num_warps": 2}]
    assert others == [{**pointers, "n": "i32", "m": "i32", "B": "constexpr"}, {"B": 4}, [0], {"num_warps": 2}]
