"""The real-checkpoint path at real width: synthetic checkpoint -> gate by path -> save / reload -> decode.

    python -m lab.realscale --arch mixtral olmoe qwen3_moe --layers 2 --workdir /tmp/rs \
        --out /tmp/realscale.json                                     # on a GPU: the published widths
    python -m lab.realscale --arch olmoe --layers 2 --width tiny --workdir /tmp/rs --out r.json   # CPU

Per architecture: `lab.synth` writes the published configuration truncated to --layers decoder
layers (sharded safetensors, index, tokenizer); the gate runs on that directory as the CLI would
(`run_gate(path, ...)`: round-to-nearest and GPTQ, experts and experts+attn, the decode instrument's
kernel-parity check) with --device, then once more with device_map="auto" and a max_memory that leaves
only part of the model on the GPU (accelerate's offload across GPU and host, on one machine); the GPTQ
experts+attn model is saved (`save_quantized`) and reloaded (`load_quantized`); greedy decode through the
int4 kernels is timed against the bf16 model. Text budgets are tiny: perplexity on random weights means
nothing, the pipeline is what is measured.

Every per-layer quantity is extrapolated to the published depth (32 / 16 / 48 layers) as
fixed + layers x per_layer, with the numbers written beside the result. Each architecture is measured on
its own (a failed step is recorded with its error and the rest continue), and the receipt is rewritten
after each one, merging with what the file already holds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from lab.synth import ARCHS, FULL_LAYERS, WIDTHS, config_fields, synth_config, write_checkpoint

SCHEMES = ("rtn", "gptq")
TARGETS = ("experts", "experts+attn")


# ------------------------------------------------------------------------------------------ measuring

def host_peak_bytes() -> int:
    """Peak resident host memory of this process since the last `reset_host_peak` (VmHWM; ru_maxrss
    where /proc is absent, which never resets)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_host_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _cuda() -> bool:
    return torch.cuda.is_available()


def _sync() -> None:
    if _cuda():
        torch.cuda.synchronize()


@contextlib.contextmanager
def phase(out: dict):
    """Fill out with seconds, peak GPU bytes (max_memory_allocated) and peak host RSS of the block."""
    _sync()
    if _cuda():
        torch.cuda.reset_peak_memory_stats()
    reset_host_peak()
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        _sync()
        out["s"] = time.perf_counter() - t0
        out["gpu_peak_bytes"] = torch.cuda.max_memory_allocated() if _cuda() else None
        out["host_peak_bytes"] = host_peak_bytes()


def extrapolate(measured: float, layers: int, full_layers: int, fixed: float = 0.0) -> dict:
    """A per-layer quantity at full depth: per_layer = (measured - fixed) / layers,
    full_depth = fixed + full_layers x per_layer; every number written beside the result."""
    per = (measured - fixed) / layers
    return {"measured": measured, "layers": layers, "fixed": fixed, "per_layer": per,
            "full_layers": full_layers, "full_depth": fixed + full_layers * per,
            "formula": f"{fixed:.6g} + {full_layers} x {per:.6g} = {fixed + full_layers * per:.6g}"}


def fit_depths(points: dict, full_layers: int) -> dict:
    """A quantity measured at several depths {layers: value}, fitted as fixed + layers x per_layer (least
    squares; through both points for two depths) and taken to full_layers; every number beside the result.
    One depth: per_layer = value / layers and fixed = 0 (an upper bound on per_layer where a fixed part exists)."""
    pts = sorted((int(k), float(v)) for k, v in points.items() if v is not None)
    if not pts:
        raise ValueError("points must hold at least one measured depth")
    if len(pts) == 1:
        e = extrapolate(pts[0][1], pts[0][0], full_layers)
        e["fit"] = "one depth: fixed taken as 0"
        return e
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        raise ValueError(f"points must hold at least two different depths, got {[x for x, _ in pts]}")
    per = sum((x - mx) * (y - my) for x, y in pts) / sxx
    fixed = my - per * mx
    full = fixed + full_layers * per
    out = {"points": {str(x): y for x, y in pts}, "fixed": fixed, "per_layer": per, "full_layers": full_layers,
           "full_depth": full, "fit": "least squares" if n > 2 else "through both depths",
           "formula": f"{fixed:.6g} + {full_layers} x {per:.6g} = {full:.6g}"}
    out["undecided"] = per < 0
    if per < 0:
        # a cost that grows with depth came out falling: the measured depths do not decide the slope (whatever
        # moved the shallower depth, run-to-run noise or a one-off cost, is not measured by the fit)
        out["warning"] = "per_layer < 0: undecided, the measured depths do not decide how this quantity grows"
    return out


