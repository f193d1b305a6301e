"""Rewrite Bazel's Debian classpath file so every jar it needs is found inside a private prefix.

Debian's jars name their own dependencies by absolute `Class-Path:` entries in their manifests
(/usr/share/java/...). Unpacked into a prefix, those paths do not exist, so the Bazel server dies
with NoClassDefFoundError. This walks the manifest closure and writes the relocated list back.
Usage: python3 relocate_classpath.py PREFIX_ROOT
"""
import os
import sys
import zipfile


def manifest_classpath(jar):
    try:
        text = zipfile.ZipFile(jar).read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (KeyError, zipfile.BadZipFile, OSError):
        return []
    # Manifest lines continue on the next line when it starts with one space.
    text = text.replace("\r\n", "\n").replace("\n ", "")
    for line in text.split("\n"):
        if line.startswith("Class-Path:"):
            return line[len("Class-Path:"):].split()
    return []


def main(root):
    listing = os.path.join(root, "usr/share/bazel/bazel_classpath_debian_depends.txt")
    pending = []
    for line in open(listing):
        p = line.strip()
        if p:
            pending.append(p[len(root):] if p.startswith(root) else p)
    closure = []
    while pending:
        p = pending.pop(0)
        if p in closure or not os.path.exists(root + p):
            continue
        closure.append(p)
        for entry in manifest_classpath(root + p):
            pending.append(entry if entry.startswith("/") else os.path.join(os.path.dirname(p), entry))
    with open(listing, "w") as fh:
        fh.writelines(root + p + "\n" for p in closure)


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"))
