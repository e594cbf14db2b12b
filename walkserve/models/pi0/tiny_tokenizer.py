"""A tiny SentencePiece BPE model in the PaliGemma tokenizer's layout, trained on a built-in corpus.

Ids 0-3 are ``<pad>``, ``</s>``, ``<s>`` (BOS, as in PaliGemma) and ``<unk>``;
then the 256 byte-fallback pieces, one user-defined piece, the merged pieces
(best first) and the single characters. Like PaliGemma's model: no dummy
prefix, spaces kept as they are and written as U+2581, byte fallback on.
Training is a plain pair-count BPE and deterministic: the same size gives the
same file. Written with ``spm_model.write_model``; the sentencepiece library
loads it too.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

from walkserve.models.pi0.files import TOKENIZER_FILE
from walkserve.models.pi0.spm_model import (
    BPE,
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    SpmModel,
    write_model,
)
from walkserve.models.pi0.spm_tokenizer import SPACE

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3

CORPUS = """\
Task: pick up the red cube and put it in the bowl, State: 128 127 255 0 64 192 10 3;
Action: move the arm to the left, open the gripper, close the gripper, lift the block.
put the black bowl on the plate; stack the green block on top of the yellow block.
open the top drawer of the cabinet and put the bowl inside. turn on the stove.
pick up the alphabet soup and place it in the basket. push the plate to the front.
State: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 100 127 128 129 200 250 255
"""
USER_PIECES = ("<image>",)


def train_pieces(corpus: str, merges: int) -> tuple[list[str], list[str]]:
    """(merged pieces in merge order, single characters by frequency) of a pair-count BPE."""
    words = Counter(SPACE + w for line in corpus.splitlines() for w in line.split(" ") if w)
    splits = {w: list(w) for w in words}
    chars = Counter(c for w, n in words.items() for c in w for _ in range(n))
    learned: list[str] = []
    for _ in range(merges):
        pairs: Counter = Counter()
        for w, n in words.items():
            s = splits[w]
            for a, b in itertools.pairwise(s):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        learned.append(a + b)
        for w, s in splits.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            splits[w] = out
    by_freq = [c for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))]
    return learned, by_freq


def tiny_spm_model(merges: int = 160) -> SpmModel:
    learned, chars = train_pieces(CORPUS, merges)
    pieces: list[tuple[str, float, int]] = [
        ("<pad>", 0.0, CONTROL), ("</s>", 0.0, CONTROL), ("<s>", 0.0, CONTROL), ("<unk>", 0.0, UNKNOWN),
    ]
    pieces += [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    pieces += [(p, 0.0, USER_DEFINED) for p in USER_PIECES]
    seen = {p for p, _, _ in pieces}
    ranked = [p for p in learned if p not in seen] + [c for c in chars if c not in learned]
    pieces += [(p, -float(i), NORMAL) for i, p in enumerate(ranked)]
    return SpmModel(
        pieces=tuple(pieces), model_type=BPE, byte_fallback=True, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_id=PAD_ID, add_dummy_prefix=False, remove_extra_whitespaces=False, escape_whitespaces=True,
        normalizer_name="identity",
    )


def write_tiny_tokenizer(out_dir: str | Path, merges: int = 160) -> Path:
    """Write ``tokenizer.model`` into ``out_dir``; returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_model(tiny_spm_model(merges), out_dir / TOKENIZER_FILE)
