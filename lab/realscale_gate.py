"""The gate at real scale: the README's real-checkpoint command on truncated-depth synthetic checkpoints, its
time and memory per layer, extrapolated to the published depth.

    python -m lab.realscale_gate --arch olmoe --layers 2 4 --workdir /tmp/rsg \
        --out data/receipts/realscale_gate_h100.json                                   # on a GPU
    python -m lab.realscale_gate --arch qwen3_moe --layers 1 2 --device-map auto --max-memory 0=6GiB cpu=200GiB \
        --workdir /tmp/rsg --out r.json                                                # GPU + host memory
    python -m lab.realscale_gate --arch olmoe --layers 1 2 --width tiny --workdir /tmp/w --out r.json \
        --gate-args="--max-docs 20 --lottery 2 --calib-draws 3 --boot 100"             # CPU (tests)

For each architecture and depth, `lab.synth` writes the published configuration truncated to that many decoder
layers, and the gate runs on that directory exactly as the README's command does (`int4lab.gate.main` with
`--scheme rtn gptq --targets experts experts+attn` and every other flag at its default: whole texts, 4 lottery
tickets and 3 GPTQ draws per target, the precision floor, the kernel-parity check), plus --device-map /
--max-memory when given and any --gate-args (quick CPU tests only; recorded). Measured per depth: the
gate's wall seconds by phase (the receipt's `timing`), peak GPU bytes (max_memory_allocated) and peak host
RSS, bytes of the source and of each int4 arm, the groups, the padding.

Each quantity q is fitted through the measured depths as q = fixed + layers x per_layer (`fit_depths`) and
taken to the published depth (OLMoE 16, Qwen3-30B-A3B 48, Mixtral 32 layers), the arithmetic in the receipt.
On one GPU without a device map the full-depth memory is predicted from the fitted parts by the gate's own
group rule (`predict_groups`): how many arms a group holds on the card, the groups, the peak, and the extra
source forwards the groups cost. "gate / forwards" is the gate's wall time over the time inside the forwards
it ran (scoring, floor and GPTQ calibration); its target is <= 1.5.

Depths run in increasing order; the receipt is rewritten after each one, so a timeout keeps what finished.
--deadline skips a depth whose predicted time (the last depth's, scaled by layers) would not fit what is left.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from lab.realscale import fit_depths, phase
from lab.synth import ARCHS, FULL_LAYERS, WIDTHS, write_checkpoint

README_FLAGS = ["--scheme", "rtn", "gptq", "--targets", "experts", "experts+attn"]
TARGET_S = {"olmoe": 600.0, "qwen3_moe": 3600.0, "mixtral": 3600.0}    # full-depth gate time targets
TARGET_RATIO = 1.5                                                      # gate time / time of its forwards


def gate_argv(ckpt, out, device: str, device_map=None, max_memory=None, extra=()) -> list[str]:
    """The README's command on a checkpoint directory (plus placement and extra flags), quiet, one log line
    per phase, writing its receipt to out."""
    argv = ["--model", str(ckpt), *README_FLAGS, "--device", device, "--quiet", "--log", "--out", str(out)]
    if device_map:
        argv += ["--device-map", device_map]
    if max_memory:
        argv += ["--max-memory", *max_memory]
    return argv + list(extra)


def summarise(p: dict) -> dict:
    """What the receipt keeps of one gate payload: timing, bytes, groups, padding, verdicts."""
    arms = p["arms"]
    kinds = {}
    for a in arms.values():
        kinds[a["kind"]] = kinds.get(a["kind"], 0.0) + a["load_s"] + a["quantise_s"]
    gpu = lambda b: (b or {}).get("cuda", 0)                                     # noqa: E731
    tm = {k: v for k, v in p["timing"].items() if k not in ("per_model_s", "note")}
    return {
        "seconds": p["seconds"], "timing": tm, "build_s_by_kind": kinds, "arms": len(arms),
        "gate_gpu_peak_bytes": p.get("gpu_peak_bytes"),
        "groups": [len(g["arms"]) for g in p["groups"]], "group_rule": p["settings"]["group_rule"],
        "gpu_source_bytes": gpu(p["source_bytes"]), "source_bytes": p["source_bytes"],
        "gpu_arm_bytes_max": max(gpu(a.get("bytes")) for a in arms.values()),
        "gpu_build_peak_bytes": max((a.get("gpu_build_peak_bytes") or 0) for a in arms.values()),
        "gpu_score_peak_bytes": max((g.get("gpu_score_peak_bytes") or 0) for g in p["groups"]),
        "source_forward_s_per_group": p["timing"]["source_forward_s"] / max(1, len(p["groups"])),
        "texts": {t: {"docs": v["docs"], "windows": v["windows"], "tokens": v["tokens"],
                      "padding": v["padding"]["fraction"], "forwards": v["padding"]["batches"]}
                  for t, v in p["texts"].items()},
        "window": p["settings"]["window"], "source_rerun_max_abs_nll": p["source_rerun"]["max_abs_nll"],
        "verdicts": {n: a["verdict"]["verdict"] for n, a in arms.items()},
        "calibration": {s: c["judgement"]["verdict"] for s, c in p["calibration"].items()},
        "parity": p.get("parity"), "settings": p["settings"]}


FITTED = ("gate_s", "score_s", "forward_s", "source_forward_s", "calibration_forward_s", "build_s", "floor_s",
          "bootstrap_s", "load_source_s", "gpu_peak_bytes", "host_peak_bytes", "gpu_source_bytes",
          "gpu_arm_bytes_max", "gpu_build_peak_bytes", "gpu_score_peak_bytes", "checkpoint_bytes", "synth_s")


def quantities(d: dict) -> dict:
    """The per-depth numbers that are fitted against the layer count."""
    g, tm = d["gate"], d["gate"]["timing"]
    q = {"gate_s": g["s"], "gpu_peak_bytes": g["gpu_peak_bytes"], "host_peak_bytes": g["host_peak_bytes"],
         "checkpoint_bytes": d["synth"]["bytes"], "synth_s": d["synth"]["s"]}
    for k in ("score_s", "forward_s", "source_forward_s", "calibration_forward_s", "build_s", "floor_s",
              "bootstrap_s", "load_source_s"):
        q[k] = tm.get(k)
    for k in ("gpu_source_bytes", "gpu_arm_bytes_max", "gpu_build_peak_bytes", "gpu_score_peak_bytes"):
        q[k] = g[k]
    return q


def predict_groups(card: float, src: float, arm: float, build_peak: float, score_peak: float, arms: int) -> dict:
    """The gate's automatic group rule (`GroupSizer`) at full depth on a card of `card` bytes: after k arms are
    held, one more is built only if card - src - k x arm >= build_peak + score_peak, so a group holds
    k = floor((card - src - build_peak - score_peak) / arm) + 1 arms (0: not even one fits)."""
    room = card - src - build_peak - score_peak
    k = 0 if room < 0 else (arms if arm <= 0 else min(arms, math.floor(room / arm) + 1))
    groups = math.ceil(arms / k) if k else None
    peak = None if not k else src + max((k - 1) * arm + build_peak, k * arm + score_peak)
    return {"card_bytes": card, "arms_per_group": k, "groups": groups, "peak_bytes": peak, "fits": bool(k),
            "formula": f"k = floor(({card:.4g} - {src:.4g} - {build_peak:.4g} - {score_peak:.4g}) / {arm:.4g}) + 1"
                       f" = {k}" + (f"; groups = ceil({arms} / {k}) = {groups}" if k else "; does not fit")}


def extrapolate_arch(arch: str, depths: dict, card: float | None, device_map) -> dict:
    """Fits of every quantity over the measured depths, the full-depth ratios and targets."""
    full = FULL_LAYERS[arch]
    ok = {int(L): d for L, d in depths.items() if d.get("gate")}
    if not ok:
        return {}
    qs = {L: quantities(d) for L, d in ok.items()}
    fits = {k: fit_depths({L: q[k] for L, q in qs.items()}, full) for k in FITTED
            if all(q.get(k) is not None for q in qs.values())}
    f = {k: v["full_depth"] for k, v in fits.items()}
    out = {"fits": fits, "full_layers": full}
    fw = f.get("forward_s", 0) + f.get("calibration_forward_s", 0)
    out["gate_over_forwards"] = {"value": f["gate_s"] / fw if fw else None, "target": TARGET_RATIO,
                                 "formula": f"{f['gate_s']:.4g} / ({f.get('forward_s', 0):.4g} + "
                                            f"{f.get('calibration_forward_s', 0):.4g})"}
    out["score_over_forwards"] = f["score_s"] / f["forward_s"] if f.get("forward_s") else None
    gate_s = f["gate_s"]
    last = ok[max(ok)]["gate"]
    if card and not device_map and f.get("gpu_arm_bytes_max"):
        pg = predict_groups(card, f["gpu_source_bytes"], f["gpu_arm_bytes_max"], f["gpu_build_peak_bytes"],
                            f["gpu_score_peak_bytes"], last["arms"])
        if pg["groups"]:
            extra = (pg["groups"] - len(last["groups"])) * fits["source_forward_s"]["full_depth"] / \
                max(1, len(last["groups"]))
            pg["extra_source_forward_s"] = extra
            gate_s += max(0.0, extra)
        out["memory"] = pg
    out["gate_s_full_depth"] = gate_s
    out["targets"] = {"gate_s": {"value": gate_s, "target": TARGET_S[arch], "met": gate_s <= TARGET_S[arch]},
                      "gate_over_forwards": {"value": out["gate_over_forwards"]["value"], "target": TARGET_RATIO,
                                             "met": (out["gate_over_forwards"]["value"] or math.inf) <= TARGET_RATIO}}
    if "memory" in out:
        out["targets"]["fits_one_card"] = {"met": out["memory"]["fits"], "card_bytes": card}
    return out


WARMUP_ARGS = ["--max-docs", "20", "--texts", "ood", "--lottery", "0", "--calib-draws", "1", "--no-floor", "--boot",
               "100"]


def measure_depth(arch: str, layers: int, workdir, width: str, device: str, device_map=None, max_memory=None,
                  extra=(), log=print, warmup: bool = False) -> dict:
    """One synthetic checkpoint and one gate run on it; the directory this call creates is removed after.
    warmup: first a small gate on the same checkpoint (WARMUP_ARGS: twenty documents of one text, one arm per
    scheme and target), so one-time costs (kernel compilation, first CUDA allocations) stay out of the
    measured run, where they would pass for a fixed cost of this depth."""
    from int4lab import gate
    Path(workdir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{arch}-{layers}l-", dir=workdir))
    rec = {"layers": layers}
    try:
        ckpt = tmp / f"synth-{arch}-{layers}l"
        synth = {}
        with phase(synth):
            synth.update(write_checkpoint(arch, layers, ckpt, width, seed=0,
                                          max_shard_size="2GB" if width == "real" else "1MB"))
        synth.pop("config", None)
        rec["synth"] = synth
        log(f"{arch} {layers} layers: checkpoint {synth['bytes'] / 2 ** 30:.2f} GiB written in {synth['s']:.1f} s")
        if warmup:
            w = {}
            wargv = gate_argv(ckpt, tmp / "warmup.json", device, device_map, max_memory, [*extra, *WARMUP_ARGS])
            with phase(w), contextlib.redirect_stdout(io.StringIO()):
                w["rc"] = gate.main(wargv)
            rec["warmup"] = {"s": w["s"], "rc": w["rc"], "args": WARMUP_ARGS}
            log(f"{arch} {layers} layers: warm-up gate {w['s']:.1f} s (not measured)")
        argv = gate_argv(ckpt, tmp / "gate.json", device, device_map, max_memory, extra)
        rec["command"] = "python -m int4lab.gate " + " ".join(shlex.quote(a) for a in argv)
        g = {}
        with phase(g), contextlib.redirect_stdout(io.StringIO()) as table:
            rc = gate.main(argv)
        if rc != 0:
            raise RuntimeError(f"the gate returned {rc}")
        g.update(summarise(json.loads((tmp / "gate.json").read_text())))
        if g.get("gate_gpu_peak_bytes") is not None:      # phases inside the gate reset torch's peak counter
            g["gpu_peak_bytes"] = max(g["gpu_peak_bytes"] or 0, g["gate_gpu_peak_bytes"])
        g["table"] = table.getvalue().splitlines()[-40:]
        rec["gate"] = g
        log(f"{arch} {layers} layers: gate {g['s']:.1f} s, GPU peak {(g['gpu_peak_bytes'] or 0) / 2 ** 30:.1f} GiB, "
            f"host peak {g['host_peak_bytes'] / 2 ** 30:.1f} GiB, groups {g['groups']}, "
            f"gate / forwards {g['seconds'] / max(1e-9, g['timing']['forward_s'] + g['timing']['calibration_forward_s']):.2f}")
    except Exception as e:                                        # recorded; the next depth runs
        rec["error"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc().splitlines()[-40:]}
        log(f"{arch} {layers} layers FAILED: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rec


def write(path, payload: dict, command: str) -> None:
    from int4lab.receipts import portable_command, write_receipt
    write_receipt(Path(path), payload, command=portable_command(command), sources="realscale_gate")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.realscale_gate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", required=True, choices=ARCHS)
    ap.add_argument("--layers", nargs="+", type=int, required=True, help="decoder layers of each measured depth")
    ap.add_argument("--workdir", required=True, help="where a fresh directory per depth is made (and removed)")
    ap.add_argument("--out", required=True, help="receipt path (rewritten after every depth)")
    ap.add_argument("--width", choices=WIDTHS, default="real")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--device-map", default=None, help="passed to the gate, e.g. auto")
    ap.add_argument("--max-memory", nargs="+", default=None, metavar="DEVICE=SIZE", help="passed to the gate")
    ap.add_argument("--card-gib", type=float, default=None,
                    help="card memory for the full-depth prediction (default: this GPU's total memory)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds for the whole run: a depth predicted not to fit what is left is skipped")
    ap.add_argument("--gate-args", default="", help="extra gate flags (quick tests only), e.g. '--max-docs 20'")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the small unmeasured gate before each architecture's first depth")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    layers = sorted(set(args.layers))
    for arch in args.arch:
        bad = [L for L in layers if not 1 <= L <= FULL_LAYERS[arch]]
        if bad:
            print(f"error: --layers must be in [1, {FULL_LAYERS[arch]}] for {arch}, got {bad}", file=sys.stderr)
            return 2
    extra = shlex.split(args.gate_args)
    t_start = time.time()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')} +{time.time() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    card = args.card_gib * 2 ** 30 if args.card_gib else (
        torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None)
    command = "python -m lab.realscale_gate " + " ".join(shlex.quote(a) for a in (
        argv if argv is not None else sys.argv[1:]))
    settings = {"readme_flags": README_FLAGS, "gate_args": extra, "width": args.width, "device": args.device,
                "device_map": args.device_map, "max_memory": args.max_memory, "card_bytes": card,
                "targets": {"gate_s": TARGET_S, "gate_over_forwards": TARGET_RATIO},
                "extrapolation": "q = fixed + layers x per_layer through the measured depths (least squares)"}
    payload = {"settings": settings, "archs": {}}
    failed = 0
    for arch in args.arch:
        a = payload["archs"].setdefault(arch, {"full_layers": FULL_LAYERS[arch], "depths": {}})
        prev = None
        for L in layers:
            if args.deadline and prev:
                need = prev[1] * L / prev[0]            # the last depth's time, scaled by layers: an upper bound
                left = args.deadline - (time.time() - t_start)
                if need > left:
                    a["depths"][str(L)] = {"layers": L, "skipped": f"predicted {need:.0f} s, {left:.0f} s left"}
                    log(f"{arch} {L} layers skipped: predicted {need:.0f} s, {left:.0f} s left")
                    continue
            log(f"== {arch}: {L} of {FULL_LAYERS[arch]} layers, {args.width} width")
            rec = measure_depth(arch, L, args.workdir, args.width, args.device, args.device_map, args.max_memory,
                                extra, log, warmup=args.warmup and prev is None)
            a["depths"][str(L)] = rec
            failed += "error" in rec
            if rec.get("gate"):
                prev = (L, rec["gate"]["s"] + rec["synth"]["s"])
            a["extrapolation"] = extrapolate_arch(arch, a["depths"], card, args.device_map)
            write(args.out, payload, command)
            log(f"receipt written: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
