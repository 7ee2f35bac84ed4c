"""Draws the picture of docs/guides/scale-out.md: callers -> a load balancer -> duplex replicas
(the light front: doors, sessions, turn-taking) -> one engine pool per model kind, each arrow
labelled with the protocol it speaks.

    python scripts/scale_out_diagram.py docs/guides/scale-out.png

A picture, not a measurement: it draws what the page says and nothing else."""

from __future__ import annotations

import argparse
from pathlib import Path

FRONT, POOL, EDGE = "#dfe6fb", "#e3f3e3", "#fdf0d8"


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(11, 6.5))
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 6.5)
    ax.axis("off")

    def box(x: float, y: float, w: float, h: float, text: str, color: str, size: int = 10) -> None:
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04,rounding_size=0.12",
                                    facecolor=color, edgecolor="#555555", linewidth=1.1))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(a: tuple[float, float], b: tuple[float, float], label: str = "", dy: float = 0.12,
              style: str = "-|>") -> None:
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, color="#444444", linewidth=1.1))
        if label:
            ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + dy, label, ha="center", va="bottom", fontsize=8,
                    color="#333333")

    box(0.2, 2.55, 1.5, 1.1, "callers\nbrowser, app,\nphone (SIP),\nTwilio", EDGE, 9)
    box(2.35, 2.35, 1.55, 1.5, "load balancer\n(haproxy, ...)\nhealth: /readyz\nsticky cookie", EDGE, 9)
    arrow((1.7, 3.1), (2.35, 3.1), "signalling", dy=0.1)
    replicas = [(4.55, 4.4), (4.55, 2.55), (4.55, 0.7)]
    for n, (x, y) in enumerate(replicas):
        name = "duplex replica " + "ABC"[n]
        box(x, y, 2.2, 1.1, f"{name}\ndoors, sessions,\nturn-taking, barge-in", FRONT, 9)
        arrow((3.9, 3.1), (x, y + 0.55))
    ax.text(5.65, 0.25, "WebRTC / RTP media goes straight to the replica holding the call",
            ha="center", fontsize=8, style="italic", color="#333333")

    pools = [(8.4, 4.55, "ASR pool\nwyoming-faster-whisper,\nfaster-whisper-server",
              "Wyoming tcp:// or\nOpenAI http(s):// /audio/transcriptions"),
             (8.4, 2.6, "thinker pool\nvLLM, SGLang\n(prefix cache)", "OpenAI chat http(s)://\n/chat/completions"),
             (8.4, 0.65, "TTS pool\nwyoming-piper, local-tts-studio,\nKokoro-FastAPI",
              "Wyoming tcp:// or\nOpenAI http(s):// /audio/speech")]
    for x, y, text, protocol in pools:
        box(x, y, 2.4, 1.05, text + "\n(one URL: a balancer in front)", POOL, 8)
        for rx, ry in replicas:
            arrow((rx + 2.2, ry + 0.55), (x, y + 0.52), style="-")
        ax.text(x + 1.2, y + 1.12, protocol, ha="center", va="bottom", fontsize=7.5, color="#1d4d1d")
    ax.text(5.65, 6.2, "light front: scale with calls", ha="center", fontsize=10, weight="bold")
    ax.text(9.6, 6.2, "engine pools: scale with model load", ha="center", fontsize=10, weight="bold")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    draw(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
