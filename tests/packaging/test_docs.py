"""The committed API reference and environment page are what tools/gen_api_docs.py renders from
today's docstrings (regenerate with `bazel run //tools:gen_api_docs`), every FRAY_* variable the
package reads is documented, and the guide's links resolve."""
import os
import re
import sys

sys.path.insert(0, "tools")  # tools/gen_api_docs.py, in runfiles
import gen_api_docs  # noqa: E402


def test_generated_pages_are_current():
    for name, render in gen_api_docs.FILES.items():
        committed = open(os.path.join("docs", name)).read()
        assert committed == render(), "docs/%s is stale: bazel run //tools:gen_api_docs" % name


def test_every_fray_variable_is_documented():
    # FRAY_* variables are read in python/fray/env.py alone (elsewhere FRAY_ names are macros of
    # generated CUDA sources, e.g. FRAY_GEMM_ENTRY); the second test holds the rest of the package to it.
    used = set(re.findall(r"FRAY_[A-Z0-9_]+", open("python/fray/env.py").read()))
    documented = set(re.findall(r"FRAY_[A-Z0-9_]+", open("docs/environment.md").read()))
    assert used - documented == set(), "undocumented: %s" % sorted(used - documented)


def test_no_fray_variable_is_read_outside_env_py():
    for root, _, files in os.walk("python/fray"):
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(".py") and path != os.path.join("python", "fray", "env.py"):
                text = open(path).read()
                reads = re.findall(r"(?:environ(?:\.get)?\(?\[?|getenv\()\s*[\"'](FRAY_[A-Z0-9_]+)", text)
                assert not reads, "%s reads %s: read FRAY_* variables in python/fray/env.py" % (path, reads)


def test_guide_links_resolve():
    # Links may point anywhere in the checkout (examples/consumer is not a label of this
    # repository): resolve them in the source tree the runfiles link to.
    root = os.path.dirname(os.path.dirname(os.path.realpath("docs/README.md")))
    pages = [os.path.join("docs", f) for f in os.listdir("docs") if f.endswith(".md")]
    pages += [os.path.join("docs", "families", f) for f in os.listdir("docs/families")] + ["README.md"]
    assert len(pages) > 10, pages
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", open(page).read()):
            if "://" in target:
                continue
            path = os.path.normpath(os.path.join(root, os.path.dirname(page), target))
            assert os.path.exists(path), "%s links to %s, which does not exist" % (page, target)
