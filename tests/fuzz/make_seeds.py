#!/usr/bin/env python3
"""Regenerates the seed corpora in seeds/ from the fixtures (headers only, small).

seeds/safetensors/: for every fixture *.safetensors, its real header cut down to at most 24 tensors
(real names, dtypes and ranks), once with shapes shrunk so a tiny data section fits (a valid file),
once exactly as in the fixture but without the data (fails on offsets), and the header of the
small expected.safetensors files verbatim with zero-filled data when it is small.
seeds/config/: every fixture config.json verbatim."""
import glob, json, os, shutil, struct

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1,
        "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1}


def image(hdr, data_len):
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data_len)


def main():
    st_dir, cfg_dir = os.path.join(HERE, "seeds", "safetensors"), os.path.join(HERE, "seeds", "config")
    for d in (st_dir, cfg_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    for path in sorted(glob.glob(os.path.join(FIX, "*", "*.safetensors"))):
        model = os.path.basename(os.path.dirname(path))
        stem = os.path.splitext(os.path.basename(path))[0]
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        names = [k for k in hdr if k != "__metadata__"]
        step = max(1, len(names) // 24)
        pick = names[::step][:24]
        real = {k: hdr[k] for k in pick}
        with open(os.path.join(st_dir, f"{model}-{stem}-nodata.safetensors"), "wb") as f:
            f.write(image(real, 0))
        small, off = {}, 0
        for k in pick:
            shape = [min(d, 3) for d in hdr[k]["shape"]]
            nb = SIZE[hdr[k]["dtype"]]
            for d in shape:
                nb *= d
            small[k] = {"dtype": hdr[k]["dtype"], "shape": shape, "data_offsets": [off, off + nb]}
            off += nb
        small["__metadata__"] = {"format": "pt", "source": model}
        with open(os.path.join(st_dir, f"{model}-{stem}-small.safetensors"), "wb") as f:
            f.write(image(small, off))
    for path in sorted(glob.glob(os.path.join(FIX, "*", "config.json"))):
        model = os.path.basename(os.path.dirname(path))
        shutil.copyfile(path, os.path.join(cfg_dir, f"{model}.json"))


main()
