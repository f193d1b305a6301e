"""Builds a wheel from the arguments rules_python's py_wheel rule (0.22.x) passes.

Only what Fray's wheel needs: files (arcname;path), METADATA (+ description), WHEEL, optional
entry points and extra dist-info files, RECORD with sha256 digests, fixed timestamps so that the
same inputs give the same bytes.
"""
import argparse
import base64
import hashlib
import os
import re
import zipfile

FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def read_status(paths):
    values = {}
    for p in paths:
        if p:
            with open(p) as fh:
                for line in fh:
                    key, _, value = line.rstrip("\n").partition(" ")
                    values[key] = value
    return values


class Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname, data, executable=False):
        info = zipfile.ZipInfo(arcname, date_time=FIXED_TIME)
        info.external_attr = (0o100755 if executable else 0o100644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append("%s,sha256=%s,%d" % (arcname, digest, len(data)))

    def close(self, record_name):
        lines = self.record + ["%s,," % record_name]
        info = zipfile.ZipInfo(record_name, date_time=FIXED_TIME)
        info.external_attr = 0o100644 << 16
        self.zip.writestr(info, "\n".join(lines) + "\n")
        self.zip.close()


def main():
    ap = argparse.ArgumentParser()
    for flag in ("name", "version", "python_tag", "abi", "platform", "out", "name_file",
                 "volatile_status_file", "stable_status_file", "input_file_list",
                 "metadata_file", "entry_points_file", "description_file"):
        ap.add_argument("--" + flag)
    ap.add_argument("--strip_path_prefix", action="append", default=[])
    ap.add_argument("--input_file", action="append", default=[])
    ap.add_argument("--extra_distinfo_file", action="append", default=[])
    a = ap.parse_args()

    status = read_status([a.stable_status_file, a.volatile_status_file])
    version = re.sub(r"\{(\w+)\}", lambda m: status.get(m.group(1), m.group(0)), a.version)
    distinfo = "%s-%s.dist-info" % (re.sub(r"[^\w\d.]+", "_", a.name), version)

    entries = list(a.input_file)
    if a.input_file_list:
        with open(a.input_file_list) as fh:
            entries += [line.strip() for line in fh if line.strip()]

    wheel = Wheel(a.out)
    for entry in sorted(entries):
        arcname, path = entry.split(";", 1)
        for prefix in a.strip_path_prefix:
            if arcname.startswith(prefix):
                arcname = arcname[len(prefix):]
                break
        with open(path, "rb") as fh:
            wheel.add(arcname, fh.read(), executable=os.access(path, os.X_OK))

    with open(a.metadata_file) as fh:
        metadata = fh.read()
    metadata = metadata.replace("Name: %s\n" % a.name, "Name: %s\nVersion: %s\n" % (a.name, version), 1)
    if a.description_file:
        with open(a.description_file) as fh:
            metadata += "\n" + fh.read()
    wheel.add(distinfo + "/METADATA", metadata.encode())

    pure = a.abi == "none" and a.platform == "any"
    tags = ["%s-%s-%s" % (p, b, f) for p in a.python_tag.split(".")
            for b in a.abi.split(".") for f in a.platform.split(".")]
    text = "Wheel-Version: 1.0\nGenerator: fray-wheelmaker\nRoot-Is-Purelib: %s\n" % str(pure).lower()
    wheel.add(distinfo + "/WHEEL", (text + "".join("Tag: %s\n" % t for t in tags)).encode())
    if a.entry_points_file:
        with open(a.entry_points_file, "rb") as fh:
            wheel.add(distinfo + "/entry_points.txt", fh.read())
    for item in a.extra_distinfo_file:
        name, path = item.split(";", 1)
        with open(path, "rb") as fh:
            wheel.add(distinfo + "/" + name, fh.read())
    wheel.close(distinfo + "/RECORD")

    with open(a.name_file, "w") as fh:
        fh.write(os.path.basename(a.out))


if __name__ == "__main__":
    main()
