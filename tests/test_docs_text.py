"""The guide and the package's own text agree with the code (tests/docs_text.py).

* No message, docstring or page names an internal issue ("until issue 30", "#31").
* Every message a troubleshooting heading quotes is one the package can produce.
* The factories' docstrings list their codec's options, and list only options they take.
"""
from __future__ import annotations

import warnings

import pytest

import docs_text as text


def test_no_internal_issue_number_in_the_package():
    refs = text.code_issue_refs()
    assert not refs, ("messages and docstrings name the project's internal issues; say what the change was "
                      "(history belongs in git and docs/guide/changelog.md):\n" + "\n".join(refs))


def test_no_internal_issue_number_in_the_docs():
    refs = text.doc_issue_refs()
    assert not refs, ("the guide names the project's internal issues (GitHub also links '#N' to an issue); say "
                      "what is meant in words, runs as 'run N':\n" + "\n".join(refs))


@pytest.mark.parametrize("sample, found", [
    ("its default was 300 until issue 30", True),
    ("see Issue #12 and", True),
    ("fixed in #31.", True),
    ("the color #1f77b4, the link [x](page.md#section-2), C#7, run 3", False),
])
def test_issue_references_are_recognized(sample, found):
    assert bool(text.issue_refs(sample)) is found, text.issue_refs(sample)


def test_troubleshooting_headings_quote_real_messages():
    page = text.TROUBLESHOOTING.read_text(encoding="utf-8")
    assert len(text.heading_quotes(page)) >= 10, "the heading scan found too few quoted messages"
    bad = text.unmatched_headings(page, text.message_literals())
    assert not bad, ("docs/guide/troubleshooting.md: headings quoting a message no string literal of "
                     "horovod_gradcomp/ (outside docstrings) contains:\n" + "\n".join(bad))


def test_a_heading_with_no_such_message_is_caught():
    literals = [("m.py:1", ["Compression.dgc keeps the momentum itself (its momentum= option): got "]),
                ("m.py:2", ["hgc.ddp: step ", ", bucket ", " failed on rank ", ""])]
    page = ("## `keeps the momentum itself` (DGC)\n\n## `applies the momentum itself`\n\n"
            "## `hgc.ddp: step S, bucket B failed on rank R`\n\n## `StallError: no progress for T s`\n")
    bad = text.unmatched_headings(page, literals)
    assert [b.split(":")[0] for b in bad] == ["line 3", "line 7"], bad
    assert "applies the momentum itself" in bad[0]


def test_external_messages_are_explained_in_the_package():
    """A heading may quote another program's message only where the package says what it is."""
    from docs_blocks import ROOT
    sources = " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "horovod_gradcomp").rglob("*.py"))
    for message in text.EXTERNAL_MESSAGES:
        assert message in sources, f"{message!r} is listed as an external message the package never mentions"


def test_factory_docstrings_list_their_options():
    problems = text.all_factory_docstring_problems()
    assert not problems, "the Compression factories' docstrings disagree with their signatures:\n" + "\n".join(
        f"Compression.{name}: {p}" for name, ps in problems.items() for p in ps)


def test_a_stale_option_list_is_caught():
    doc = ("1-bit SGD. Codec options (``scales``, ``ramp_steps``, ``warmup_steps``, ``momentum``): see\n"
           ":class:`OneBitCodec`; the exchange options: :meth:`codec`.")
    bad = text.bad_listed_options("onebit", doc)
    assert any("``ramp_steps`` is deprecated" in b for b in bad), bad
    assert any("``momentum`` is listed" in b for b in bad), bad
    assert text.undocumented_codec_options("onebit", doc) == ["lr_warmup_steps", "residual_cap"]
    assert text.bad_listed_options("terngrad", "TernGrad. Options: seed, clip (c in c*sigma).") == [
        "option list 'seed, clip (c in c*sigma)' names no option in ``double backticks``"]


@pytest.mark.parametrize("codec, option", sorted(text.DEPRECATED_OPTIONS))
def test_deprecated_options_warn(codec, option):
    import horovod_gradcomp as hgc
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hgc.get_codec(codec, impl="reference", **{option: text.DEPRECATED_OPTIONS[(codec, option)]})
    assert any(issubclass(w.category, FutureWarning) for w in caught), f"{codec}: {option} is not deprecated"
