"""``localspec doctor``: is this install sound on this machine?

Prints the llama.cpp build (version, CPU features compiled in, AMX, llamafile's
sgemm, CUDA, batch invariance), the GPUs with their free memory, the folders
localspec uses, whether the default model is on disk, and the result of a
self-test decode run in a child process (so a crashing build is one line, not a
dead terminal). With ``--draft``, which kind of pair the model and that draft
make (same vocabulary, or another tokenizer drafting by text) and what it costs,
from their GGUF headers. Exit 0 when sound, 1 when the self-test failed or the
pair cannot run, 3 when llama.cpp died by a signal (``scripts/setup.sh`` then
removes the build it just installed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from localspec import doctor
from localspec.commands.flags import MODEL_REF_HELP
from localspec.commands.refs import OFF
from localspec.models.hub_errors import human_size

EXIT_FAILED = 1
EXIT_CRASHED = 3


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doctor", help="check the llama.cpp build, GPUs, folders and a self-test decode",
        description="Report the llama.cpp build, GPUs, folders and default model, and run a self-test decode "
                    "(a long prompt in one batch and a verification batch) in a child process.")
    p.add_argument("--model", default=None, metavar="MODEL",
                   help="the model to self-test with: " + MODEL_REF_HELP + " (default: the embedded model)")
    p.add_argument("--draft", metavar="DRAFT", default=None,
                   help="also judge this draft for the model, named as `generate --draft` names it: which kind "
                        "of pair they are (same vocabulary, or another tokenizer drafting by text), what that "
                        "costs, and the model's own-family draft when the registry knows one")
    p.add_argument("--smoke-only", action="store_true",
                   help="only the self-test decode, one line (what scripts/setup.sh runs after installing)")
    p.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT]", default=None,
                   help="also check these ggml rpc-server machines: reachable, protocol, devices and memory")
    p.set_defaults(func=run)


def _model_path(ref: str | None) -> tuple[str, Path | None]:
    if ref is None:
        return doctor.default_model()
    from localspec.commands.refs import resolve_name
    from localspec.models.registry_file import load_registry

    resolved = resolve_name(ref, load_registry())
    if resolved.spec is None:
        return str(resolved.path), resolved.path
    from localspec.models import hub

    return resolved.spec.name, hub.cached_path(resolved.spec)


def _unreadable(path: Path | None) -> str:
    """Why the model file cannot be loaded, read from its header as ``generate`` reads it ("" if it can)."""
    if path is None:
        return ""
    from localspec.errors import ModelFileError
    from localspec.models.gguf_info import read_info

    try:
        read_info(path)
    except ModelFileError as err:
        return str(err)
    return ""


def run(args: argparse.Namespace) -> int:
    if args.smoke_only and args.draft is not None:
        from localspec.errors import InvalidOptionError

        raise InvalidOptionError("--smoke-only runs the self-test alone and judges no pair; drop --smoke-only to see "
                                 "what kind of pair --draft makes")
    name, path = _model_path(args.model)
    # The model named with --model is "model"; the registry's default, when none is named, "default model".
    label = "default model" if args.model is None else "model"
    # A file that is not a loadable GGUF gets generate's own cause, not the child's vaguer one.
    cause = _unreadable(path)
    if cause:
        if args.smoke_only:
            print(f"localspec: error: no self-test: {cause}", file=sys.stderr)
            return EXIT_FAILED
        path_shown = path
        path = None
    from localspec.models.split import parse_endpoints  # pure: loads no llama.cpp

    endpoints = parse_endpoints(args.rpc) if args.rpc is not None else ()  # "" is refused, not ignored
    # The draft's name is checked (and the pair judged from the headers) before the self-test runs.
    pair = _pair(args.model, args.draft, path) if args.draft is not None and not cause else None
    result = doctor.selftest(path, endpoints)
    test = result.records.get("selftest")
    failure = result.failure()
    code = 0 if result.ok else EXIT_CRASHED if result.signal_name else EXIT_FAILED
    servers = result.records.get("rpc", [])
    if code == 0 and any(not s["ok"] for s in servers):
        code = EXIT_FAILED
    if args.smoke_only:
        if path is None:
            print(f"localspec: error: no model to self-test with ({name or 'no default'} is not downloaded); "
                  "run `localspec pull smollm2-135m` first", file=sys.stderr)
            return EXIT_FAILED
        if failure:
            print(f"localspec: error: the llama.cpp self-test {failure}", file=sys.stderr)
        else:
            print(f"localspec: self-test passed{_where(test)}: {test['prompt_tokens']} prompt tokens in one batch, "
                  f"a verification batch of {test['verify_rows']} rows; {_exact_short(test)}", file=sys.stderr)
        return code
    build = result.records.get("build")
    dirs = doctor.folders()
    if args.json:
        model = {"name": name, "path": str(path_shown if cause else path) if (path or cause) else None,
                 "problem": cause or None}
        # "default_model" is the key scripts read; "model" says the same whichever model was tested.
        print(json.dumps({"build": build, "folders": {k: str(v) for k, v in dirs.items()}, "rpc": servers,
                          "default_model": model, "model": model,
                          "selftest": {"ok": result.ok and not cause, "failure": failure or cause,
                                       "result": test},
                          "pair": pair.to_dict() if isinstance(pair, doctor.PairFinding) else None}, indent=2))
        return EXIT_FAILED if cause else _with_pair(code, pair)
    out = []
    if build is None:
        out.append(f"llama.cpp     could not be loaded: {failure}")
    else:
        sgemm = "llamafile sgemm" + (" (its exact kernels only)" if build["sgemm_exact_only"] else "")
        repack = "repacked Q4_K (exact)" if build["repack_q4_k_exact"] else ""
        columns = f"{'/'.join(build['multi_column'])} batches by columns" if build["multi_column"] else ""
        chunks = build["small_batch_chunks"]
        chunked = f"small batches in {chunks} chunks per thread" if chunks else ""
        accel = ", ".join(k for k, on in (("AMX", build["amx"]), (sgemm, build["llamafile_sgemm"]),
                                           (repack, bool(repack)), (columns, bool(columns)),
                                           (chunked, bool(chunked)), ("CUDA", build["cuda"])) if on) or "none"
        out.append(f"llama.cpp     llama-cpp-python {build['llama_cpp_python']}; "
                   f"{'GPU offload' if build['gpu_offload'] else 'CPU only'}")
        out.append(f"patches       {_patches(build)}")
        out.append(f"CPU features  {' '.join(build['cpu_features']) or 'none reported'}")
        out.append(f"special paths {accel}")
        if build["gpus"]:
            out.append("exactness     on the GPU: as the self-test below measures it (model exact)"
                       + _cuda_switch(build.get("cuda_batch_invariant")))
        else:
            out.append(f"exactness     {'batch-invariant (greedy speculation is token-identical)' if build['batch_invariant'] else 'not batch-invariant (greedy speculation may part at near-ties)'}")
        if not build["gpu_offload"]:
            simd = {16: " in AVX-512", 8: " in AVX2", 0: " in plain loops"}.get(build["fa_simd"], "")
            out.append("flash attn    " + (f"on (batch-invariant CPU kernel{simd})" if build["cpu_flash_attention"] else
                                          "off (this build's CPU kernel is batch-dependent; scripts/setup.sh builds one that is not)"))
        gpus = build["gpus"]
        if gpus:
            for g in gpus:
                out.append(f"GPU           {g['name']}: {human_size(g['free'])} free of {human_size(g['total'])}")
        elif build.get("cuda"):
            archs = "/".join(f"sm_{a[:-1]}" for a in build.get("cuda_archs", [])) or "CUDA"
            out.append(f"GPU           none found: this build has CUDA ({archs}) but no driver or GPU answered, "
                       "so it decodes on the CPU")
        else:
            out.append("GPU           none found")
    out.extend(_rpc_lines(endpoints, servers))
    for key, folder in dirs.items():
        out.append(f"{key + ' dir':<13} {folder}{'' if folder.exists() else ' (not created yet)'}")
    if cause:
        out.append(f"{label:<13} {name}: cannot be loaded")
        out.append(f"self-test     skipped: {cause}")
        if args.draft is not None:
            out.append("pair          not judged: the model cannot be loaded")
        print("\n".join(out))
        return EXIT_FAILED
    where = path if path else "not downloaded (`localspec pull " + name + "`)"
    out.append(f"{label:<13} {name}: {where}")
    if path is None:
        out.append("self-test     skipped: no model on disk")
    elif failure:
        out.append(f"self-test     FAILED: {failure}")
    else:
        out.append(f"self-test     ok{_where(test)}: {test['prompt_tokens']} prompt tokens in one batch "
                   f"({test['prefill_ms']:.0f} ms), a verification batch of {test['verify_rows']} rows")
        out.append(f"model exact   {_model_exactness(test)}")
    if args.draft is not None:
        out.append(f"pair          {_pair_line(name, args.draft, pair)}")
    print("\n".join(out))
    return _with_pair(code, pair)


def _pair(model: str | None, draft: str, target: Path | None) -> doctor.PairFinding | None:
    """``--draft`` resolved as ``generate`` resolves it (an unknown name is the same one-line error) and
    judged against the model (``target``: its file, None when not downloaded). None: no draft model."""
    from localspec.commands.refs import check_registry_pair, resolve_draft_refs, resolve_ref, same_family_draft
    from localspec.drafting.by_text import SAME_VOCAB, TEXT_PAIR
    from localspec.errors import LocalspecError
    from localspec.models import hub
    from localspec.models.registry_file import load_registry

    registry = load_registry()
    drafts = resolve_draft_refs(draft, registry)
    if drafts.model is None:
        return None
    target_ref, draft_ref = resolve_ref(model, registry), drafts.model
    try:
        check_registry_pair(target_ref, draft_ref, registry)  # a draft head of another family, refused
    except LocalspecError as err:
        return doctor.PairFinding(draft_ref.name, problem=str(err))
    draft_path = draft_ref.path if draft_ref.spec is None else hub.cached_path(draft_ref.spec)
    missing = target_ref.name if target is None else draft_ref.name
    by_family = None
    if target_ref.spec is not None and draft_ref.spec is not None:
        by_family = SAME_VOCAB if target_ref.spec.family == draft_ref.spec.family else TEXT_PAIR
    return doctor.judge_pair(target, draft_path, draft_ref.name, missing=missing, by_family=by_family,
                             better=same_family_draft(target_ref, registry))


def _pair_line(model: str, draft: str, pair: doctor.PairFinding | None) -> str:
    """The ``pair`` line: which kind of pair, what it costs and what would do better; or why it cannot run."""
    from localspec.drafting.by_text import SAME_VOCAB, TEXT_PAIR, TEXT_PAIR_COST

    if pair is None:
        return "no draft model: " + ("plain decoding" if draft.strip().lower() in (OFF, "none") else
                                     f"{draft} drafts without one")
    if pair.problem:
        return f"cannot run: {pair.problem}"
    head = f"{pair.draft} for {model}: "
    if pair.kind is None:
        return head + f"not judged: {pair.unchecked}"
    if pair.kind == SAME_VOCAB:
        line = head + ("same vocabulary (token ids shared: verified by id with the draft's probabilities, "
                       "no re-encoding)")
    else:
        assert pair.kind == TEXT_PAIR
        better = f"; --draft {pair.better}, of {model}'s own family, would likely be better" if pair.better else ""
        line = head + f"{TEXT_PAIR} ({TEXT_PAIR_COST}){better}"
    return line + (f"; from the registry's families, since {pair.unchecked}" if pair.unchecked else "")


def _with_pair(code: int, pair: doctor.PairFinding | None) -> int:
    """The exit code with the pair judged: a pair that cannot run fails the doctor, as a failed self-test does."""
    return EXIT_FAILED if code == 0 and pair is not None and pair.problem else code


def _rpc_lines(endpoints: tuple[str, ...], servers: list[dict[str, Any]]) -> list[str]:
    """One line per RPC server named: reachable with its devices' memory, or why not."""
    lines = []
    for server in servers:
        if not server["ok"]:
            lines.append(f"RPC server    {server['endpoint']}: NOT usable: {server['problem']}")
            continue
        devices = "; ".join(f"{d['name']} {human_size(d['free'])} free of {human_size(d['total'])}"
                            for d in server["devices"])
        lines.append(f"RPC server    {server['endpoint']}: reachable, protocol {server['version']}; {devices}")
    seen = {s["endpoint"] for s in servers}
    lines += [f"RPC server    {e}: not checked (the check ended first)" for e in endpoints if e not in seen]
    return lines