def param_split(arch: str, width: str) -> dict:
    """Parameters of one decoder layer and of the rest (embeddings, final norm, lm_head), counted on the
    meta device from the configs with 1 and 2 layers (exact, nothing allocated)."""
    from transformers import AutoModelForCausalLM
    n = []
    for L in (1, 2):
        with torch.device("meta"):
            m = AutoModelForCausalLM.from_config(synth_config(arch, L, width))
        n.append(sum(p.numel() for p in m.parameters()))
    per = n[1] - n[0]
    return {"per_layer": per, "fixed": n[0] - per}


@torch.no_grad()
def decode_rate(model, prompt: torch.Tensor, steps: int = 16, warmup: int = 4) -> dict:
    """Greedy decode, batch 1: prefill `prompt` [1, P], then `steps` one-token forwards through the KV cache
    (the next token chosen on the device: no host sync per step), timed after `warmup` untimed steps.
    Decoder layers are timed by events around each layer's forward, so the step splits into
    layers x per_layer + fixed (embedding, final norm, lm_head, sampling)."""
    from int4lab.quantize import decoder_layers, input_device
    dev = input_device(model)
    layers = decoder_layers(model)
    marks = []
    on = [False]

    def mark():
        if not on[0]:
            return
        if dev.type == "cuda":
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            marks.append(e)
        else:
            marks.append(time.perf_counter())

    handles = [h for lay in layers for h in (lay.register_forward_pre_hook(lambda *a: mark()),
                                             lay.register_forward_hook(lambda *a: mark()))]

    def run(n):
        o = model(input_ids=prompt.to(dev), use_cache=True)
        past, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
        _sync()
        t0 = time.perf_counter()
        on[0] = True
        for _ in range(n):
            o = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
        _sync()
        on[0] = False
        return time.perf_counter() - t0

    try:
        run(warmup)
        marks.clear()
        total = run(steps)
    finally:
        for h in handles:
            h.remove()
    if dev.type == "cuda":
        layer_s = sum(a.elapsed_time(b) for a, b in zip(marks[0::2], marks[1::2])) / 1e3
    else:
        layer_s = sum(b - a for a, b in zip(marks[0::2], marks[1::2]))
    step = total / steps
    per_layer = layer_s / steps / len(layers)
    return {"steps": steps, "warmup": warmup, "prompt": int(prompt.shape[1]), "step_s": step,
            "tokens_per_s": 1.0 / step, "per_layer_s": per_layer, "fixed_s": step - len(layers) * per_layer,
            "layers": len(layers)}


# ------------------------------------------------------------------------------------------ one architecture

def _summarise_arms(payload: dict) -> dict:
    out = {}
    for name, a in payload["arms"].items():
        rep = a["quant_report"]
        out[name] = {"load_s": a.get("load_s"), "quantise_s": a["quantise_s"], "timing": rep.get("timing", []),
                     "capture_s": rep.get("capture_s"), "hessian_device": rep.get("hessian_device"),
                     "gptq_experts": rep["gptq_experts"], "fallback_experts": len(rep["fallback"]),
                     "calib_tokens": rep["calib_tokens"], "verdict": a["verdict"]}
    return out


