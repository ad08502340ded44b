"""What fuzz/python found in the .npy and safetensors header parsers
(docs/fuzzing.md), each kept here as the behaviour it holds."""

import base64

import pytest

import upager
from upager import npy

#: An .npy header numpy cannot tokenize (a byte 0xcd in a record dtype):
#: numpy.lib.format raised tokenize.TokenError, which read_header and
#: load let out instead of their documented ValueError.
UNTOKENIZABLE = base64.b64decode(
    "k05VTVBZAQB2AHsnZGVzY3InOiBbKCdhJywgJzxpMifNLCAoJ2InLCAnPmY0JyldLCAnZm9ydHJhbl9v"
    "cmRlcic6IEZhbHNlLCAnc2hhcGUnOiAoMSwpLCB9ICAgICAgICAgICAgICAgICAgICAgICAgICAgICAg"
    "ICAgICAgIAoBAEAAAAA=")


def test_an_npy_header_numpy_cannot_tokenize_is_a_value_error(tmp_path):
    p = tmp_path / "x.npy"
    p.write_bytes(UNTOKENIZABLE)
    with pytest.raises(ValueError, match="is not an .npy file: its header cannot be read"):
        npy.read_header(str(p))
    with pytest.raises(ValueError, match="is not an .npy file"):
        upager.load(str(p), mmap_mode="r")
