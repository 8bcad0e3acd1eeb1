"""Coverage-guided fuzzing (atheris, libFuzzer) of every decoder the proxy runs on input.

One target picks a decoder from the first bytes of each input: request decoding and
peeking, every decoded response API and version (full decode and the skipping walk),
the frame reader, each decompressor and the OTLP decoder. Any exception other than
``CodecError`` is a finding; libFuzzer then stops and writes the input to a crash-*
file. The seed corpus is the captured vectors.

    python tests/fuzz/atheris_codecs.py -max_total_time=600 CORPUS_DIR

``make fuzz`` runs it; a short run is part of ``make test`` (test_fuzz_harnesses).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from targets import (  # type: ignore[import-not-found]
        decode_response_opaque,
        stream_fetch_response,
        walk_response,
    )

    from kproxy.codecs import api_keys, compression, messages
    from kproxy.codecs.errors import CodecError
    from kproxy.codecs.framing import FrameReader
    from kproxy.codecs.otlp import model as otlp
    from kproxy.codecs.peek import peek_request, peek_response_error
    from kproxy.codecs.registry import DECODED

RESPONSES = [(key, v) for key, api in DECODED.items()
             for v in range(api.response.valid.lo, api.response.valid.hi + 1)]
TARGETS = 6


def one_input(raw: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(raw)
    target = fdp.ConsumeIntInRange(0, TARGETS - 1)
    if target == 0:
        data = fdp.ConsumeBytes(fdp.remaining_bytes())
        run(lambda: messages.decode_request(data))
        run(lambda: peek_request(data))
    elif target == 1:
        key, version = RESPONSES[fdp.ConsumeIntInRange(0, len(RESPONSES) - 1)]
        data = fdp.ConsumeBytes(fdp.remaining_bytes())
        run(lambda: messages.decode_response(data, key, version))
        run(lambda: walk_response(key, version, data))
        run(lambda: decode_response_opaque(key, version, data))
        run(lambda: peek_response_error(data, key, version))
        if key == api_keys.FETCH:
            run(lambda: stream_fetch_response(version, data, 1 + len(data) % 61))
    elif target == 2:
        limit = fdp.ConsumeIntInRange(0, 1 << 16)
        reader = FrameReader(max_frame_bytes=limit)

        def feed() -> None:
            while fdp.remaining_bytes():
                reader.feed(fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 64)))
                for frame in reader.frames():
                    if len(frame) > limit:
                        raise AssertionError("frame over the limit")

        run(feed)
    elif target == 3:
        kind = fdp.ConsumeIntInRange(0, 9)
        limit = fdp.ConsumeIntInRange(1, 1 << 20)
        data = fdp.ConsumeBytes(fdp.remaining_bytes())

        def bounded() -> None:
            if len(compression.decompress(kind, data, limit)) > limit:
                raise AssertionError("decompressed past the bound")

        run(bounded)
    elif target == 4:
        data = fdp.ConsumeBytes(fdp.remaining_bytes())
        run(lambda: otlp.decode_metrics_data(data))
    else:
        data = fdp.ConsumeBytes(fdp.remaining_bytes())
        run(lambda: otlp.to_otlp_json(data, {}))


def run(fn: Callable[[], object]) -> None:
    with contextlib.suppress(CodecError):
        fn()


def write_seed_corpus(folder: Path) -> None:
    """The captured vectors, each prefixed so it lands on the decoder it belongs to."""
    folder.mkdir(parents=True, exist_ok=True)
    vectors = Path(__file__).resolve().parent.parent / "vectors"
    n = 0
    for path in sorted(vectors.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            (folder / f"seed-{n}").write_bytes(b"\0" + bytes.fromhex(row["hex"]))
            n += 1


if __name__ == "__main__":
    corpus = [a for a in sys.argv[1:] if not a.startswith("-")]
    if corpus and not any(Path(c).exists() and any(Path(c).iterdir()) for c in corpus):
        write_seed_corpus(Path(corpus[0]))
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
