"""fray/__init__.pyi matches the runtime API: every public function fray exports is typed there,
with the same parameter names, kinds and defaults (the first overload is compared), and the stub
names nothing fray does not export."""
import ast
import inspect

import fray
import torch

_KINDS = {"posonly": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
          "kwonly": inspect.Parameter.KEYWORD_ONLY}


def _stub_functions():
    tree = ast.parse(open("python/fray/__init__.pyi").read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name not in out:
            out[node.name] = node
    return out


def _default(node):
    """A stub default: a literal, or a torch attribute (torch.int8 and the other dtypes)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        return getattr(torch, node.attr)
    return ast.literal_eval(node)


def _stub_params(fn):
    a = fn.args
    params = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        kind = "posonly" if i < len(a.posonlyargs) else "args"
        params.append((arg.arg, _KINDS[kind], inspect.Parameter.empty if d is None else _default(d)))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append((arg.arg, _KINDS["kwonly"], inspect.Parameter.empty if d is None else _default(d)))
    return params


def test_every_public_function_is_typed_with_its_runtime_signature():
    stub = _stub_functions()
    # Every family's __all__ (what fray/__init__.py re-exports) and the seed's kernel timer.
    public = {n for module in fray.FAMILIES.values() for n in module.__all__} | {"bench_kineto"}
    assert public - set(stub) == set(), "untyped in fray/__init__.pyi: %s" % sorted(public - set(stub))
    assert set(stub) - public == set(), "typed but not public: %s" % sorted(set(stub) - public)
    for name in sorted(public):
        runtime = [(p.name, p.kind, p.default) for p in inspect.signature(getattr(fray, name)).parameters.values()]
        assert _stub_params(stub[name]) == runtime, "%s: stub %s != runtime %s" % (name, _stub_params(stub[name]), runtime)


def test_the_stub_declares_the_exported_data():
    tree = ast.parse(open("python/fray/__init__.pyi").read())
    names = {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign)}
    names |= {a.asname for t in tree.body if isinstance(t, ast.ImportFrom) and t.module == "fray" for a in t.names}
    for n in fray.__all__:
        if not inspect.isfunction(getattr(fray, n)):
            assert n in names, "%s exported by fray but not declared in fray/__init__.pyi" % n
