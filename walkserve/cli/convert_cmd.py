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
    add_vjepa2_ac(kinds)


def run_snac(args: argparse.Namespace) -> int:
    from walkserve.models.snac.convert import convert_snac

    out = convert_snac(args.src, args.dst)
    print(f"wrote {out}")
    return 0


def add_vjepa2_ac(kinds: argparse._SubParsersAction) -> None:
    ac = kinds.add_parser(
        "vjepa2-ac",
        help="V-JEPA 2-AC: the released vjepa2-ac-vitg.pt -> config.json + safetensors",
        description="Read IN.pt once (torch.load with weights_only=True: tensors only, no code), rename its "
        "encoder and predictor tensors (split the fused qkv, drop module./backbone. prefixes) and write "
        "OUT_DIR/config.json (model_type vjepa2-ac, see docs/models/vjepa2.md) and safetensors shards.",
    )
    ac.add_argument("src", help="the released pickle (vjepa2-ac-vitg.pt)")
    ac.add_argument("dst", help="directory to write config.json and the safetensors into")
    ac.add_argument("--crop-size", type=int, default=256, help="frame size the model was trained at (256)")
    ac.add_argument("--max-steps", type=int, default=32, help="steps of the predictor's mask (32 = 64 frames / 2)")
    ac.add_argument("--encoder-heads", type=int, default=None, help="encoder heads (default: released, by width)")
    ac.add_argument("--predictor-heads", type=int, default=None, help="predictor heads (default: released, by width)")
    ac.set_defaults(func=run_vjepa2_ac)


def run_vjepa2_ac(args: argparse.Namespace) -> int:
    from walkserve.models.vjepa2.convert import convert_vjepa2_ac

    out, others = convert_vjepa2_ac(args.src, args.dst, crop_size=args.crop_size, max_steps=args.max_steps,
                                    encoder_heads=args.encoder_heads, predictor_heads=args.predictor_heads)
    if others:
        print(f"not converted (not weights of the model): {', '.join(others)}")
    print(f"wrote {out}")
    return 0
