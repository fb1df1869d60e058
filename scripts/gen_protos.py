"""Regenerate the Python gRPC code from protos/ (run after editing a .proto file).

    python scripts/gen_protos.py          # write the generated files
    python scripts/gen_protos.py --check  # fail when the committed files are stale
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out: Path) -> list[Path]:
    """Compile every .proto under protos/ into `out`; return the generated paths, relative."""
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    bindir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside the interpreter
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out}", f"--mypy_out={out}",
            f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
            f"--grpc_python_out={out}", f"--mypy_grpc_out={out}", *sources]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.name.endswith(SUFFIXES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    check = parser.parse_args().check
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generated = generate(fresh)
        committed = sorted(p.relative_to(ROOT) for p in (ROOT / "tritongate").rglob("*")
                           if p.name.endswith(SUFFIXES))
        if check:
            stale = [str(p) for p in generated if not (ROOT / p).exists()
                     or not filecmp.cmp(fresh / p, ROOT / p, shallow=False)]
            stale += [str(p) for p in committed if p not in generated]
            if stale:
                sys.exit("generated code is stale, run scripts/gen_protos.py: " + ", ".join(stale))
            print(f"generated code is up to date ({len(generated)} files)")
            return
        for path in committed:
            if path not in generated:
                (ROOT / path).unlink()
        for path in generated:
            target = ROOT / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((fresh / path).read_bytes())
            for pkg in target.relative_to(ROOT).parents[:-1]:
                (ROOT / pkg / "__init__.py").touch()
        print(f"wrote {len(generated)} files")


if __name__ == "__main__":
    main()
