#!/usr/bin/python3
"""Writes an OCI image archive of one layer, a rootfs directory, for `ctr images import`.

usage: oci-image.py ROOTFS OUT.tar NAME

NAME is the image's name in containerd's store (the archive's index annotates its manifest
with io.containerd.image.name). The archive is an OCI image layout: oci-layout, index.json
and blobs/sha256/ holding the layer (an uncompressed tar of ROOTFS), the image config (the
layer's diff id, linux/amd64, PATH=/bin) and the manifest. No registry is involved: the
suite's containerd cases import this instead of pulling an image.
"""
import hashlib
import io
import json
import sys
import tarfile


def blob(out, data):
    """Adds DATA under blobs/sha256/ of the archive OUT; returns its digest and size."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest[len("sha256:"):])
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))
    return {"digest": digest, "size": len(data)}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    rootfs, path, name = sys.argv[1:]
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        t.add(rootfs, arcname=".")
    layer = layer.getvalue()
    with tarfile.open(path, "w") as out:
        layer_desc = blob(out, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
        config_desc = blob(out, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": dict(config_desc, mediaType="application/vnd.oci.image.config.v1+json"),
            "layers": [dict(layer_desc, mediaType="application/vnd.oci.image.layer.v1.tar")],
        }
        manifest_desc = blob(out, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [dict(manifest_desc, mediaType="application/vnd.oci.image.manifest.v1+json",
                               platform={"architecture": "amd64", "os": "linux"},
                               annotations={"io.containerd.image.name": name})],
        }
        for fname, data in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            data = json.dumps(data).encode()
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))


main()