def _cuda_switch(on: bool | None) -> str:
    """What the exactness line adds about our CUDA batch-invariant switch (None: the build has none)."""
    if on is None:
        return ""
    if on:
        return ("; batch-invariant kernels on (LOCALSPEC_CUDA_BATCH_INVARIANT=1: verification batches of at most "
                "8 rows)")
    return "; LOCALSPEC_CUDA_BATCH_INVARIANT=1 turns on this build's batch-invariant kernels (docs/gpu.md)"


def _patches(build: dict[str, Any]) -> str:
    """Whether the build carries localspec's llama.cpp patches, and what their absence costs."""
    if build.get("patched"):
        return "localspec's exactness and speed patches (scripts/llama.cpp-patches/)"
    return ("none: a stock llama-cpp-python (installed without scripts/setup.sh); greedy speculation then "
            "equals plain decoding only up to near-ties, flash attention stays off on the CPU and batches take "
            "upstream's slower kernels; run scripts/setup.sh to build the patched one")


def _where(test: dict[str, Any]) -> str:
    """Where the self-test ran, as " on NVIDIA GeForce RTX 4090 (33/33 layers offloaded)"; empty on the CPU."""
    device = test.get("device", "cpu")
    if device == "cpu":
        return ""
    layers = test.get("offloaded_layers")
    return f" on {device}" + (f" ({layers[0]}/{layers[1]} layers offloaded)" if layers else "")