def _gptq_per_layer(arms: dict) -> dict:
    """Mean seconds per layer of each GPTQ arm's phases, and per expert matrix (experts_pack_s over the
    expert matrices the layer packed)."""
    out = {}
    for name, a in arms.items():
        rows = [t for t in a["timing"] if "calib_s" in t]
        if not rows:
            continue
        n = len(rows)
        mats = sum(t.get("gptq_matrices", 0) + t.get("rtn_matrices", 0) for t in rows)
        out[name] = {k: sum(t[k] for t in rows) / n for k in ("calib_s", "attn_pack_s", "experts_pack_s",
                                                             "propagate_s")}
        out[name]["per_expert_matrix_s"] = sum(t["experts_pack_s"] for t in rows) / mats if mats else None
        out[name]["expert_matrices_per_layer"] = mats / n
        out[name]["capture_s"] = a["capture_s"]
    return out


def _step(rec: dict, key: str, fn, log) -> object:
    """Run one measurement; on failure record the error under rec["errors"][key] and return None."""
    log(f"{key} ...")
    try:
        r = fn()
        log(f"{key} done")
        return r
    except Exception as e:                                          # recorded, and the next step runs
        rec.setdefault("errors", {})[key] = {"error": f"{type(e).__name__}: {e}",
                                             "traceback": traceback.format_exc().splitlines()[-40:]}
        log(f"{key} FAILED: {type(e).__name__}: {e}")
        return None


def gate_settings(width: str) -> dict:
    """The gate's tiny text budget: perplexity on random weights means nothing; the pipeline is measured
    (the fewest documents per text the gate accepts: int4lab.gate.settings.MIN_DOCS in each of its development
    and held-out splits)."""
    from int4lab.gate.settings import MIN_DOCS
    return {"texts": ("test", "ood"), "max_docs": 2 * MIN_DOCS, "window": 256 if width == "real" else 64, "batch": 8,
            "calib_tokens": 1024 if width == "real" else 256, "calib_len": 256 if width == "real" else 64,
            "min_rows": 16, "n_boot": 200, "parity_steps": 4 if width == "real" else 0}


