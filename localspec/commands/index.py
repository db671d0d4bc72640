"""``localspec index PATH... --model MODEL -o STORE``: build a REST datastore from your files.

The corpus (files, folders walked recursively, glob patterns) is tokenized with
MODEL's own tokenizer, loaded alone (``vocab_only``: no weights), and written
as one store that records the tokenizer's fingerprint, so ``--draft
rest:STORE`` refuses it for a model that tokenizes differently. MODEL is
required: a store built for the wrong tokenizer is useless, and nothing in the
corpus says which model it is meant for.

stdout gets the store's path (or, with ``--json``, one JSON summary); what was
indexed and skipped goes to stderr.

``localspec index --verify STORE [--model MODEL]`` reads a store whole and
checks it: its structure and every array's checksum, and with MODEL also that
it was built for MODEL's tokenizer and holds no id outside its vocabulary.
One line on stdout when it is sound; one error line and exit 2 when not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from localspec.errors import InvalidOptionError, OutputPathError, shown


def register(subparsers: Any) -> None:
    """Add the ``index`` subcommand."""
    p = subparsers.add_parser(
        "index",
        help="build a datastore for --draft rest:STORE from your files",
        description="Tokenize text files with a model's tokenizer and write a suffix-array datastore "
                    "for REST drafting (--draft rest:STORE). Binary and non-UTF-8 files are skipped "
                    "and counted. Prints the store's path on stdout and a summary on stderr. "
                    "With --verify STORE, checks an existing store instead.",
    )
    # PATH, --model and -o are required to build; run() says so in one line,
    # since --verify STORE needs none of them.
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="files, folders (walked recursively; hidden entries skipped) or glob patterns "
                        "(quote them; ** allowed)")
    p.add_argument("--model", "-m", metavar="MODEL",
                   help="the model the store is for: a name from `localspec models` or a GGUF path "
                        "(only its tokenizer is loaded); required to build")
    p.add_argument("--output", "-o", metavar="STORE",
                   help="the store file to write, e.g. notes.lsstore (an existing store is replaced); "
                        "required to build")
    p.add_argument("--verify", metavar="STORE",
                   help="check an existing store instead of building one: read it whole against its "
                        "checksums (with --model, also its tokenizer and token ids)")
    p.add_argument("--offline", action="store_true", help="never download: use only models already on disk")
    p.add_argument("--json", action="store_true", help="print one JSON summary on stdout instead of the path")
    p.set_defaults(func=run)


def check_output(path: Path) -> None:
    """Refuse an output that cannot take the store (``paths.output_path``: a folder, a FIFO, a device,
    a missing or unwritable folder) or would overwrite a file that is not a store. A symlink to a
    store is written through: the store it points at is replaced, the link kept."""
    from localspec.drafting.suffix_array import MAGIC
    from localspec.paths import output_path

    real = output_path(path, name=f"-o {shown(str(path), 120, quote='')}")
    if real.exists():  # a regular file by now: reading its head cannot block
        try:
            with open(real, "rb") as f:
                head = f.read(len(MAGIC))
        except OSError as err:
            raise InvalidOptionError(f"-o {path} cannot be read: {err.strerror or err}") from None
        if head != MAGIC:
            raise InvalidOptionError(f"-o {path} exists and is not a localspec store; "
                                     "choose another name or delete it first")


def run(args: argparse.Namespace) -> int:
    from localspec.backend import Model
    from localspec.commands.refs import resolve_model
    from localspec.drafting.corpus import build_store_from_corpus, iter_corpus
    from localspec.errors import StoreError
    from localspec.models.gguf_info import tokenizer_fingerprint

    if args.verify is not None:
        if args.paths or args.output is not None:
            raise InvalidOptionError("--verify STORE checks a store and takes no PATH or -o; "
                                     "drop --verify to build a store")
        return verify(args)
    if not args.paths:
        raise InvalidOptionError("name what to index: localspec index PATH... --model MODEL -o STORE "
                                 "(or --verify STORE to check a store)")
    if args.model is None:
        raise InvalidOptionError("--model MODEL is required: the store is tokenized with that model's tokenizer")
    if args.output is None:
        raise InvalidOptionError("-o STORE is required: the store file to write, e.g. -o notes.lsstore")
    out = Path(args.output)
    check_output(out)
    # Check every PATH (and that some text is there) before a model is resolved or downloaded.
    if next(iter_corpus(args.paths), None) is None:
        raise StoreError(f"no text files to index under {', '.join(args.paths)} "
                         "(binary and non-UTF-8 files are skipped)")
    model_path = resolve_model(args.model, offline=args.offline)
    fingerprint = tokenizer_fingerprint(model_path)
    model = Model(model_path, vocab_only=True)
    progress = progress_line(sys.stderr)
    try:
        build = build_store_from_corpus(args.paths, lambda text: model.tokenize(text, add_special=False),
                                        fingerprint, out, progress=progress)
    except OSError as err:  # checked before, but the disk may fill (or the folder vanish) meanwhile
        raise OutputPathError(f"-o {shown(str(out), 120, quote='')}: the store could not be written "
                              f"({err.strerror or err}); the previous file, if any, is untouched") from None
    finally:
        model.close()
        if progress is not None:
            sys.stderr.write("\r\x1b[K")  # the progress line gives way to the summary (or the error)
    corpus = build.corpus
    summary = {
        "store": str(out),
        "store_bytes": out.stat().st_size,
        "model": str(model_path),
        "fingerprint": fingerprint,
        "files": corpus.files,
        "documents": build.documents,
        "bytes": corpus.bytes,
        "tokens": build.tokens,
        "seconds": round(build.seconds, 3),
        "skipped": {"binary": corpus.binary, "undecodable": corpus.undecodable, "unreadable": corpus.unreadable},
        "lossy": corpus.lossy,
    }
    print(format_summary(summary), file=sys.stderr)
    if args.json:
        json.dump(summary, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(out)
    return 0


def progress_line(stream: Any, every_s: float = 0.25) -> Callable[[str, int, int], None] | None:
    """On a terminal, one line that ``build_store_from_corpus`` keeps up to date (MB read, then the
    sort); None elsewhere (a log gets the summary only)."""
    if stream is None or not stream.isatty():
        return None
    shown_at = [-every_s]

    def show(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if stage == "tokenizing" and done < total and now - shown_at[0] < every_s:
            return
        shown_at[0] = now
        if stage == "tokenizing":
            pct = f" ({100 * done // total}%)" if total else ""
            line = f"tokenizing {done / 1e6:,.1f} of {total / 1e6:,.1f} MB{pct}"
        else:
            line = f"sorting the suffixes of {done:,} tokens"
        # \r and erase-to-end: the summary line that follows overwrites it.
        stream.write(f"\r\x1b[Klocalspec: indexing: {line}\r")
        stream.flush()

    return show


def verify(args: argparse.Namespace) -> int:
    """``--verify STORE``: the full check (Store.verify); StoreError when it fails."""
    from localspec.drafting.suffix_array import open_store

    fingerprint = n_vocab = None
    if args.model is not None:
        from localspec.commands.refs import resolve_model
        from localspec.models.gguf_info import read_info, tokenizer_fingerprint

        model_path = resolve_model(args.model, offline=args.offline)
        fingerprint, n_vocab = tokenizer_fingerprint(model_path), read_info(model_path).n_vocab
    with open_store(args.verify, fingerprint, n_vocab=n_vocab) as store:
        store.verify(n_vocab)
        result = {"store": args.verify, "sound": True, "tokens": len(store) - len(store.doc_starts),
                  "documents": len(store.doc_starts), "fingerprint": store.fingerprint,
                  "model": args.model}
    if args.json:
        json.dump(result, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        model = f"built for {Path(args.model).name}'s tokenizer" if args.model else \
            f"tokenizer {store.fingerprint[:12]}…; add --model MODEL to check it is that model's"
        print(f"store {args.verify} is sound: {result['tokens']:,} tokens in {result['documents']:,} documents, "
              f"every checksum matches ({model})")
    return 0


def format_summary(s: dict[str, Any]) -> str:
    """Human lines for stderr: what was indexed, what was skipped and why, the store."""
    from localspec.models.hub_errors import human_size

    rate = s["bytes"] / s["seconds"] if s["seconds"] > 0 else 0.0
    model = Path(s["model"]).name
    lines = [f"localspec: indexed {s['files']} files ({human_size(s['bytes'])}) with {model}'s tokenizer: "
             f"{s['tokens']:,} tokens in {s['seconds']:.2f} s ({human_size(int(rate))}/s)"]
    reasons = [(s["skipped"]["binary"], "binary"), (s["skipped"]["undecodable"], "not UTF-8"),
               (s["skipped"]["unreadable"], "unreadable")]
    skipped = sum(len(paths) for paths, _ in reasons)
    if skipped:
        lines.append(f"localspec: skipped {skipped}: "
                     + "; ".join(f"{len(paths)} {why} ({_names(paths)})" for paths, why in reasons if paths))
    if s["lossy"]:
        lines.append(f"localspec: {len(s['lossy'])} files had invalid UTF-8 past their start, replaced by U+FFFD "
                     f"({_names(s['lossy'])})")
    lines.append(f"localspec: store {s['store']} ({human_size(s['store_bytes'])})")
    return "\n".join(lines)


def _names(paths: list[str], shown: int = 3) -> str:
    names = ", ".join(paths[:shown])
    return names + (f", … {len(paths) - shown} more" if len(paths) > shown else "")
