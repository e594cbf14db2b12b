"""An SVG of the load sweep (no plotting library): viability of admitted streams and goodput per offered load."""

from __future__ import annotations

from html import escape

from benchmarks.tts_load import Level

W, H, PAD = 360, 240, 48
COLORS = {"capacity+deadline": "#1f77b4", "count+fifo": "#d62728", "capacity+fifo": "#2ca02c", "count+deadline": "#ff7f0e"}


def _panel(levels: list[Level], x0: float, title: str, value, y_max: float, y_label: str) -> list[str]:
    names = list(dict.fromkeys(lv.name for lv in levels))
    step = (W - 2 * PAD) / max(1, len(names) - 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return x0 + PAD + i * step, H - PAD - (H - 2 * PAD) * min(v, y_max) / y_max

    out = [f'<text x="{x0 + W / 2}" y="18" text-anchor="middle" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{x0 + PAD}" y1="{H - PAD}" x2="{x0 + W - PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<line x1="{x0 + PAD}" y1="{PAD}" x2="{x0 + PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<text x="{x0 + 12}" y="{H / 2}" transform="rotate(-90 {x0 + 12} {H / 2})" text-anchor="middle">'
           f'{escape(y_label)}</text>',
           f'<text x="{x0 + W / 2}" y="{H - 8}" text-anchor="middle">offered load (x estimated capacity)</text>']
    for k in range(5):
        v = y_max * k / 4
        _, y = xy(0, v)
        out.append(f'<text x="{x0 + PAD - 4}" y="{y + 4}" text-anchor="end" font-size="10">{v:.3g}</text>')
        out.append(f'<line x1="{x0 + PAD}" y1="{y}" x2="{x0 + W - PAD}" y2="{y}" stroke="#ddd"/>')
    for i, name in enumerate(names):
        x, _ = xy(i, 0)
        out.append(f'<text x="{x}" y="{H - PAD + 14}" text-anchor="middle" font-size="10">{escape(name)}</text>')
    for mode, color in COLORS.items():
        points = [xy(names.index(lv.name), value(lv)) for lv in levels if lv.mode == mode]
        if points:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points]
    return out


def sweep_svg(levels: list[Level], caption: str) -> str:
    goodput_max = max([lv.goodput() for lv in levels] + [1e-9]) * 1.15
    parts = _panel(levels, 0, "Admitted streams viable", lambda lv: 100 * lv.viability(), 100.0, "% gap-free")
    parts += _panel(levels, W, "Goodput", lambda lv: lv.goodput(), goodput_max, "viable audio s / wall s")
    shown = [(m, c) for m, c in COLORS.items() if any(lv.mode == m for lv in levels)]
    legend = [f'<rect x="{PAD + 160 * i}" y="{H + 6}" width="12" height="12" fill="{c}"/>'
              f'<text x="{PAD + 160 * i + 16}" y="{H + 16}">{m}</text>' for i, (m, c) in enumerate(shown)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 44}" font-family="sans-serif" '
            f'font-size="12">\n<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(parts + legend) +
            f'\n<text x="{PAD}" y="{H + 38}" font-size="10">{escape(caption)}</text>\n</svg>\n')
