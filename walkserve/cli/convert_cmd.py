"""``walkserve convert``: one-time conversion of released checkpoints to safetensors."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a released checkpoint to safetensors once (e.g. SNAC)")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    snac = kinds.add_parser(
        "snac",
        help="SNAC: config.json + pytorch_model.bin -> config.json + model.safetensors",
        description="Read SRC/pytorch_model.bin once (torch.load with weights_only=True: tensors only, no code) "
        "and write DST/model.safetensors and DST/config.json. DST may equal SRC.",
    )
    snac.add_argument("src", help="directory with config.json and pytorch_model.bin (e.g. hubertsiuzdak/snac_24khz)")
    snac.add_argument("dst", help="directory to write config.json and model.safetensors into")
    snac.set_defaults(func=run_snac)


def run_snac(args: argparse.Namespace) -> int:
    from walkserve.models.snac.convert import convert_snac

    out = convert_snac(args.src, args.dst)
    print(f"wrote {out}")
    return 0