def measure_arch(arch: str, layers: int, workdir, width: str = "real", split_gpu: str | None = None,
                 log=print) -> dict:
    """Everything the receipt holds for one architecture (see the module docstring); errors recorded.

    The checkpoint and the quantised file go to a fresh directory <workdir>/<arch>-XXXXXX that this call
    creates (tempfile.mkdtemp) and removes when it returns or fails: nothing else under workdir is touched."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{arch}-", dir=workdir))
    try:
        return _measure_arch(arch, layers, work, width, split_gpu, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure_arch(arch: str, layers: int, work: Path, width: str, split_gpu: str | None, log) -> dict:
    from int4lab.gate import plan_arms, run_gate
    from int4lab.gate.models import load_model
    from int4lab.quantize import FORMAT_VERSION, load_quantized, save_quantized

    full = FULL_LAYERS[arch]
    src = work / "checkpoint"
    cuda = _cuda()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    gs = gate_settings(width)
    rec = {"arch": arch, "layers": layers, "full_layers": full, "width": width, "device": device,
           "dtype": str(dtype).replace("torch.", ""), "config": config_fields(arch, layers, width),
           "gate_settings": {k: list(v) if isinstance(v, tuple) else v for k, v in gs.items()}}

    rec["params"] = _step(rec, "params", lambda: param_split(arch, width), log)
    synth = {}

    def do_synth():
        with phase(synth):
            synth.update(write_checkpoint(arch, layers, src, width, seed=0,
                                          max_shard_size="2GB" if width == "real" else "1MB"))
        synth.pop("config", None)
        return synth
    rec["synth"] = _step(rec, "synth", do_synth, log)
    if rec["synth"] is None:
        return rec

    loads, made = [], []

    def loader(device_map=None, max_memory=None):
        def load(dt):
            t0 = time.perf_counter()
            r = load_model(str(src), dt, device, device_map, max_memory)
            _sync()
            loads.append(time.perf_counter() - t0)
            made.append(r[0])
            return r
        return load

    arms = plan_arms(SCHEMES, TARGETS, ("int8",), lottery=0, calib_draws=1)
    kw = dict(dtype=dtype, device=device, texts=gs["texts"], window=gs["window"], batch=gs["batch"], floor=False,
              calib_tokens=gs["calib_tokens"], calib_len=gs["calib_len"], min_rows=gs["min_rows"],
              n_boot=gs["n_boot"], parity_steps=gs["parity_steps"], max_docs=gs["max_docs"], progress=False)

    # 1. the gate by path on one device: RTN and GPTQ, experts and experts+attn, parity through the kernels
    gate = {}
    kept = {}

    def keep(name, model):                 # the arms saved and decoded below (the gate frees the others)
        if name.startswith(("gptq/experts+attn", "rtn/experts/")):
            kept[name] = model

    def do_gate():
        with phase(gate):
            p = run_gate(str(src), arms, loader=loader(), on_arm=keep, **kw)
        gate.update({"load_s": list(loads), "arms": _summarise_arms(p), "parity": p.get("parity"),
                     "seconds_in_gate": p["seconds"]})
        gate["gptq_per_layer"] = _gptq_per_layer(gate["arms"])
        return gate
    rec["gate"] = _step(rec, "gate", do_gate, log)
    models = {"source": made[0], **kept} if rec["gate"] else {}

    # 2. save and reload the GPTQ experts+attn model; decode through the kernels against bf16
    gq = next((n for n in models if n.startswith("gptq/experts+attn")), None)
    rq = next((n for n in models if n.startswith("rtn/experts/")), None)
    ckpt = {}
    qfile = work / "quantized.safetensors"

    def do_save():
        with phase(ckpt.setdefault("save", {})):
            save_quantized(models[gq], qfile)
        ckpt["bytes"] = qfile.stat().st_size
        ckpt["format_version"] = FORMAT_VERSION
        ckpt["model"] = gq
        return ckpt
    if gq:
        rec["checkpoint"] = _step(rec, "save_quantized", do_save, log)
    dec = {}

    def do_decode():
        from int4lab.gate.decode import decode_windows
        from int4lab.gate.texts import documents
        from int4lab.models import load_tokenizer
        prompt = decode_windows(load_tokenizer(), documents("test")[0], windows=1, prompt=8, steps=1)[:, :8]
        for name, key in (("source", "bf16"), (rq, "int4")):
            dec[key] = decode_rate(models[name], prompt)
            dec[key]["model"] = name
        dec["int4_over_bf16_tokens_per_s"] = dec["int4"]["tokens_per_s"] / dec["bf16"]["tokens_per_s"]
        dec["kernels"] = cuda
        dec["source_dtype"] = rec["dtype"]
        return dec
    if rq:
        rec["decode"] = _step(rec, "decode", do_decode, log)
    models.clear()
    kept.clear()
    made.clear()
    _free()

    def do_reload():
        base_t = {}
        n0 = len(loads)
        with phase(base_t):
            base = loader()(dtype)[0]
        ld = {}
        with phase(ld):
            _, sch = load_quantized(qfile, base)
        ckpt["load"] = ld
        ckpt["base_load"] = base_t
        ckpt["base_load_s"] = loads[n0]
        del base
        made.clear()
        return ckpt
    if rec.get("checkpoint"):
        _step(rec, "load_quantized", do_reload, log)
    _free()

    # 3. device_map="auto" with a max_memory that leaves part of the model on the host
    split = {}

    def do_split():
        gpu = split_gpu or _half_gb(synth["bytes"])
        mm = {0: gpu, "cpu": "200GiB"}
        n0 = len(loads)
        split["max_memory"] = {str(k): v for k, v in mm.items()}
        try:
            with phase(split):
                p = run_gate(str(src), [a for a in arms if a.scheme.name.startswith("gptq/experts/")],
                             loader=loader("auto", mm), device_map="auto", max_memory=mm, **kw)
        finally:    # the placement is evidence whether the gate finished or not
            hf_map = getattr(made[0], "hf_device_map", None) if made else None
            split["device_map"] = {k: str(d) for k, d in (hf_map or {}).items()}
            rec["split_placement"] = split["device_map"]
        placed = {}
        for d in split["device_map"].values():
            placed[d] = placed.get(d, 0) + 1
        split.update({"device_map_entries": placed, "load_s": loads[n0:], "arms": _summarise_arms(p),
                      "parity": p.get("parity")})
        made.clear()
        return split
    if cuda:
        rec["gate_split"] = _step(rec, "gate_split", do_split, log)
    else:
        rec["gate_split"] = {"skipped": "no CUDA device: a GPU/host split needs a GPU"}
    _free()
    rec["extrapolation"] = _extrapolate(rec)
    return rec


def _half_gb(nbytes: int) -> str:
    """A GPU max_memory of about half the checkpoint: accelerate must offload the rest to the host."""
    return f"{max(1, round(nbytes / 2 / 2 ** 30))}GiB"


def _free() -> None:
    import gc
    gc.collect()
    if _cuda():
        torch.cuda.empty_cache()


def _extrapolate(rec: dict) -> dict:
    """Full-depth estimates from the measured per-layer quantities (see `extrapolate`)."""
    L, F = rec["layers"], rec["full_layers"]
    out = {}
    ps = rec.get("params")
    if ps:
        n = ps["fixed"] + L * ps["per_layer"]
        out["params"] = extrapolate(n, L, F, ps["fixed"])
        out["bf16_bytes"] = extrapolate(2 * n, L, F, 2 * ps["fixed"])
    s = rec.get("synth")
    if s and ps:
        # loading and writing move bytes: they scale with the checkpoint's size
        frac = lambda x: x * ps["fixed"] / (ps["fixed"] + L * ps["per_layer"])     # noqa: E731
        out["synth_write_s"] = extrapolate(s["save_s"], L, F, frac(s["save_s"]))
        loads = (rec.get("gate") or {}).get("load_s") or []
        if loads:
            out["load_s"] = extrapolate(loads[0], L, F, frac(loads[0]))
    g = rec.get("gate")
    if g:
        for name, a in g["arms"].items():
            if a["timing"] and "pack_s" in a["timing"][0]:
                tot = sum(t["pack_s"] for t in a["timing"])
                out[f"quantise_s {name}"] = extrapolate(tot, L, F)
        for name, v in g["gptq_per_layer"].items():
            per = v["calib_s"] + v["attn_pack_s"] + v["experts_pack_s"] + v["propagate_s"]
            out[f"quantise_s {name}"] = extrapolate(v["capture_s"] + L * per, L, F, v["capture_s"])
    c = rec.get("checkpoint")
    if c and ps:
        q = c["bytes"]
        # the int4 file: lm_head / embeddings / norms are the fixed part, stored as in the source dtype
        fixed = torch.empty(0, dtype=getattr(torch, rec["dtype"])).element_size() * ps["fixed"]
        out["quantized_bytes"] = extrapolate(q, L, F, min(fixed, q))
        if "save" in c:
            out["save_quantized_s"] = extrapolate(c["save"]["s"], L, F)
        if "load" in c:
            out["load_quantized_s"] = extrapolate(c["load"]["s"], L, F)
    d = rec.get("decode")
    if d:
        for key in ("bf16", "int4"):
            x = d[key]
            e = extrapolate(x["step_s"], L, F, x["fixed_s"])
            e["tokens_per_s_full_depth"] = 1.0 / e["full_depth"]
            out[f"decode_step_s {key}"] = e
        out["decode_int4_over_bf16_full_depth"] = (out["decode_step_s bf16"]["full_depth"]
                                                   / out["decode_step_s int4"]["full_depth"])
    return out


# ------------------------------------------------------------------------------------------ CLI

def merge_receipt(path, arch_rec: dict, settings: dict, command: str) -> Path:
    """Add (or replace) one architecture in the receipt at path and rewrite it with fresh provenance."""
    from lab.provenance import portable_command, write_receipt
    path = Path(path)
    old = json.loads(path.read_text()) if path.exists() else {}
    archs = dict(old.get("archs", {}))
    archs[arch_rec["arch"]] = arch_rec
    payload = {"settings": settings, "archs": archs}
    return write_receipt(path, payload, command=portable_command(command))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.realscale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", required=True, choices=ARCHS)
    ap.add_argument("--layers", type=int, required=True, help="decoder layers of each synthetic checkpoint")
    ap.add_argument("--workdir", required=True,
                    help="scratch directory: each architecture writes to a fresh <arch>-XXXXXX inside it and "
                         "removes only that")
    ap.add_argument("--out", default=None,
                    help="receipt path, merged with what it holds (default runs/realscale.json; data/receipts/ "
                         "only when named here)")
    ap.add_argument("--width", choices=WIDTHS, default="real")
    ap.add_argument("--split-gpu", default=None,
                    help="GPU max_memory of the device_map run, e.g. 4GiB (default: half the checkpoint)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from int4lab.files import check_dir_path, check_out_path
    from lab.paths import RUNS
    for arch in args.arch:
        if not 1 <= args.layers <= FULL_LAYERS[arch]:
            print(f"error: --layers must be in [1, {FULL_LAYERS[arch]}] for {arch}, got {args.layers}", file=sys.stderr)
            return 2
    args.out = args.out or str(RUNS / "realscale.json")
    try:                                           # before any work: where the receipt and the scratch go
        check_out_path(args.out)
        if Path(args.out).exists():
            json.loads(Path(args.out).read_text())      # merged into: it must be a receipt already
        check_dir_path(args.workdir, flag="--workdir")
        if args.split_gpu is not None:
            from int4lab.gate.models import parse_max_memory
            try:
                parse_max_memory([f"0={args.split_gpu}"])
            except ValueError:
                raise ValueError(f"--split-gpu must be a size with a unit, e.g. 4GiB or 500MB, got "
                                 f"{args.split_gpu!r}") from None
    except json.JSONDecodeError as e:
        print(f"error: --out {args.out!r} exists and is not JSON ({e}): the receipt is merged into it", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t_start = time.time()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')} +{time.time() - t_start:6.1f}s] {msg}", flush=True)

    settings = {"layers": args.layers, "width": args.width, "schemes": list(SCHEMES), "targets": list(TARGETS),
                "extrapolation": "fixed + full_layers x per_layer (per_layer = (measured - fixed) / layers)"}
    command = "python -m lab.realscale " + " ".join(argv if argv is not None else sys.argv[1:])
    # `timeout` stops a run with SIGTERM: exit through Python so measure_arch's cleanup still runs
    old_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return _run_archs(args, settings, command, log)
    finally:
        signal.signal(signal.SIGTERM, old_handler)


def _run_archs(args, settings, command, log) -> int:
    failed = 0
    for arch in args.arch:
        log(f"== {arch}: {args.layers} layers, {args.width} width")
        try:
            rec = measure_arch(arch, args.layers, args.workdir, args.width, args.split_gpu, log)
        except Exception as e:                                  # one architecture's failure keeps the others
            rec = {"arch": arch, "layers": args.layers, "width": args.width,
                   "errors": {"measure": {"error": f"{type(e).__name__}: {e}",
                                          "traceback": traceback.format_exc().splitlines()[-40:]}}}
        failed += bool(rec.get("errors"))
        merge_receipt(args.out, rec, settings, command)
        log(f"== {arch} written to {args.out}" + (f" (errors: {sorted(rec['errors'])})" if rec.get("errors") else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
