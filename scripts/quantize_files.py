"""QDQ copies of float ONNX files, quantized as the ``onnxruntime-int8`` peer quantizes a CNN
(``quant_pre_process``, then ``quantize_static``: per-channel s8 weights, u8 activations
calibrated on seeded inputs; a graph without a conv: ``quantize_dynamic``, unless ``--static``), for
``mlexec report --model NAME-int8.onnx --engines int8,onnxruntime`` (the same quantized file on both).

    python scripts/quantize_files.py /tmp/zoo/*-torchscript.onnx --out /tmp/qdq
    python scripts/quantize_files.py --static transformer.onnx --out /tmp/qdq     # a QDQ transformer
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines import load_onnx  # noqa: E402
from engines.peers.onnxrt_int8 import quantized  # noqa: E402


def quantize(path: Path, out: Path, static: bool | None = None) -> Path:
    """``out``/NAME-int8.onnx: ``path`` as the peer runs it (``static``: ``quantized``'s)."""
    import onnx
    proto, scheme = quantized(load_onnx(path), onnx.load(path), onnx, static)
    target = out / f"{path.stem}-int8.onnx"
    onnx.save(proto, target)
    print(f"{target}: {scheme}", file=sys.stderr)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--static", action="store_true", default=None,
                        help="quantize_static in QDQ form even without a conv (a transformer's QDQ file)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.files:
        quantize(path, args.out, args.static)


if __name__ == "__main__":
    main()
