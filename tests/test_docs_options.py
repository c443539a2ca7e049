"""The options and defaults the guide quotes are those of the code (tests/docs_options.py).

A page that shows ``dgc(named_parameters, momentum=0.9)`` as the factory's signature while the
default is None, or a block commented ``# the default`` with another value, or an option name
no factory takes, fails here with the page and line.
"""
from __future__ import annotations

import pytest

import docs_options as opts

QUOTES = opts.all_quotes()


def _describe(q: opts.Quote) -> str:
    about = f" (codec {q.codec})" if q.codec else ""
    return f"{q.where}: {q.target}{about} option {q.option}={q.value!r}"


def test_the_pages_quote_options():
    """The collector finds what it is meant to check (so an empty scan cannot pass)."""
    targets = {q.target for q in QUOTES}
    assert {"Compression.onebit", "Compression.dgc", "Compression.qsgd", "prose"} <= targets, targets
    assert sum(q.is_default for q in QUOTES) >= 10, [_describe(q) for q in QUOTES if q.is_default]


def test_quoted_options_exist():
    unknown = [_describe(q) for q in QUOTES if q.target != "prose" and not opts.lookup(q)[0]]
    assert not unknown, "the guide quotes options the code does not take:\n" + "\n".join(unknown)


def test_quoted_defaults_are_the_code_defaults():
    wrong = []
    for q in QUOTES:
        if not q.is_default or q.target == "prose" or q.value is ...:
            continue
        error = opts.default_quote_error(q)
        if error:
            wrong.append(f"{_describe(q)} is quoted as the default; {error}")
    assert not wrong, "\n".join(wrong)


def _default_quotes(kind: str, text: str):
    found = opts.page_quotes("x.md", text) if kind == "page" else opts.block_quotes("x.md", 1, text)
    return [q for q in found if q.is_default]


@pytest.mark.parametrize("kind, text, expect, says, fixed", [
    # a default that depends on the optimizer, quoted as its SGD value in a signature
    ("page", "| DGC | `dgc(named_parameters, density=0.001, momentum=None)` |", "density=0.001", "quote None",
     ("density=0.001", "density=None")),
    # the factories' default (the codec's adapter_defaults) is not the codec constructor's
    ("block", "c = hgc.Compression.codec('qsgd', named, norm='l2')  # the default\n", "norm='l2'", "'max'",
     ("'l2'", "'max'")),
])
def test_an_effective_default_quoted_wrongly_is_caught(kind, text, expect, says, fixed):
    quotes = [q for q in _default_quotes(kind, text) if f"{q.option}={q.value!r}" == expect]
    assert quotes, _default_quotes(kind, text)
    error = opts.default_quote_error(quotes[0])
    assert error and says in error, error
    right = _default_quotes(kind, text.replace(*fixed))
    assert right and not any(opts.default_quote_error(q) for q in right), right


def test_prose_defaults_are_the_code_defaults():
    wrong = [f"{_describe(q)}: no factory or codec has this default" for q in QUOTES
             if q.target == "prose" and not opts.prose_default_holds(q)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("line, expect", [
    ("| DGC | `dgc(named_parameters, density=0.001, momentum=0.9)` |", "momentum=0.9"),
    ("Set `ramp_steps` (default 30) to change it.", "ramp_steps=30"),
    ("Pass `scales=\"columns\"` (the default).", "scales='columns'"),
])
def test_a_wrong_default_is_caught(line, expect):
    """Each kind of quote, written with a wrong default, is found and flagged."""
    quotes = [q for q in opts.page_quotes("x.md", line) if q.is_default]
    assert any(f"{q.option}={q.value!r}" == expect for q in quotes), quotes
    bad = [q for q in quotes if f"{q.option}={q.value!r}" == expect][0]
    if bad.target == "prose":
        assert not opts.prose_default_holds(bad)
    else:
        assert opts.lookup(bad)[1] != bad.value


def test_a_wrong_commented_default_in_a_block_is_caught():
    code = ("import horovod_gradcomp as hgc\n"
            "c = hgc.Compression.onebit(named,\n"
            "                           warmup_steps=5,   # the default\n"
            "                           impl='reference')  # or native\n")
    quotes = list(opts.block_quotes("x.md", 1, code))
    by_name = {q.option: q for q in quotes}
    assert by_name["warmup_steps"].is_default and not by_name["impl"].is_default
    assert opts.lookup(by_name["warmup_steps"]) == (True, 0)


def test_documented_errors_are_exported():
    """Every exception the Errors reference renders, and every ``hgc.X`` / ``hgc.ddp.X`` error the
    Troubleshooting page names, is importable from there and is an exception class."""
    import re
    import horovod_gradcomp as hgc
    from docs_blocks import ROOT
    reference = (ROOT / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    rendered = re.findall(r"^::: horovod_gradcomp\.[\w.]+\.(\w+)$", reference, re.M)
    assert len(rendered) >= 4, rendered
    for name in rendered:
        assert name in hgc.__all__ and issubclass(getattr(hgc, name), Exception), name
    pages = reference + (ROOT / "docs" / "guide" / "troubleshooting.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`hgc\.((?:ddp\.)?\w+Error)`", pages))
    assert {"ExchangeMismatchError", "ddp.DDPExchangeError"} <= named, named
    for dotted in named:
        obj = hgc
        for part in dotted.split("."):
            obj = getattr(obj, part)
        assert isinstance(obj, type) and issubclass(obj, Exception), dotted


def test_every_exported_error_is_in_the_reference():
    """The reverse: each exception class the package exports (``hgc.X``, ``hgc.ddp.X``) is
    rendered by the Errors reference or named there as ``hgc.X``."""
    import re
    import horovod_gradcomp as hgc
    from docs_blocks import ROOT
    reference = (ROOT / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^::: horovod_gradcomp\.[\w.]+\.(\w+)$", reference, re.M))
    listed |= set(re.findall(r"`hgc\.((?:ddp\.)?\w+)`", reference))
    exported = {name for name in hgc.__all__
                if isinstance(getattr(hgc, name), type) and issubclass(getattr(hgc, name), Exception)}
    exported |= {f"ddp.{name}" for name in getattr(hgc.ddp, "__all__", [])
                 if isinstance(getattr(hgc.ddp, name), type) and issubclass(getattr(hgc.ddp, name), Exception)}
    assert exported, "no exported exception found: the scan is broken"
    missing = sorted(exported - listed)
    assert not missing, f"docs/reference/errors.md does not document these exported exceptions: {missing}"
