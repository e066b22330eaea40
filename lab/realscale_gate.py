"""The gate at real scale: the README's real-checkpoint command on synthetic checkpoints at the published widths,
at truncated depths with its time and memory fitted per layer, or once at the published depth.

    python -m lab.realscale_gate --arch olmoe --layers 1 2 3 --workdir /dev/shm/rsg --out r.json      # on a GPU
    python -m lab.realscale_gate --arch qwen3_moe --layers 1 2 3 --device-map auto \
        --max-memory 0=70GiB cpu=100GiB --workdir /dev/shm/rsg --out r.json \
        --gate-args="--max-docs 20 --lottery 1 --calib-draws 1 --no-floor"       # one card + host, quick settings
    python -m lab.realscale_gate --arch olmoe --full --workdir /dev/shm/rsg --out full.json        # 16 layers
    python -m lab.realscale_gate --arch olmoe --layers 1 2 --width tiny --workdir /tmp/w --out r.json \
        --gate-args="--max-docs 20 --lottery 2 --calib-draws 3 --boot 100"             # CPU (tests)

For each architecture and depth, `lab.synth` writes the published configuration truncated to that many decoder
layers (safetensors shards of SHARD; /dev/shm keeps the write in memory), and the gate runs on that directory
exactly as the README's command does (`int4lab.gate.main` with `--scheme rtn gptq --targets experts
experts+attn` and every other flag at its default: whole texts, 16 lottery tickets and 3 GPTQ draws per target,
the precision floor, the kernel-parity check), plus --device-map / --max-memory when given and any --gate-args
(recorded). Measured per depth: the gate's wall seconds by phase (the receipt's `timing`), peak GPU bytes
(max_memory_allocated) and peak host RSS, bytes of the source and of each int4 arm, the groups, the padding,
GPTQ's column sweeps; and the same depth taken to the README defaults part by part (`lab.realscale_predict`),
which is what quick --gate-args (fewer documents, tickets, draws) need.

Fit mode (--layers): each quantity q is fitted through the measured depths as q = fixed + layers x per_layer
(`fit_depths`) and taken to the published depth (OLMoE 16, Qwen3-30B-A3B 48, Mixtral 32 layers), the arithmetic
in the receipt; `readme_defaults` holds the default-settings time and GPTQ's share at full depth.
On one GPU without a device map the full-depth memory is predicted from the fitted parts by the gate's own
group rule (`predict_groups`): how many arms a group holds on the card, the groups, the peak, and the extra
source forwards the groups cost. "gate / forwards" is the gate's wall time over the time inside the forwards
it ran (scoring and GPTQ calibration; the floor's forwards are not timed apart); its target is <= 1.5.
Full mode (--full): one run at the published depth, no warm-up (a user's first run pays compilation too; with
--warmup-full the small gate runs first, as a second run on the same machine finds the kernels compiled), reporting
wall time with the checkpoint write, peaks, time by phase and gate / forwards beside an earlier fit's prediction
(`realscale_predict.earlier_fit`).

Depths run in increasing order; the receipt is rewritten after each one, so a timeout keeps what finished: its
top-level "complete" stays false until every depth ran ("interrupted" names what stopped it), and the report
marks such a receipt.
--deadline skips a depth whose predicted time (the last depth's, scaled by layers) would not fit what is left.
That prediction is no bound: with a fixed part and a steady cost per layer it runs high, but where the depths grow
faster than in proportion to their layers it runs low (`realscale_gate_mixtral_allexperts_h100.json`'s third depth
took more than its second's time scaled), so a depth it starts may not fit.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from lab.realscale import fit_depths, phase
from lab.synth import ARCHS, FULL_LAYERS, WIDTHS, config_fields, write_checkpoint

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
    kinds, n_kind, sweep, gfw = {}, {}, 0.0, 0.0
    for a in arms.values():
        kinds[a["kind"]] = kinds.get(a["kind"], 0.0) + a["load_s"] + a["quantise_s"]
        n_kind[a["kind"]] = n_kind.get(a["kind"], 0) + 1
        if a["kind"] == "gptq":
            rep = a["quant_report"]
            sweep += sum(t.get("experts_pack_s", 0) + t.get("attn_pack_s", 0) for t in rep["timing"])
            gfw += sum(t.get("calib_s", 0) + t.get("propagate_s", 0) for t in rep["timing"]) + rep["capture_s"]
    gpu = lambda b: (b or {}).get("cuda", 0)                                     # noqa: E731
    tm = {k: v for k, v in p["timing"].items() if k not in ("per_model_s", "note")}
    return {
        "seconds": p["seconds"], "timing": tm, "build_s_by_kind": kinds, "arms": len(arms), "arms_by_kind": n_kind,
        "gptq_sweep_s": sweep, "gptq_forward_s": gfw,
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


FITTED = ("gate_s", "default_gate_s", "gptq_sweep_default_s", "gptq_forward_default_s", "score_s", "forward_s",
          "source_forward_s", "calibration_forward_s", "build_s", "floor_s",
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
    dft = d.get("defaults") or {}
    q["default_gate_s"] = (dft.get("seconds") or {}).get("total")
    q["gptq_sweep_default_s"] = (dft.get("gptq") or {}).get("sweep_s")
    q["gptq_forward_default_s"] = (dft.get("gptq") or {}).get("calibration_forward_s")
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


def extrapolate_arch(arch: str, depths: dict, card: float | None, device_map, max_memory=None) -> dict:
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
    if "default_gate_s" in f:
        out["readme_defaults"] = {"gate_s": f["default_gate_s"], "gptq_sweep_s": f.get("gptq_sweep_default_s"),
                                  "gptq_calibration_forward_s": f.get("gptq_forward_default_s"),
                                  "gptq_share": (f.get("gptq_sweep_default_s") or 0) / f["default_gate_s"]
                                  if f["default_gate_s"] > 0 and (f.get("gptq_sweep_default_s") or 0) >= 0 and not
                                  any(fits[k].get("undecided") for k in ("default_gate_s", "gptq_sweep_default_s")
                                      if k in fits) else None,
                                  "note": "the README command at its defaults, each depth's parts scaled by "
                                          "lab.realscale_predict, then fitted to the full depth"}
    target = TARGET_S.get(arch)                      # None: no full-depth time target set for this architecture
    out["undecided_fits"] = sorted(k for k, v in fits.items() if v.get("undecided"))
    # a target read off an undecided fit is undecided (None), never met or missed
    gate_open = fits["gate_s"].get("undecided") or gate_s <= 0
    ratio_open = gate_open or any(fits[k].get("undecided") for k in ("forward_s", "calibration_forward_s") if k in fits)
    met = None if target is None or gate_open else gate_s <= target
    ratio = out["gate_over_forwards"]["value"]
    out["targets"] = {"gate_s": {"value": gate_s, "target": target, "met": met},
                      "gate_over_forwards": {"value": ratio, "target": TARGET_RATIO,
                                             "met": None if ratio_open else (ratio or math.inf) <= TARGET_RATIO}}
    if "memory" in out:
        out["targets"]["fits_one_card"] = {"met": out["memory"]["fits"], "card_bytes": card}
    cap = gpu_cap(max_memory)
    if device_map and cap and f.get("gpu_source_bytes") is not None:
        out["device_map_cap"] = {
            "gpu_cap_bytes": cap, "source_gpu_bytes_full_depth": f["gpu_source_bytes"],
            "source_exceeds_cap": f["gpu_source_bytes"] > cap,
            "note": "where the full-depth source exceeds the cap, accelerate keeps the layers past it on the host; "
                    "a measured depth whose source fits the card has no offload in it, so the fit does not "
                    "include the cost of offloaded layers (their host-to-device copies)"}
    return out


SHARD = "4GB"            # safetensors shard size at real width: few files, each written in one pass
# every text the measured run scores: a text's window lengths are shapes of their own for the kernels
WARMUP_ARGS = ["--max-docs", "20", "--lottery", "0", "--calib-draws", "1", "--no-floor", "--boot", "100"]


def measure_depth(arch: str, layers: int, workdir, width: str, device: str, device_map=None, max_memory=None,
                  extra=(), log=print, warmup: bool = False, predict=None) -> dict:
    """One synthetic checkpoint and one gate run on it; the directory this call creates is removed after.
    warmup: first a small gate on the same checkpoint (WARMUP_ARGS: twenty documents of each text, one arm per
    scheme and target), so the one-time costs of what it runs (kernel compilation, first CUDA allocations) stay
    out of the measured run, where they would pass for a fixed cost of this depth. It builds no lottery ticket
    (`--lottery 0`: the dither's kernel is not run) and runs no precision floor (`--no-floor`: no float32 forwards),
    so their first use stays in the measured run where that run has them. predict: (full_text_size,
    default_arms) of `lab.realscale_predict`, to take this depth to the README defaults."""
    from int4lab import gate
    Path(workdir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{arch}-{layers}l-", dir=workdir))
    rec = {"layers": layers}
    try:
        ckpt = tmp / f"synth-{arch}-{layers}l"
        synth = {}
        with phase(synth):
            synth.update(write_checkpoint(arch, layers, ckpt, width, seed=0,
                                          max_shard_size=SHARD if width == "real" else "1MB"))
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
        with phase(g), contextlib.redirect_stdout(io.StringIO()) as table, allocator_trace(log) as alloc:
            rc = gate.main(argv)
        g["allocator"] = alloc
        if rc != 0:
            raise RuntimeError(f"the gate returned {rc}")
        g.update(summarise(json.loads((tmp / "gate.json").read_text())))
        if g.get("gate_gpu_peak_bytes") is not None:      # phases inside the gate reset torch's peak counter
            g["gpu_peak_bytes"] = max(g["gpu_peak_bytes"] or 0, g["gate_gpu_peak_bytes"])
        g["table"] = table.getvalue().splitlines()[-40:]
        rec["gate"] = g
        if predict is not None:
            from lab.realscale_predict import default_seconds, gptq_share
            try:
                rec["defaults"] = {"seconds": default_seconds(g, *predict), "gptq": gptq_share(g, predict[1]),
                                   "text": predict[0], "arms": predict[1]}
            except ValueError as e:                           # a kind of arm not measured: no prediction
                rec["defaults"] = {"error": str(e)}
        log(f"{arch} {layers} layers: gate {g['s']:.1f} s, GPU peak {(g['gpu_peak_bytes'] or 0) / 2 ** 30:.1f} GiB, "
            f"host peak {g['host_peak_bytes'] / 2 ** 30:.1f} GiB, groups {g['groups']}, "
            f"gate / forwards {g['seconds'] / max(1e-9, g['timing']['forward_s'] + g['timing']['calibration_forward_s']):.2f}")
    except Exception as e:                                        # recorded; the next depth runs
        rec["error"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc().splitlines()[-40:]}
        log(f"{arch} {layers} layers FAILED: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rec


@contextlib.contextmanager
def allocator_trace(log, every_s: float = 20.0):
    """Yields a dict that ends as torch's CUDA allocator counters over the block (retries: cudaMalloc failed and the
    cache was flushed to retry, the cost of a fragmented pool); meanwhile logs them every `every_s` seconds, so a
    run stopped by a timeout still shows them. Empty without CUDA."""
    out: dict = {}
    if not torch.cuda.is_available():
        yield out
        return
    import threading

    def now() -> dict:
        m = torch.cuda.memory_stats()
        return {"alloc_retries": m.get("num_alloc_retries", 0), "ooms": m.get("num_ooms", 0),
                "reserved_bytes": m.get("reserved_bytes.all.current", 0),
                "allocated_bytes": m.get("allocated_bytes.all.current", 0)}

    start, stop, t0 = now(), threading.Event(), time.time()

    def watch():
        while not stop.wait(every_s):
            c = now()
            log(f"allocator at {time.time() - t0:.0f} s: {c['alloc_retries'] - start['alloc_retries']} retries, "
                f"reserved {c['reserved_bytes'] / 2 ** 30:.1f} GiB, allocated {c['allocated_bytes'] / 2 ** 30:.1f} GiB")

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    try:
        yield out
    finally:
        stop.set()
        th.join()
        end = now()
        out.update({"alloc_retries": end["alloc_retries"] - start["alloc_retries"],
                    "ooms": end["ooms"] - start["ooms"],
                    "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default"})


def write(path, payload: dict, command: str) -> None:
    from lab.provenance import portable_command, write_receipt
    write_receipt(Path(path), payload, command=portable_command(command))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.realscale_gate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", required=True, choices=ARCHS)
    ap.add_argument("--layers", nargs="+", type=int, default=None,
                    help="decoder layers of each measured depth (a fit needs two or more; not with --full)")
    ap.add_argument("--full", action="store_true",
                    help="one run at the published depth, no fit and no warm-up, beside an earlier fit's prediction")
    ap.add_argument("--compare", default=None,
                    help="--full: the receipt of the earlier fit (default data/receipts/realscale_gate_<arch>_h100.json"
                         " where it exists)")
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
    ap.add_argument("--gate-args", default="",
                    help="extra gate flags (fewer documents or arms; each depth is also taken to the defaults by "
                         "lab.realscale_predict), e.g. '--max-docs 20 --lottery 1'")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the small unmeasured gate before each architecture's first depth")
    ap.add_argument("--warmup-full", action="store_true",
                    help="--full: run the small unmeasured gate first too (a second run's time: kernels compiled; "
                         "without it the measured run pays compilation, as a first run on a fresh machine does)")
    return ap


def gpu_cap(max_memory) -> int | None:
    """Bytes --max-memory allows GPU 0 (None without a cap)."""
    from accelerate.utils import convert_file_size_to_int

    from int4lab.gate.models import parse_max_memory
    size = (parse_max_memory(max_memory) or {}).get(0)
    return convert_file_size_to_int(size) if size else None


def check_args(args) -> list:
    """The depths to run per architecture, {arch: [layers]}; ValueError naming the flag and the rule."""
    from int4lab.gate.cli import check_extra_flags, check_settings
    if bool(args.full) == bool(args.layers):
        raise ValueError("--layers: give the depths to measure, or --full; --layers is not with --full")
    if args.layers and (len(set(args.layers)) != len(args.layers) or len(args.layers) < 2):
        raise ValueError(f"--layers: a fit needs two or more distinct depths (--full: one run), got {args.layers}")
    for flag, v in (("--deadline", args.deadline), ("--card-gib", args.card_gib)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"{flag} must be a positive finite number, got {v!r}")
    out = {}
    for arch in args.arch:
        layers = [FULL_LAYERS[arch]] if args.full else sorted(set(args.layers))
        bad = [L for L in layers if not 1 <= L <= FULL_LAYERS[arch]]
        if bad:
            raise ValueError(f"--layers must be in [1, {FULL_LAYERS[arch]}] for {arch}, got {bad}")
        out[arch] = layers
    if args.warmup_full and not args.full:
        raise ValueError("--warmup-full: only with --full (fit mode warms up before each architecture's first depth)")
    if args.max_memory and not args.device_map:
        raise ValueError("--max-memory: needs --device-map (accelerate places the layers by it)")
    check_settings(device=args.device, device_map=args.device_map, max_memory=args.max_memory)
    check_extra_flags(args.gate_args, README_FLAGS, flag="--gate-args")
    return out


def window_of(arch: str, width: str, extra) -> int:
    """The scoring window the gate will use: --window in extra, else the synthetic config's context."""
    from int4lab.gate.cli import check_extra_flags
    return check_extra_flags(extra).window or config_fields(arch, 1, width)["max_position_embeddings"]


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:                              # before anything is built: the flags, where the receipt and the scratch go
        plan = check_args(args)
        from int4lab.files import check_dir_path, check_out_path
        check_out_path(args.out)
        check_dir_path(args.workdir, flag="--workdir")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
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
                "mode": "full depth" if args.full else "fit",
                "warmup": ("before the run" if args.warmup_full else "none") if args.full else
                ("before each architecture's first depth" if args.warmup else "none"),
                "targets": {"gate_s": TARGET_S, "gate_over_forwards": TARGET_RATIO},
                "extrapolation": "q = fixed + layers x per_layer through the measured depths (least squares)"}
    payload = {"settings": settings, "complete": False, "archs": {}}   # complete: set once every depth ran
    failed = 0
    from lab.realscale_predict import default_arms, earlier_fit, full_text_size
    old_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # `timeout` stops with SIGTERM
    try:
        for arch, layers in plan.items():
            a = payload["archs"].setdefault(arch, {"full_layers": FULL_LAYERS[arch], "depths": {}})
            predict = (full_text_size(window_of(arch, args.width, extra)), default_arms(README_FLAGS))
            prev = None
            for L in layers:
                if args.deadline and prev:
                    # the last depth's time, scaled by layers: no bound (low where the depths grow faster than that)
                    need = prev[1] * L / prev[0]
                    left = args.deadline - (time.time() - t_start)
                    if need > left:
                        a["depths"][str(L)] = {"layers": L, "skipped": f"predicted {need:.0f} s, {left:.0f} s left"}
                        log(f"{arch} {L} layers skipped: predicted {need:.0f} s, {left:.0f} s left")
                        continue
                log(f"== {arch}: {L} of {FULL_LAYERS[arch]} layers, {args.width} width")
                rec = measure_depth(arch, L, args.workdir, args.width, args.device, args.device_map, args.max_memory,
                                    extra, log, warmup=prev is None and (args.warmup_full if args.full
                                                                             else args.warmup), predict=predict)
                a["depths"][str(L)] = rec
                failed += "error" in rec
                if rec.get("gate"):
                    prev = (L, rec["gate"]["s"] + rec["synth"]["s"])
                if args.full:
                    a["full"] = full_record(rec, earlier_fit(args.compare, arch))
                else:
                    a["extrapolation"] = extrapolate_arch(arch, a["depths"], card, args.device_map, args.max_memory)
                write(args.out, payload, command)
                log(f"receipt written: {args.out}")
    except BaseException as e:               # Ctrl-C, SIGTERM, an error: what finished is kept, marked partial
        payload["interrupted"] = f"{type(e).__name__}: {e}"[:500]
        write(args.out, payload, command)
        raise
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    payload["complete"] = True
    write(args.out, payload, command)
    return 1 if failed else 0


def full_record(rec: dict, earlier: dict | None) -> dict:
    """What a full-depth run reports: wall time (checkpoint included), peaks, time by phase, gate / forwards,
    and the earlier fit's prediction beside it."""
    g = rec.get("gate")
    if not g:
        return {"error": rec.get("error")}
    tm = g["timing"]
    fw = tm["forward_s"] + tm["calibration_forward_s"]
    return {"wall_s": rec["synth"]["s"] + g["s"], "checkpoint_s": rec["synth"]["s"], "gate_s": g["s"],
            "gpu_peak_bytes": g["gpu_peak_bytes"], "host_peak_bytes": g["host_peak_bytes"],
            "phases": {"load_source_s": tm["load_source_s"], **{f"build_{k}_s": v for k, v in
                                                                 g["build_s_by_kind"].items()},
                       "score_s": tm["score_s"], "floor_s": tm["floor_s"], "bootstrap_s": tm["bootstrap_s"],
                       "parity_s": tm["parity_s"], "gptq_sweep_s": g["gptq_sweep_s"]},
            "arms": g["arms_by_kind"], "groups": g["groups"],
            "gate_over_forwards": g["seconds"] / fw if fw else None, "earlier_fit": earlier}


if __name__ == "__main__":
    sys.exit(main())
