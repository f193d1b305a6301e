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
    used = set()
    for root, _, files in os.walk("python/fray"):
        for f in files:
            if f.endswith(".py"):
                used |= set(re.findall(r"FRAY_[A-Z0-9_]+", open(os.path.join(root, f)).read()))
    documented = set(re.findall(r"FRAY_[A-Z0-9_]+", open("docs/environment.md").read()))
    assert used - documented == set(), "undocumented: %s" % sorted(used - documented)


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
