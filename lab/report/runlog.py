"""What a real-width gate run's log says when the run stopped before its receipt could: the phases that finished,
read from the lines `lab.realscale_gate` and the gate print (`data/receipts/realscale_gate_*_<card>.log`, the
stage's output as `lab/gpu_run.sh` printed it, beside its interrupted receipt; a log may keep only the gate's last
lines)."""
from __future__ import annotations

import re
import statistics
from pathlib import Path

_CKPT = re.compile(r"checkpoint ([\d.]+) GiB written in ([\d.]+) s")
_TOKENS = re.compile(r"(\d+) tokens in (\d+) forwards per model; window (\d+)")
_BUILT = re.compile(r"built (.+?) in ([\d.]+) s \(quantise ([\d.]+) s\)")
_GROUP = re.compile(r"group (\d+): (\d+) arms scored in ([\d.]+) s")
# the line that ends a measured gate (a warm-up gate's line says "warm-up gate" and ends an unmeasured one)
_GATE_END = re.compile(r"(\w+) (\d+) layers: gate [\d.]+ s")
_WARMUP_END = re.compile(r"\d+ layers: warm-up gate ")
# lab/gpu_run.sh's stage marks: seconds since the script began
_MARK = re.compile(r"^== (.+?) \((\d+) s in\)$", re.M)


def kind_of(arm: str) -> str:
    """'gptq', 'lottery' or 'rtn' (+ '/experts+attn' when attention is quantised too) of an arm's name."""
    kind = "gptq" if arm.startswith("gptq") else "lottery" if "lottery#" in arm else "rtn"
    return kind + ("/experts+attn" if "/experts+attn/" in arm else "")


def measured_builds(text: str) -> dict[str, dict[str, list[tuple[str, float]]]]:
    """{arch: {depth: [(arm, quantise s)]}}: the build lines of each measured gate in a stage log, those between the
    line that ended the previous gate (or an unmeasured warm-up gate, whose arms are left out) and the line that ends
    the depth's gate; a gate whose end line the log lacks is left out."""
    out: dict = {}
    built: list = []
    for line in text.splitlines():
        if m := _BUILT.search(line):
            built.append((m[1], float(m[3])))
        elif _WARMUP_END.search(line):
            built = []
        elif m := _GATE_END.search(line):
            out.setdefault(m[1], {})[m[2]] = built
            built = []
    return out


def summary(text: str) -> dict:
    """{checkpoint_gib, checkpoint_s, tokens, forwards, window, groups: [(arms, s)], built: {kind: [quantise s]},
    arms_built, stage_s (the gate stage's seconds, between its mark and the end mark)} from a gate stage's log; a
    key is absent when its line is."""
    out: dict = {"groups": [], "built": {}, "arms_built": 0}
    if m := _CKPT.search(text):
        out["checkpoint_gib"], out["checkpoint_s"] = float(m[1]), float(m[2])
    if m := _TOKENS.search(text):
        out["tokens"], out["forwards"], out["window"] = int(m[1]), int(m[2]), int(m[3])
    for m in _BUILT.finditer(text):
        out["built"].setdefault(kind_of(m[1]), []).append(float(m[3]))
        out["arms_built"] += 1
    out["groups"] = [(int(m[2]), float(m[3])) for m in _GROUP.finditer(text)]
    marks = [(m[1], int(m[2])) for m in _MARK.finditer(text)]
    done = [s for name, s in marks if name == "done"]
    gate = [s for name, s in marks if name.startswith("gate")]
    if done and gate:                               # the gate stage: from its own mark to the script's end
        out["stage_s"] = done[-1] - gate[-1]
    return out


def summary_text(path: Path) -> str:
    """One paragraph of what the log at `path` shows (figures as printed there)."""
    s = summary(Path(path).read_text(encoding="utf-8", errors="replace"))
    parts = []
    if "checkpoint_s" in s:
        parts.append(f"checkpoint {s['checkpoint_gib']:.2f} GiB written in {s['checkpoint_s']:.1f} s")
    if "tokens" in s:
        parts.append(f"{s['tokens']:,} tokens in {s['forwards']} forwards per model (window {s['window']})")
    if s["built"]:
        head = (f"{s['arms_built']} arms built" if "checkpoint_s" in s else "the gate's first lines are not in it "
                f"(the stage printed only the gate's last lines); the {s['arms_built']} arms built in the lines kept")
        parts.append(head + ", median quantise time by kind: " + ", ".join(
            f"{k} {statistics.median(v):.1f} s ({len(v)})" for k, v in sorted(s["built"].items())))
    for i, (n, sec) in enumerate(s["groups"]):
        parts.append(f"group {i}: {n} arms scored in {sec:.1f} s ({sec / n:.1f} s per arm, the source's forwards "
                     "included)")
    if "stage_s" in s:
        parts.append(f"the stage ended {s['stage_s']} s after it began")
    return f"Its log, `data/receipts/{Path(path).name}`: " + ("; ".join(parts) if parts else "no phase finished") + "."
