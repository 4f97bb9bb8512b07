"""EFA vs TCP-baseline A/B: compare two fabric-probe (or nccl-tests) JSON reports.

    python -m training.fabric_compare efa.json tcp.json [--output-json ab.json]

Prints both large-message bus bandwidths and their ratio (what EFA buys on this cluster),
as one line a log search can find: `FABRIC A/B: efa X GB/s, tcp Y GB/s, efa/tcp Z x`.
Standard library only: it runs inside the training containers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_UNUSABLE = 2


def large_message_busbw(report: dict[str, Any], path: Path) -> float:
    value = report.get("large_message_busbw_gbps")
    if not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{path}: no large-message bus bandwidth (large_message_busbw_gbps={value!r})")
    return float(value)


def compare(efa: dict[str, Any], tcp: dict[str, Any], efa_path: Path, tcp_path: Path) -> dict[str, Any]:
    efa_bw, tcp_bw = large_message_busbw(efa, efa_path), large_message_busbw(tcp, tcp_path)
    if efa.get("large_message_bytes") != tcp.get("large_message_bytes"):
        raise ValueError(
            f"the two sweeps end at different sizes ({efa.get('large_message_bytes')} vs "
            f"{tcp.get('large_message_bytes')} bytes); run both with the same --max-bytes"
        )
    return {
        "message_bytes": efa.get("large_message_bytes"),
        "world_size": efa.get("world_size"),
        "efa_busbw_gbps": efa_bw,
        "tcp_busbw_gbps": tcp_bw,
        "efa_over_tcp": efa_bw / tcp_bw,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.fabric_compare", description=__doc__.splitlines()[0])
    parser.add_argument("efa", type=Path)
    parser.add_argument("tcp", type=Path)
    parser.add_argument("--output-json", type=Path)
    args = parser.parse_args(argv)
    try:
        result = compare(json.loads(args.efa.read_text()), json.loads(args.tcp.read_text()), args.efa, args.tcp)
    except (OSError, ValueError) as exc:
        print(f"FABRIC A/B UNUSABLE: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(
        f"FABRIC A/B: efa {result['efa_busbw_gbps']:.2f} GB/s, tcp {result['tcp_busbw_gbps']:.2f} GB/s, "
        f"efa/tcp {result['efa_over_tcp']:.2f}x at {result['message_bytes']} B over {result['world_size']} ranks"
    )
    if args.output_json:
        args.output_json.write_text(json.dumps(result, indent=2) + "\n")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
