"""Split models (llama.cpp's gguf-split: NAME-00001-of-0000N.gguf, the metadata in the first file,
`split.*` keys in each): opened by the first file and read whole, the same logits as the model in
one file; a missing or inconsistent part is one line naming the file."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import specdec
from specdec.errors import GGUFError
from synth import TinySpec, write_tiny_model


def split(src, stem, n: int, drop_last: bool = False, count_off: int = 0) -> list:
    """Write src's tensors over n files as gguf-split lays them out; the paths."""
    r = gguf.GGUFReader(str(src))
    names = [t.name for t in r.tensors]
    per = -(-len(names) // n)
    paths = []
    for i in range(n):
        path = src.parent / f"{stem}-{i + 1:05d}-of-{n:05d}.gguf"
        w = gguf.GGUFWriter(str(path), r.fields["general.architecture"].contents())
        if i == 0:
            for k, f in r.fields.items():
                if k.startswith("GGUF.") or k == "general.architecture":
                    continue
                if f.types[0] == gguf.GGUFValueType.ARRAY:
                    w.add_array(k, f.contents())
                else:
                    w.add_key_value(k, f.contents(), f.types[0])
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", n)
        w.add_int32("split.tensors.count", len(names) + count_off)
        for t in r.tensors[i * per:(i + 1) * per]:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(path)
    if drop_last:
        paths[-1].unlink()
    return paths


@pytest.mark.parametrize("qtype", [8, 12])                       # Q8_0, Q4_K
def test_a_split_model_reads_whole(tmp_path, qtype):
    src = write_tiny_model(tmp_path / "whole.gguf", TinySpec(qtype=qtype, d_model=256, d_ff=256, seed=4))
    parts = split(src, "tiny", 3)
    for mmap in (True, False):
        whole, joined = specdec.load(str(src), mmap=mmap), specdec.load(str(parts[0]), mmap=mmap)
        assert set(joined.gguf.tensors) == set(whole.gguf.tensors)
        ids = [1, 5, 9, 2, 7]
        a, b = whole.session(16).eval(ids), joined.session(16).eval(ids)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_a_broken_split_is_one_line(tmp_path):
    src = write_tiny_model(tmp_path / "whole.gguf", TinySpec(seed=4))
    first = split(src, "gone", 2, drop_last=True)[0]
    with pytest.raises(GGUFError, match=r"gone-00002-of-00002\.gguf: no such file"):
        specdec.load(str(first))
    first = split(src, "miscount", 2, count_off=1)[0]
    with pytest.raises(GGUFError, match=r"split\.tensors\.count"):
        specdec.load(str(first))
    renamed = first.with_name("renamed.gguf")
    first.rename(renamed)
    with pytest.raises(GGUFError, match="split.count is 2"):
        specdec.load(str(renamed))
