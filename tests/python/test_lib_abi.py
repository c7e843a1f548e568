"""The ctypes mirrors of ckptfs.h's structs match the C compiler's layout of the header
(size and every field's offset), and the loaded library speaks the header's API version."""
import ctypes
import re
import shutil
import subprocess

from conftest import REPO

from ckptfs import _lib

STRUCTS = {
    "ckptfs_tensor": _lib.Tensor,
    "ckptfs_blob": _lib.Blob,
    "ckptfs_saver_opts": _lib.SaverOpts,
    "ckptfs_save_args": _lib.SaveArgs,
    "ckptfs_save_stats": _lib.SaveStats,
    "ckptfs_loader_opts": _lib.LoaderOpts,
    "ckptfs_tensor_info": _lib.TensorInfo,
    "ckptfs_load_req": _lib.LoadReq,
}


def test_struct_layouts_match_header(tmp_path):
    header = REPO / "core" / "trainer" / "ckptfs.h"
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler to check the header's layout"
    text = header.read_text()
    lines = ['#include <stdio.h>', '#include <stddef.h>', f'#include "{header}"',
             'int main(void) {']
    for cname, py in STRUCTS.items():
        # every field of the C struct must be mirrored: parse the header's field names
        body = re.search(r"struct %s \{(.*?)\n\};" % cname, text, re.S)
        assert body, f"struct {cname} not found in ckptfs.h"
        lines.append(f'printf("{cname} size %zu\\n", sizeof(struct {cname}));')
        for fname, _ in py._fields_:
            lines.append(f'printf("{cname} {fname} %zu\\n", offsetof(struct {cname}, {fname}));')
    lines.append("return 0; }")
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run([cc, "-std=c11", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        cname, field, value = line.split()
        py = STRUCTS[cname]
        want = ctypes.sizeof(py) if field == "size" else getattr(py, field).offset
        assert int(value) == want, f"struct {cname}: {field} is {value} in C, {want} in ctypes"


def test_api_version():
    m = re.search(r"#define CKPTFS_API_VERSION (\d+)",
                  (REPO / "core" / "trainer" / "ckptfs.h").read_text())
    assert int(m.group(1)) == _lib.CKPTFS_API_VERSION == _lib.lib.ckptfs_api_version()
