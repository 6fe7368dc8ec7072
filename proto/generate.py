"""Regenerates the Python code of truba's .proto files: ``python -m truba.proto.generate``.

The sources live in ``proto/truba/v1/*.proto`` (proto package ``truba.v1``); the generated modules
are committed in ``proto/v1/`` and imported as ``truba.proto.v1``. protoc writes imports as
``from truba.v1 import ...``, so they are rewritten to the installed package path. A test
regenerates into a temporary directory and fails when the committed code is stale.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent
PROTO_DIR = SOURCE_ROOT / "truba" / "v1"
_IMPORT = re.compile(r"^from truba\.v1 import ", re.MULTILINE)


def _plugins() -> list[str]:
    """Points protoc at mypy-protobuf's plugins beside this Python (a venv's bin/), PATH or not."""
    bin_dir = Path(sys.executable).parent
    found = []
    for name in ("protoc-gen-mypy", "protoc-gen-mypy_grpc"):
        plugin = bin_dir / name
        if plugin.exists():
            found.append(f"--plugin={name}={plugin}")
    return found


def generate(out_dir: Path) -> list[Path]:
    """Writes the generated modules for every .proto file into ``out_dir``; returns their paths."""
    from grpc_tools import protoc  # dev dependency: imported only when generating

    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            *_plugins(),
            f"-I{SOURCE_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *(str(p.relative_to(SOURCE_ROOT)) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for produced in sorted((Path(tmp) / "truba" / "v1").iterdir()):
            text = _IMPORT.sub("from truba.proto.v1 import ", produced.read_text())
            target = out_dir / produced.name
            target.write_text(text)
            written.append(target)
        init = out_dir / "__init__.py"
        init.write_text('"""Generated protobuf and gRPC modules of truba.v1 (see truba.proto.generate)."""\n')
        written.append(init)
    return written


def main() -> int:
    for path in generate(SOURCE_ROOT / "v1"):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