def _exact_short(test: dict[str, Any]) -> str:
    """The self-test's batch-vs-single comparison in a few words (setup.sh's one line)."""
    if test["batch_invariant"]:
        return "verification rows bit-identical to one-token decodes"
    same = test.get("argmax_same_rows", test["verify_rows"])
    verdict = ("exact up to near-ties" if same == test["verify_rows"] else
               "greedy speculation may part from plain decoding")
    return (f"verification rows differ from one-token decodes by up to {test['max_logit_diff']:.3g} "
            f"(the same top token in {same}/{test['verify_rows']}): {verdict}")


def _model_exactness(test: dict[str, Any]) -> str:
    """What the self-test's row-by-row comparison says about greedy speculation with this model."""
    if test["batch_invariant"]:
        return (f"yes: {test['verify_rows']} rows decoded in one batch and one at a time gave bit-identical "
                "logits (greedy speculation is token-identical to plain decoding)")
    same = test.get("argmax_same_rows", test["verify_rows"])
    if test.get("device", "cpu") != "cpu":
        return (f"{'up to near-ties' if same == test['verify_rows'] else 'no'}: on the GPU a batch's logits "
                f"differ from one-token decodes by up to "
                f"{test['max_logit_diff']:.3g} (the same top token in {same}/{test['verify_rows']} rows); "
                "llama.cpp's CUDA kernels for a batch are not those for one token, so greedy speculation "
                "can part from plain decoding where two tokens are nearly tied (docs/gpu.md)")
    return (f"no: a batch's logits differ from one-token decodes by up to {test['max_logit_diff']:.3g} "
            "(greedy speculation may part from plain decoding at near-ties; a build from scripts/setup.sh, "
            "with its patches, is batch-invariant for the models it knows)")
